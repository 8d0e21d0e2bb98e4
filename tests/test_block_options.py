"""The block options of issue 13 on their own (the converters prove them exact against transformers' families):
sliding windows and per-layer attention kinds, RoPE per layer type and NoPE layers, soft-capping, the (1 + weight)
RMSNorm, padding-aware positions, and that each option survives save and load."""

from types import SimpleNamespace

import pytest
import torch
from conftest import VOCAB, tiny_config

from benchmarks.trace import UnfusedAttention
from hf_tfm import (
    TfmDecoderConfig,
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderForMaskedLM,
)
from hf_tfm.model.modeling_tfm_layers import TfmRMSNorm, TfmUnitOffsetRMSNorm

ROPE = dict(position_embedding_type="rope", norm_type="rmsnorm", ffn_type="glu")
ALTERNATING = dict(ROPE, layer_types=["sliding_attention", "full_attention"], sliding_window=3)
NESTED_ROPE = {"full_attention": {"rope_theta": 10000.0}, "sliding_attention": {"rope_theta": 100.0}}

# one model per option, each on top of what it needs
DECODER_OPTIONS = {
    "sliding-all": dict(ROPE, sliding_window=3),
    "sliding-alternating": ALTERNATING,
    "rope-per-layer-type": dict(ALTERNATING, rope_parameters=NESTED_ROPE),
    "partial-rotary": dict(ROPE, rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    "nope-layers": dict(ROPE, nope_layers=[1]),
    "qk-norm-per-head": dict(ROPE, qk_norm="per_head"),
    "qk-norm-projection": dict(ROPE, qk_norm="projection", num_key_value_heads=2),
    "out-bias-split": dict(ROPE, attention_bias=True, attention_out_bias=False),
    "parallel-residual": dict(parallel_residual=True),
    "sandwich": dict(ROPE, norm_position="sandwich", rmsnorm_unit_offset=True),
    "output-norms": dict(ROPE, norm_position="output"),
    "softcapping": dict(ROPE, attn_logit_softcapping=5.0, final_logit_softcapping=3.0, query_pre_attn_scalar=16),
    "first-layer-without-attn-norm": dict(first_layer_attn_norm=False),
}


def decoder(seed: int = 0, **overrides) -> TfmDecoderForCausalLM:
    torch.manual_seed(seed)
    model = TfmDecoderForCausalLM(tiny_config(**overrides)).eval()
    with torch.no_grad():  # norms away from their init, so that a norm dropped or doubled shows in the logits
        for name, tensor in model.state_dict().items():
            if "norm" in name:
                tensor.add_(torch.randn_like(tensor) * 0.3)
    return model


@pytest.mark.parametrize("overrides", DECODER_OPTIONS.values(), ids=DECODER_OPTIONS.keys())
def test_option_trains_saves_and_loads(overrides, tmp_path):
    """Each option builds, back-propagates to every parameter, and comes back from save_pretrained with the same
    logits (computed buffers such as per-layer-type RoPE frequencies are rebuilt right after meta-device loading)."""
    model = decoder(**overrides)
    input_ids = torch.randint(3, VOCAB, (2, 7))
    model.train()
    model(input_ids, labels=input_ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters()), "a parameter the forward never reads"
    model.eval()
    model.save_pretrained(tmp_path)
    loaded = TfmDecoderForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids).logits, model(input_ids).logits, rtol=0, atol=0)


GPU_LAYOUT_OPTIONS = {**DECODER_OPTIONS, "alibi": dict(position_embedding_type="alibi")}


@pytest.mark.parametrize("overrides", GPU_LAYOUT_OPTIONS.values(), ids=GPU_LAYOUT_OPTIONS.keys())
def test_no_option_hands_sdpa_a_layout_gpu_kernels_refuse(overrides):
    """A training step and a padded decode: every sdpa call gets a query, key, value and mask whose last dimension
    has stride 1, which CUDA's fused kernels need (a CPU takes any layout, so only this check shows it)."""
    model = decoder(**overrides)  # sdpa where the option allows it (soft-capping runs eager: no call)
    counting = SimpleNamespace(counting=True)
    input_ids = torch.randint(3, VOCAB, (2, 7))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0
    with UnfusedAttention(counting) as attention:
        model.train()
        model(input_ids, attention_mask=attention_mask, labels=input_ids).loss.backward()
        model.eval()
        model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=2, do_sample=False)
    assert attention.places == []
    assert attention.calls == (0 if "attn_logit_softcapping" in overrides else 2 * 3)  # 2 layers x 3 forwards


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generation_past_the_window_matches_recomputation(cache):
    """Generating past a sliding window with a cache (whose sliding layers keep only the window) gives the tokens
    and logits of recomputing every step from scratch."""
    model = decoder(**ALTERNATING)
    prompt = torch.randint(3, VOCAB, (1, 5))
    run = dict(max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    cached = model.generate(prompt, cache_implementation=cache, **run)
    recomputed = model.generate(prompt, use_cache=False, **run)
    assert torch.equal(cached.sequences, recomputed.sequences)
    torch.testing.assert_close(torch.stack(cached.logits), torch.stack(recomputed.logits), rtol=0, atol=1e-5)


def test_sliding_window_limits_what_a_token_sees():
    """A sliding layer ignores tokens beyond its window; a window as long as the input changes nothing."""
    full = decoder(**ROPE)
    wide = decoder(**dict(ROPE, sliding_window=16))
    narrow = decoder(**dict(ROPE, sliding_window=2, layer_types=["sliding_attention"] * 2))
    input_ids = torch.randint(3, VOCAB, (1, 8))
    changed_first = input_ids.clone()
    changed_first[0, 0] = (changed_first[0, 0] + 1) % VOCAB
    with torch.no_grad():
        torch.testing.assert_close(wide(input_ids).logits, full(input_ids).logits, rtol=0, atol=0)
        # two layers of window 2 reach 2 tokens back: the last token cannot see the first one
        last = narrow(input_ids).logits[0, -1]
        torch.testing.assert_close(narrow(changed_first).logits[0, -1], last, rtol=0, atol=0)
        assert not torch.equal(full(changed_first).logits[0, -1], full(input_ids).logits[0, -1])


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_bidirectional_sliding_window(attn):
    """An encoder's sliding layer sees `sliding_window` tokens on each side, with eager and sdpa alike."""
    config = tiny_config(TfmEncoderConfig, **dict(ROPE, sliding_window=2, layer_types=["sliding_attention"] * 2))
    torch.manual_seed(0)
    model = TfmEncoderForMaskedLM(config).eval()
    model.set_attn_implementation(attn)
    input_ids = torch.randint(3, VOCAB, (1, 9))
    changed = input_ids.clone()
    changed[0, 8] = (changed[0, 8] + 1) % VOCAB
    with torch.no_grad():
        before, after = model(input_ids).logits[0], model(changed).logits[0]
    assert torch.equal(before[:4], after[:4])  # two layers of window 2: position 3 is 5 away from position 8
    assert not torch.equal(before[4], after[4])


def test_nope_layers_ignore_positions():
    """A model whose every layer is NoPE does not depend on position ids; with RoPE it does."""
    input_ids = torch.randint(3, VOCAB, (1, 6))
    stretched = torch.arange(6)[None] * 3  # not a shift: RoPE only sees relative positions
    for nope_layers, depends in (([0, 1], False), ([1], True)):
        model = decoder(**dict(ROPE, nope_layers=nope_layers))
        with torch.no_grad():
            same = torch.allclose(model(input_ids).logits, model(input_ids, position_ids=stretched).logits, atol=1e-6)
        assert same != depends


def test_softcapping_refuses_sdpa_and_caps_logits():
    model = decoder(**DECODER_OPTIONS["softcapping"])
    assert model.config._attn_implementation == "eager"  # the default falls back from sdpa
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        model.set_attn_implementation("sdpa")
    # weights scaled up, so that logits and scores would pass the caps: the same model without caps shows they do
    options = dict(DECODER_OPTIONS["softcapping"])
    ids = torch.randint(3, VOCAB, (1, 5))
    outputs = {}
    for name, caps in {
        "capped": {},
        "no final cap": {"final_logit_softcapping": None},
        "no caps": {"final_logit_softcapping": None, "attn_logit_softcapping": None},
    }.items():
        capped = decoder(**{**options, **caps})
        with torch.no_grad():
            capped.lm_head.weight.mul_(10.0)
            for layer in capped.model.layers:
                layer.self_attn.q_proj.weight.mul_(30.0)
                layer.self_attn.k_proj.weight.mul_(30.0)
            outputs[name] = capped(ids).logits
    raw = outputs["no final cap"]
    assert raw.abs().max() > 3.0  # the cap has something to cap
    assert outputs["capped"].abs().max() <= 3.0
    torch.testing.assert_close(outputs["capped"], 3.0 * torch.tanh(raw / 3.0), rtol=1e-5, atol=1e-5)
    assert (outputs["no caps"] - raw).abs().max() > 1e-2  # the attention cap changes the scores it caps


def test_unit_offset_rmsnorm_starts_as_identity_scale():
    """Gemma's norm scales by 1 + weight: a fresh model starts at weight 0 (transformers would set 1, doubling)."""
    model = TfmDecoderForCausalLM(tiny_config(**DECODER_OPTIONS["sandwich"]))
    norms = [m for m in model.modules() if isinstance(m, TfmRMSNorm)]
    assert norms and all(isinstance(m, TfmUnitOffsetRMSNorm) and torch.all(m.weight == 0) for m in norms)


def test_padding_aware_positions_make_left_padding_harmless():
    """With positions counted over real tokens (RoBERTa), a left-padded row encodes as the same row unpadded."""
    config = tiny_config(TfmEncoderConfig, position_ids_from_padding=True, position_offset=1, pad_token_id=0)
    torch.manual_seed(0)
    model = TfmEncoderForMaskedLM(config).eval()
    row = torch.randint(3, VOCAB, (1, 6))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), row], dim=1)
    mask = (padded != 0).long()
    with torch.no_grad():
        torch.testing.assert_close(
            model(padded, attention_mask=mask).logits[0, 3:], model(row).logits[0], atol=1e-5, rtol=0
        )


def test_encoder_decoder_refuses_per_layer_attention_kinds():
    with pytest.raises(ValueError, match="sliding_window"):
        TfmEncoderDecoderConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, sliding_window=4)


def test_layer_types_follow_a_new_depth_only_when_uniform(tmp_path):
    """`from_pretrained(path, num_hidden_layers=N)` builds the config at the new depth: a layer_types that says the
    same of every layer follows it, a per-layer pattern is an error naming layer_types (not an IndexError). A depth
    assigned to a finished config is named too when a model is built from it."""
    tiny_config(**ROPE).save_pretrained(tmp_path / "uniform")
    uniform = TfmDecoderConfig.from_pretrained(tmp_path / "uniform", num_hidden_layers=3)
    assert uniform.layer_types == ["full_attention"] * 3 and len(TfmDecoderForCausalLM(uniform).model.layers) == 3
    tiny_config(**ALTERNATING).save_pretrained(tmp_path / "alternating")
    with pytest.raises(ValueError, match="layer_types"):
        TfmDecoderConfig.from_pretrained(tmp_path / "alternating", num_hidden_layers=3)
    assigned = tiny_config(**ROPE)
    assigned.num_hidden_layers = 3
    with pytest.raises(ValueError, match="`layer_types`: has 2 entries for num_hidden_layers=3"):
        TfmDecoderForCausalLM(assigned)
