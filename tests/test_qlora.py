"""QLoRA: bitsandbytes 4-bit loading (`BitsAndBytesConfig(load_in_4bit=True)`, its CPU backend) on every paradigm,
the MoE experts' 3D weights quantised too (hf_tfm.quantization), proved against the reference classes loaded the same
way with their experts treated alike, and trained with peft's `prepare_model_for_kbit_training` + LoRA.

transformers' bitsandbytes integration quantises `nn.Linear` layers only, so a Mixtral-shaped model would keep its
experts, most of its bytes, in full precision; hf_tfm quantises them after the load with bitsandbytes' parameter
quantisation and the configuration's 4-bit type. 8-bit has no such path and is refused for an MoE model unless the
experts are named to stay full precision. Memory of the loaded models: `test_memory_of_the_loaded_models` prints it
(pytest -s), the figures are in docs/serving.md."""

import pytest
import torch
from conftest import padded_inputs
from support.families import tiny_reference
from torch.nn.utils import parametrize
from transformers import BitsAndBytesConfig

from hf_tfm.convert import to_tfm
from hf_tfm.quantization import expert_modules, quantize_experts_4bit

bitsandbytes = pytest.importorskip("bitsandbytes", reason="bitsandbytes is in the test extras: pip install .[test]")
peft = pytest.importorskip("peft")

FOUR_BIT = dict(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32)
# a reference family per paradigm, and one with experts
FAMILIES = ["llama", "mixtral", "bert", "t5", "bart"]
# bitsandbytes' CPU kernels take a 4-bit Linear layer of 64 input features or more (the family records' tiny width,
# 32, fails inside bitsandbytes, for the reference classes as for hf_tfm's)
WIDER = {"llama": dict(hidden_size=64), "mixtral": dict(hidden_size=64), "bert": dict(hidden_size=64)}
WIDER |= {"t5": dict(d_model=64), "bart": dict(d_model=64)}
# T5's reference keeps its feed-forward output layer (`wo`) in full precision (`_keep_in_fp32_modules`), which
# transformers' bitsandbytes loading leaves unquantised; hf_tfm has no such rule: named to stay, as a user would
SAME_TREATMENT = {"t5": dict(llm_int8_skip_modules=["down_proj", "lm_head"])}


def saved_pair(tmp_path, name: str):
    """(the reference folder, hf_tfm's folder) holding the same full-precision weights, and the reference class."""
    reference = tiny_reference(name, **WIDER[name])
    reference.save_pretrained(tmp_path / "reference")
    ours = to_tfm(reference)
    ours.save_pretrained(tmp_path / "ours")
    return tmp_path / "reference", tmp_path / "ours", type(reference), type(ours)


def load_4bit(model_class, folder, **fields):
    return model_class.from_pretrained(folder, quantization_config=BitsAndBytesConfig(**FOUR_BIT, **fields)).eval()


def packed_experts(model) -> list[str]:
    return [name for name, module in expert_modules(model).items() if parametrize.is_parametrized(module)]


def four_bit_linears(model) -> int:
    return sum(isinstance(module, bitsandbytes.nn.Linear4bit) for module in model.modules())


@pytest.mark.parametrize("name", FAMILIES)
def test_four_bit_logits_equal_the_reference_class_loaded_the_same_way(tmp_path, name):
    reference_folder, our_folder, reference_class, our_class = saved_pair(tmp_path, name)
    reference = load_4bit(reference_class, reference_folder)
    quantize_experts_4bit(reference, reference.config.quantization_config)  # its experts as hf_tfm treats its own
    ours = load_4bit(our_class, our_folder, **SAME_TREATMENT.get(name, {}))
    assert four_bit_linears(ours) == four_bit_linears(reference) > 0
    assert len(packed_experts(ours)) == len(packed_experts(reference)) == (2 if name == "mixtral" else 0)
    inputs = padded_inputs(ours)
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs).logits, reference(**inputs).logits, rtol=0, atol=1e-5)


def test_experts_are_quantised_with_the_configured_type_or_kept_full_precision_on_request(tmp_path):
    _, folder, _, our_class = saved_pair(tmp_path, "mixtral")
    ours = load_4bit(our_class, folder, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    assert packed_experts(ours) == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    experts = ours.model.layers[0].mlp.experts
    storage = experts.parametrizations.gate_up_proj
    assert storage.original.dtype == torch.uint8
    assert storage[0].quant_state.quant_type == "nf4" and storage[0].quant_state.nested  # double quantisation
    assert experts.gate_up_proj.shape == (4, 2 * ours.config.moe_intermediate_size, ours.config.hidden_size)
    kept = load_4bit(our_class, folder, llm_int8_skip_modules=["experts"])
    assert packed_experts(kept) == [] and four_bit_linears(kept) == four_bit_linears(ours)


def test_eight_bit_refuses_experts_it_would_leave_full_precision(tmp_path):
    _, folder, _, our_class = saved_pair(tmp_path, "mixtral")
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.experts: .*8-bit.*llm_int8_skip_modules=\['experts'\]"):
        our_class.from_pretrained(folder, quantization_config=BitsAndBytesConfig(load_in_8bit=True))
    kept = our_class.from_pretrained(
        folder, quantization_config=BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=["experts"])
    )
    assert any(isinstance(module, bitsandbytes.nn.Linear8bitLt) for module in kept.modules())


def test_a_model_with_four_bit_experts_refuses_to_save_before_writing(tmp_path):
    _, folder, _, our_class = saved_pair(tmp_path, "mixtral")
    ours = load_4bit(our_class, folder)
    with pytest.raises(ValueError, match="experts are stored 4-bit.*Save the adapter"):
        ours.save_pretrained(tmp_path / "four-bit")
    assert not (tmp_path / "four-bit").exists()


def test_memory_of_the_loaded_models(tmp_path):
    """The experts' bytes are what 4-bit loading must shrink in an MoE model: hf_tfm's 4-bit Mixtral-shaped model
    holds less than half of what the reference class holds when loaded the same way (experts full precision)."""
    reference_folder, our_folder, reference_class, our_class = saved_pair(tmp_path, "mixtral")
    full = our_class.from_pretrained(our_folder).get_memory_footprint()
    reference = load_4bit(reference_class, reference_folder).get_memory_footprint()
    ours = load_4bit(our_class, our_folder).get_memory_footprint()
    print(f"\nMixtral-shaped tiny model: float32 {full} B, reference 4-bit {reference} B, hf_tfm 4-bit {ours} B")
    assert ours < reference / 2 < full


def lora_step_inputs(model, name: str) -> dict:
    inputs = padded_inputs(model)
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    if name in ("t5", "bart"):
        return {**inputs, "labels": labels[:, :4], "decoder_input_ids": None}
    return {**inputs, "labels": labels}


@pytest.mark.parametrize("name", FAMILIES)
def test_qlora_trains_the_adapter_alone_on_every_paradigm(tmp_path, name):
    """prepare_model_for_kbit_training (with gradient checkpointing, as peft sets it), then LoRA on the attention's
    q and v projections: 8 AdamW steps lower the loss, only the adapter's weights move, and the 4-bit base (experts
    included) stays as loaded."""
    _, folder, _, our_class = saved_pair(tmp_path, name)
    # reentrant checkpointing (peft's default) would record the router logits without autograd: hf_tfm refuses it
    checkpointing = {"use_reentrant": False}
    model = peft.prepare_model_for_kbit_training(
        load_4bit(our_class, folder), gradient_checkpointing_kwargs=checkpointing
    )
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trainable = {key: value.detach().clone() for key, value in model.named_parameters() if value.requires_grad}
    assert trainable and all("lora_" in key for key in trainable)
    frozen = {key: value.detach().clone() for key, value in model.state_dict().items() if key not in trainable}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    inputs = lora_step_inputs(model, name)
    model.train()
    losses = []
    for _ in range(8):
        loss = model(**{key: value for key, value in inputs.items() if value is not None}).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    moved = [
        key
        for key, value in model.named_parameters()
        if value.requires_grad and not torch.equal(value, trainable[key])
    ]
    assert moved
    after = model.state_dict()
    assert all(torch.equal(after[key], value) for key, value in frozen.items())
    if name == "mixtral":
        assert len(packed_experts(model)) == 2
