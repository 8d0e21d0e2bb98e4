"""hf_tfm models: the three paradigms and their task heads, each a thin composition of the shared stack.

The decoder-only model is a causal stack, the encoder a bidirectional stack, the encoder-decoder a bidirectional
stack feeding a causal stack with cross-attention. The stack and blocks live in `modeling_tfm_stack.py` and
`modeling_tfm_layers.py`; caches, masks, generation, losses and output capture come from transformers.

Reading starts at `TfmDecoderForCausalLM.forward`: the body (`TfmStack.forward`, modeling_tfm_stack.py), the
vocabulary projection and its loss (`vocabulary_prediction`), the router losses of an MoE model (`add_router_losses`),
the output, every field named, as Llama's and Mixtral's heads build it.

The other heads share one pattern (`TfmHead`): a body, one task layer, and a forward that hands its arguments to the
body by name, the body's output to the task layer (logits and a loss), and both to `head_output` (MoE router losses,
output fields). A paradigm's head base (`TfmDecoderHead`, `TfmEncoderHead`) writes the forward its heads share, so a
new head is its task layer and `predict`.
"""

from dataclasses import dataclass

import torch
from torch import nn

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch built without distributed: nothing is sharded
    DTensor = ()
from transformers.cache_utils import Cache
from transformers.loss.loss_utils import ForCausalLMLoss, ForMaskedLMLoss
from transformers.modeling_outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    MoeCausalLMOutputWithPast,
    QuestionAnsweringModelOutput,
    Seq2SeqMoEModelOutput,
    Seq2SeqMoEOutput,
    SequenceClassifierOutput,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs, can_return_tuple

from .compat import CACHE_NAME, accepts_legacy_cache_argument
from .configuration_tfm import TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig
from .modeling_tfm_layers import TfmMaskedLMHead
from .modeling_tfm_loss import linear_cross_entropy, load_balancing_loss
from .modeling_tfm_saving import HEAD_MODULES
from .modeling_tfm_stack import (
    TfmGenerationMixin,
    TfmPreTrainedModel,
    TfmStack,
    check_labels,
    lm_logits,
    make_lm_head,
    stores_signature,
)

# ------------------------------------------------------------------------------------------------------- outputs


def with_router_outputs(output_class: type[ModelOutput], name: str) -> type[ModelOutput]:
    """transformers' `output_class` plus the MoE fields every hf_tfm head reports (None for dense models): the
    load-balancing loss (already included in `loss`, reported separately) and each MoE layer's router logits. Heads
    whose transformers output already has them (MoeCausalLMOutputWithPast, Seq2SeqMoEOutput) use it as it is."""
    added = {"aux_loss": torch.FloatTensor | None, "router_logits": tuple[torch.FloatTensor, ...] | None}
    # named and placed in this module from the start: ModelOutput registers each subclass as a pytree node by name
    namespace = {"__module__": __name__, "__qualname__": name, "__annotations__": added, **dict.fromkeys(added)}
    return dataclass(type(name, (output_class,), namespace))


TfmMaskedLMOutput = with_router_outputs(MaskedLMOutput, "TfmMaskedLMOutput")
TfmSequenceClassifierOutput = with_router_outputs(SequenceClassifierOutput, "TfmSequenceClassifierOutput")
TfmSequenceClassifierOutputWithPast = with_router_outputs(
    SequenceClassifierOutputWithPast, "TfmSequenceClassifierOutputWithPast"
)
TfmTokenClassifierOutput = with_router_outputs(TokenClassifierOutput, "TfmTokenClassifierOutput")
TfmQuestionAnsweringOutput = with_router_outputs(QuestionAnsweringModelOutput, "TfmQuestionAnsweringOutput")

# ---------------------------------------------------------------------------------------------- the head pattern


class TfmHead(TfmPreTrainedModel):
    """A body plus one task layer: how every hf_tfm head is built and run.

    A head names its task layer (`task_layer`, transformers' name for it: `lm_head`, `score`, `classifier`,
    `qa_outputs`) and builds it (`build_task_layer`); its paradigm builds the body (`build_body`, kept as `model`).
    The forward, as in transformers' heads, hands its arguments to the body by name, then the body's output to the
    task layer (`predict`: logits and loss), then both to `head_output`, which joins the MoE router losses to the task
    loss and builds the output (`output_class`) with every field of the body's output that it has (hidden states,
    attentions, cache, router logits). A paradigm's head base writes the forward its heads share.

    transformers' Generic*ForSequenceClassification / TokenClassification / QuestionAnswering heads are not used:
    they build their body with AutoModel.from_config, know no router losses, score a batch without targets as NaN,
    and the token-classification one drops Trainer's num_items_in_batch (its loss then is not scaled for gradient
    accumulation). The heads here follow their module names, dropout and outputs."""

    task_layer: str
    output_class: type[ModelOutput]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # the saving code must know every head's task layer (a checkpoint may come from any head): registered here,
        # from the name the head is built with, so a new head cannot be left out
        if getattr(cls, "task_layer", None) is not None:
            HEAD_MODULES.add(cls.task_layer)

    def __init__(self, config):
        super().__init__(config)
        self.model = self.build_body(config)
        setattr(self, self.task_layer, self.build_task_layer(config))
        self.post_init()

    def head_output(self, outputs: ModelOutput, fields: dict, labels, router_stacks=(), **kwargs) -> ModelOutput:
        """The head's output from the task layer's `fields` (logits and loss) and the body's `outputs`: each MoE
        stack's router losses joined to the loss, and every field of the body's output that `output_class` has
        (hidden states, attentions, cache, router logits). `router_stacks` holds (output field of the aux loss,
        router logits, padding mask) for each stack that was asked for its router logits; `labels` (extractive QA:
        the start positions) counts the scored items under Trainer's `num_items_in_batch`."""
        for aux_field, router_logits, attention_mask in router_stacks:
            if router_logits:
                fields["loss"], fields[aux_field] = self.add_router_losses(
                    fields["loss"], router_logits, attention_mask, labels, **kwargs
                )
        reported = self.output_class.__dataclass_fields__
        fields.update((name, value) for name, value in outputs.items() if name in reported)
        return self.output_class(**fields)

    # ------------------------------------------------------------------------------------------- the losses

    def wants_router_logits(self, kwargs: dict, labels) -> bool:
        """Whether a head asks its stacks for router logits (and reports them with the aux loss): an MoE model given
        labels, or asked by `output_router_logits` (argument, else config). Pops the argument from the head's
        kwargs, because the head passes its own decision on to the stack."""
        asked = kwargs.pop("output_router_logits", None)
        if self.config.num_experts == 0:  # a dense model has no router to ask
            return False
        if asked is None:
            asked = self.config.output_router_logits
        return labels is not None or bool(asked)

    def add_router_losses(self, loss, router_logits, attention_mask, labels, **kwargs):
        """The task loss plus the weighted aux and z losses, and the aux loss to report. Under Trainer's
        `num_items_in_batch` each micro-batch adds its share of tokens, so accumulated micro-batches sum to one
        token-weighted average (Trainer does not divide by the accumulation steps then) instead of counting the router
        losses once per micro-batch."""
        aux, z_loss = self.router_losses(router_logits, attention_mask, with_z_loss=self.config.router_z_loss_coef > 0)
        if loss is not None:
            detached = (
                torch.is_grad_enabled() and loss.requires_grad and not any(r.requires_grad for r in router_logits)
            )
            if detached and (self.config.router_aux_loss_coef or self.config.router_z_loss_coef):
                # reentrant checkpointing runs the first forward under no_grad: the recorded router logits carry
                # no graph, and the router losses would add to the loss value but silently not to the gradient
                raise ValueError(
                    "the router losses cannot reach the gradient: router logits were recorded without autograd "
                    "(reentrant gradient checkpointing). Use gradient_checkpointing_kwargs={'use_reentrant': False}."
                )
            extra = self.config.router_aux_loss_coef * aux + self.config.router_z_loss_coef * z_loss
            num_items = kwargs.get("num_items_in_batch")
            if num_items is not None:  # clamped: an accumulated batch without targets has 0 items (and 0 share)
                extra = extra * (self.scored_labels(labels) != -100).sum() / torch.as_tensor(num_items).clamp(min=1)
            loss = loss + extra
        return loss, aux

    def scored_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """The labels the task loss scores: a causal LM scores each token's successor, so never the first label."""
        return labels[..., 1:] if self.loss_type == "ForCausalLM" else labels

    def task_loss(self, loss_function, **inputs) -> torch.Tensor:
        """`loss_function(**inputs)` (a transformers loss), but 0 instead of NaN for a batch with no target to score:
        every label -100, or every answer position beyond the input (transformers divides 0 by 0 there). The 0 keeps
        the loss's graph, whose gradients are all zero, so backward, Trainer and gradient accumulation run unchanged;
        a torch.where, so no device sync."""
        loss = loss_function(**inputs)
        if "labels" in inputs:
            labels = inputs["labels"]
            if labels.is_floating_point():  # regression, multi-label: nothing is ignored
                return loss
            scored = (self.scored_labels(labels) != -100).any()
        else:  # extractive QA ignores the positions it clamps to the sequence length
            length = inputs["start_logits"].shape[-1]
            scored = (inputs["start_positions"] < length).any() & (inputs["end_positions"] < length).any()
        return torch.where(scored, loss, torch.zeros_like(loss))

    def router_losses(
        self, router_logits, attention_mask, with_z_loss: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The load-balancing loss (Switch/Mixtral, over all MoE layers, padding excluded) and the ST-MoE z-loss
        (mean squared log-sum-exp of the router logits over real tokens, summed over layers; 0.0 unless
        `with_z_loss`, so that a model trained without it does not pay for it)."""
        # 2D padding masks only: not prepared 4D masks, nor the per-layer-type masks a static-cache generate() passes
        mask = attention_mask if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 else None
        aux = load_balancing_loss(router_logits, self.config.num_experts, self.config.num_experts_per_tok, mask)
        weights = mask.reshape(-1).float() if mask is not None else None
        z_loss = 0.0
        for logits in router_logits if with_z_loss else ():
            squared = torch.logsumexp(logits.float(), dim=-1) ** 2
            z_loss = z_loss + (squared.mean() if weights is None else (squared * weights).sum() / weights.sum())
        return aux, z_loss

    def vocabulary_prediction(
        self, hidden, labels, output_layer: nn.Linear, loss_function, logits_to_keep=0, select_scored=False, **kwargs
    ) -> dict:
        """A language-model head's fields from its final hidden states. Training with labels: the loss alone, the
        vocabulary projected a chunk of tokens at a time (`loss_chunk_size`; logits None: Trainer's training step
        reads only the loss), only the scored tokens with `select_scored` (masked LM). Otherwise (evaluation,
        generation, `loss_chunk_size=0`, tensor parallelism): the logits, and their loss by `loss_function` when labels
        are given. Both paths give the same loss and gradients."""
        config = self.config
        # a tensor-parallel head holds a slice of the vocabulary (a DTensor), which its module's hooks gather into
        # logits: the chunked loss, reading the weight itself, would mix that slice with local tensors.
        # (isinstance, not transformers' `is_dtensor`, which sits behind an lru_cache torch.compile warns about)
        chunked = config.loss_chunk_size != 0 and not isinstance(output_layer.weight, DTensor)
        if labels is not None and self.training and chunked:
            if loss_function is ForCausalLMLoss:  # each token scores its successor: the labels move, not the states
                labels = nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
            loss = linear_cross_entropy(
                hidden,
                output_layer.weight,
                output_layer.bias,
                labels,
                config.loss_chunk_size,
                vocab_size=config.vocab_size,
                scale=config.hidden_size**-0.5 if config.scale_lm_head_input else 1.0,
                softcap=config.final_logit_softcapping,
                select_scored=select_scored,
                activation_width=config.num_hidden_layers * config.hidden_size,
                bias_after_matmul=config.lm_head_bias,
                **kwargs,
            )
            return {"logits": None, "loss": loss}
        logits = lm_logits(config, output_layer, hidden, logits_to_keep)
        loss = None
        if labels is not None:
            loss = self.task_loss(loss_function, logits=logits, labels=labels, vocab_size=config.vocab_size, **kwargs)
        return {"logits": logits, "loss": loss}


class TfmTokenClassification:
    """A label per token (NER, part of speech): dropout, then a linear layer on every token's final hidden state."""

    output_class = TfmTokenClassifierOutput

    def build_task_layer(self, config):
        self.num_labels = config.num_labels
        self.dropout = nn.Dropout(config.hidden_dropout)
        return nn.Linear(config.hidden_size, config.num_labels)

    def predict(self, outputs, labels, input_ids, inputs_embeds, **kwargs):
        check_labels(labels, input_ids, inputs_embeds)
        logits = getattr(self, self.task_layer)(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = self.task_loss(self.loss_function, logits=logits, labels=labels, config=self.config, **kwargs)
        return {"logits": logits, "loss": loss}


class TfmQuestionAnswering:
    """Extractive QA: a start and an end logit per token. Each paradigm writes its forward, because Trainer finds
    the label names (`start_positions`, `end_positions`) in the signature."""

    task_layer = "qa_outputs"
    output_class = TfmQuestionAnsweringOutput

    def build_task_layer(self, config):
        return nn.Linear(config.hidden_size, 2)

    def predict(self, outputs, start_positions, end_positions, **kwargs):
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).unbind(dim=-1)
        start_logits, end_logits = start_logits.contiguous(), end_logits.contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.task_loss(
                self.loss_function,
                start_logits=start_logits,
                end_logits=end_logits,
                start_positions=start_positions,
                end_positions=end_positions,
                **kwargs,
            )
        return {"start_logits": start_logits, "end_logits": end_logits, "loss": loss}


# ------------------------------------------------------------------------------------------------ decoder-only


class TfmDecoderModel(TfmStack):
    """Decoder-only body (GPT-2 / Llama): the shared stack with causal self-attention."""

    config: TfmDecoderConfig


class TfmDecoderHead(TfmHead):
    """A decoder-only body plus a task layer, with the forward of transformers' Llama heads."""

    config: TfmDecoderConfig

    def build_body(self, config):
        return TfmDecoderModel(config)

    @accepts_legacy_cache_argument
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> ModelOutput:
        if labels is not None and use_cache is None:
            use_cache = False  # as the causal LM's
        routed = self.wants_router_logits(kwargs, labels)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_router_logits=routed,
            **kwargs,
        )
        fields = self.predict(outputs, labels, input_ids, inputs_embeds, **kwargs)
        stacks = [("aux_loss", outputs.router_logits, attention_mask)] if routed else ()
        return self.head_output(outputs, fields, labels, stacks, **kwargs)


class TfmDecoderForCausalLM(TfmDecoderHead, TfmGenerationMixin):
    task_layer = "lm_head"
    output_class = MoeCausalLMOutputWithPast
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    # the vocabulary sharded as the token table is (tied, they are one tensor), the logits gathered: Llama's plans
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}

    def build_task_layer(self, config):
        return make_lm_head(config)

    @stores_signature
    @accepts_legacy_cache_argument
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MoeCausalLMOutputWithPast:
        check_labels(labels, input_ids, inputs_embeds)
        if labels is not None and use_cache is None:
            use_cache = False  # a step scored against labels is not continued: no copy of every layer's keys
        routed = self.wants_router_logits(kwargs, labels)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_router_logits=routed,
            **kwargs,
        )
        hidden = outputs.last_hidden_state
        fields = self.vocabulary_prediction(hidden, labels, self.lm_head, self.loss_function, logits_to_keep, **kwargs)
        loss, aux_loss = fields["loss"], None
        if routed and outputs.router_logits:  # an MoE model: the router losses join the task loss
            loss, aux_loss = self.add_router_losses(loss, outputs.router_logits, attention_mask, labels, **kwargs)
        return MoeCausalLMOutputWithPast(
            loss=loss,
            aux_loss=aux_loss,
            logits=fields["logits"],
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            router_logits=outputs.router_logits,
            **{CACHE_NAME: outputs.get(CACHE_NAME)},
        )


class TfmDecoderForSequenceClassification(TfmDecoderHead):
    """Classifies from the last non-padding token, like `LlamaForSequenceClassification`."""

    task_layer = "score"
    output_class = TfmSequenceClassifierOutputWithPast
    # the regression and multi-label losses cannot use Trainer's num_items_in_batch: with this False, Trainer passes
    # none and divides by the gradient accumulation steps itself
    accepts_loss_kwargs = False

    def build_task_layer(self, config):
        self.num_labels = config.num_labels
        return nn.Linear(config.hidden_size, config.num_labels, bias=False)

    def predict(self, outputs, labels, input_ids, inputs_embeds, **kwargs):
        logits = self.score(outputs.last_hidden_state)
        pad = self.config.pad_token_id
        if input_ids is None or pad is None:
            if logits.shape[0] > 1 and pad is None:
                raise ValueError("Classifying a batch needs config.pad_token_id to find each row's last token")
            last = torch.full((logits.shape[0],), logits.shape[1] - 1, device=logits.device)
        else:  # the rightmost non-padding token, for left- and right-padded rows alike
            positions = torch.arange(input_ids.shape[-1], device=logits.device)
            last = (positions * (input_ids != pad).to(logits.device)).argmax(-1)
        pooled_logits = logits[torch.arange(logits.shape[0], device=logits.device), last]
        loss = None
        if labels is not None:
            loss = self.task_loss(
                self.loss_function, logits=logits, labels=labels, pooled_logits=pooled_logits, config=self.config
            )
        return {"logits": pooled_logits, "loss": loss}


class TfmDecoderForTokenClassification(TfmTokenClassification, TfmDecoderHead):
    """A label per token from a decoder, like `LlamaForTokenClassification` (its layer is named `score`)."""

    task_layer = "score"


class TfmDecoderForQuestionAnswering(TfmQuestionAnswering, TfmDecoderHead):
    """Extractive QA from a decoder, like `LlamaForQuestionAnswering` (whose body is `transformer`; here `model`,
    as in every hf_tfm head, so a causal LM's checkpoint loads into it)."""

    @accepts_legacy_cache_argument
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TfmQuestionAnsweringOutput:
        routed = self.wants_router_logits(kwargs, start_positions)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            output_router_logits=routed,
            **kwargs,
        )
        fields = self.predict(outputs, start_positions, end_positions, **kwargs)
        stacks = [("aux_loss", outputs.router_logits, attention_mask)] if routed else ()
        return self.head_output(outputs, fields, start_positions, stacks, **kwargs)


# ------------------------------------------------------------------------------------------------ encoder-only


class TfmEncoderModel(TfmStack):
    """Encoder-only body (BERT): the shared stack with bidirectional self-attention, and a pooler."""

    config: TfmEncoderConfig

    def __init__(self, config: TfmEncoderConfig, add_pooling_layer: bool = True):
        super().__init__(config, is_causal=False, pooler=add_pooling_layer and config.use_pooler)


class TfmEncoderHead(TfmHead):
    """An encoder body plus a task layer, with the forward of transformers' BERT heads."""

    config: TfmEncoderConfig
    add_pooling_layer = False

    def build_body(self, config):
        return TfmEncoderModel(config, add_pooling_layer=self.add_pooling_layer)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> ModelOutput:
        routed = self.wants_router_logits(kwargs, labels)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_router_logits=routed,
            **kwargs,
        )
        fields = self.predict(outputs, labels, input_ids, inputs_embeds, **kwargs)
        stacks = [("aux_loss", outputs.router_logits, attention_mask)] if routed else ()
        return self.head_output(outputs, fields, labels, stacks, **kwargs)


class TfmEncoderForMaskedLM(TfmEncoderHead):
    task_layer = "lm_head"
    output_class = TfmMaskedLMOutput
    _tied_weights_keys = {"lm_head.decoder.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head.decoder": "colwise_gather_output"}  # as TfmDecoderForCausalLM's lm_head

    def build_task_layer(self, config):
        return TfmMaskedLMHead(config)

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    def predict(self, outputs, labels, input_ids, inputs_embeds, **kwargs):
        check_labels(labels, input_ids, inputs_embeds)
        hidden = self.lm_head.transform(outputs.last_hidden_state)
        return self.vocabulary_prediction(
            hidden, labels, self.lm_head.decoder, self.loss_function, select_scored=True, **kwargs
        )


class TfmEncoderForSequenceClassification(TfmEncoderHead):
    """Classifies from the pooled first token; `problem_type` picks single-label, multi-label or regression loss."""

    task_layer = "classifier"
    output_class = TfmSequenceClassifierOutput
    add_pooling_layer = True
    accepts_loss_kwargs = False  # as TfmDecoderForSequenceClassification: Trainer scales for accumulation

    def build_task_layer(self, config):
        self.dropout = nn.Dropout(config.hidden_dropout)
        return nn.Linear(config.hidden_size, config.num_labels)

    def predict(self, outputs, labels, input_ids, inputs_embeds, **kwargs):
        pooled = outputs.pooler_output if outputs.pooler_output is not None else outputs.last_hidden_state[:, 0]
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            loss = self.task_loss(self.loss_function, labels=labels, pooled_logits=logits, config=self.config)
        return {"logits": logits, "loss": loss}


class TfmEncoderForTokenClassification(TfmTokenClassification, TfmEncoderHead):
    task_layer = "classifier"  # BERT's name


class TfmEncoderForQuestionAnswering(TfmQuestionAnswering, TfmEncoderHead):
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TfmQuestionAnsweringOutput:
        routed = self.wants_router_logits(kwargs, start_positions)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_router_logits=routed,
            **kwargs,
        )
        fields = self.predict(outputs, start_positions, end_positions, **kwargs)
        stacks = [("aux_loss", outputs.router_logits, attention_mask)] if routed else ()
        return self.head_output(outputs, fields, start_positions, stacks, **kwargs)


# --------------------------------------------------------------------------------------------- encoder-decoder


class TfmEncoderDecoderModel(TfmPreTrainedModel):
    """Encoder-decoder body (T5 / BART / the original Transformer): a bidirectional stack, then a causal stack
    that cross-attends to it. Both read one shared token table."""

    config: TfmEncoderDecoderConfig
    # Both stacks hold the body's token table (one module under three names), saved once, as `shared`, and loaded
    # from it. Not declared as ties: transformers ties only when `tie_word_embeddings` is set, and here that flag
    # is the LM head's alone (T5 v1.1 has a head of its own and still one table).
    _keys_to_ignore_on_save = ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]
    _keys_to_ignore_on_load_missing = [r"(en|de)coder\.embed_tokens\.weight"]

    def __init__(self, config: TfmEncoderDecoderConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.padded_vocab_size(), config.hidden_size)
        self.encoder = TfmStack(config, is_causal=False, embed_tokens=self.shared)
        self.decoder = TfmStack(
            config, is_causal=True, cross_attention=True, num_layers=config.decoder_layers, embed_tokens=self.shared
        )
        self.post_init()

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, new_embeddings):
        self.shared = self.encoder.embed_tokens = self.decoder.embed_tokens = new_embeddings

    def get_encoder(self):
        return self.encoder

    @accepts_legacy_cache_argument
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqMoEModelOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, ModelOutput):  # a plain tuple from a user
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            raise ValueError(
                "The decoder needs decoder_input_ids (or decoder_inputs_embeds, or labels to shift right)"
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            position_ids=decoder_position_ids,
            inputs_embeds=decoder_inputs_embeds,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqMoEModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **{CACHE_NAME: decoder_outputs.get(CACHE_NAME)},
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            decoder_router_logits=decoder_outputs.router_logits,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
            encoder_router_logits=getattr(encoder_outputs, "router_logits", None),
        )


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """BART's `shift_tokens_right`: the decoder's inputs are the labels one step late behind the start token, with
    the ignored positions (-100) read as padding."""
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == -100, pad_token_id)


class TfmEncoderDecoderForConditionalGeneration(TfmHead, TfmGenerationMixin):
    config: TfmEncoderDecoderConfig
    task_layer = "lm_head"
    output_class = Seq2SeqMoEOutput
    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # as TfmDecoderForCausalLM's

    def build_body(self, config):
        return TfmEncoderDecoderModel(config)

    def build_task_layer(self, config):
        return make_lm_head(config)

    def get_encoder(self):
        return self.model.encoder

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        for field in ("decoder_start_token_id", "pad_token_id"):
            if getattr(self.config, field) is None:
                raise ValueError(f"labels can only be shifted into decoder_input_ids when the config sets {field}")
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @stores_signature
    @accepts_legacy_cache_argument
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqMoEOutput:
        if labels is not None:
            use_cache = False  # as BART's and T5's heads: a step scored against labels is not continued
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
            check_labels(labels, decoder_input_ids, decoder_inputs_embeds, "decoder_input_ids")
        routed = self.wants_router_logits(kwargs, labels)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            decoder_position_ids=decoder_position_ids,
            use_cache=use_cache,
            output_router_logits=routed,
            **kwargs,
        )
        # labels are already the decoder's targets: plain cross-entropy, not transformers' ForConditionalGeneration
        # loss, which shifts labels like a causal LM
        hidden = outputs.last_hidden_state
        fields = self.vocabulary_prediction(hidden, labels, self.lm_head, ForMaskedLMLoss, logits_to_keep, **kwargs)
        stacks = ()
        if routed:  # each stack's router losses over that stack's real tokens
            stacks = [
                ("encoder_aux_loss", outputs.encoder_router_logits, attention_mask),
                ("decoder_aux_loss", outputs.decoder_router_logits, decoder_attention_mask),
            ]
        return self.head_output(outputs, fields, labels, stacks, **kwargs)


# the public model classes; hf_tfm/__init__.py exports these names
__all__ = [
    "TfmPreTrainedModel",
    "TfmDecoderModel",
    "TfmDecoderForCausalLM",
    "TfmDecoderForSequenceClassification",
    "TfmDecoderForTokenClassification",
    "TfmDecoderForQuestionAnswering",
    "TfmEncoderModel",
    "TfmEncoderForMaskedLM",
    "TfmEncoderForSequenceClassification",
    "TfmEncoderForTokenClassification",
    "TfmEncoderForQuestionAnswering",
    "TfmEncoderDecoderModel",
    "TfmEncoderDecoderForConditionalGeneration",
]
