"""Parity in bfloat16, not only float32: a converted model cast to bf16 gives the reference's bf16 outputs exactly
(atol 0). Where a reference rounds differently from Llama, a config field says so and the family's record sets it (a
control shows each one matters):
- `rmsnorm_scale_in_float32` (OLMo 2, GPT-OSS): RMSNorm scales the float32 states, then casts;
- `rope_tables_in_float32` (OLMo 2): RoPE's tables stay float32, so queries and keys rotate in float32;
- `rope_in_float32` (ModernBERT): queries and keys are upcast to rotate by the bf16 tables;
- `router_weights_in_model_dtype` (Qwen2-MoE, Qwen3-MoE): the top-k weights are cast to the logits' dtype (GPT-OSS's
  `top_k_softmax` scoring computes them in that dtype);
- `round_embedding_scale` (Gemma 2, Gemma 3): sqrt(hidden_size) rounded to the table's dtype;
- `router_in_float32` (DeepSeek-V3, tests/test_convert_deepseek_v3.py; Switch Transformer, DeepSeek-V2);
- `router_scores_in_model_dtype` (Switch Transformer): the router's float32 probabilities are rounded to the model's
  dtype before the top-1 expert is chosen and weighted;
- `scale_queries_as_projected` (OPT): the queries are scaled as they are projected, the scores not;
- `rope_as_complex` (DeepSeek-V2): interleaved rotary pairs multiplied as complex numbers in float32 by tables made
  with `torch.polar`, which round otherwise than `cos` and `sin` (its control is in float32, where it shows:
  tests/test_convert_deepseek_v2.py).
- BART's `final_logits_bias` is added after the LM head's matmul, as its reference adds it (rounded twice in bf16)."""

import copy

import pytest
import torch
from support.families import tiny_reference

from hf_tfm.convert import to_tfm
from hf_tfm.convert.families import FAMILIES
from hf_tfm.model.modeling_tfm_layers import TfmRMSNorm, TfmRMSNormScaledInFloat32, TfmUnitOffsetRMSNorm

# `numerics` entry -> the families whose record sets it: without it, the bf16 logits must differ (the control)
NUMERICS = {
    "rmsnorm_scale_in_float32": ("olmo2", "gpt_oss"),
    "rope_tables_in_float32": ("olmo2",),
    "rope_in_float32": ("modernbert",),
    "router_weights_in_model_dtype": ("qwen2_moe", "qwen3_moe"),
    "round_embedding_scale": ("gemma2", "gemma3_text"),
    "router_in_float32": ("switch_transformers", "deepseek_v2"),
    "router_scores_in_model_dtype": ("switch_transformers",),
    "scale_queries_as_projected": ("opt",),
}


def bf16_pair(name: str):
    """The reference and hf_tfm's conversion of it in bf16, and a batch (a seq2seq decoder reads a prefix)."""
    reference = tiny_reference(name)
    ours = to_tfm(reference).to(torch.bfloat16).eval()
    reference = reference.to(torch.bfloat16).eval()
    # the kernels the reference runs: its attention backend (Switch Transformer's is eager only), and the experts'
    # eager loop where its experts are a loop of modules (Switch's; no experts backend to set)
    ours.set_attn_implementation(reference.config._attn_implementation)
    if not reference._can_set_experts_implementation():
        ours.set_experts_implementation("eager")
    ids = torch.randint(3, reference.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids}
    if reference.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = ids[:, :5]
    return reference, ours, inputs


def output(model, inputs) -> torch.Tensor:
    """The logits of a head, the last hidden states of a base model."""
    with torch.no_grad():
        result = model(**inputs)
    return result.logits if "logits" in result else result.last_hidden_state


# families whose reference rounds in places no `numerics` entry covers yet: their bf16 outputs agree to bf16 rounding
ROUNDED_ELSEWHERE = {
    "bloom": "its GELU writes sqrt(2/pi) as 0.79788456, and its scores add the ALiBi bias inside one bf16 baddbmm, at "
    "absolute key positions (hf_tfm adds a float32 bias of query-key distances)",
    "deberta-v2": "it divides the keys by the score scale before the content matmul, sums its three score terms in "
    "bf16 and takes the softmax in bf16 (hf_tfm scales the product and adds the position scores through the mask, as "
    "eager and sdpa do)",
}
# GPT-2's Conv1D multiplies by its weight held [in, out], hf_tfm's Linear by the same weight held [out, in]. On an
# AVX2-only CPU torch's bf16 matmul sums the two layouts in other orders for some shapes (GPT-2's c_proj, 128 inputs:
# one bf16 step apart); the suite's earlier machines, with AVX-512, gave both the same sums
if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
    ROUNDED_ELSEWHERE["gpt2"] = "its Conv1D weight layout rounds otherwise in an AVX2 CPU's bf16 matmul"


@pytest.mark.parametrize("name", FAMILIES)
def test_bf16_logits_equal_the_references(name):
    reference, ours, inputs = bf16_pair(name)
    expected, actual = output(reference, inputs), output(ours, inputs)
    if name not in ROUNDED_ELSEWHERE:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        return
    # a few bf16 steps of the logits' scale apart, never a different model
    scale = expected.float().abs().max()
    assert (actual.float() - expected.float()).abs().max() <= 0.02 * scale
    assert (actual.float() - expected.float()).abs().max() > 0  # the entry is needed: remove it once exact


@pytest.mark.parametrize(("entry", "name"), [(entry, name) for entry, names in NUMERICS.items() for name in names])
def test_each_rounding_choice_matters(entry, name):
    """The control: the family's record sets the `numerics` entry, and the same weights in a model built without it
    give bf16 logits that differ from the reference's."""
    reference, ours, inputs = bf16_pair(name)
    assert entry in ours.config.numerics
    config = copy.deepcopy(ours.config)
    config.numerics = [other for other in config.numerics if other != entry]
    without = type(ours)(config).to(torch.bfloat16).eval()
    without.load_state_dict(ours.state_dict())
    assert (output(without, inputs).float() - output(reference, inputs).float()).abs().max() > 0


def test_bart_adds_its_bias_after_the_matmul(monkeypatch):
    """The control for BART's head: with the bias inside the matmul (the head called as a module) the bf16 logits
    differ from the reference's."""
    reference, ours, inputs = bf16_pair("bart")
    torch.testing.assert_close(output(ours, inputs), output(reference, inputs), rtol=0, atol=0)
    ours.lm_head.bias_after_matmul = False
    assert (output(ours, inputs).float() - output(reference, inputs).float()).abs().max() > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", [TfmRMSNorm, TfmUnitOffsetRMSNorm, TfmRMSNormScaledInFloat32])
def test_rmsnorm_without_gradients_gives_the_values_it_gives_with_them(variant, dtype):
    """Without gradients a 16-bit input is scaled itself (T5's form: its float32 copy dies after the variance), with
    them its float32 copy (Llama's, whose gradient rounds once): the same values either way, bit for bit."""
    norm = variant(64)
    with torch.no_grad():
        norm.weight.normal_()
    norm = norm.to(dtype)
    hidden = torch.randn(3, 7, 64, generator=torch.Generator().manual_seed(0)).mul(5).to(dtype)
    with torch.no_grad():
        without = norm(hidden)
    with_gradients = norm(hidden.requires_grad_())
    assert with_gradients.dtype == without.dtype == dtype
    assert torch.equal(with_gradients.detach(), without)
