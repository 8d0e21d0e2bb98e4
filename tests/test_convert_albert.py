"""What is particular to ALBERT (the proofs every family owes, on `AlbertForMaskedLM` at the tiny shape, are in
tests/test_convert_families.py): cross-layer sharing (`layer_sharing`: num_hidden_groups groups of inner_group_num
blocks run across depth, each block held and saved once), the projection its embeddings always pass through, its
dropout (none on the feed-forward), training with shared weights, and what hf_tfm refuses."""

import pytest
import safetensors.torch
import torch
import transformers
from conftest import VOCAB, assert_same_state_dict
from support.families import tiny_reference
from support.parity_harness import (
    assert_checkpointing_keeps_gradients,
    assert_gradients_match,
    main_output,
    masked_lm_batch,
    source_batch,
)

from hf_tfm import TfmDecoderConfig, TfmEncoderConfig, TfmEncoderForMaskedLM
from hf_tfm.convert import from_tfm, to_tfm
from hf_tfm.convert.encoder import albert_order


def albert(class_name: str = "AlbertForMaskedLM", **overrides):
    return tiny_reference("albert", model_class=getattr(transformers, class_name), **overrides)


def assert_same_outputs(reference, ours) -> None:
    input_ids, attention_mask = source_batch()
    real = attention_mask.bool()  # a padded position's output is noise
    torch.testing.assert_close(
        main_output(ours, input_ids=input_ids, attention_mask=attention_mask)[real],
        main_output(reference, input_ids=input_ids, attention_mask=attention_mask)[real],
        atol=1e-4,
        rtol=0,
    )


# (num_hidden_layers, num_hidden_groups, inner_group_num) -> the blocks hf_tfm runs, in order
SHAPES = {
    (3, 2, 2): [0, 1, 0, 1, 2, 3],  # the tiny model: two layers run group 0, one group 1, two blocks a group
    (12, 1, 1): [0] * 12,  # every published ALBERT: one block at every depth
    (5, 3, 1): [0, 0, 1, 1, 2],  # groups that do not divide the depth
    (2, 1, 3): [0, 1, 2, 0, 1, 2],
    (4, 4, 1): None,  # a group per layer: nothing shared
}


@pytest.mark.parametrize("shape", sorted(SHAPES), ids=lambda shape: "layers{}-groups{}-inner{}".format(*shape))
@pytest.mark.parametrize("class_name", ["AlbertForMaskedLM", "AlbertModel"])
def test_every_grouping_converts_exactly(class_name, shape):
    layers, groups, inner = shape
    reference = albert(class_name, num_hidden_layers=layers, num_hidden_groups=groups, inner_group_num=inner)
    ours = to_tfm(reference)
    body = getattr(ours, "model", ours)
    assert ours.config.layer_sharing == SHAPES[shape] and ours.config.num_hidden_layers == layers * inner
    assert len(body.layers) == groups * inner  # each block held once
    assert_same_outputs(reference, ours)
    back = from_tfm(ours, "albert")
    assert (back.config.num_hidden_layers, back.config.num_hidden_groups, back.config.inner_group_num) == shape
    assert_same_state_dict(back.state_dict(), reference.state_dict())


def test_the_order_is_albert_group_arithmetic():
    """albert_order reproduces AlbertTransformer's choice of group for each layer, float division included."""
    for layers in range(1, 13):
        for groups in range(1, layers + 1):
            expected = [int(i / (layers / groups)) for i in range(layers)]
            assert albert_order(layers, groups, 1) == expected


def test_the_embeddings_are_projected_even_at_the_blocks_width():
    """ALBERT's embedding_hidden_mapping_in is there whatever embedding_size is: at hidden_size too."""
    reference = albert(embedding_size=32)
    ours = to_tfm(reference)
    assert ours.config.embedding_size == 32 and ours.model.embed_proj.weight.shape == (32, 32)
    assert_same_outputs(reference, ours)
    assert_same_state_dict(from_tfm(ours, "albert").state_dict(), reference.state_dict())


def test_every_depth_reports_its_hidden_states():
    """A shared block called at several depths records each call, as ALBERT's layers do."""
    reference = albert("AlbertModel")
    ours = to_tfm(reference)
    input_ids, attention_mask = source_batch()
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        actual = ours(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    assert len(actual.hidden_states) == len(expected.hidden_states) == 3 * 2 + 1
    real = attention_mask.bool()
    for mine, theirs in zip(actual.hidden_states, expected.hidden_states):
        torch.testing.assert_close(mine[real], theirs[real], atol=1e-5, rtol=0)


def test_shared_blocks_train_as_the_reference():
    """The masked-LM loss and every gradient, dropout off: a shared block's gradient sums its uses at every depth."""
    reference = albert()
    ours = to_tfm(reference)
    expected, actual = reference(**masked_lm_batch()), ours(**masked_lm_batch())
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-5, rtol=0)
    expected.loss.backward(), actual.loss.backward()
    assert_gradients_match(reference, ours, "albert")


def test_dropout_falls_where_albert_drops_out():
    """In training mode with the same seed, the loss is the reference's: the embeddings and each attention output are
    dropped out, the feed-forward output never (ffn_dropout=0, whatever hidden_dropout_prob says)."""
    reference = albert(hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.0)
    ours = to_tfm(reference)
    assert ours.config.hidden_dropout == 0.3 and ours.config.ffn_dropout == 0.0
    reference.train(), ours.train()
    torch.manual_seed(7)
    expected = reference(**masked_lm_batch()).loss
    torch.manual_seed(7)
    actual = ours(**masked_lm_batch()).loss
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)
    torch.manual_seed(8)  # a control: another seed drops out other features
    assert not torch.allclose(ours(**masked_lm_batch()).loss, expected, atol=1e-3)


def test_gradient_checkpointing_recomputes_each_use():
    assert_checkpointing_keeps_gradients(to_tfm(albert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)))


def test_a_shared_block_is_saved_once(tmp_path):
    ours = to_tfm(albert())
    ours.save_pretrained(tmp_path)
    saved = safetensors.torch.load_file(tmp_path / "model.safetensors")
    assert {key.split(".")[2] for key in saved if key.startswith("model.layers.")} == {"0", "1", "2", "3"}
    loaded = TfmEncoderForMaskedLM.from_pretrained(tmp_path)
    assert loaded.config.layer_sharing == ours.config.layer_sharing
    loaded.set_attn_implementation(ours.config._attn_implementation)
    assert_same_state_dict(loaded.state_dict(), ours.state_dict())
    input_ids, _ = source_batch()
    torch.testing.assert_close(
        main_output(loaded, input_ids=input_ids), main_output(ours, input_ids=input_ids), atol=0, rtol=0
    )


def test_one_block_at_every_depth_holds_one_blocks_parameters():
    def parameters(layer_sharing):
        config = TfmEncoderConfig(
            vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_hidden_layers=4, layer_sharing=layer_sharing
        )
        return sum(param.numel() for param in TfmEncoderForMaskedLM(config).parameters())

    block = (parameters(None) - parameters([0, 0, 0, 0])) // 3
    assert block > 0 and parameters([0, 1, 0, 1]) == parameters([0, 0, 0, 0]) + block


@pytest.mark.parametrize(
    "layer_sharing, match",
    [
        ([0, 0, 0], "has 3 entries for num_hidden_layers=4"),
        ([1, 1, 0, 0], "order of first use"),
        ([0, 2, 1, 1], "order of first use"),
        ([0, -1, 0, 0], "order of first use"),
    ],
)
def test_a_sharing_that_is_no_order_of_blocks_is_refused(layer_sharing, match):
    with pytest.raises(ValueError, match=rf"Invalid `layer_sharing`: .*{match}"):
        TfmEncoderConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=4, layer_sharing=layer_sharing)


def test_layers_built_otherwise_cannot_share_a_block():
    """A block is built once, for the first layer that runs it: a layer of another kind cannot run it."""
    base = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, layer_sharing=[0, 0])
    with pytest.raises(ValueError, match="layer 1 runs block 0, built for layer 0, but their MoE layers differ"):
        TfmEncoderConfig(**base, num_experts=4, num_experts_per_tok=1, moe_layers=[1])
    with pytest.raises(ValueError, match="their layer_types differ"):
        TfmEncoderConfig(**base, layer_types=["full_attention", "sliding_attention"], sliding_window=4)
    with pytest.raises(ValueError, match="their first_layer_attn_norm differ"):
        TfmEncoderConfig(**base, first_layer_attn_norm=False)


def test_decoders_cannot_share_blocks():
    with pytest.raises(ValueError, match="Invalid `layer_sharing`: shared blocks are built for encoders"):
        TfmDecoderConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, layer_sharing=[0, 0])


def test_what_albert_cannot_express_is_refused():
    ours = to_tfm(albert())
    other = TfmEncoderForMaskedLM(TfmEncoderConfig(**{**ours.config.to_dict(), "layer_sharing": [0, 1, 1, 0, 2, 3]}))
    with pytest.raises(ValueError, match=r"layer_sharing=\[0, 1, 1, 0, 2, 3\] to AlbertConfig"):
        from_tfm(other, "albert")
    unprojected = TfmEncoderForMaskedLM(TfmEncoderConfig(**{**ours.config.to_dict(), "embedding_size": None}))
    with pytest.raises(ValueError, match="embedding_size=None, but ALBERT always maps its embeddings"):
        from_tfm(unprojected, "albert")
    dropped = TfmEncoderForMaskedLM(TfmEncoderConfig(**{**ours.config.to_dict(), "ffn_dropout": None}))
    with pytest.raises(ValueError, match="ffn_dropout"):
        from_tfm(dropped, "albert")  # hidden_dropout 0.1 would fall on the feed-forward, as ALBERT's never does
    with pytest.raises(ValueError, match="num_hidden_groups=3 for num_hidden_layers=2 leaves groups"):
        to_tfm(albert(num_hidden_layers=2, num_hidden_groups=3, inner_group_num=1))


def test_vllm_refuses_shared_blocks_and_transformers_backends_run_them():
    from hf_tfm.model import capabilities

    config = TfmEncoderConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, layer_sharing=[0, 0])
    assert capabilities.backend_refusal(config, "vllm").startswith("layer_sharing=[0, 0] cannot run")
    for implementation in ("eager", "sdpa", "flex_attention"):
        assert capabilities.backend_refusal(config, implementation) is None
