"""Context parallelism declared honestly: accelerate's context-parallel hooks (what `Accelerator.prepare` attaches
under a `ParallelismConfig` with `cp_size > 1`) drop every self-attention's mask and make it causal, and sdpa then
shards the sequence. `supports_context_parallel` is True only where that computes the same model: a causal decoder
of full attention without a position bias in its mask, sinks or soft-capping. One process, no sharding: the hooks
alone, attached to a copy, change the outputs of every model hf_tfm says False for and of none it says True for.
Packed rows (position_ids restarting inside a row) are a property of a batch, not of the model: context parallelism
would attend across their boundaries, which no flag can say."""

import copy
from unittest import mock

import pytest
import torch
from accelerate.big_modeling import _attach_context_parallel_hooks
from conftest import VOCAB, tiny_config

from hf_tfm import (
    TfmDecoderConfig,
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
)
from hf_tfm.compat import accelerate_refuses_context_parallel
from hf_tfm.model.capabilities import parallel_refusal

DECODER, ENCODER = (TfmDecoderForCausalLM, TfmDecoderConfig), (TfmEncoderForMaskedLM, TfmEncoderConfig)
ENCODER_DECODER = (TfmEncoderDecoderForConditionalGeneration, TfmEncoderDecoderConfig)
BIASED = "position_embedding_type"
# name -> ((model class, config class), fields, what hf_tfm says, the field its refusal names)
CASES = {
    "llama-shaped": (DECODER, dict(position_embedding_type="rope"), True, None),
    "learned-positions": (DECODER, dict(position_embedding_type="learned"), True, None),
    "encoder": (ENCODER, {}, False, "model_type"),
    "encoder-decoder": (ENCODER_DECODER, {}, False, "model_type"),
    "alibi": (DECODER, dict(position_embedding_type="alibi"), False, BIASED),
    "t5-bias": (DECODER, dict(position_embedding_type="relative_bias"), False, BIASED),
    "disentangled": (ENCODER, dict(position_embedding_type="disentangled", relative_attention_num_buckets=8), False,
                     "model_type"),
    "sliding": (DECODER, dict(sliding_window=3), False, "layer_types"),
}  # fmt: skip
# refused by sdpa itself, so the hooks cannot run them here; declared False all the same
SDPA_REFUSES = {
    "attention_sinks": dict(attention_sinks=True),
    "attn_logit_softcapping": dict(attn_logit_softcapping=5.0),
}


def build(name: str):
    (model_class, config_class), fields, _, _ = CASES[name]
    torch.manual_seed(0)
    return model_class(tiny_config(config_class, **fields)).eval()


def outputs(model, input_ids, attention_mask) -> torch.Tensor:
    extra = {"decoder_input_ids": input_ids[:, :5]} if model.config.is_encoder_decoder else {}
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits


@pytest.mark.parametrize("name", sorted(CASES))
def test_hf_tfm_says_where_context_parallelism_computes_the_same_model(name):
    _, _, supported, field = CASES[name]
    model = build(name)
    assert model.supports_context_parallel is supported
    refusal = parallel_refusal(model.config, {"context"})
    assert (refusal is None) if supported else refusal[0] == field


# accelerate refuses a sliding window itself; disentangled attention hands its position scores to sdpa as the mask,
# which the hooks leave in place and torch's context-parallel sdpa refuses ("attn_bias is not supported yet")
NOT_SILENT = {"sliding", "disentangled"}


@pytest.mark.parametrize("name", sorted(set(CASES) - NOT_SILENT))
def test_accelerates_hooks_change_exactly_the_models_declared_unsupported(name):
    """An unpadded batch (the mask all ones, as context parallelism's batches are): the hooks' causal attention
    without the mask is the same model for a causal decoder of full attention, another model elsewhere. accelerate
    1.16+ refuses the hooks itself where hf_tfm says False (`compat.accelerate_refuses_context_parallel`); the
    declaration is proved all the same, on a copy that claims support so that the hooks attach."""
    model = build(name)
    model.set_attn_implementation("sdpa")
    hooked = copy.deepcopy(model)
    if not model.supports_context_parallel and accelerate_refuses_context_parallel():
        with pytest.raises(ValueError, match="does not support context parallelism"):
            _attach_context_parallel_hooks(hooked)
    with mock.patch.object(type(hooked), "supports_context_parallel", True):  # read when the hooks attach
        _attach_context_parallel_hooks(hooked)
    input_ids = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    expected, actual = outputs(model, input_ids, attention_mask), outputs(hooked, input_ids, attention_mask)
    if model.supports_context_parallel:
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)
    else:
        assert (actual - expected).abs().max() > 1e-3


def test_a_sliding_window_is_refused_by_accelerate_and_declared_by_hf_tfm():
    """accelerate refuses a sliding window by its layer type (before 1.16) or by the model's declaration (1.16+)."""
    model = build("sliding")
    assert not model.supports_context_parallel
    refusal = "does not support context parallelism" if accelerate_refuses_context_parallel() else "sliding_attention"
    with pytest.raises(ValueError, match=refusal):
        _attach_context_parallel_hooks(copy.deepcopy(model))


@pytest.mark.parametrize("field", sorted(SDPA_REFUSES))
def test_what_sdpa_cannot_run_is_declared_unsupported(field):
    config = tiny_config(TfmDecoderConfig, position_embedding_type="rope", **SDPA_REFUSES[field])
    config._attn_implementation = "eager"
    model = TfmDecoderForCausalLM(config)
    assert not model.supports_context_parallel
    assert parallel_refusal(config, {"context"})[0] == field
