"""Joint projections (modeling_tfm_layers.joint_projections): in a training step under autocast to another dtype
than the weights', attention's q/k/v and a GLU's gate/up run as one matmul over their concatenated weights, with the
separate layers' loss and gradients up to fp32 rounding; without gradients, with the weights already in the matmul's
dtype (the joined weight would be a copy held for backward), and for a layer that must be called (an adapter, a hooked
or gathered layer), each layer runs on its own. The parameters are the layers' own throughout, so checkpoints saved
before the change load and give the logits they gave then."""

from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import padded_inputs, perturb, tiny_config

from hf_tfm import (
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
)
from hf_tfm.model import modeling_tfm_layers
from hf_tfm.model.modeling_tfm_layers import joint_projections, reads_its_weight

CHECKPOINT = Path(__file__).parent / "data" / "checkpoint-before-joint-projections"

CONFIGS = {
    "llama": (TfmDecoderForCausalLM, dict(position_embedding_type="rope", num_key_value_heads=2, ffn_type="glu")),
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
    fields = dict(fields, loss_chunk_size=0)  # the logits, so that both paths are compared on them too
    config_class = fields.pop("config_class", None)
    config = tiny_config(config_class, **fields) if config_class else tiny_config(**fields)
    torch.manual_seed(0)
    return perturb(model_class(config), scale=0.5).train()


def step(model, autocast: bool = False) -> tuple[torch.Tensor, dict]:
    """A training forward and backward without dropout, under bf16 autocast if asked (fp32 weights, bf16 matmuls:
    where the projections join): the logits and every parameter's gradient."""
    model.zero_grad()
    inputs = padded_inputs(model)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        output = model(**inputs, labels=inputs.get("decoder_input_ids", inputs["input_ids"]).contiguous())
    output.loss.backward()
    return output.logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def joined_calls(model, monkeypatch, run=None) -> list[int]:
    """Runs of the joint matmul (as the number of layers it joined) while `model` trains one step (or does `run`)."""
    calls = []
    cat = torch.cat

    def counting_cat(tensors, *args, **kwargs):
        if all(isinstance(tensor, torch.nn.Parameter) for tensor in tensors):  # weights joined, not activations
            calls.append(len(tensors))
        return cat(tensors, *args, **kwargs)

    monkeypatch.setattr(modeling_tfm_layers.torch, "cat", counting_cat)
    (run or step)(model)
    monkeypatch.setattr(modeling_tfm_layers.torch, "cat", cat)
    return calls


@pytest.mark.parametrize("name", CONFIGS)
def test_a_joint_training_step_computes_the_separate_layers_numbers(name, monkeypatch):
    model = build(name)
    for module in model.modules():  # dropout off: both steps see the same function
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    assert joined_calls(model, monkeypatch, partial(step, autocast=True)), "no projection was joined"
    # the joint path in fp32 too (as if the matmuls ran in another dtype), so that both compare at fp32 rounding
    monkeypatch.setattr(modeling_tfm_layers, "compute_dtype", lambda tensor: torch.bfloat16)
    assert joined_calls(model, monkeypatch)
    joint_logits, joint_grads = step(model)
    monkeypatch.setattr(modeling_tfm_layers, "reads_its_weight", lambda layer: False)  # every layer on its own
    assert not joined_calls(model, monkeypatch)
    separate_logits, separate_grads = step(model)
    torch.testing.assert_close(joint_logits, separate_logits, rtol=0, atol=1e-5)
    assert sorted(joint_grads) == sorted(separate_grads)
    for key, grad in separate_grads.items():
        torch.testing.assert_close(joint_grads[key], grad, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16])
def test_weights_in_the_matmul_dtype_run_each_layer_on_its_own(weights, monkeypatch):
    """fp32 weights without autocast, bf16 weights with it: the matmul reads the parameters as they are, which the
    separate layers save for backward; a joined weight would be a copy of them held until then."""
    model = build("llama").to(weights)
    assert joined_calls(model, monkeypatch, lambda model: step(model, autocast=weights == torch.bfloat16)) == []


def test_inference_runs_each_layer_on_its_own(monkeypatch):
    """No gradients (evaluation, generate()): concatenating the weights at every decode step would copy them per
    token; the layers run as they are, as Llama's do."""
    model = build("llama").eval()

    def evaluate(model):
        with torch.no_grad():
            model(**padded_inputs(model))

    assert joined_calls(model, monkeypatch, evaluate) == []


def test_layers_that_must_be_called_run_on_their_own():
    layer = torch.nn.Linear(4, 4)
    assert reads_its_weight(layer)
    hooked = torch.nn.Linear(4, 4)
    hooked.register_forward_hook(lambda *args: None)  # ZeRO-3 gathers, offloading moves, a user watches
    offloaded = torch.nn.Linear(4, 4)
    offloaded._hf_hook = object()  # accelerate's hook replaces forward rather than registering one
    assert not reads_its_weight(hooked) and not reads_its_weight(offloaded)
    seen = []
    hooked.register_forward_hook(lambda module, args, output: seen.append(output))
    outputs = joint_projections(torch.randn(2, 4), [layer, hooked])
    assert len(seen) == 1 and torch.equal(outputs[1], seen[0])  # the hooked layer was called


def test_adapters_run_their_layers():
    peft = pytest.importorskip("peft")
    model = build("llama")
    adapter = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    lora = peft.get_peft_model(model, adapter)
    attention = lora.base_model.model.model.layers[0].self_attn
    assert not reads_its_weight(attention.q_proj) and reads_its_weight(attention.k_proj)
    _, grads = step(lora)
    assert any("lora_A" in key for key in grads)  # the adapter trains: its layer was called


def test_a_checkpoint_saved_before_the_change_loads_with_its_logits():
    """Saved (tests/data) by the code that fused q/k/v and gate/up through parameter views at inference: the same
    parameters load, and give the logits that code computed, within fp32 rounding of a joint matmul."""
    model = TfmDecoderForCausalLM.from_pretrained(CHECKPOINT).eval()
    expected = torch.load(CHECKPOINT / "expected_logits.pt")
    with torch.no_grad():
        logits = model(**padded_inputs(model)).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)


def saved_for_backward_bytes(model, autocast: bool, run=None) -> int:
    """The bytes a training step (`step`, or `run(model)`) keeps for its backward pass beyond the parameters (unique
    storages)."""
    parameters = {parameter.untyped_storage().data_ptr() for parameter in model.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        (run or partial(step, autocast=autocast))(model)
    return sum(saved.values())


@pytest.mark.parametrize(
    ("weights", "autocast"), [(torch.bfloat16, False), (torch.bfloat16, True), (torch.float32, False)]
)
def test_a_step_in_the_weights_dtype_saves_what_the_separate_layers_save(weights, autocast, monkeypatch):
    """With the matmuls in the weights' own dtype a joined weight would be a copy of them kept for backward (the
    separate layers keep the parameters themselves): the step saves exactly the separate layers' bytes. The control:
    joined anyway, it saves more."""
    model = build("llama").to(weights)
    joint = saved_for_backward_bytes(model, autocast)
    monkeypatch.setattr(modeling_tfm_layers, "reads_its_weight", lambda layer: False)  # every layer on its own
    assert joint == saved_for_backward_bytes(model, autocast)
    monkeypatch.undo()
    monkeypatch.setattr(modeling_tfm_layers, "compute_dtype", lambda tensor: torch.float64)  # joined regardless
    assert saved_for_backward_bytes(model, autocast) > joint


def test_a_rope_step_without_a_cache_keeps_no_joint_output():
    """Joined (fp32 weights under bf16 autocast), RoPE makes new query and key tensors while the value views the
    joint q/k/v output, and sdpa's flash kernel keeps the tensors it is given: a copy of the value lets that output
    go. So a step given labels, which builds no cache, keeps for backward what the same step with a cache keeps (the
    cache's copies of keys and values let it go too); without the value's copy it kept the whole joint output."""
    torch.manual_seed(0)
    model = perturb(TfmDecoderForCausalLM(tiny_config(position_embedding_type="rope", loss_chunk_size=0)), 0.5).train()
    input_ids = torch.randint(3, 90, (2, 16))  # no padding: no mask, so the CPU's sdpa runs its flash kernel

    def forward(model, **kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=input_ids, labels=input_ids, **kwargs)

    with_cache = saved_for_backward_bytes(model, True, partial(forward, use_cache=True))
    assert saved_for_backward_bytes(model, True, forward) == with_cache
    with pytest.MonkeyPatch.context() as patch:  # the projections did join
        assert joined_calls(model, patch, forward)
