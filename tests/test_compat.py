"""hf_tfm.compat against the installed transformers: every row of its table holds, the functions hf_tfm owns instead
of importing another model's module compute what the reference computes, and the cache reaches generate() under
whichever name the installed release uses (5.24 renamed `past_key_values` to `cache`). `make test-matrix` runs this
file on every minor release."""

import inspect
import logging
import warnings

import pytest
import torch
from conftest import tiny_config, tiny_model
from transformers.utils import logging as transformers_logging

from hf_tfm import (
    TfmDecoderForCausalLM,
    TfmDecoderForQuestionAnswering,
    TfmDecoderForSequenceClassification,
    TfmDecoderModel,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderDecoderModel,
    compat,
)
from hf_tfm.model.modeling_tfm import shift_tokens_right
from hf_tfm.model.modeling_tfm_attention import eager_attention_forward
from hf_tfm.model.modeling_tfm_moe import load_balancing_loss
from hf_tfm.model.modeling_tfm_positions import apply_rotary, relative_position_bucket

# ------------------------------------------------------------------------------------------------------ the table


@pytest.mark.parametrize("row", compat.TABLE, ids=[row.name for row in compat.TABLE])
def test_compat_row_holds(row):
    """Each transformers internal or version decision hf_tfm relies on is still there and still shaped as used."""
    try:
        problem = row.probe()
    except Exception as error:  # noqa: BLE001  (whatever a release broke, the message names the row)
        problem = f"{type(error).__name__}: {error}"
    assert problem is None, f"hf_tfm.compat row {row.name!r} ({row.what}) no longer holds: {problem}"


def test_table_rows_are_complete_and_unique():
    names = [row.name for row in compat.TABLE]
    assert len(names) == len(set(names))
    for row in compat.TABLE:
        assert row.what and row.releases and row.replaced_by, row.name


def test_no_module_outside_compat_touches_transformers_internals():
    """Nothing in hf_tfm but compat.py imports a transformers underscore name or another model's module."""
    import ast
    from pathlib import Path

    package = Path(compat.__file__).parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformers"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                if ".models." in node.module or private or any(p.startswith("_") for p in node.module.split(".")):
                    offenders.append(f"{path.relative_to(package)}:{node.lineno} from {node.module}")
    assert not offenders, offenders


# ------------------------------------------------------------------------------- functions hf_tfm owns a copy of


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 16), (16, 20)])
def test_relative_position_bucket_matches_t5(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    offsets = torch.arange(-300, 301)[None, :] - torch.arange(0, 7)[:, None]
    ours = relative_position_bucket(offsets, bidirectional, num_buckets, max_distance)
    reference = T5Attention._relative_position_bucket(offsets, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, reference)


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_eager_attention_matches_gemma2(softcap):
    from types import SimpleNamespace

    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as reference_attention

    module = SimpleNamespace(head_dim=8, num_key_value_groups=2, training=False)
    query, key, value = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.zeros(2, 1, 5, 5).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), torch.finfo().min)
    ours = eager_attention_forward(module, query, key, value, mask, scaling=0.3, softcap=softcap)
    reference = reference_attention(module, query, key, value, mask, scaling=0.3, softcap=softcap)
    for mine, theirs in zip(ours, reference):
        assert torch.equal(mine, theirs)


def test_rotation_matches_llama():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    query, key, cos, sin = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    for mine, theirs in zip(apply_rotary(query, key, (cos, sin)), apply_rotary_pos_emb(query, key, cos, sin)):
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_loss_matches_mixtral(masked):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    logits = tuple(torch.randn(2 * 6, 8) for _ in range(3))  # 3 layers, batch 2 x 6 tokens, 8 experts
    mask = torch.tensor([[1] * 6, [0, 0] + [1] * 4]) if masked else None
    ours = load_balancing_loss(logits, 8, 2, mask)
    torch.testing.assert_close(ours, load_balancing_loss_func(logits, 8, 2, mask), rtol=1e-6, atol=1e-7)


def test_shift_tokens_right_matches_bart():
    from transformers.models.bart.modeling_bart import shift_tokens_right as reference

    labels = torch.tensor([[5, 6, -100, -100], [7, 8, 9, 10]])
    assert torch.equal(shift_tokens_right(labels, 0, 2), reference(labels, 0, 2))


# ------------------------------------------------------------------------------------------ the cache's two names


def encoder_decoder(seed: int = 0) -> TfmEncoderDecoderForConditionalGeneration:
    torch.manual_seed(seed)
    config = tiny_config(TfmEncoderDecoderConfig, decoder_start_token_id=0, position_embedding_type="relative_bias")
    return TfmEncoderDecoderForConditionalGeneration(config).eval()


CACHED_FORWARDS = [
    TfmDecoderModel,
    TfmDecoderForCausalLM,
    TfmDecoderForSequenceClassification,
    TfmDecoderForQuestionAnswering,
    TfmEncoderDecoderModel,
    TfmEncoderDecoderForConditionalGeneration,
]


@pytest.mark.parametrize("model_class", CACHED_FORWARDS, ids=lambda c: c.__name__)
def test_forward_signature_names_the_cache_as_transformers_does(model_class):
    """`cache` in the signature (transformers >= 5.24's name; its tooling reads the signature), `past_key_values`
    taken as well by the wrapper."""
    parameters = inspect.signature(model_class.forward).parameters
    assert "cache" in parameters and "past_key_values" not in parameters


def test_both_names_give_the_same_cached_step():
    model = tiny_model()
    prompt, step = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[9]])
    results = []
    for name in ("cache", "past_key_values"):
        cache = model(prompt, use_cache=True).get(compat.CACHE_NAME)
        out = model(step, **{name: cache}, use_cache=True)
        assert out.get(compat.CACHE_NAME).get_seq_length() == 5, name
        results.append(out.logits)
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
    cache = model(prompt, use_cache=True).get(compat.CACHE_NAME)
    if compat.CACHE_NAME == "cache":  # deprecate_kwarg, as on Llama: `cache` wins, with a warning
        with pytest.warns(FutureWarning, match="Both `past_key_values` and `cache`"):
            out = model(step, cache=cache, past_key_values=None, use_cache=True)
        assert out.get(compat.CACHE_NAME) is cache and cache.get_seq_length() == 5
    else:
        with pytest.raises(ValueError, match="not both"):
            model(step, cache=cache, past_key_values=cache)


def test_legacy_cache_name_warns_as_on_llama():
    """On transformers >= 5.24 the old name is renamed by transformers' own decorator, so it warns exactly where
    Llama's forwards warn; on 5.17-5.23 (generate() passes it at every step) it is silent."""
    model, prompt = tiny_model(), torch.tensor([[5, 6, 7, 8]])
    cache = model(prompt, use_cache=True).get(compat.CACHE_NAME)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(torch.tensor([[9]]), past_key_values=cache, use_cache=True)
    renamed = [w for w in caught if issubclass(w.category, FutureWarning) and "past_key_values" in str(w.message)]
    assert len(renamed) == (1 if compat.CACHE_NAME == "cache" else 0)
    assert cache.get_seq_length() == 5


def assert_generate_carries_cache(model, input_ids):
    """generate() hands the cache back to the model at every step: its length at the end is every token but the last
    (prompt and new ones). A cache dropped on the way (a renamed keyword) would restart each step at one token."""
    out = model.generate(input_ids, max_new_tokens=6, do_sample=False, return_dict_in_generate=True)
    assert out.get(compat.CACHE_NAME).get_seq_length() == out.sequences.shape[1] - 1
    no_cache = model.generate(input_ids, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(out.sequences, no_cache)


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_generate_carries_the_cache_decoder(cache_implementation):
    model = tiny_model(num_experts=4, num_experts_per_tok=2)
    model.generation_config.cache_implementation = cache_implementation
    if cache_implementation == "static":  # the static cache's length is its capacity: compare tokens only
        tokens = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=6, do_sample=False)
        assert torch.equal(tokens, model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=6, use_cache=False))
        return
    assert_generate_carries_cache(model, torch.tensor([[5, 6, 7], [8, 9, 10]]))


def test_generate_carries_the_cache_encoder_decoder():
    model = encoder_decoder()
    out = model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=6, do_sample=False, return_dict_in_generate=True)
    cache = out.get(compat.CACHE_NAME)
    assert cache.self_attention_cache.get_seq_length() == out.sequences.shape[1] - 1
    assert cache.cross_attention_cache.get_seq_length() == 4
    no_cache = model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(out.sequences, no_cache)


def test_gradient_checkpointing_drops_the_cache_on_every_release():
    """The backward pass re-runs each checkpointed block; a cache there would take its keys twice. transformers'
    checkpointing layer drops it by keyword, whose name changed in 5.24: the stack drops it itself."""
    model = tiny_model().train()
    model.gradient_checkpointing_enable({"use_reentrant": False})
    out = model(torch.tensor([[5, 6, 7, 8]]), labels=torch.tensor([[5, 6, 7, 8]]), use_cache=True)
    assert out.get(compat.CACHE_NAME) is None
    out.loss.backward()


# ------------------------------------------------------------------------------------ deprecations seen in time


def test_no_transformers_deprecation_from_hf_tfm_calls(caplog):
    """Forward, generate (dynamic and static cache) and Trainer-style evaluation of every paradigm neither raise a
    Python deprecation warning from hf_tfm's own calls (the suite makes those errors) nor log transformers' own
    deprecation notices (the renamed cache's getter logs one)."""
    transformers_logging.get_logger("transformers").warning_once.cache_clear()  # notices already logged count too
    transformers_logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING), warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            for model in (tiny_model(), tiny_model(num_experts=4, num_experts_per_tok=2), encoder_decoder()):
                inputs = {"input_ids": torch.tensor([[5, 6, 7, 8]])}
                model.generate(**inputs, max_new_tokens=3, do_sample=False)
                model.generate(**inputs, max_new_tokens=3, do_sample=False, cache_implementation="static")
                model(
                    **inputs, **({"decoder_input_ids": inputs["input_ids"]} if model.config.is_encoder_decoder else {})
                )
    finally:
        transformers_logging.disable_propagation()
    notices = [r.getMessage() for r in caplog.records if "deprecat" in r.getMessage().lower()]
    assert not notices, notices
