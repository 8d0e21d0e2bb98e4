"""Fused projections at inference (modeling_tfm_layers.FusedProjections): attention's q/k/v and a GLU's gate/up run as
one matmul when nothing trains, with the separate layers' numbers up to fp32 rounding, and everything that reads the
parameters (training, optimizers, state dicts and savers, dtype moves, reassigned weights, adapters) sees what it saw
before."""

import copy

import pytest
import torch
from conftest import padded_inputs, perturb, tiny_config
from torch import nn

from hf_tfm import (
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
)
from hf_tfm.modeling_tfm_layers import FusingModule

CONFIGS = {
    "llama": (TfmDecoderForCausalLM, dict(position_embedding_type="rope", num_key_value_heads=2)),
    "gpt2": (TfmDecoderForCausalLM, dict(position_embedding_type="learned", attention_bias=True, mlp_bias=True)),
    "qk-norm-per-head": (TfmDecoderForCausalLM, dict(position_embedding_type="rope", qk_norm="per_head")),
    "qk-norm-projection": (TfmDecoderForCausalLM, dict(position_embedding_type="rope", qk_norm="projection")),
    "moe-shared-expert": (
        TfmDecoderForCausalLM,
        dict(
            position_embedding_type="rope",
            num_experts=4,
            num_experts_per_tok=2,
            hidden_act="silu",
            ffn_type="glu",
            shared_expert_intermediate_size=48,
        ),
    ),
    "encoder": (TfmEncoderForMaskedLM, dict(config_class=TfmEncoderConfig)),
    "encoder-decoder": (
        TfmEncoderDecoderForConditionalGeneration,
        dict(config_class=TfmEncoderDecoderConfig, decoder_start_token_id=0, ffn_type="glu", hidden_act="silu"),
    ),
}


def build(name: str) -> torch.nn.Module:
    model_class, fields = CONFIGS[name]
    fields = dict(fields)
    config_class = fields.pop("config_class", None)
    config = tiny_config(config_class, **fields) if config_class else tiny_config(**fields)
    torch.manual_seed(0)
    return perturb(model_class(config), scale=0.5).eval()


def fusing_modules(model) -> list[FusingModule]:
    return [module for module in model.modules() if isinstance(module, FusingModule) and module.fusable]


def logits(model, grad: bool = False) -> torch.Tensor:
    with torch.set_grad_enabled(grad):
        return model(**padded_inputs(model)).logits.detach()


@pytest.mark.parametrize("name", CONFIGS)
def test_fused_inference_computes_the_separate_layers_numbers(name):
    model = build(name)
    separate = logits(model, grad=True)  # gradients on: the layers run one by one
    assert all(module.fused is None for module in fusing_modules(model))
    # one matmul where there were two or three: equal up to fp32 rounding (bit for bit at most shapes on CPU)
    torch.testing.assert_close(logits(model), separate, rtol=0, atol=1e-5)
    modules = fusing_modules(model)
    assert modules and all(module.fused is not None for module in modules)
    for module in modules:  # the parameters are views of the fused tensor: no second copy of the weights
        first = getattr(module, module.fusable[0]).weight
        assert first.data_ptr() == module.fused.weight.data_ptr()
    if model.can_generate():
        ids = padded_inputs(model)["input_ids"]
        greedy = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False)
        unfused = copy.deepcopy(model)
        with torch.enable_grad():  # generate() turns gradients off; the copy runs its layers separately anyway
            for module in fusing_modules(unfused):
                module.fusable = ()
            expected = unfused.generate(ids, **greedy)
        assert torch.equal(model.generate(ids, **greedy), expected)


def test_training_after_fused_inference_is_unchanged():
    model = build("llama")
    twin = copy.deepcopy(model)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, twin)]
    logits(model)  # fused, with the optimizer already holding the parameters
    for m, optimizer in zip((model, twin), optimizers):
        m.train()
        inputs = padded_inputs(m)
        m(**inputs, labels=inputs["input_ids"]).loss.backward()
        optimizer.step()
    assert all(module.fused is None for module in fusing_modules(model))  # train() released the views
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.weight.data_ptr() != attention.k_proj.weight.data_ptr() - attention.q_proj.weight.nbytes
    for (key, mine), (_, theirs) in zip(model.state_dict().items(), twin.state_dict().items()):
        assert torch.equal(mine, theirs), key


def test_a_fused_models_state_dict_shares_no_storage_and_saves(tmp_path):
    model = build("gpt2")
    expected = logits(model)
    state = model.state_dict()
    fused = [key for key in state if any(f".{name}." in key for name in ("q_proj", "k_proj", "v_proj"))]
    # savers that drop tensors sharing storage (accelerate's clean_state_dict_for_safetensors) would lose weights
    assert len({state[key].untyped_storage().data_ptr() for key in fused}) == len(fused) == 12
    model.save_pretrained(tmp_path)
    assert torch.equal(logits(TfmDecoderForCausalLM.from_pretrained(tmp_path).eval()), expected)


def test_a_dtype_move_or_a_reassigned_weight_is_followed():
    model, twin = build("llama"), build("llama")
    logits(model)
    model.to(torch.float64)
    twin.to(torch.float64)
    before = logits(model)
    torch.testing.assert_close(before, logits(twin, grad=True), rtol=0, atol=1e-12)
    assert model.model.layers[0].self_attn.fused.weight.dtype == torch.float64  # rebuilt from the moved weights
    for m in (model, twin):
        m.model.layers[1].self_attn.k_proj.weight = nn.Parameter(torch.ones(16, 32, dtype=torch.float64))
    after = logits(model)
    torch.testing.assert_close(after, logits(twin, grad=True), rtol=0, atol=1e-12)
    assert (after - before).abs().max() > 0.1


def test_fused_under_inference_mode_leaves_weights_that_train():
    model = build("llama")
    with torch.inference_mode():
        model.generate(padded_inputs(model)["input_ids"][:1], max_new_tokens=3, do_sample=False)
    assert fusing_modules(model)[0].fused is not None
    model(**padded_inputs(model)).logits.sum().backward()  # eval mode, gradients on: no inference tensor in the graph
    assert model.model.layers[0].self_attn.q_proj.weight.grad is not None


def test_adapters_keep_their_layers_unfused():
    peft = pytest.importorskip("peft")
    model = build("llama")
    adapter = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    lora = peft.get_peft_model(model, adapter)
    expected = logits(lora, grad=True)
    assert torch.equal(logits(lora), expected)  # the adapter's update is in both
    attention = [m for m in fusing_modules(lora) if "q_proj" in m.fusable]
    assert attention and all(module.fused is None for module in attention)


def test_weights_deepspeed_gathers_per_forward_stay_unfused():
    model = build("llama")
    for module in fusing_modules(model):
        for name in module.fusable:
            getattr(module, name).weight.ds_id = 0  # what ZeRO-3 marks its partitioned parameters with
    logits(model)
    assert all(module.fused is None for module in fusing_modules(model))
