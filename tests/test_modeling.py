"""hf_tfm models: every block combination trains, bad input is named, weights tie, save and load, outputs match."""

import importlib
import inspect
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import POSITION_TYPES, VOCAB, tiny_config, tiny_model
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs

import hf_tfm  # noqa: F401  (registers the tfm model types with the Auto classes)
from hf_tfm import (
    TfmDecoderForCausalLM,
    TfmDecoderForSequenceClassification,
    TfmDecoderModel,
)


def random_ids(batch=2, length=6):
    return torch.randint(3, VOCAB, (batch, length))


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("ffn", [("mlp", "gelu"), ("glu", "silu")], ids=["mlp", "swiglu"])
@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("position", POSITION_TYPES)
def test_every_combination_trains(position, norm_type, norm_position, ffn, heads):
    """Forward + backward of every block combination gives a finite loss and a finite gradient on every parameter."""
    model = tiny_model(
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=heads[0],
        num_key_value_heads=heads[1],
        position_embedding_type=position,
        norm_type=norm_type,
        norm_position=norm_position,
        ffn_type=ffn[0],
        hidden_act=ffn[1],
    ).train()
    ids = random_ids()
    loss = model(ids, labels=ids).loss
    assert loss.isfinite()
    loss.backward()
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert param.grad is not None, f"{name} got no gradient"
            assert param.grad.isfinite().all(), f"{name} has a non-finite gradient"


# ---------------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad_id", [VOCAB + 5, -1])
def test_out_of_vocabulary_id_is_named(bad_id):
    """A token id outside [0, vocab_size) raises ValueError naming the id and the vocabulary."""
    ids = random_ids()
    ids[1, 3] = bad_id
    with pytest.raises(ValueError, match=rf"(?<!\d){bad_id}(?!\d).*vocab"):
        tiny_model()(ids)


@pytest.mark.parametrize("position", ["learned", "sinusoidal"])
def test_too_long_sequence_is_named(position):
    """A sequence longer than the absolute position table raises ValueError naming max_position_embeddings."""
    model = tiny_model(position_embedding_type=position, max_position_embeddings=8)
    model(random_ids(length=8))  # exactly the table length is fine
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(random_ids(length=9))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(attention_mask=torch.ones(2, 5, dtype=torch.long)), "attention_mask"),
        (dict(attention_mask=torch.ones(3, 6, dtype=torch.long)), "attention_mask"),
        (dict(labels=torch.ones(2, 5, dtype=torch.long)), "labels"),
        (dict(labels=torch.ones(6, dtype=torch.long)), "labels"),
    ],
    ids=["mask-length", "mask-batch", "labels-length", "labels-1d"],
)
def test_wrong_shape_is_named(kwargs, match):
    """An attention_mask or labels of the wrong shape raises ValueError naming the tensor."""
    with pytest.raises(ValueError, match=match):
        tiny_model()(random_ids(), **kwargs)


@pytest.mark.parametrize("with_ids, with_embeds", [(True, True), (False, False)], ids=["both", "neither"])
def test_exactly_one_of_ids_or_embeds(with_ids, with_embeds):
    """Passing both or neither of input_ids and inputs_embeds raises ValueError naming them."""
    model, ids = tiny_model(), random_ids()
    kwargs = dict(
        input_ids=ids if with_ids else None, inputs_embeds=model.get_input_embeddings()(ids) if with_embeds else None
    )
    with pytest.raises(ValueError, match="input_ids.*inputs_embeds"):
        model(**kwargs)


# ------------------------------------------------------------------------------------------- tying, save, load


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_word_embedding_tying_survives_save_load(tmp_path, tie):
    """tie_word_embeddings=True shares one tensor between lm_head and embed_tokens, False keeps two; both after
    reload."""
    model = tiny_model(tie_word_embeddings=tie)
    if not tie:  # make the two matrices distinguishable so a reload that ties them is caught
        with torch.no_grad():
            model.lm_head.weight.normal_()
    assert_tying(model, tie)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert_tying(loaded, tie)
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight, rtol=0, atol=0)
    torch.testing.assert_close(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight, rtol=0, atol=0)


def assert_tying(model, tie):
    head, embed = model.lm_head.weight, model.model.embed_tokens.weight
    assert (head is embed) == tie
    assert (head.data_ptr() == embed.data_ptr()) == tie


def test_sharded_safetensors_round_trip(tmp_path):
    """A small max_shard_size writes several safetensors shards plus an index; loading them gives identical logits."""
    model = tiny_model()
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert len(shards) > 1
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {s.name for s in shards}
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is TfmDecoderForCausalLM
    ids = random_ids()
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------- equivalences


@pytest.mark.parametrize("position", POSITION_TYPES)
def test_gradient_checkpointing_matches(position):
    """Gradient checkpointing in train mode gives the same loss and gradients as a plain backward."""
    results = []
    for checkpointing in (False, True):
        model = tiny_model(position_embedding_type=position).train()
        if checkpointing:
            model.gradient_checkpointing_enable()
            assert all(layer.gradient_checkpointing for layer in model.model.layers)
        torch.manual_seed(0)
        ids = random_ids()
        loss = model(ids, labels=ids).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("scale_embeddings", [False, True])
@pytest.mark.parametrize("position", POSITION_TYPES)
def test_inputs_embeds_matches_input_ids(position, scale_embeddings):
    """Feeding the token embeddings as inputs_embeds gives the same logits as feeding input_ids."""
    model = tiny_model(position_embedding_type=position, scale_embeddings=scale_embeddings)
    ids = random_ids()
    expected = model(input_ids=ids).logits
    torch.testing.assert_close(model(inputs_embeds=model.get_input_embeddings()(ids)).logits, expected)


def test_hidden_states_and_attentions_follow_transformers_convention():
    """output_hidden_states/attentions return as many tensors as LlamaModel (layers+1, layers), of the right shapes."""
    layers, batch, length = 2, 2, 6
    ids = random_ids(batch, length)
    ours = TfmDecoderModel(tiny_config(num_hidden_layers=layers, attn_implementation="eager"))
    llama = LlamaModel(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=layers,
            num_attention_heads=4,
            intermediate_size=64,
            attn_implementation="eager",
        )
    )
    out = ours(ids, output_hidden_states=True, output_attentions=True)
    ref = llama(ids, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == len(ref.hidden_states) == layers + 1
    assert len(out.attentions) == len(ref.attentions) == layers
    assert all(h.shape == (batch, length, 32) for h in out.hidden_states)
    assert all(a.shape == (batch, 4, length, length) for a in out.attentions)
    # same convention as Llama: the last entry is the final (normed) output
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state)
    torch.testing.assert_close(ref.hidden_states[-1], ref.last_hidden_state)
    # causal attention rows are probability distributions with nothing on future keys
    for a in out.attentions:
        torch.testing.assert_close(a.sum(-1), torch.ones(batch, 4, length))
        assert (a.triu(1) == 0).all()


# ------------------------------------------------------------------------------------------ sequence classification


def classifier(seed=0, **overrides):
    torch.manual_seed(seed)
    return TfmDecoderForSequenceClassification(tiny_config(**overrides)).eval()


@pytest.mark.parametrize("position", POSITION_TYPES)
def test_classification_pools_last_non_pad_token(position):
    """Logits are [B, num_labels], taken at the last real token: right- and left-padded rows match the unpadded row."""
    model = classifier(num_labels=3, position_embedding_type=position)
    row, pad = torch.randint(3, VOCAB, (5,)), torch.zeros(2, dtype=torch.long)
    expected = model(row[None]).logits[0]
    ids = torch.stack([torch.cat([row, pad]), torch.cat([pad, row])])
    mask = (ids != 0).long()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(ids, attention_mask=mask, position_ids=position_ids).logits
    assert logits.shape == (2, 3)
    torch.testing.assert_close(logits, expected.expand(2, 3))


@pytest.mark.parametrize(
    "num_labels, problem_type, make_labels, reference",
    [
        (3, None, lambda: torch.tensor([0, 2, 1]), lambda logits, y: F.cross_entropy(logits, y)),
        (1, "regression", lambda: torch.tensor([0.5, -1.0, 2.0]), lambda logits, y: F.mse_loss(logits.squeeze(-1), y)),
        (
            3,
            "multi_label_classification",
            lambda: torch.tensor([[1.0, 0, 1], [0, 0, 0], [0, 1, 1]]),
            lambda logits, y: F.binary_cross_entropy_with_logits(logits, y),
        ),
    ],
    ids=["single_label", "regression", "multi_label"],
)
def test_classification_loss(num_labels, problem_type, make_labels, reference):
    """Sequence classification computes the loss of its problem type from the pooled logits."""
    model = classifier(num_labels=num_labels, problem_type=problem_type)
    labels = make_labels()
    out = model(random_ids(batch=3), labels=labels)
    assert out.logits.shape == (3, num_labels)
    torch.testing.assert_close(out.loss, reference(out.logits, labels))


# ------------------------------------------------------------------------------------ transformers' conventions


def test_rotary_embedding_follows_transformers_rope_modules():
    """The RoPE module is built as transformers' rope tests build it (`rope_class(config=..., device=...)`), and linear
    scaling by 10 puts new position x where the unscaled module had x / 10 (the frequency check those tests run)."""
    config = tiny_config(position_embedding_type="rope")
    rope_class = type(TfmDecoderModel(config).rotary_emb)
    x = torch.randn(1)
    positions = torch.arange(40).unsqueeze(0)
    original_cos, original_sin = rope_class(config=config, device=x.device)(x, positions)
    config.rope_parameters = {**config.rope_parameters, "rope_type": "linear", "factor": 10.0}
    scaled_cos, scaled_sin = rope_class(config=config, device=x.device)(x, positions)
    torch.testing.assert_close(scaled_cos[:, ::10], original_cos[:, :4])
    torch.testing.assert_close(scaled_sin[:, ::10], original_sin[:, :4])


BUNDLE_MODULES = [
    importlib.import_module(f"hf_tfm.model.{path.stem}") for path in Path(hf_tfm.model.__file__).parent.glob("*.py")
]


def test_forward_kwargs_are_transformers_kwargs():
    """Every forward that takes **kwargs annotates them `Unpack[TransformersKwargs]`, as transformers' models do
    (its tooling reads the annotation to know which outputs the kwargs can ask for)."""
    classes = [
        value
        for module in BUNDLE_MODULES
        for value in vars(module).values()
        if isinstance(value, type) and value.__module__ == module.__name__ and "forward" in vars(value)
    ]
    unannotated = []
    for cls in classes:
        for parameter in inspect.signature(cls.forward).parameters.values():
            if parameter.kind is parameter.VAR_KEYWORD and parameter.annotation != Unpack[TransformersKwargs]:
                unannotated.append(cls.__name__)
    assert len(classes) > 10 and not unannotated
