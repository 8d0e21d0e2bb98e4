"""hf_tfm models: the three paradigms and their task heads, each a thin composition of the shared stack.

The decoder-only model is a causal stack, the encoder a bidirectional stack, the encoder-decoder a bidirectional
stack feeding a causal stack with cross-attention. The stack and blocks live in `modeling_tfm_stack.py` and
`modeling_tfm_layers.py`; caches, masks, generation, losses and output capture come from transformers.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.generation import GenerationMixin
from transformers.loss.loss_utils import ForMaskedLMLoss
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
from transformers.models.bart.modeling_bart import shift_tokens_right
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs, can_return_tuple

from .configuration_tfm import TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig
from .modeling_tfm_layers import TfmMaskedLMHead
from .modeling_tfm_stack import TfmPreTrainedModel, TfmStack, check_labels, lm_logits, make_lm_head, share_embeddings

# transformers' output classes plus the MoE fields every hf_tfm head reports (None for dense models): the
# load-balancing loss (already included in `loss`, reported separately) and each MoE layer's router logits.


@dataclass
class TfmMaskedLMOutput(MaskedLMOutput):
    aux_loss: torch.FloatTensor | None = None
    router_logits: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class TfmSequenceClassifierOutput(SequenceClassifierOutput):
    aux_loss: torch.FloatTensor | None = None
    router_logits: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class TfmTokenClassifierOutput(TokenClassifierOutput):
    aux_loss: torch.FloatTensor | None = None
    router_logits: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class TfmQuestionAnsweringOutput(QuestionAnsweringModelOutput):
    aux_loss: torch.FloatTensor | None = None
    router_logits: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class TfmSequenceClassifierOutputWithPast(SequenceClassifierOutputWithPast):
    aux_loss: torch.FloatTensor | None = None
    router_logits: tuple[torch.FloatTensor, ...] | None = None


# ------------------------------------------------------------------------------------------------ decoder-only


class TfmDecoderModel(TfmStack):
    """Decoder-only body (GPT-2 / Llama): the shared stack with causal self-attention."""

    config: TfmDecoderConfig


class TfmDecoderForCausalLM(TfmPreTrainedModel, GenerationMixin):
    config: TfmDecoderConfig
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: TfmDecoderConfig):
        super().__init__(config)
        self.model = TfmDecoderModel(config)
        self.lm_head = make_lm_head(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MoeCausalLMOutputWithPast:
        check_labels(labels, input_ids, inputs_embeds)
        routed = self.wants_router_logits(kwargs, labels)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_router_logits=routed,
            **kwargs,
        )
        logits = lm_logits(self.config, self.lm_head, outputs.last_hidden_state, logits_to_keep)
        loss = aux_loss = None
        if labels is not None:
            # kwargs carry Trainer's num_items_in_batch: a forward that accepts **kwargs gets it, and Trainer then no
            # longer divides by the accumulation steps, so the loss must divide by it to keep accumulation exact
            loss = self.task_loss(
                self.loss_function, logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        if routed:
            loss, aux_loss = self.add_router_losses(loss, outputs.router_logits, attention_mask, labels, **kwargs)
        return MoeCausalLMOutputWithPast(
            loss=loss,
            aux_loss=aux_loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            router_logits=outputs.router_logits,
        )


class TfmDecoderForSequenceClassification(TfmPreTrainedModel):
    """Classifies from the last non-padding token, like `LlamaForSequenceClassification`."""

    config: TfmDecoderConfig
    accepts_loss_kwargs = False  # as TfmEncoderForSequenceClassification: Trainer scales for accumulation

    def __init__(self, config: TfmDecoderConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = TfmDecoderModel(config)
        self.score = nn.Linear(config.hidden_size, self.num_labels, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TfmSequenceClassifierOutputWithPast:
        routed = self.wants_router_logits(kwargs, labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_router_logits=routed,
            **kwargs,
        )
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
        aux_loss = None
        if routed:
            loss, aux_loss = self.add_router_losses(loss, outputs.router_logits, attention_mask, labels, **kwargs)
        return TfmSequenceClassifierOutputWithPast(
            loss=loss,
            aux_loss=aux_loss,
            router_logits=outputs.router_logits,
            logits=pooled_logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


# ------------------------------------------------------------------------------------------------ encoder-only


class TfmEncoderModel(TfmStack):
    """Encoder-only body (BERT): the shared stack with bidirectional self-attention, and a pooler."""

    config: TfmEncoderConfig

    def __init__(self, config: TfmEncoderConfig, add_pooling_layer: bool = True):
        super().__init__(config, is_causal=False, pooler=add_pooling_layer and config.use_pooler)


class TfmEncoderHead(TfmPreTrainedModel):
    """An encoder body plus a task layer. Subclasses build the layer (`build_head`), turn the encoder's output into
    logits and loss (`predict`), and name their `output_class`; the forward pass around them is this one."""

    config: TfmEncoderConfig
    add_pooling_layer = False
    output_class: type[ModelOutput]

    def __init__(self, config: TfmEncoderConfig):
        super().__init__(config)
        self.model = TfmEncoderModel(config, add_pooling_layer=self.add_pooling_layer)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.build_head(config)
        self.post_init()

    def encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, **kwargs):
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            **kwargs,
        )

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
        outputs = self.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_router_logits=routed,
            **kwargs,
        )
        logits, loss = self.predict(outputs, labels, input_ids, inputs_embeds, **kwargs)
        aux_loss = None
        if routed:  # MoE: the router losses join the task loss
            loss, aux_loss = self.add_router_losses(loss, outputs.router_logits, attention_mask, labels, **kwargs)
        return self.output_class(
            loss=loss,
            logits=logits,
            aux_loss=aux_loss,
            router_logits=outputs.router_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class TfmEncoderForMaskedLM(TfmEncoderHead):
    output_class = TfmMaskedLMOutput
    _tied_weights_keys = {"lm_head.decoder.weight": "model.embed_tokens.weight"}

    def build_head(self, config):
        self.lm_head = TfmMaskedLMHead(config)

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    def predict(self, outputs, labels, input_ids, inputs_embeds, **kwargs):
        check_labels(labels, input_ids, inputs_embeds)
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.task_loss(
                self.loss_function, logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        return logits, loss


class TfmEncoderForSequenceClassification(TfmEncoderHead):
    """Classifies from the pooled first token; `problem_type` picks single-label, multi-label or regression loss."""

    add_pooling_layer = True
    output_class = TfmSequenceClassifierOutput
    # the regression and multi-label losses cannot use Trainer's num_items_in_batch: with this False, Trainer passes
    # none and divides by the gradient accumulation steps itself
    accepts_loss_kwargs = False

    def build_head(self, config):
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def predict(self, outputs, labels, input_ids, inputs_embeds, **kwargs):
        pooled = outputs.pooler_output if outputs.pooler_output is not None else outputs.last_hidden_state[:, 0]
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            loss = self.task_loss(self.loss_function, labels=labels, pooled_logits=logits, config=self.config)
        return logits, loss


class TfmEncoderForTokenClassification(TfmEncoderHead):
    output_class = TfmTokenClassifierOutput

    def build_head(self, config):
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def predict(self, outputs, labels, input_ids, inputs_embeds, **kwargs):
        check_labels(labels, input_ids, inputs_embeds)
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = self.task_loss(self.loss_function, logits=logits, labels=labels, config=self.config, **kwargs)
        return logits, loss


class TfmEncoderForQuestionAnswering(TfmEncoderHead):
    """Extractive QA: a start and an end logit per token. Its own forward, because Trainer finds the label
    names (`start_positions`, `end_positions`) in the signature."""

    def build_head(self, config):
        self.qa_outputs = nn.Linear(config.hidden_size, 2)

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
        outputs = self.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_router_logits=routed,
            **kwargs,
        )
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).unbind(dim=-1)
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
        aux_loss = None
        if routed:
            loss, aux_loss = self.add_router_losses(
                loss, outputs.router_logits, attention_mask, start_positions, **kwargs
            )
        return TfmQuestionAnsweringOutput(
            loss=loss,
            aux_loss=aux_loss,
            router_logits=outputs.router_logits,
            start_logits=start_logits.contiguous(),
            end_logits=end_logits.contiguous(),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


# --------------------------------------------------------------------------------------------- encoder-decoder


class TfmEncoderDecoderModel(TfmPreTrainedModel):
    """Encoder-decoder body (T5 / BART / the original Transformer): a bidirectional stack, then a causal stack
    that cross-attends to it. Both read one shared token table."""

    config: TfmEncoderDecoderConfig

    def __init__(self, config: TfmEncoderDecoderConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.hidden_size)
        self.encoder = TfmStack(config, is_causal=False, embed_tokens=self.shared)
        self.decoder = TfmStack(
            config, is_causal=True, cross_attention=True, num_layers=config.decoder_layers, embed_tokens=self.shared
        )
        self.post_init()

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, new_embeddings):
        self.shared = new_embeddings
        share_embeddings(self.encoder, new_embeddings)
        share_embeddings(self.decoder, new_embeddings)

    def get_encoder(self):
        return self.encoder

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
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
            past_key_values=past_key_values,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqMoEModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            past_key_values=decoder_outputs.past_key_values,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            decoder_router_logits=decoder_outputs.router_logits,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
            encoder_router_logits=getattr(encoder_outputs, "router_logits", None),
        )


class TfmEncoderDecoderForConditionalGeneration(TfmPreTrainedModel, GenerationMixin):
    config: TfmEncoderDecoderConfig
    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: TfmEncoderDecoderConfig):
        super().__init__(config)
        self.model = TfmEncoderDecoderModel(config)
        self.lm_head = make_lm_head(config)
        self.post_init()

    def get_encoder(self):
        return self.model.encoder

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        for field in ("decoder_start_token_id", "pad_token_id"):
            if getattr(self.config, field) is None:
                raise ValueError(f"labels can only be shifted into decoder_input_ids when the config sets {field}")
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqMoEOutput:
        routed = self.wants_router_logits(kwargs, labels)
        if labels is not None:
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
            check_labels(labels, decoder_input_ids, decoder_inputs_embeds, "decoder_input_ids")
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            decoder_position_ids=decoder_position_ids,
            use_cache=use_cache,
            output_router_logits=routed,
            **kwargs,
        )
        logits = lm_logits(self.config, self.lm_head, outputs.last_hidden_state, logits_to_keep)
        loss = encoder_aux = decoder_aux = None
        if labels is not None:
            # labels are already the decoder's targets: plain cross-entropy, not transformers'
            # ForConditionalGeneration loss, which shifts labels like a causal LM
            loss = self.task_loss(
                ForMaskedLMLoss, logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        if routed:  # MoE: each stack's router losses, over its own real tokens
            if outputs.encoder_router_logits:
                loss, encoder_aux = self.add_router_losses(
                    loss, outputs.encoder_router_logits, attention_mask, labels, **kwargs
                )
            if outputs.decoder_router_logits:
                loss, decoder_aux = self.add_router_losses(
                    loss, outputs.decoder_router_logits, decoder_attention_mask, labels, **kwargs
                )
        return Seq2SeqMoEOutput(
            loss=loss,
            logits=logits,
            encoder_aux_loss=encoder_aux,
            decoder_aux_loss=decoder_aux,
            past_key_values=outputs.past_key_values,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            decoder_router_logits=outputs.decoder_router_logits,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
            encoder_router_logits=outputs.encoder_router_logits,
        )


# Every Auto class each paradigm answers to: the one place that registration and `auto_map` read from.


# the public model classes; hf_tfm/__init__.py exports these names
__all__ = [
    "TfmPreTrainedModel",
    "TfmDecoderModel",
    "TfmDecoderForCausalLM",
    "TfmDecoderForSequenceClassification",
    "TfmEncoderModel",
    "TfmEncoderForMaskedLM",
    "TfmEncoderForSequenceClassification",
    "TfmEncoderForTokenClassification",
    "TfmEncoderForQuestionAnswering",
    "TfmEncoderDecoderModel",
    "TfmEncoderDecoderForConditionalGeneration",
]
