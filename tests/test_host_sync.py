"""No host synchronisation in the decode loop: after the first forward of a generation, no forward of an hf_tfm model
reads a tensor's value into Python (on an accelerator, each read makes the host wait for the device once per token),
while bad input is still named in an error on the forward that starts a sequence. The one read left is transformers'
own, and the reference classes make it too: whether sdpa may skip a padding mask that a decode step is given
(`MASK_SKIP_DECISIONS`).

Syncs are counted by `benchmarks.host_sync.HostSyncCounter`, a torch dispatch mode that records the aten ops that
read values (`_local_scalar_dense`, which `item()`, `int()`, `bool()`, `float()` and `__index__` all call, `nonzero`,
boolean-mask indexing, `bincount`...) whatever Python method or C++ call led to them, plus the tensor methods that copy
to the host without an aten op (`tolist`, `numpy`, `cpu`). It runs on the CPU and counts what a GPU run would wait on.
"""

import pytest
import torch
from conftest import VOCAB, tiny_config
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    LlamaConfig,
    LlamaForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.cache_utils import DynamicCache, StaticCache

from benchmarks.host_sync import HostSyncCounter, greedy_steps_by_hand, syncs_per_call
from hf_tfm import (
    TfmDecoderConfig,
    TfmDecoderForCausalLM,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
)
from hf_tfm.compat import CACHE_NAME
from hf_tfm.convert.record import TINY_DECODER

STEPS = 3
GREEDY = dict(do_sample=False, max_new_tokens=STEPS + 1, min_new_tokens=STEPS + 1)

# decoder recipes: Llama (RoPE, RMSNorm, SwiGLU, GQA), GPT-2 (learned positions: their range is checked), ALiBi (a
# position bias over the cache's key positions), Mistral (sliding-window layers, a window shorter than the run),
# Mixtral (MoE, the default experts backend)
LLAMA = dict(position_embedding_type="rope", norm_type="rmsnorm", ffn_type="glu", num_key_value_heads=2)
DECODERS = {
    "llama": LLAMA,
    "gpt2": dict(position_embedding_type="learned"),
    "alibi": dict(position_embedding_type="alibi"),
    "mistral": dict(LLAMA, sliding_window=6),
    "mixtral": dict(LLAMA, num_experts=4, num_experts_per_tok=2),
}
# encoder-decoder recipes: T5 (relative position bias, RMSNorm, GeGLU, unscaled scores), BART (learned positions
# at offset 2, post-norm, embedding norm, LM-head bias)
SEQ2SEQ = {
    "t5": dict(
        position_embedding_type="relative_bias",
        norm_type="rmsnorm",
        ffn_type="glu",
        hidden_act="gelu_new",
        attention_multiplier=1.0,
        attention_bias=False,
        mlp_bias=False,
        decoder_start_token_id=0,
    ),
    "bart": dict(
        position_embedding_type="learned",
        position_offset=2,
        norm_position="post",
        embedding_norm=True,
        lm_head_bias=True,
        decoder_start_token_id=2,
    ),
}


def decoder(recipe: str, attn: str, **overrides) -> TfmDecoderForCausalLM:
    torch.manual_seed(0)
    config = tiny_config(**DECODERS[recipe], **overrides)
    return TfmDecoderForCausalLM._from_config(config, attn_implementation=attn).eval()


def seq2seq(recipe: str, attn: str) -> TfmEncoderDecoderForConditionalGeneration:
    torch.manual_seed(0)
    config = tiny_config(TfmEncoderDecoderConfig, **SEQ2SEQ[recipe])
    return TfmEncoderDecoderForConditionalGeneration._from_config(config, attn_implementation=attn).eval()


def new_cache(model, kind: str):
    if kind == "static":
        return StaticCache(config=model.config, max_cache_len=16)
    return DynamicCache(config=model.config)


def prompt(length: int = 5, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def decode_by_hand(model, cache, padding_mask: bool, steps: int = STEPS, **options) -> list[list[str]]:
    """The host syncs of each forward of a greedy batch-1 generation written out (`greedy_steps_by_hand`): from the
    prompt, or for an encoder-decoder from its start token."""
    encoder = "encoder_outputs" in options
    first = torch.full((1, 1), model.config.decoder_start_token_id) if encoder else prompt()
    return greedy_steps_by_hand(model, first, cache, steps, padding_mask, **options)


def assert_no_sync_after_first(calls: list[list[str]], forwards: int = STEPS + 1):
    assert len(calls) == forwards
    assert calls[1:] == [[]] * (forwards - 1), f"host syncs in decode steps: {calls[1:]}"


# transformers' mask helpers decide whether sdpa may run without a mask (`is_causal`, or no padding) by reading the
# 2D padding mask, in `_ignore_causal_mask_sdpa` (self-attention, dynamic cache) and `_ignore_bidirectional_mask_sdpa`
# (an encoder-decoder's cross-attention): one sync per decode step that is given a padding mask, which the reference
# classes make too. Building the mask instead would cost more than the sync (sdpa without its flash kernel, and for
# GQA transformers' repeat_kv copying the whole cache every step) and change the logits in their last bits.
MASK_SKIP_DECISIONS = ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa")


def own_syncs(calls: list[list[str]]) -> list[str]:
    """The decode steps' syncs that are not transformers' mask-skip decision."""
    return [sync for step in calls[1:] for sync in step if not any(d in sync for d in MASK_SKIP_DECISIONS)]


def syncs_per_step(calls: list[list[str]]) -> float:
    return sum(map(len, calls[1:])) / (len(calls) - 1)


def llama(attn: str) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(**TINY_DECODER)
    return LlamaForCausalLM._from_config(config, attn_implementation=attn).eval()


def seq2seq_reference(recipe: str, attn: str):
    torch.manual_seed(0)
    shape = dict(vocab_size=VOCAB, pad_token_id=0)
    if recipe == "t5":
        config = T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0, **shape)
        return T5ForConditionalGeneration._from_config(config, attn_implementation=attn).eval()
    config = BartConfig(
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        decoder_start_token_id=2,
        **shape,
    )
    return BartForConditionalGeneration._from_config(config, attn_implementation=attn).eval()


# ----------------------------------------------------------------------------------------------- the counter


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_counter_sees_every_kind_of_read(mode):
    """Each way of reading a value counts once, with and without inference mode (where composite ops reach the
    counter whole); ops that stay on the device do not count."""
    ids, mask = torch.tensor([3, 1, 2]), torch.tensor([True, False, True])
    reads = [
        lambda: ids[0].item(),
        lambda: int(ids[0]),
        lambda: float(ids[0]),
        lambda: bool(ids[0]),
        lambda: [0, 1, 2, 3][ids[0]],
        lambda: ids.tolist(),
        lambda: ids.nonzero(),
        lambda: torch.where(mask),
        lambda: ids[mask],
        lambda: torch.bincount(ids),
        lambda: ids.repeat_interleave(ids),
    ]
    device_only = [
        lambda: ids + 1,
        lambda: ids.topk(2),
        lambda: torch.where(mask, ids, 0),
        lambda: torch.histc(ids.float(), bins=4, min=0, max=3),
        lambda: ids.repeat_interleave(ids, output_size=6),
    ]
    with mode(), HostSyncCounter() as counter:
        for read in reads:
            read()
        found = len(counter.syncs)
        for work in device_only:
            work()
    assert (found, len(counter.syncs)) == (len(reads), len(reads)), counter.syncs


# ------------------------------------------------------------------------------------------------ decode steps


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("recipe", DECODERS)
def test_decoder_decode_steps_make_no_host_sync(recipe, attn, cache):
    """Every single-token step on the cache reads no value: no input check, no cache length, no routing. The first
    forward may (it checks the prompt's ids and positions). No padding mask, as generate() passes none for an
    unpadded batch; with position_ids given or made by the model."""
    model = decoder(recipe, attn)
    for positions in (False, True):
        assert_no_sync_after_first(decode_by_hand(model, new_cache(model, cache), False, positions=positions))


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("recipe", DECODERS)
def test_decode_steps_given_a_padding_mask_sync_no_more_than_llama(recipe, attn, cache):
    """Given a padding mask, a decode step's only sync is transformers' mask-skip decision (sdpa with a dynamic
    cache), and LlamaForCausalLM makes as many."""
    model, reference = decoder(recipe, attn), llama(attn)
    ours = decode_by_hand(model, new_cache(model, cache), padding_mask=True)
    theirs = decode_by_hand(reference, new_cache(reference, cache), padding_mask=True)
    assert own_syncs(ours) == []
    assert syncs_per_step(ours) <= syncs_per_step(theirs), (ours, theirs)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("recipe", ["gpt2", "mixtral"])
def test_generate_decode_steps_make_no_host_sync(recipe, cache):
    """The same through generate(), with the inputs it builds (position_ids, a static cache's masks; transformers
    before 5.23 also passes the all-ones padding mask, whose skip decision then syncs as in Llama)."""
    model = decoder(recipe, "sdpa")
    ids = prompt()
    options = dict(attention_mask=torch.ones_like(ids), cache_implementation=cache, **GREEDY)
    calls = syncs_per_call(model, lambda: model.generate(ids, **options))
    assert len(calls) == STEPS + 1
    assert own_syncs(calls) == []


@pytest.mark.parametrize("experts", ["batched_mm", "grouped_mm"])
def test_moe_decode_steps_make_no_host_sync_with_fused_experts(experts):
    """transformers' fused experts backends route without reading the routing: sorting, `histc` over a fixed range,
    grouped or batched matmuls."""
    torch.manual_seed(0)
    model = TfmDecoderForCausalLM._from_config(tiny_config(**DECODERS["mixtral"]), experts_implementation=experts)
    assert_no_sync_after_first(decode_by_hand(model.eval(), DynamicCache(config=model.config), padding_mask=False))


def test_moe_eager_experts_sync_only_in_their_loop():
    """experts_implementation="eager" loops over the experts the tokens picked, which it must read (as Mixtral's
    eager experts do): those are the only syncs of a decode step, the rest of the forward reads nothing."""
    torch.manual_seed(0)
    model = TfmDecoderForCausalLM._from_config(tiny_config(**DECODERS["mixtral"]), experts_implementation="eager")
    calls = decode_by_hand(model.eval(), DynamicCache(config=model.config), padding_mask=False)
    steps = [sync for step in calls[1:] for sync in step]
    assert steps and all("TfmExperts.forward" in sync.split(" <- ")[0] for sync in steps), steps


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("recipe", SEQ2SEQ)
def test_encoder_decoder_decode_steps_sync_no_more_than_the_reference(recipe, attn):
    """An encoder-decoder's decode steps over a padded source make no sync of hf_tfm's own; the cross-attention
    mask's skip decision is transformers' (T5 and BART make it too), by hand and through generate()."""
    source = prompt(6)
    source_mask = torch.ones_like(source)
    source_mask[:, -2:] = 0
    counts = {}
    for name, model in (("ours", seq2seq(recipe, attn)), ("reference", seq2seq_reference(recipe, attn))):
        with torch.no_grad():
            encoder_outputs = model.get_encoder()(input_ids=source, attention_mask=source_mask)
        encoder = dict(encoder_outputs=encoder_outputs, attention_mask=source_mask)
        counts[name] = decode_by_hand(model, None, padding_mask=False, **encoder)
    assert own_syncs(counts["ours"]) == []
    assert syncs_per_step(counts["ours"]) <= syncs_per_step(counts["reference"]), counts
    model = seq2seq(recipe, attn)
    calls = syncs_per_call(model, lambda: model.generate(source, attention_mask=source_mask, **GREEDY))
    assert len(calls) == STEPS + 1
    assert own_syncs(calls) == []


def test_encoder_decoder_generate_with_static_cache_makes_no_host_sync():
    """generate() of an encoder-decoder with a static cache and an unpadded source: no decode step reads a value."""
    model = seq2seq("t5", "sdpa")
    source = prompt(6)
    options = dict(attention_mask=torch.ones_like(source), cache_implementation="static", **GREEDY)
    calls = syncs_per_call(model, lambda: model.generate(source, **options))
    assert len(calls) == STEPS + 1
    assert own_syncs(calls) == []


# ------------------------------------------------------------------------------------- the checks that remain


def test_first_forward_still_names_a_bad_token_id():
    """The forward that starts a sequence reads the ids: a bad one is a ValueError naming input_ids, from a plain
    forward and from generate() alike, and so is one among several tokens fed to a cache."""
    model = decoder("llama", "sdpa")
    bad = prompt()
    bad[0, 2] = VOCAB + 3
    match = rf"input_ids contains id {VOCAB + 3}, outside the vocabulary"
    with pytest.raises(ValueError, match=match):
        model(bad)
    with pytest.raises(ValueError, match=match):
        model.generate(bad, attention_mask=torch.ones_like(bad), **GREEDY)
    with torch.no_grad():
        past = model(prompt(), use_cache=True).get(CACHE_NAME)
    with pytest.raises(ValueError, match=match):
        model(bad[:, 1:3], past_key_values=past)


def test_decode_past_the_position_table_is_still_named():
    """A learned position table ends: the decode step that reaches past it is a ValueError naming
    max_position_embeddings (the host knows a dynamic cache's length, so only steps near the end read positions)."""
    model = decoder("gpt2", "sdpa", max_position_embeddings=7)
    ids = prompt()
    with pytest.raises(ValueError, match=r"position_ids reach position 7, .*max_position_embeddings=7"):
        model.generate(ids, attention_mask=torch.ones_like(ids), **GREEDY)


def test_value_checks_can_be_switched_off():
    """check_input_values=False (production serving): not even the first forward reads a value; a bad id then
    fails where the embedding reads it, while shapes are still checked; the setting survives save and load."""
    model = decoder("llama", "eager", check_input_values=False)
    assert decode_by_hand(model, DynamicCache(config=model.config), padding_mask=True) == [[]] * (STEPS + 1)
    bad = prompt()
    bad[0, 2] = VOCAB + 3
    with pytest.raises(IndexError):
        model(bad)
    with pytest.raises(ValueError, match=r"^input_ids has shape \(5,\)"):
        model(bad[0])
    loaded = TfmDecoderConfig.from_dict(model.config.to_dict())
    assert loaded.check_input_values is False


def test_check_input_values_must_be_a_bool():
    with pytest.raises(Exception, match="check_input_values"):
        tiny_config(check_input_values="no")


def test_router_balancing_reads_no_values():
    """Auxiliary-loss-free balancing counts each expert's load in a training forward and moves the biases after the
    optimizer step, both on the device: neither reads a value (bincount would, to size its output)."""
    model = decoder("mixtral", "sdpa", router_bias_update_rate=0.01, check_input_values=False).train()
    with HostSyncCounter() as counter:
        model(prompt())
        model.update_router_biases()
    assert counter.syncs == []
    router = model.model.layers[0].mlp.router
    assert router.expert_bias.abs().sum() > 0 and router.tokens_per_expert.sum() == 0
