"""hf_tfm models: the three paradigms' bodies and their task heads.

The decoder-only body is a causal stack, the encoder a bidirectional stack with a pooler, the encoder-decoder a
bidirectional stack feeding a causal stack with cross-attention (modeling_tfm_stack.py). A head is a body plus one task
layer: its forward keeps transformers' signature for its task (Trainer reads the label names from it) and hands its
arguments to the one body every head shares (`TfmHead.run`): the base model, the task layer's logits and loss
(`predict`), the MoE router losses, the output.

Reading starts at `TfmDecoderForCausalLM.forward`.
"""

import functools
from dataclasses import dataclass

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.loss.loss_utils import ForMaskedLMLoss
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_bidirectional_sliding_window_mask,
    create_causal_mask,
    create_sliding_window_causal_mask,
    packed_sequence_mask_function,
)
from transformers.modeling_outputs import (
    BaseModelOutput,
    CausalLMOutputWithPast,
    MaskedLMOutput,
    MoeCausalLMOutputWithPast,
    QuestionAnsweringModelOutput,
    Seq2SeqLMOutput,
    Seq2SeqMoEModelOutput,
    Seq2SeqMoEOutput,
    SequenceClassifierOutput,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs, can_return_tuple

from .capabilities import sum_over_data_parallel_ranks
from .compat import CACHE_NAME, MASK_CACHE_ARGUMENT, accepts_legacy_cache_argument, name_in_task_tables
from .configuration_tfm import TfmConfig, TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig
from .modeling_tfm_layers import make_dropout, make_token_embedding
from .modeling_tfm_lm_head import TfmLMHead, TfmMaskedLMHead, lm_head_in
from .modeling_tfm_loading import AUTO_CLASSES, HEAD_MODULES
from .modeling_tfm_moe import router_losses
from .modeling_tfm_stack import (
    TfmGenerationMixin,
    TfmPreTrainedModel,
    TfmStack,
    new_dynamic_cache,
    stores_signature,
)

# ------------------------------------------------------------------------------------------------------- bodies


class TfmDecoderModel(TfmStack):
    """Decoder-only body (GPT-2 / Llama): the stack with causal self-attention and a cache; with `cross_attention`,
    an encoder-decoder's decoder."""

    config: TfmDecoderConfig
    is_causal = True
    mask_helpers = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}

    def open_cache(self, cache: Cache | None, use_cache: bool | None) -> tuple[Cache | None, Cache | None]:
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            # the backward pass re-runs each block: a cache would take its keys twice (transformers' checkpointing
            # layer drops it by keyword, whose name differs between releases: dropped here for all of them)
            return None, None
        if use_cache and cache is None:
            cache = new_dynamic_cache(self.config, self.cross_attention)
        return cache, cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache

    def build_masks(self, inputs_embeds, attention_mask, cache, sequence_ids=None) -> dict:
        # an additive position bias needs the full causal mask to add to (sdpa would otherwise get None and the bias
        # alone, not causal), unless one query sees every key: a decode step's mask may be skipped then
        skip = not self.position_bias.adds_to_masks or inputs_embeds.shape[1] == 1
        return {
            kind: self.mask_helpers[kind](
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                **{MASK_CACHE_ARGUMENT: cache},
                allow_is_causal_skip=skip,
                and_mask_function=None if sequence_ids is None else packed_sequence_mask_function(sequence_ids),
            )
            for kind in self.layer_kinds
        }


class TfmEncoderModel(TfmStack):
    """Encoder-only body (BERT): the stack with bidirectional self-attention, and a pooler."""

    config: TfmEncoderConfig
    is_causal = False
    mask_helpers = {
        "full_attention": create_bidirectional_mask,
        "sliding_attention": create_bidirectional_sliding_window_mask,
    }

    def __init__(
        self, config: TfmEncoderConfig, add_pooling_layer: bool = True, embed_tokens: nn.Embedding | None = None
    ):
        super().__init__(config, pooler=add_pooling_layer and config.use_pooler, embed_tokens=embed_tokens)

    def build_masks(self, inputs_embeds, attention_mask, cache, sequence_ids=None) -> dict:
        return {
            kind: self.mask_helpers[kind](
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                and_mask_function=None if sequence_ids is None else packed_sequence_mask_function(sequence_ids),
            )
            for kind in self.layer_kinds
        }


class TfmEncoderDecoderModel(TfmPreTrainedModel):
    """Encoder-decoder body (T5 / BART / the original Transformer): a bidirectional stack, then a causal stack that
    cross-attends to it. Both read the body's one token table, held under three names (`shared`,
    `encoder.embed_tokens`, `decoder.embed_tokens`) as T5 and BART hold it, and saved once."""

    config: TfmEncoderDecoderConfig
    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }
    # transformers ties only with `tie_word_embeddings`, here the LM head's flag alone (T5 v1.1 has a head of its own
    # and still one table): the table is saved once and loaded from `shared` either way
    _keys_to_ignore_on_save = ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]
    _keys_to_ignore_on_load_missing = [r"(en|de)coder\.embed_tokens\.weight"]

    def __init__(self, config: TfmEncoderDecoderConfig):
        super().__init__(config)
        self.shared = make_token_embedding(config)
        self.encoder = TfmEncoderModel(config, add_pooling_layer=False, embed_tokens=self.shared)
        self.decoder = TfmDecoderModel(
            config, cross_attention=True, num_layers=config.decoder_layers, embed_tokens=self.shared
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


# ------------------------------------------------------------------------------------------------------- outputs


def with_router_outputs(output_class: type[ModelOutput], name: str) -> type[ModelOutput]:
    """transformers' `output_class` plus the MoE fields an hf_tfm head of an MoE model reports: the load-balancing
    loss (already included in `loss`, reported apart) and each MoE layer's router logits."""
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
# a replaced-token logit per token (ELECTRA's discriminator): the fields of a token classifier's output
TfmPreTrainingOutput = with_router_outputs(TokenClassifierOutput, "TfmPreTrainingOutput")
TfmQuestionAnsweringOutput = with_router_outputs(QuestionAnsweringModelOutput, "TfmQuestionAnsweringOutput")


# ---------------------------------------------------------------------------------------------------------- heads


def check_labels(labels, inputs: dict) -> None:
    """Labels must line up token for token with the inputs they score (`input_ids`, else `inputs_embeds`)."""
    name = "input_ids" if inputs["input_ids"] is not None else "inputs_embeds"
    tokens = inputs[name]
    if labels is not None and tuple(labels.shape) != tuple(tokens.shape[:2]):
        raise ValueError(
            f"labels have shape {tuple(labels.shape)}, expected {tuple(tokens.shape[:2])} (the shape of {name})"
        )


def zero_without_targets(loss: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """`loss`, or 0 where no target is scored (`scored`: a 0-d bool; transformers divides 0 by 0 there): the 0 keeps
    the loss's graph, whose gradients are all zero, so backward, Trainer and accumulation run unchanged. No sync."""
    return torch.where(scored, loss, torch.zeros_like(loss))


class TfmHead(TfmPreTrainedModel):
    """A body (`model`) plus one task layer, named as in transformers (`lm_head`, `score`, `classifier`,
    `qa_outputs`), built by `build_body` and `build_task_layer`. Every head's forward hands its arguments to `run`.

    transformers' Generic*ForSequenceClassification / TokenClassification / QuestionAnswering heads are not used: they
    build their body with AutoModel.from_config, know no router losses, score a batch without targets as NaN, and the
    token-classification one drops Trainer's num_items_in_batch."""

    task_layer: str
    output_class: type[ModelOutput]  # transformers' output for the task, as a dense model returns it
    moe_output_class: type[ModelOutput]  # the same with the router fields (aux_loss, router_logits): an MoE model's

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # a checkpoint may come from any head: the loading checks must know every head's task layer
        if getattr(cls, "task_layer", None) is not None:
            HEAD_MODULES.add(cls.task_layer)

    def __init__(self, config):
        super().__init__(config)
        self.model = self.build_body(config)
        setattr(self, self.task_layer, self.build_task_layer(config))
        if config.num_experts > 0:  # as Mixtral's heads answer where Llama's answer without the router fields
            self.output_class = self.moe_output_class
        self.post_init()

    def run(self, inputs: dict, targets: dict, **kwargs) -> ModelOutput:
        """The body every head shares: the base model on `inputs`, the task layer on its output (`predict`: logits and
        a loss against `targets`), an MoE model's router losses joined to the task loss, and the output with every
        field of the base model's output that `output_class` has (hidden states, attentions, cache, router logits)."""
        labels = next(iter(targets.values()))  # what the router losses count their share of a batch by
        # an MoE model reports router logits with labels, or when asked (argument, else config): the body is told
        asked = kwargs.pop("output_router_logits", None)
        asked = self.config.output_router_logits if asked is None else asked
        routed = self.config.num_experts > 0 and (labels is not None or bool(asked))
        outputs = self.model(**inputs, output_router_logits=routed, **kwargs)
        fields = self.predict(outputs, inputs, **targets, **kwargs)
        if routed:
            fields.update(self.add_router_losses(fields["loss"], outputs, inputs, labels, **kwargs))
        reported = self.output_class.__dataclass_fields__
        fields |= {name: value for name, value in outputs.items() if name in reported}
        return self.output_class(**fields)

    def router_stacks(self, outputs, inputs: dict) -> list[tuple[str, tuple, torch.Tensor | None]]:
        """(the output field of its aux loss, its router logits, its padding mask) for each stack of the body."""
        return [("aux_loss", outputs.router_logits, inputs["attention_mask"])]

    def add_router_losses(self, loss, outputs, inputs: dict, labels, **kwargs) -> dict:
        """The task loss plus each stack's weighted router losses, and each stack's aux loss to report. Under Trainer's
        `num_items_in_batch` each micro-batch adds its share of tokens, so accumulated micro-batches sum to one
        token-weighted average (Trainer does not divide by the accumulation steps then). With
        `router_aux_loss_scope="global"` the losses count every data-parallel rank's tokens in training, and the share
        is the global batch's divided by the ranks, which Trainer's scaling by the world size under
        `average_tokens_across_devices` makes whole."""
        fields = {"loss": loss}
        sequences = outputs.last_hidden_state.shape[0]  # every stack's batch
        sum_over_ranks = None
        # while training only: every rank trains each step, but a forward another rank does not run (an evaluation
        # on rank 0 alone) would wait for it forever
        if self.config.router_aux_loss_scope == "global" and self.training:
            sum_over_ranks = functools.partial(sum_over_data_parallel_ranks, self)
        for aux_field, router_logits, attention_mask in self.router_stacks(outputs, inputs):
            if not router_logits:  # a stack without MoE layers
                continue
            weighted, fields[aux_field] = router_losses(
                self.config, router_logits, attention_mask, sequences, sum_over_ranks
            )
            if loss is None:
                continue
            detached = loss.requires_grad and not any(logits.requires_grad for logits in router_logits)
            if detached and (self.config.router_aux_loss_coef or self.config.router_z_loss_coef):
                # reentrant checkpointing runs the first forward under no_grad: the recorded router logits carry no
                # graph, and the router losses would add to the loss value but silently not to the gradient
                raise ValueError(
                    "the router losses cannot reach the gradient: router logits were recorded without autograd "
                    "(reentrant gradient checkpointing). Use gradient_checkpointing_kwargs={'use_reentrant': False}."
                )
            num_items = kwargs.get("num_items_in_batch")
            if num_items is not None:  # clamped: an accumulated batch without targets has 0 items (and 0 share)
                scored = (self.scored_labels(labels) != -100).sum()
                if sum_over_ranks is not None:
                    scored, ranks = sum_over_ranks(
                        torch.stack([scored.float(), scored.new_ones((), dtype=torch.float)])
                    )
                    scored = scored / ranks
                weighted = weighted * scored / torch.as_tensor(num_items).clamp(min=1)
            fields["loss"] = fields["loss"] + weighted
        return fields

    def scored_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """The labels the task loss scores: a causal LM scores each token's successor, so never the first label."""
        return labels[..., 1:] if self.loss_type == "ForCausalLM" else labels


class TfmTokenClassification:
    """A label per token (NER, part of speech): dropout, then a linear layer on every token's final hidden state."""

    output_class = TokenClassifierOutput
    moe_output_class = TfmTokenClassifierOutput

    def build_task_layer(self, config):
        self.num_labels = config.num_labels
        self.dropout = make_dropout(config.classifier_dropout_probability())
        return nn.Linear(config.output_width(), config.num_labels)

    def predict(self, outputs, inputs, labels, **kwargs) -> dict:
        check_labels(labels, inputs)
        logits = getattr(self, self.task_layer)(self.dropout(outputs.last_hidden_state))
        if labels is None:
            return {"logits": logits, "loss": None}
        loss = self.loss_function(logits=logits, labels=labels, config=self.config, **kwargs)
        return {"logits": logits, "loss": zero_without_targets(loss, (labels != -100).any())}


class TfmQuestionAnswering:
    """Extractive QA: a start and an end logit per token. Each paradigm writes its forward: Trainer finds the label
    names (`start_positions`, `end_positions`) in the signature."""

    task_layer = "qa_outputs"
    output_class = QuestionAnsweringModelOutput
    moe_output_class = TfmQuestionAnsweringOutput

    def build_task_layer(self, config):
        return nn.Linear(config.output_width(), 2)

    def predict(self, outputs, inputs, start_positions, end_positions, **kwargs) -> dict:
        start_logits, end_logits = (
            logits.contiguous() for logits in self.qa_outputs(outputs.last_hidden_state).unbind(-1)
        )
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions, **kwargs)
            # positions past the input are clamped to it and ignored: a batch of those alone scores nothing
            length = start_logits.shape[-1]
            loss = zero_without_targets(loss, (start_positions < length).any() & (end_positions < length).any())
        return {"start_logits": start_logits, "end_logits": end_logits, "loss": loss}


class TfmSequenceClassification:
    """A label (or a score) per sequence; `problem_type` picks single-label, multi-label or regression loss. Trainer
    scales its loss for gradient accumulation (`accepts_loss_kwargs = False`): the regression and multi-label losses
    cannot use num_items_in_batch."""

    accepts_loss_kwargs = False

    def sequence_loss(self, logits, labels) -> torch.Tensor | None:
        if labels is None:
            return None
        loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        return loss if labels.is_floating_point() else zero_without_targets(loss, (labels != -100).any())


# -------------------------------------------------------------------------------------------------- decoder heads


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
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            # a step scored against labels is not continued: no copy of every layer's keys
            use_cache=False if labels is not None and use_cache is None else use_cache,
        )
        return self.run(inputs, {"labels": labels}, **kwargs)


class TfmDecoderForCausalLM(TfmDecoderHead, TfmGenerationMixin):
    """A decoder with its LM head, like `LlamaForCausalLM` and `GPT2LMHeadModel`: next-token logits, the shifted
    loss with `labels`, and `generate()`."""

    task_layer = "lm_head"
    output_class = CausalLMOutputWithPast
    moe_output_class = MoeCausalLMOutputWithPast
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    # the vocabulary sharded as the token table is (tied, they are one tensor), the logits gathered: Llama's plans
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}
    # FSDP2 (transformers' DistributedConfig) keeps the head gathered after the forward, grouped with the final norm
    # (with the tied token table when tied): the backward needs it at once, as Llama's plan says
    _fsdp_plan = {"lm_head": "keep_full_weight"}

    def build_task_layer(self, config):
        return TfmLMHead(config)

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = TfmLMHead.holding(new_embeddings, self.config)

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
    ) -> CausalLMOutputWithPast | MoeCausalLMOutputWithPast:
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=False if labels is not None and use_cache is None else use_cache,
        )
        return self.run(inputs, {"labels": labels}, logits_to_keep=logits_to_keep, **kwargs)

    def predict(self, outputs, inputs, labels, logits_to_keep=0, **kwargs) -> dict:
        # through the module the model holds in the head's place (PEFT's wrapper of a targeted head calls it)
        return lm_head_in(self.lm_head).predict(
            outputs.last_hidden_state, labels, self.loss_function, self.lm_head, logits_to_keep, **kwargs
        )


class TfmDecoderForSequenceClassification(TfmSequenceClassification, TfmDecoderHead):
    """Classifies from the last non-padding token, like `LlamaForSequenceClassification`."""

    task_layer = "score"
    output_class = SequenceClassifierOutputWithPast
    moe_output_class = TfmSequenceClassifierOutputWithPast

    def build_task_layer(self, config):
        self.num_labels = config.num_labels
        return nn.Linear(config.output_width(), config.num_labels, bias=False)

    def predict(self, outputs, inputs, labels, **kwargs) -> dict:
        logits, input_ids, pad = self.score(outputs.last_hidden_state), inputs["input_ids"], self.config.pad_token_id
        if input_ids is None or pad is None:
            if logits.shape[0] > 1 and pad is None:
                raise ValueError("Classifying a batch needs config.pad_token_id to find each row's last token")
            last = torch.full((logits.shape[0],), logits.shape[1] - 1, device=logits.device)
        else:  # the rightmost non-padding token, for left- and right-padded rows alike
            positions = torch.arange(input_ids.shape[-1], device=logits.device)
            last = (positions * (input_ids != pad).to(logits.device)).argmax(-1)
        pooled_logits = logits[torch.arange(logits.shape[0], device=logits.device), last]
        return {"logits": pooled_logits, "loss": self.sequence_loss(pooled_logits, labels)}


class TfmDecoderForTokenClassification(TfmTokenClassification, TfmDecoderHead):
    """A label per token from a decoder, like `LlamaForTokenClassification` (its layer is named `score`)."""

    task_layer = "score"


class TfmDecoderForQuestionAnswering(TfmQuestionAnswering, TfmDecoderHead):
    """Extractive QA from a decoder, like `LlamaForQuestionAnswering` (whose body is `transformer`; here `model`, as in
    every hf_tfm head, so a causal LM's checkpoint loads into it)."""

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
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
        )
        return self.run(inputs, {"start_positions": start_positions, "end_positions": end_positions}, **kwargs)


# -------------------------------------------------------------------------------------------------- encoder heads


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
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
        )
        return self.run(inputs, {"labels": labels}, **kwargs)


class TfmEncoderForMaskedLM(TfmEncoderHead):
    """An encoder with BERT's masked-LM head (`BertForMaskedLM`): logits per token, the loss over the positions
    `labels` scores."""

    task_layer = "lm_head"
    output_class = MaskedLMOutput
    moe_output_class = TfmMaskedLMOutput
    _tied_weights_keys = {"lm_head.decoder.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head.decoder": "colwise_gather_output"}  # as TfmDecoderForCausalLM's lm_head

    def build_task_layer(self, config):
        return TfmMaskedLMHead(config)

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = TfmLMHead.holding(new_embeddings, self.config, bias_after_matmul=False)

    def predict(self, outputs, inputs, labels, **kwargs) -> dict:
        hidden_states = self.lm_head.transform(outputs.last_hidden_state)
        decoder = self.lm_head.decoder
        return lm_head_in(decoder).predict(
            hidden_states, labels, self.loss_function, decoder, select_scored=True, **kwargs
        )


class TfmEncoderForSequenceClassification(TfmSequenceClassification, TfmEncoderHead):
    """Classifies from the pooled first token (BERT's pooler), or the first token without a pooler."""

    task_layer = "classifier"
    output_class = SequenceClassifierOutput
    moe_output_class = TfmSequenceClassifierOutput
    add_pooling_layer = True

    def build_task_layer(self, config):
        self.dropout = make_dropout(config.classifier_dropout_probability())
        return nn.Linear(config.output_width(), config.num_labels)

    def predict(self, outputs, inputs, labels, **kwargs) -> dict:
        pooled = outputs.pooler_output if outputs.pooler_output is not None else outputs.last_hidden_state[:, 0]
        logits = self.classifier(self.dropout(pooled))
        return {"logits": logits, "loss": self.sequence_loss(logits, labels)}


class TfmEncoderForTokenClassification(TfmTokenClassification, TfmEncoderHead):
    """A label per token from an encoder, like `BertForTokenClassification`."""

    task_layer = "classifier"  # BERT's name


class TfmReplacedTokenHead(nn.Module):
    """ELECTRA's discriminator head: dense, activation, and one logit per token that it was replaced."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act_fn = ACT2FN[config.hidden_act]
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.act_fn(self.dense(hidden_states))).squeeze(-1)


class TfmEncoderForPreTraining(TfmEncoderHead):
    """Replaced-token detection (ELECTRA's discriminator, `ElectraForPreTraining`): a logit per token that it is not
    the original; `labels` are 1 (replaced) or 0 (original), scored by binary cross-entropy over the tokens the
    attention mask marks real, as ELECTRA scores them."""

    task_layer = "discriminator_predictions"  # ELECTRA's name
    output_class = TokenClassifierOutput
    moe_output_class = TfmPreTrainingOutput

    def build_task_layer(self, config):
        return TfmReplacedTokenHead(config)

    def predict(self, outputs, inputs, labels, **kwargs) -> dict:
        check_labels(labels, inputs)
        logits = self.discriminator_predictions(outputs.last_hidden_state)
        if labels is None:
            return {"logits": logits, "loss": None}
        attention_mask = inputs["attention_mask"]
        if attention_mask is None:
            scored_logits, scored_labels = logits, labels
        else:
            real = attention_mask == 1
            scored_logits, scored_labels = logits[real], labels[real]
        loss = nn.functional.binary_cross_entropy_with_logits(scored_logits, scored_labels.to(logits.dtype))
        return {"logits": logits, "loss": loss}


class TfmEncoderForQuestionAnswering(TfmQuestionAnswering, TfmEncoderHead):
    """Extractive QA from an encoder, like `BertForQuestionAnswering`: start and end logits per token."""

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
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
        )
        return self.run(inputs, {"start_positions": start_positions, "end_positions": end_positions}, **kwargs)


# ------------------------------------------------------------------------------------------ encoder-decoder head


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """BART's `shift_tokens_right`: the decoder's inputs are the labels one step late behind the start token, with the
    ignored positions (-100) read as padding."""
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == -100, pad_token_id)


class TfmEncoderDecoderForConditionalGeneration(TfmHead, TfmGenerationMixin):
    """An encoder-decoder with its LM head, like `T5ForConditionalGeneration` and `BartForConditionalGeneration`:
    `labels` are shifted right behind `decoder_start_token_id` for the decoder's inputs; `generate()` decodes."""

    config: TfmEncoderDecoderConfig
    task_layer = "lm_head"
    output_class = Seq2SeqLMOutput
    moe_output_class = Seq2SeqMoEOutput
    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # as TfmDecoderForCausalLM's

    def build_body(self, config):
        return TfmEncoderDecoderModel(config)

    def build_task_layer(self, config):
        return TfmLMHead(config)

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = TfmLMHead.holding(new_embeddings, self.config)

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
    ) -> Seq2SeqLMOutput | Seq2SeqMoEOutput:
        if labels is not None and decoder_input_ids is None and decoder_inputs_embeds is None:
            decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            decoder_position_ids=decoder_position_ids,
            # as BART's and T5's heads: a step scored against labels is not continued
            use_cache=False if labels is not None else use_cache,
        )
        return self.run(inputs, {"labels": labels}, logits_to_keep=logits_to_keep, **kwargs)

    def predict(self, outputs, inputs, labels, logits_to_keep=0, **kwargs) -> dict:
        # labels are already the decoder's targets: plain cross-entropy, not transformers' ForConditionalGeneration
        # loss, which shifts labels like a causal LM
        return lm_head_in(self.lm_head).predict(
            outputs.last_hidden_state, labels, ForMaskedLMLoss, self.lm_head, logits_to_keep, **kwargs
        )

    def router_stacks(self, outputs, inputs: dict) -> list[tuple[str, tuple, torch.Tensor | None]]:
        # each stack's router losses over that stack's real tokens
        return [
            ("encoder_aux_loss", outputs.encoder_router_logits, inputs["attention_mask"]),
            ("decoder_aux_loss", outputs.decoder_router_logits, inputs["decoder_attention_mask"]),
        ]


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
    "TfmEncoderForPreTraining",
    "TfmEncoderDecoderModel",
    "TfmEncoderDecoderForConditionalGeneration",
]

# named where transformers looks a task up by class name, as an installed or a remote-code model alike
name_in_task_tables(AUTO_CLASSES)
