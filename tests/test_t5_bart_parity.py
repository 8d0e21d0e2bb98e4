"""Exact parity between converted hf_tfm encoder-decoders and transformers' T5 (v1.0, v1.1) and BART, fp32."""

from functools import partial

import pytest
import torch
from conftest import VOCAB, assert_same_state_dict, tiny_model
from support.families import tiny_reference
from support.parity_harness import source_batch
from transformers import BartConfig, T5Config

from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm
from hf_tfm.model import modeling_tfm_positions

ATOL = 1e-4
PAD, BOS, EOS = 0, 1, 2


def t5(v1_1: bool = False):
    """v1.0 (the record's): ReLU MLP, LM head tied and rescaled. v1.1: gated GELU, its own LM head, not rescaled."""
    if not v1_1:
        return tiny_reference("t5")

    def own_head(model):  # what from_pretrained leaves for a v1.1 checkpoint: an lm_head of its own
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())

    return tiny_reference("t5", feed_forward_proj="gated-gelu", tie_word_embeddings=False, prepare=own_head)


def bart(tied: bool = True, one_table: bool = True, **overrides):
    """Untied BART still has one token table in practice (checkpoints store it three times, equal)."""

    def one_token_table(model):
        if one_table and not tied:
            shared = model.model.shared.weight
            model.model.encoder.embed_tokens.weight = model.model.decoder.embed_tokens.weight = shared

    fields = dict(scale_embedding=tied, tie_word_embeddings=tied)  # one of each
    return tiny_reference("bart", prepare=one_token_table, **{**fields, **overrides})


# (id, reference factory, to_tfm, back to reference)
REFERENCES = [
    pytest.param(t5, to_tfm, partial(from_tfm, name="t5"), id="t5-v1.0-tied-relu"),
    pytest.param(lambda: t5(v1_1=True), to_tfm, partial(from_tfm, name="t5"), id="t5-v1.1-untied-gated-gelu"),
    pytest.param(bart, to_tfm, partial(from_tfm, name="bart"), id="bart-tied-scaled"),
    pytest.param(lambda: bart(tied=False), to_tfm, partial(from_tfm, name="bart"), id="bart-untied"),
]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("make_ref, to_tfm, from_tfm", REFERENCES)
def test_logits_match_reference(make_ref, to_tfm, from_tfm, attn):
    """Converted models give the reference logits on a right-padded source batch with given decoder inputs."""
    ref = make_ref()
    ours = to_tfm(ref)
    # transformers 5.17's T5 keeps the stacks' own config copies at sdpa when only the top model is switched
    for model in (ref, ref.get_encoder(), ref.get_decoder(), ours):
        model.set_attn_implementation(attn)
    input_ids, attention_mask = source_batch()
    kwargs = dict(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=torch.randint(3, VOCAB, (2, 6))
    )
    with torch.no_grad():
        expected, actual = ref(**kwargs).logits, ours(**kwargs).logits
    assert expected.abs().max() > 100 * ATOL  # the comparison is not vacuous
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("num_beams", [1, 3], ids=["greedy", "beam3"])
@pytest.mark.parametrize("make_ref, to_tfm, from_tfm", REFERENCES)
def test_generate_matches_reference(make_ref, to_tfm, from_tfm, num_beams):
    """Greedy and beam search on a right-padded source batch produce the reference tokens (with the reference's
    generation defaults, such as BART's forced EOS)."""
    ref = make_ref()
    ours = to_tfm(ref)
    input_ids, attention_mask = source_batch()
    kwargs = dict(attention_mask=attention_mask, do_sample=False, num_beams=num_beams, max_new_tokens=6)
    assert torch.equal(ours.generate(input_ids, **kwargs), ref.generate(input_ids, **kwargs))


@pytest.mark.parametrize("make_ref, to_tfm, from_tfm", REFERENCES)
def test_round_trip_restores_state_dict(make_ref, to_tfm, from_tfm):
    """Reference -> hf_tfm -> reference reproduces the state dict exactly (same keys, equal tensors) and the tie."""
    ref = make_ref()
    expected = ref.state_dict()
    back = from_tfm(to_tfm(ref))
    assert_same_state_dict(back.state_dict(), expected)
    tied = [model.lm_head.weight is model.get_input_embeddings().weight for model in (ref, back)]
    assert tied[0] == tied[1]


def edited(make_ref, to_tfm, **fields):
    """A converted model whose config is then changed into something the reference cannot express."""
    model = to_tfm(make_ref())
    for field, value in fields.items():
        setattr(model.config, field, value)
    return model


@pytest.mark.parametrize(
    "convert, make_source, field",
    [
        (
            partial(from_tfm, name="t5"),
            lambda: edited(t5, to_tfm, position_embedding_type="rope"),
            "position_embedding_type",
        ),
        (partial(from_tfm, name="t5"), lambda: edited(t5, to_tfm, attention_multiplier=None), "attention_multiplier"),
        (partial(from_tfm, name="t5"), lambda: edited(t5, to_tfm, attention_bias=True), "attention_bias"),
        (partial(from_tfm, name="t5"), lambda: edited(t5, to_tfm, attention_dropout=0.1), "attention_dropout"),
        (
            partial(from_tfm, name="t5"),
            lambda: edited(lambda: t5(v1_1=True), to_tfm, hidden_act="gelu"),
            "hidden_act",
        ),  # GELU-tanh only
        (partial(from_tfm, name="t5"), lambda: edited(bart, to_tfm), "norm_type"),
        (partial(from_tfm, name="bart"), lambda: edited(bart, to_tfm, norm_position="pre"), "norm_position"),
        (partial(from_tfm, name="bart"), lambda: edited(bart, to_tfm, position_offset=0), "position_offset"),
        (partial(from_tfm, name="bart"), lambda: edited(bart, to_tfm, head_dim=16), "head_dim"),
        (
            partial(from_tfm, name="bart"),
            lambda: edited(bart, to_tfm, final_norm=True),
            "final_norm",
        ),  # a falsy expected value
        (to_tfm, lambda: bart(decoder_attention_heads=2), "decoder_attention_heads"),
        (to_tfm, lambda: bart(decoder_ffn_dim=48), "decoder_ffn_dim"),
        (to_tfm, lambda: bart(tied=False, one_table=False), "embed_tokens"),  # three different token tables
        # options TfmConfig gained after these converters were written: refused by the round trip, listed nowhere
        (partial(from_tfm, name="t5"), lambda: edited(t5, to_tfm, qk_norm="per_head"), "qk_norm"),
        (partial(from_tfm, name="t5"), lambda: edited(t5, to_tfm, rmsnorm_unit_offset=True), "rmsnorm_unit_offset"),
        (partial(from_tfm, name="bart"), lambda: edited(bart, to_tfm, attention_out_bias=False), "attention_out_bias"),
        (
            partial(from_tfm, name="bart"),
            lambda: edited(bart, to_tfm, position_ids_from_padding=True),
            "position_ids_from_padding",
        ),
        (
            partial(from_tfm, name="bart"),
            lambda: edited(bart, to_tfm, final_logit_softcapping=30.0),
            "final_logit_softcapping",
        ),
    ],
)
def test_inexpressible_config_raises(convert, make_source, field):
    """A config or model the target cannot express exactly raises ValueError naming the offending field."""
    with pytest.raises(ValueError, match=field):
        convert(make_source())


def test_a_model_of_another_paradigm_is_refused():
    with pytest.raises(TypeError, match="bart converts TfmEncoderDecoderForConditionalGeneration, got TfmDecoderFor"):
        from_tfm(tiny_model(), "bart")  # a decoder-only model


# config.json files as published (transformers 4.x keys included)
BART_BASE = dict(
    activation_dropout=0.1, activation_function="gelu", add_bias_logits=False, add_final_layer_norm=False,
    attention_dropout=0.1, bos_token_id=0, classif_dropout=0.1, classifier_dropout=0.0, d_model=768,
    decoder_attention_heads=12, decoder_ffn_dim=3072, decoder_layerdrop=0.0, decoder_layers=6,
    decoder_start_token_id=2, dropout=0.1, early_stopping=True, encoder_attention_heads=12, encoder_ffn_dim=3072,
    encoder_layerdrop=0.0, encoder_layers=6, eos_token_id=2, forced_eos_token_id=2, gradient_checkpointing=False,
    init_std=0.02, is_encoder_decoder=True, max_position_embeddings=1024, model_type="bart", no_repeat_ngram_size=3,
    normalize_before=False, normalize_embedding=True, num_beams=4, num_hidden_layers=6, pad_token_id=1,
    scale_embedding=False, use_cache=True, vocab_size=50265,
)  # fmt: skip
T5_SMALL = dict(
    d_ff=2048, d_kv=64, d_model=512, decoder_start_token_id=0, dropout_rate=0.1, eos_token_id=1,
    initializer_factor=1.0, is_encoder_decoder=True, layer_norm_epsilon=1e-06, model_type="t5", n_positions=512,
    num_heads=8, num_layers=6, output_past=True, pad_token_id=0, relative_attention_num_buckets=32, vocab_size=32128,
)  # fmt: skip
FLAN_T5_SMALL = dict(
    T5_SMALL, d_ff=1024, dense_act_fn="gelu_new", feed_forward_proj="gated-gelu", is_gated_act=True,
    num_decoder_layers=8, num_heads=6, num_layers=8, relative_attention_max_distance=128, tie_word_embeddings=False,
)  # fmt: skip


@pytest.mark.parametrize(
    "config_class, fields, to_tfm, back",
    [
        (BartConfig, BART_BASE, config_to_tfm, partial(config_from_tfm, name="bart")),
        (T5Config, T5_SMALL, config_to_tfm, partial(config_from_tfm, name="t5")),
        (T5Config, FLAN_T5_SMALL, config_to_tfm, partial(config_from_tfm, name="t5")),
    ],
    ids=["bart-base", "t5-small", "flan-t5-small"],
)
def test_published_configs_convert_both_ways(config_class, fields, to_tfm, back):
    """Keys these classes keep but never read (BART's 4.x options, T5's n_positions, training-only dropouts) are
    named as such in the converters, not refused; everything else comes back equal."""
    config = config_class.from_dict(fields)
    converted = back(to_tfm(config))
    assert converted.d_model == fields["d_model"] and converted.pad_token_id == fields["pad_token_id"]


def test_bart_trains_its_final_logits_bias_as_the_reference_does(tmp_path):
    """BART's final_logits_bias is a buffer: an optimizer step leaves it where it was, on both sides, and a step
    of the converted model moves every other weight as the reference's does. It stays frozen after a reload."""
    reference = bart(dropout=0.0)  # BART drops out functionally: off in the config, for both sides
    ours = to_tfm(reference)
    assert not ours.lm_head.bias.requires_grad
    ours.save_pretrained(tmp_path)
    assert not type(ours).from_pretrained(tmp_path).lm_head.bias.requires_grad
    source = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    for model in (reference, ours):
        model.train()
        # SGD: Adam's first step would turn rounding-sized gradients into full-sized steps
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5, weight_decay=0.1)
        model(input_ids=source, labels=labels).loss.backward()
        optimizer.step()
    torch.testing.assert_close(ours.lm_head.bias, reference.final_logits_bias[0], rtol=0, atol=0)
    back = from_tfm(ours, "bart")
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


def test_t5_position_bias_is_built_once_for_the_batch():
    """Rows that share positions get one [1, heads, q, kv] bias (the reference's shape), not one per row."""
    ours = to_tfm(t5())
    shapes = []
    stack = ours.model.encoder
    stack.position_bias.register_forward_hook(lambda module, args, output: shapes.append(tuple(output.shape)))
    ours(input_ids=torch.randint(3, VOCAB, (3, 6)), decoder_input_ids=torch.randint(3, VOCAB, (3, 4)))
    assert shapes == [(1, 4, 6, 6)]


@pytest.mark.parametrize("padded", [False, True])
def test_t5_masks_reach_the_attention_as_a_gpu_kernel_reads_them(padded):
    """The masks that carry the relative bias are contiguous (sdpa's fused GPU kernels refuse a mask whose last
    dimension has another stride, and take the math path: the embedding's heads-innermost layout did that), and
    one [1, heads, q, kv] mask where the rows share it: the decoder's causal mask is one row expanded over the
    batch."""
    ours = to_tfm(t5())
    masks = {}

    def record(name):
        def hook(module, args, kwargs):
            masks.setdefault(name, kwargs["attention_mask"])

        return hook

    ours.model.encoder.layers[0].self_attn.register_forward_pre_hook(record("encoder"), with_kwargs=True)
    ours.model.decoder.layers[0].self_attn.register_forward_pre_hook(record("decoder"), with_kwargs=True)
    source = torch.randint(3, VOCAB, (3, 6))
    attention_mask = torch.ones_like(source)
    if padded:
        attention_mask[0, -2:] = 0
    ours(input_ids=source, attention_mask=attention_mask, decoder_input_ids=torch.randint(3, VOCAB, (3, 4)))
    assert masks["encoder"].shape == ((3 if padded else 1), 4, 6, 6)
    assert masks["decoder"].shape == (1, 4, 4, 4)
    for mask in masks.values():
        assert mask.is_contiguous(), mask.stride()


def test_a_t5_decode_step_adds_the_bias_without_a_mask(monkeypatch):
    """One query sees every cached key: its causal mask is skipped and the bias goes to the attention alone (no
    bool-to-float mask merged per step: T5's batch-1 decode step launched 8 kernels more than the reference for it).
    A prompt keeps its causal mask, which the bias needs; the tokens are the reference's."""
    reference = t5()
    ours = to_tfm(reference)
    merged = []  # (query length, whether a mask came with the bias), for the decoder's self-attention
    original = modeling_tfm_positions.merge_position_bias

    def recording(mask, bias, dtype):
        merged.append((bias.shape[-2], mask is not None))
        return original(mask, bias, dtype)

    monkeypatch.setattr(modeling_tfm_positions, "merge_position_bias", recording)
    source = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    options = dict(max_new_tokens=3, do_sample=False)
    assert torch.equal(ours.generate(source, **options), reference.generate(source, **options))
    decoder_steps = merged[1:]  # the first merge is the encoder's (no mask: no padding)
    assert decoder_steps == [(1, False)] * 3
    ours(input_ids=source, decoder_input_ids=torch.randint(3, VOCAB, (1, 4)))
    assert merged[-1] == (4, True)


@pytest.mark.parametrize("v1_1", [False, True], ids=["v1.0", "v1.1"])
def test_a_float16_load_keeps_t5s_feed_forward_output_in_float32(tmp_path, v1_1):
    """T5 keeps `wo` in float32 when loaded in float16 (`_keep_in_fp32_modules`), where its output overflows float16;
    a converted T5 keeps its `down_proj` so (`numerics` "ffn_output_in_float32"): the reference's logits bit for bit,
    where a float16 `down_proj` gives inf."""
    reference = t5(v1_1)
    with torch.no_grad():  # feed-forward outputs past float16's range, as large T5 checkpoints have them
        for stack in (reference.encoder, reference.decoder):
            for block in stack.block:
                block.layer[-1].DenseReluDense.wo.weight.mul_(2e5)
    ours = to_tfm(reference)
    assert "ffn_output_in_float32" in ours.config.numerics
    reference.save_pretrained(tmp_path / "reference")
    ours.save_pretrained(tmp_path / "ours")
    reference = type(reference).from_pretrained(tmp_path / "reference", dtype=torch.float16).eval()
    ours = type(ours).from_pretrained(tmp_path / "ours", dtype=torch.float16).eval()
    kept = {name for name, parameter in ours.named_parameters() if parameter.dtype == torch.float32}
    assert kept and all(name.endswith("mlp.down_proj.weight") for name in kept)
    input_ids, attention_mask = source_batch()
    decoder_input_ids = input_ids[:, :5]
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        got = ours(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        assert torch.isfinite(expected.logits).all() and torch.equal(got.logits, expected.logits)
        ours.get_submodule("model.encoder.layers.0.mlp.down_proj").half()  # the float16 layer overflows
        assert not torch.isfinite(ours(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits).all()
