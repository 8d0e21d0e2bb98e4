"""torchao quantisation through transformers' `TorchAoConfig`: int8 weight-only and int8 dynamic-activation for every
paradigm, the MoE experts' 3D weights included (hf_tfm.quantization), proved against the full-precision
model holding the same (dequantised) weights and against the reference classes quantised the same way."""

import pytest
import torch
from conftest import padded_inputs, perturb, tiny_config
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, TorchAoConfig

from hf_tfm import (
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
    TfmEncoderForSequenceClassification,
)
from hf_tfm.convert import to_tfm
from hf_tfm.quantization import (
    expert_modules,
    finish_torchao_loading,
    is_quantized,
    quantize_expert_weights,
)

quantization = pytest.importorskip("torchao.quantization", reason="torchao is in the test extras: pip install .[test]")
WEIGHT_ONLY, DYNAMIC = quantization.Int8WeightOnlyConfig, quantization.Int8DynamicActivationInt8WeightConfig

MOE = dict(position_embedding_type="rope", num_experts=4, num_experts_per_tok=2, hidden_act="silu", ffn_type="glu")
MODELS = {
    "decoder": (TfmDecoderForCausalLM, tiny_config(position_embedding_type="rope", num_key_value_heads=2)),
    "decoder-moe": (TfmDecoderForCausalLM, tiny_config(**MOE)),
    "encoder-mlm": (TfmEncoderForMaskedLM, tiny_config(TfmEncoderConfig)),
    "encoder-classifier": (TfmEncoderForSequenceClassification, tiny_config(TfmEncoderConfig, num_labels=3)),
    "encoder-decoder": (
        TfmEncoderDecoderForConditionalGeneration,
        tiny_config(TfmEncoderDecoderConfig, decoder_start_token_id=0, position_embedding_type="relative_bias"),
    ),
}


def saved(tmp_path, name: str) -> tuple[torch.nn.Module, object]:
    model_class, config = MODELS[name]
    torch.manual_seed(0)
    model = perturb(model_class(config), scale=0.1).eval()
    model.save_pretrained(tmp_path / "fp32")
    return model, tmp_path / "fp32"


def load(name: str, folder, config=None, **kwargs) -> torch.nn.Module:
    quantization = {} if config is None else {"quantization_config": TorchAoConfig(config)}
    return MODELS[name][0].from_pretrained(folder, **quantization, **kwargs).eval()


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(**padded_inputs(model)).logits


def quantized_weights(model) -> list[torch.Tensor]:
    return [parameter for parameter in model.parameters() if is_quantized(parameter)]


def dequantized_copy(quantized, fp32_folder) -> torch.nn.Module:
    """The full-precision model holding exactly the weights the quantised one computes with."""
    copy = type(quantized).from_pretrained(fp32_folder).eval()
    state = {
        name: value.dequantize() if is_quantized(value) else value for name, value in quantized.state_dict().items()
    }
    copy.load_state_dict(state)
    if expert_modules(copy):
        copy.set_experts_implementation("eager")
    return copy


@pytest.mark.parametrize("name", MODELS)
def test_int8_weight_only_quantises_every_linear_and_expert_and_computes_with_its_weights(tmp_path, name):
    fp32, folder = saved(tmp_path, name)
    model = load(name, folder, WEIGHT_ONLY())
    linears = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
    tied_head = getattr(model.get_output_embeddings(), "weight", None) is model.get_input_embeddings().weight
    expected = len(linears) - tied_head + 2 * len(expert_modules(model))  # a tied head is the token table: fp32
    assert len(quantized_weights(model)) == expected > 0
    assert all(type(weight).__name__ == "Int8Tensor" for weight in quantized_weights(model))
    torch.testing.assert_close(logits(model), logits(dequantized_copy(model, folder)), rtol=0, atol=1e-4)
    assert 0 < (logits(model) - logits(fp32)).abs().max() < 0.1  # int8 rounding, small at this scale


@pytest.mark.parametrize("name", MODELS)
def test_int8_dynamic_activation_quantises_activations_too(tmp_path, name):
    fp32, folder = saved(tmp_path, name)
    model = load(name, folder, DYNAMIC())
    weight_only = load(name, folder, WEIGHT_ONLY())
    weights = quantized_weights(model)
    assert len(weights) == len(quantized_weights(weight_only)) > 0
    assert all(weight.act_quant_kwargs is not None for weight in weights)  # each matmul quantises its input per token
    assert (logits(model) - logits(weight_only)).abs().max() > 1e-4  # the activations' rounding shows
    assert (logits(model) - logits(fp32)).abs().max() < 0.1


@pytest.mark.parametrize("config", [WEIGHT_ONLY, DYNAMIC])
@pytest.mark.parametrize("name", ["decoder-moe", "encoder-decoder", "encoder-classifier"])
def test_a_quantised_model_saves_and_reloads_exactly(tmp_path, name, config):
    _, folder = saved(tmp_path, name)
    model = load(name, folder, config())
    model.save_pretrained(tmp_path / "int8")
    again = load(name, tmp_path / "int8")
    assert again.config.quantization_config.quant_method == "torchao"
    assert list(map(type, quantized_weights(again))) == list(map(type, quantized_weights(model)))
    assert torch.equal(logits(again), logits(model))
    if model.config.is_encoder_decoder or name == "decoder-moe":
        ids = padded_inputs(model)["input_ids"][:1]
        greedy = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False)
        assert torch.equal(again.generate(ids, **greedy), model.generate(ids, **greedy))


def test_quantised_experts_run_the_eager_loop(tmp_path):
    _, folder = saved(tmp_path, "decoder-moe")
    plain = load("decoder-moe", folder, experts_implementation="grouped_mm")
    assert plain.config._experts_implementation == "grouped_mm"
    quantized = load("decoder-moe", folder, WEIGHT_ONLY(), experts_implementation="grouped_mm")
    assert quantized.config._experts_implementation == "eager"  # torchao's int8 tensors have no batched matmul


def test_experts_listed_in_modules_to_not_convert_stay_full_precision(tmp_path):
    _, folder = saved(tmp_path, "decoder-moe")
    config = TorchAoConfig(WEIGHT_ONLY(), modules_to_not_convert=["experts"])
    model = TfmDecoderForCausalLM.from_pretrained(folder, quantization_config=config)
    assert not any(is_quantized(module.gate_up_proj) for module in expert_modules(model).values())
    assert is_quantized(model.model.layers[0].self_attn.q_proj.weight)
    assert model.config._experts_implementation == "grouped_mm"


def test_a_configuration_torchao_cannot_apply_is_refused_naming_the_module(tmp_path):
    _, folder = saved(tmp_path, "decoder")
    # torchao skips int4 weights whose in_features (32 here) is not a multiple of group_size, with a log line only
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj \(weight \[32, 32\]\).*group_size"):
        load("decoder", folder, quantization.Int4WeightOnlyConfig())
    model = TfmDecoderForCausalLM(tiny_config(**MOE))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts: .*IntxWeightOnlyConfig.*2-d and 4-d"):
        quantize_expert_weights(model, quantization.IntxWeightOnlyConfig())


REFERENCES = {
    "llama": (
        LlamaForCausalLM,
        LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
        to_tfm,
    ),
    "mixtral": (
        MixtralForCausalLM,
        MixtralConfig(
            vocab_size=97,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=4,
        ),
        to_tfm,
    ),
}


@pytest.mark.parametrize("config", [WEIGHT_ONLY, DYNAMIC])
@pytest.mark.parametrize("name", REFERENCES)
def test_quantised_like_the_reference_class_quantised_the_same_way(tmp_path, name, config):
    reference_class, reference_config, convert = REFERENCES[name]
    torch.manual_seed(0)
    reference = perturb(reference_class(reference_config), scale=0.1)
    reference.save_pretrained(tmp_path / "reference")
    convert(reference).save_pretrained(tmp_path / "ours")
    reference = reference_class.from_pretrained(tmp_path / "reference", quantization_config=TorchAoConfig(config()))
    finish_torchao_loading(reference)  # transformers quantises Linear weights only: its experts, as hf_tfm does
    ours = TfmDecoderForCausalLM.from_pretrained(tmp_path / "ours", quantization_config=TorchAoConfig(config()))
    assert len(quantized_weights(ours)) == len(quantized_weights(reference)) > 0
    ids = torch.randint(3, 97, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, reference(ids).logits, rtol=0, atol=1e-5)
