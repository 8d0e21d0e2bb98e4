"""`fused_qkv_proj`: a self-attention's q, k and v stored as one `qkv_proj` (as GPT-2's `c_attn`) instead of three
layers. The same function either way: GPT-2 converts into it exactly and back, `with_fused_qkv` switches a model's
layout with the same logits, every family converts from a fused model (the engine reads q, k and v apart), a decode
step runs one q/k/v matmul where three ran, tensor parallelism gathers its output, and what cannot see through it
refuses it by name."""

import pytest
import torch
from conftest import tiny_config
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import DistributedConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from hf_tfm import TfmDecoderForCausalLM, TfmEncoderDecoderConfig, TfmEncoderDecoderForConditionalGeneration
from hf_tfm.convert import from_tfm, to_tfm, with_fused_qkv
from hf_tfm.model.capabilities import check_parallel_layout, tensor_parallel_plan

TOKENS = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17, 18]])


def gpt2():
    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=64, n_positions=32, resid_pdrop=0.0)
    return GPT2LMHeadModel(config).eval()


def test_gpt2_converts_into_one_qkv_projection_and_back_exactly():
    reference = gpt2()
    ours = to_tfm(reference)
    attention = ours.model.layers[0].self_attn
    assert ours.config.fused_qkv_proj and attention.q_proj is None
    assert attention.qkv_proj.weight.shape == (3 * 32, 32)
    assert torch.equal(attention.qkv_proj.weight, reference.transformer.h[0].attn.c_attn.weight.t())
    assert torch.equal(ours(TOKENS).logits, reference(TOKENS).logits)
    back = from_tfm(ours, "gpt2")
    for key, tensor in reference.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor), key


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_either_layout_computes_the_same_numbers(kv_heads):
    torch.manual_seed(0)
    fields = dict(position_embedding_type="rope", num_key_value_heads=kv_heads, attention_bias=True)
    three = TfmDecoderForCausalLM(tiny_config(**fields)).eval()
    one = with_fused_qkv(three, True)
    assert one.config.fused_qkv_proj and not three.config.fused_qkv_proj
    assert one.model.layers[0].self_attn.qkv_proj.weight.shape == ((4 + 2 * kv_heads) * 8, 32)
    assert torch.equal(one(TOKENS).logits, three(TOKENS).logits)
    generated = [model.generate(TOKENS[:1], max_new_tokens=6, do_sample=False) for model in (one, three)]
    assert torch.equal(*generated)
    one.train(), three.train()
    for model in (one, three):
        model(TOKENS, labels=TOKENS).loss.backward()
    joined = torch.cat(
        [getattr(three.model.layers[1].self_attn, name).weight.grad for name in ("q_proj", "k_proj", "v_proj")]
    )
    torch.testing.assert_close(one.model.layers[1].self_attn.qkv_proj.weight.grad, joined)
    again = with_fused_qkv(one, False)
    for key, tensor in three.state_dict().items():
        assert torch.equal(again.state_dict()[key], tensor), key


def test_a_fused_model_converts_to_a_family_that_stores_three_and_saves_and_loads(tmp_path):
    torch.manual_seed(0)
    reference = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=64,
            vocab_size=64,
        )
    ).eval()
    fused = with_fused_qkv(to_tfm(reference), True)
    assert torch.equal(fused(TOKENS).logits, reference(TOKENS).logits)
    back = from_tfm(fused, "llama")
    for key, tensor in reference.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor), key
    fused.save_pretrained(tmp_path)
    loaded = TfmDecoderForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.fused_qkv_proj and torch.equal(loaded(TOKENS).logits, fused(TOKENS).logits)


def test_cross_attention_keeps_its_three_layers():
    model = with_fused_qkv(TfmEncoderDecoderForConditionalGeneration(tiny_config(TfmEncoderDecoderConfig)), True)
    block = model.model.decoder.layers[0]
    assert block.self_attn.qkv_proj is not None and block.cross_attn.qkv_proj is None
    assert block.cross_attn.q_proj is not None


def test_tensor_parallelism_gathers_the_one_matrix_as_phi3s_plan():
    """A column split of one q/k/v matrix would give a rank rows of the three mixed: its output is gathered (and
    every rank attends over every head) as in Phi-3's own plan; tests/test_tensor_parallel.py runs it on two ranks."""
    config = tiny_config(fused_qkv_proj=True)
    check_parallel_layout(config, DistributedConfig(tp_size=2))
    plan = tensor_parallel_plan(config)
    assert plan["layers.*.self_attn.qkv_proj"] == "colwise_gather_output"
    assert plan["layers.*.self_attn.o_proj"] == "rowwise_split_input"
    assert not {name.rsplit(".", 1)[-1] for name in plan} & {"q_proj", "k_proj", "v_proj"}


def test_what_cannot_run_it_refuses_it_by_name():
    with pytest.raises(ValueError, match="fused_qkv_proj"):
        tiny_config(
            fused_qkv_proj=True, position_embedding_type="rope", kv_lora_rank=16, qk_nope_head_dim=8, v_head_dim=8
        )


def test_peft_targets_the_fused_projection():
    model = TfmDecoderForCausalLM(tiny_config(fused_qkv_proj=True))
    adapted = get_peft_model(model, LoraConfig(target_modules=["qkv_proj"], r=4))
    adapted.train()
    adapted(input_ids=TOKENS, labels=TOKENS).loss.backward()
    lora = adapted.base_model.model.model.layers[0].self_attn.qkv_proj.lora_B.default.weight  # (A's is 0: B starts 0)
    assert lora.grad is not None and lora.grad.abs().sum() > 0


def test_gpt2_decodes_with_one_qkv_matmul_a_layer():
    """The H200 measured GPT-2's generation at 1.03-1.08x the reference's time with three q/k/v matmuls a layer
    (benchmarks/results/gpu-2026-11-27-2.json); a decode step now launches the reference's linear layers."""
    reference = gpt2()
    ours = to_tfm(reference)
    counts = {}
    for name, model in (("reference", reference), ("ours", ours)):
        linears = [
            module for module in model.modules() if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"
        ]
        calls = []
        handles = [module.register_forward_hook(lambda *args, calls=calls: calls.append(1)) for module in linears]
        model(TOKENS[:, -1:])
        for handle in handles:
            handle.remove()
        counts[name] = len(calls)
    assert counts["ours"] == counts["reference"]  # q/k/v, o, up, down a layer and the head: 2 x 4 + 1
