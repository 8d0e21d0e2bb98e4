"""Generation and caching properties of hf_tfm decoders, for every position scheme."""

import pytest
import torch
from conftest import POSITION_TYPES, VOCAB, require_flex_attention, seq2seq, tiny_model
from torch._dynamo.utils import counters
from transformers import CompileConfig
from transformers.cache_utils import DynamicCache

from hf_tfm.compat import CACHE_NAME

ATOL = 1e-5
PAD = 0  # tiny_config's pad_token_id
GREEDY = dict(do_sample=False, max_new_tokens=5, min_new_tokens=5)  # min_new_tokens: no early EOS, fixed shapes


def padded_batch(lengths=(7, 4), seed=2):
    """Left-padded prompts (pad id, mask 0 on the left) and the position ids `generate` builds from the mask."""
    torch.manual_seed(seed)
    width = max(lengths)
    input_ids = torch.randint(3, VOCAB, (len(lengths), width))
    attention_mask = torch.ones_like(input_ids)
    for row, length in enumerate(lengths):
        input_ids[row, : width - length] = PAD
        attention_mask[row, : width - length] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


@pytest.mark.parametrize("position", POSITION_TYPES)
def test_causality(position):
    """Changing the token at position t leaves the logits at positions < t unchanged (and changes position t)."""
    model = tiny_model(position_embedding_type=position)
    input_ids = torch.randint(3, VOCAB, (1, 8))
    changed = input_ids.clone()
    changed[0, 5] = (changed[0, 5] + 1 - 3) % (VOCAB - 3) + 3
    with torch.no_grad():
        before, after = model(input_ids).logits, model(changed).logits
    torch.testing.assert_close(after[:, :5], before[:, :5], atol=ATOL, rtol=0)
    assert (after[:, 5] - before[:, 5]).abs().max() > 100 * ATOL


@pytest.mark.parametrize("position", POSITION_TYPES)
def test_left_padding_logits(position):
    """A left-padded batch gives, at every real token, the logits of each row run alone."""
    model = tiny_model(position_embedding_type=position)
    input_ids, attention_mask, position_ids = padded_batch()
    with torch.no_grad():
        batched = model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        for row, mask in enumerate(attention_mask.bool()):
            alone = model(input_ids[row : row + 1, mask]).logits[0]
            torch.testing.assert_close(batched[row, mask], alone, atol=ATOL, rtol=0)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("position", POSITION_TYPES)
def test_left_padding_generate(position, cache):
    """Greedy generation of a left-padded batch equals generating each row alone, tokens and every step's logits,
    with either cache (a static cache once gave ALiBi and relative-bias rows the bias of cache slots, not of their
    token positions)."""
    model = tiny_model(position_embedding_type=position)
    input_ids, attention_mask, _ = padded_batch()
    run = dict(pad_token_id=PAD, cache_implementation=cache, output_logits=True, return_dict_in_generate=True)
    run.update(GREEDY)
    batched = model.generate(input_ids, attention_mask=attention_mask, **run)
    steps = torch.stack(batched.logits)  # [new tokens, batch, vocab]
    for row, mask in enumerate(attention_mask.bool()):
        prompt = input_ids[row : row + 1, mask]
        alone = model.generate(prompt, attention_mask=torch.ones_like(prompt), **run)
        assert torch.equal(batched.sequences[row, (~mask).sum() :], alone.sequences[0])
        torch.testing.assert_close(steps[:, row], torch.stack(alone.logits)[:, 0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("position", POSITION_TYPES)
def test_cache_matches_full_forward(position):
    """Prefill on a prefix then one-token decode steps with a DynamicCache reproduce the full-forward logits,
    on a left-padded batch."""
    model = tiny_model(position_embedding_type=position)
    input_ids, attention_mask, position_ids = padded_batch()
    prefix = 5
    with torch.no_grad():
        full = model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        cache = DynamicCache(config=model.config)
        out = model(
            input_ids[:, :prefix],
            attention_mask=attention_mask[:, :prefix],
            position_ids=position_ids[:, :prefix],
            past_key_values=cache,
            use_cache=True,
        )
        steps = [out.logits]
        for t in range(prefix, input_ids.shape[1]):
            out = model(
                input_ids[:, t : t + 1],
                attention_mask=attention_mask[:, : t + 1],
                position_ids=position_ids[:, t : t + 1],
                past_key_values=out.get(CACHE_NAME),
                use_cache=True,
            )
            steps.append(out.logits)
    assert cache.get_seq_length() == input_ids.shape[1]
    real = attention_mask.bool()
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("position", POSITION_TYPES)
def test_generate_cache_matches_no_cache(position):
    """Greedy generate gives the same tokens with and without the KV cache."""
    model = tiny_model(position_embedding_type=position)
    input_ids, attention_mask, _ = padded_batch()
    cached = model.generate(input_ids, attention_mask=attention_mask, use_cache=True, **GREEDY)
    uncached = model.generate(input_ids, attention_mask=attention_mask, use_cache=False, **GREEDY)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("position", POSITION_TYPES)
def test_static_cache_matches_dynamic(position):
    """Greedy generate with a StaticCache gives the same tokens as the default DynamicCache."""
    model = tiny_model(position_embedding_type=position)
    input_ids, attention_mask, _ = padded_batch()
    dynamic = model.generate(input_ids, attention_mask=attention_mask, **GREEDY)
    static = model.generate(input_ids, attention_mask=attention_mask, cache_implementation="static", **GREEDY)
    assert torch.equal(static, dynamic)


@pytest.mark.parametrize("position", POSITION_TYPES)
def test_attention_backends_agree(position):
    """eager, sdpa and flex_attention give the same logits at real tokens of a left-padded batch (ALiBi included)."""
    model = tiny_model(position_embedding_type=position)
    # 16 tokens: torch 2.13's CPU flex_attention kernel returns garbage (flakily) for some tiny lengths such as
    # 8 and 24, independently of hf_tfm (reproduced with plain torch.compile(flex_attention)).
    input_ids, attention_mask, position_ids = padded_batch(lengths=(16, 11))
    real = attention_mask.bool()
    logits = {}
    require_flex_attention()
    for implementation in ("eager", "sdpa", "flex_attention"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            logits[implementation] = model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[
                real
            ]
    torch.testing.assert_close(logits["sdpa"], logits["eager"], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits["flex_attention"], logits["eager"], atol=ATOL, rtol=0)


def test_sampling_is_reproducible():
    """do_sample with a fixed seed repeats exactly, another seed differs, and every token is in the vocabulary."""
    model = tiny_model()
    input_ids, attention_mask, _ = padded_batch()
    kwargs = dict(attention_mask=attention_mask, do_sample=True, max_new_tokens=8, min_new_tokens=8, top_k=0)

    def sample(seed):
        torch.manual_seed(seed)
        return model.generate(input_ids, **kwargs)

    first, again, other = sample(123), sample(123), sample(124)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert first.shape == (2, input_ids.shape[1] + 8)
    assert ((first >= 0) & (first < VOCAB)).all()


def test_beam_search_shape():
    """Beam search with num_return_sequences=2 returns 2 distinct continuations of each prompt."""
    model = tiny_model()
    input_ids, attention_mask, _ = padded_batch()
    beams = dict(num_beams=3, num_return_sequences=2, do_sample=False, max_new_tokens=4, min_new_tokens=4)
    out = model.generate(input_ids, attention_mask=attention_mask, **beams)
    assert out.shape == (4, input_ids.shape[1] + 4)
    assert torch.equal(out[:, : input_ids.shape[1]], input_ids.repeat_interleave(2, dim=0))
    assert not torch.equal(out[0], out[1]) and not torch.equal(out[2], out[3])


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_slow_compiled_static_cache_generate(position):
    """SLOW, the one inductor compile of the suite (deselect with `-k "not slow"`): generate with a static cache and
    a fullgraph torch.compile'd decode step gives the uncompiled model's tokens, and compilation really happened."""
    model = tiny_model(num_hidden_layers=1, position_embedding_type=position)
    input_ids, attention_mask, _ = padded_batch(lengths=(6, 4))
    kwargs = dict(attention_mask=attention_mask, cache_implementation="static", **GREEDY)
    expected = model.generate(input_ids, **kwargs)

    compile_config = CompileConfig(fullgraph=True, dynamic=False, mode="default")
    # `GenerationMixin._valid_auto_compile_criteria` only auto-compiles on cuda/xpu/neuron/tpu, unless this private
    # flag is set; there is no public switch for CPU (transformers' own tests set it the same way).
    compile_config._compile_all_devices = True
    torch._dynamo.reset()
    counters.clear()
    actual = model.generate(input_ids, compile_config=compile_config, **kwargs)
    assert counters["stats"]["unique_graphs"] >= 1, "generate did not run the compiled forward"
    assert torch.equal(actual, expected)


# Left padding shifts learned and sinusoidal encoder positions (as in BART), so only the schemes that see relative
# positions alone are left-padded on the encoder side; every scheme is right-padded (the seq2seq convention).
PADDED_SOURCES = [(p, "right") for p in POSITION_TYPES] + [
    (p, "left") for p in POSITION_TYPES if p not in ("learned", "sinusoidal")
]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize(("position", "side"), PADDED_SOURCES)
def test_padded_source_generate_encoder_decoder(position, side, cache):
    """An encoder-decoder generating for a padded batch of sources gives each row's tokens and step logits of that
    source generated alone, with either cache."""
    model = seq2seq(position_embedding_type=position)
    input_ids, attention_mask, _ = padded_batch()
    if side == "right":
        order = attention_mask.argsort(dim=-1, descending=True, stable=True)
        input_ids, attention_mask = input_ids.gather(-1, order), attention_mask.gather(-1, order)
    run = dict(pad_token_id=PAD, cache_implementation=cache, output_logits=True, return_dict_in_generate=True)
    run.update(GREEDY)
    batched = model.generate(input_ids, attention_mask=attention_mask, **run)
    steps = torch.stack(batched.logits)  # [new tokens, batch, vocab]
    for row, mask in enumerate(attention_mask.bool()):
        source = input_ids[row : row + 1, mask]
        alone = model.generate(source, attention_mask=torch.ones_like(source), **run)
        assert torch.equal(batched.sequences[row], alone.sequences[0])
        # the wide init of `seq2seq` gives logits of tens: float32 sums over different paddings differ by ~1e-5
        torch.testing.assert_close(steps[:, row], torch.stack(alone.logits)[:, 0], atol=1e-4, rtol=0)
