"""Sparse upcycling: a dense model becomes an MoE model that computes the same function, then can diverge."""

import pytest
import torch
from conftest import VOCAB, perturb, tiny_config, tiny_model

from hf_tfm import TfmEncoderDecoderConfig, TfmEncoderDecoderForConditionalGeneration
from hf_tfm.convert.upcycle import upcycle
from hf_tfm.model.modeling_tfm_moe import TfmMoE

GLU = dict(ffn_type="glu", hidden_act="silu", mlp_bias=False)


MLP = dict(ffn_type="mlp", hidden_act="gelu", mlp_bias=False)


@pytest.mark.parametrize(
    "moe_fields, feed_forward",
    [({}, GLU), ({"decoder_sparse_step": 2}, GLU), ({"moe_layers": [0]}, GLU), ({}, MLP)],
    ids=["all", "every-2nd", "list", "ungated"],
)
def test_upcycled_decoder_matches_dense(moe_fields, feed_forward):
    """Right after upcycling, logits equal the dense model's (normalised top-k), on the layers chosen; a gated
    feed-forward becomes gated experts, an ungated one ungated experts."""
    dense = perturb(tiny_model(num_hidden_layers=2, **feed_forward))
    moe = upcycle(dense, num_experts=4, num_experts_per_tok=2, **moe_fields).eval()
    assert moe.config.moe_ffn_type == feed_forward["ffn_type"]
    layers = [isinstance(layer.mlp, TfmMoE) for layer in moe.model.layers]
    assert layers == [moe.config.is_moe_layer(i) for i in range(2)] and any(layers)
    ids = torch.randint(3, VOCAB, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(moe(ids).logits, dense(ids).logits, atol=1e-5, rtol=0)
    router = next(m.router for m in moe.modules() if isinstance(m, TfmMoE))
    assert router.weight.abs().sum() > 0  # a fresh router, not zeros


def test_upcycled_encoder_decoder_matches_dense():
    config = tiny_config(TfmEncoderDecoderConfig, decoder_start_token_id=1, decoder_layers=3, **GLU)
    torch.manual_seed(0)
    dense = perturb(TfmEncoderDecoderForConditionalGeneration(config))
    moe = upcycle(dense, num_experts=3).eval()
    ids, targets = torch.randint(3, VOCAB, (2, 7)), torch.randint(3, VOCAB, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(
            moe(ids, decoder_input_ids=targets).logits, dense(ids, decoder_input_ids=targets).logits, atol=1e-5, rtol=0
        )
    assert moe.model.encoder.embed_tokens is moe.model.shared


def test_experts_diverge_after_training():
    """Routed experts start identical and stop being identical once trained."""
    moe = upcycle(perturb(tiny_model(**GLU)), num_experts=4).train()
    optimizer = torch.optim.SGD(moe.parameters(), lr=0.5)
    ids = torch.randint(3, VOCAB, (4, 12))
    for _ in range(3):
        moe(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    experts = moe.model.layers[0].mlp.experts.gate_up_proj
    assert not torch.equal(experts[0], experts[1])


@pytest.mark.parametrize("feed_forward", [GLU, MLP], ids=["gated", "ungated"])
def test_upcycling_refuses_what_experts_cannot_copy(feed_forward):
    with pytest.raises(ValueError, match="mlp_bias"):
        upcycle(tiny_model(**{**feed_forward, "mlp_bias": True}), num_experts=4)


def test_upcycle_command(tmp_path):
    """`hf-tfm upcycle` writes an MoE folder that loads with AutoModelForCausalLM and matches the dense logits."""
    from transformers import AutoModelForCausalLM

    from hf_tfm_cli.entry import main

    dense = perturb(tiny_model(**GLU))
    dense.save_pretrained(tmp_path / "dense")
    main(["upcycle", str(tmp_path / "dense"), str(tmp_path / "moe"), "--num-experts", "4", "--top-k", "2"])
    moe = AutoModelForCausalLM.from_pretrained(tmp_path / "moe").eval()
    assert moe.config.num_experts == 4 and isinstance(moe.model.layers[0].mlp, TfmMoE)
    ids = torch.randint(3, VOCAB, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(moe(ids).logits, dense(ids).logits, atol=1e-5, rtol=0)
