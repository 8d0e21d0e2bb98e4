"""torchao and bitsandbytes quantisation of the MoE experts' 3D weights, after `from_pretrained` quantised the Linear
layers.

`from_pretrained(..., quantization_config=TorchAoConfig(Int8WeightOnlyConfig()))` quantises every `nn.Linear` weight as
transformers loads it, and nothing else: the experts' fused `gate_up_proj [E, 2I, H]` (`up_proj [E, I, H]` for ungated
experts) and `down_proj [E, H, I]` (most of an MoE model's bytes) would stay in full precision, silently. The models
hand over to `finish_torchao_loading` after every load (`hf_tfm.model_hooks`), which quantises them with the same
torchao configuration, through torchao's parameter quantisation (`FqnToConfig`), so the expert weights become the
tensor subclass the Linear layers hold.

`BitsAndBytesConfig(load_in_4bit=True)` (QLoRA's loading) leaves them in full precision the same way: after a load,
`finish_bitsandbytes_loading` quantises them with the same 4-bit type and statistics through bitsandbytes' parameter
quantisation (`replace_parameter_4bit`: packed 4-bit storage, dequantised when a forward reads the weight). 8-bit
has no such path, and an 8-bit load of an MoE model is refused unless the experts are named to stay full precision.
"""

import torch
from torch import nn
from torch.nn.utils import parametrize


def expert_weights(module: nn.Module) -> list[str]:
    """The names of `module`'s fused 3D expert weights: gated experts' `gate_up_proj` or ungated ones' `up_proj`,
    and `down_proj`; [] for any other module (a dense feed-forward's `up_proj` is a Linear layer)."""
    candidates = ("gate_up_proj", "up_proj", "down_proj")
    names = [name for name in candidates if getattr(getattr(module, name, None), "ndim", 0) == 3]
    return names if len(names) == 2 and names[-1] == "down_proj" else []


def expert_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Modules holding fused 3D expert weights (hf_tfm's `TfmExperts`, transformers' Mixtral-style ones), by name."""
    return {name: module for name, module in model.named_modules() if expert_weights(module)}


def is_quantized(weight: torch.Tensor) -> bool:
    return type(weight) not in (nn.Parameter, torch.Tensor)  # torchao's weights are tensor subclasses


def experts_quantized(module: nn.Module) -> bool:
    """Whether every expert weight of `module` is quantised: a torchao tensor, or stored packed by bitsandbytes (a
    parametrisation that dequantises it when read)."""
    return all(
        parametrize.is_parametrized(module, weight) or is_quantized(getattr(module, weight))
        for weight in expert_weights(module)
    )


def quantize_expert_weights(model: nn.Module, quant_type, skip=()) -> None:
    """Quantise every expert module's 3D weights with the torchao configuration `quant_type` (torchao's parameter
    quantisation, keyed by parameter name), except modules whose name contains an entry of `skip` and weights already
    quantised. transformers quantises only `nn.Linear` weights: the experts, most of an MoE model's bytes, would stay
    in full precision, silently. A configuration torchao cannot apply to a parameter is refused naming the module."""
    from torchao.quantization import FqnToConfig, quantize_

    for name, module in expert_modules(model).items():
        if any(entry in name for entry in skip or ()) or experts_quantized(module):
            continue
        reason = "torchao skipped them"  # as it skips shapes its kernels cannot take, with a log line only
        try:
            quantize_(module, FqnToConfig({weight: quant_type for weight in expert_weights(module)}), filter_fn=None)
        except (NotImplementedError, AssertionError, ValueError) as error:
            reason = str(error)
        if not experts_quantized(module):
            raise ValueError(
                f"{name}: torchao's {type(quant_type).__name__} cannot quantise the experts' 3D weights "
                f"{expert_weights(module)} ({reason}). Use Int8WeightOnlyConfig or "
                "Int8DynamicActivationInt8WeightConfig, or keep the experts in full precision with "
                "TorchAoConfig(..., modules_to_not_convert=['experts'])."
            )


def unquantized_linears(model: nn.Module, quantizer) -> list[str]:
    """Linear layers the quantiser was to quantise that still hold full-precision weights: torchao skips, with a log
    line only, shapes its kernels cannot take. A head tied to the token table is the table, which stays."""
    tied = model.get_input_embeddings().weight
    return [
        f"{name} (weight {list(module.weight.shape)})"
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and not is_quantized(module.weight)
        and module.weight is not tied
        and quantizer.param_needs_quantization(model, f"{name}.weight")
    ]


def finish_torchao_loading(model: nn.Module) -> None:
    """After `from_pretrained` with a torchao quantisation config: quantise the experts as the Linear layers were, run
    quantised experts in the eager loop (torchao's int8 tensors support indexing one expert and `F.linear`, not the
    batched backends), and refuse a model that torchao left partly unquantised, naming the layers."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or quantizer.quantization_config.quant_method != "torchao":
        return
    from torchao.quantization import FqnToConfig

    quant_type = quantizer.quantization_config.get_apply_tensor_subclass()
    if not isinstance(quant_type, FqnToConfig):  # a per-name plan is the user's own: transformers applied it
        quantize_expert_weights(model, quant_type, quantizer.quantization_config.modules_to_not_convert)
        skipped = unquantized_linears(model, quantizer)
        if skipped:
            raise ValueError(
                f"torchao's {type(quant_type).__name__} left {len(skipped)} Linear layers unquantised, first "
                f"{skipped[0]}: torchao skips weights its kernels cannot take. Choose a configuration that fits these "
                f"shapes (for int4, a group_size dividing in_features) or list the layers in "
                f"TorchAoConfig(..., modules_to_not_convert=[...])."
            )
    if any(experts_quantized(module) for module in expert_modules(model).values()):
        model.set_experts_implementation("eager")


def finish_bitsandbytes_loading(model: nn.Module) -> None:
    """After `from_pretrained` with a bitsandbytes configuration: 4-bit quantises the experts as the Linear layers
    were (`quantize_experts_4bit`); 8-bit, which bitsandbytes cannot apply to a 3D weight, is refused for a model
    with experts unless `llm_int8_skip_modules` names them."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or quantizer.quantization_config.quant_method != "bitsandbytes":
        return
    config = quantizer.quantization_config
    skip = config.llm_int8_skip_modules or ()
    experts = [name for name in expert_modules(model) if not any(entry in name for entry in skip)]
    if config.load_in_4bit:
        quantize_experts_4bit(model, config)
    elif experts:
        raise ValueError(
            f"{experts[0]}: bitsandbytes' 8-bit quantises Linear layers only, and the experts' 3D weights "
            f"{expert_weights(model.get_submodule(experts[0]))} (most of the model's bytes) would stay in full "
            "precision. Load in 4-bit (BitsAndBytesConfig(load_in_4bit=True) quantises the experts too), or keep "
            "them in full precision explicitly: BitsAndBytesConfig(load_in_8bit=True, "
            "llm_int8_skip_modules=['experts'])."
        )


def quantize_experts_4bit(model: nn.Module, config) -> None:
    """Quantise every expert module's 3D weights with the 4-bit type and statistics of the `BitsAndBytesConfig`
    `config` (bitsandbytes' `replace_parameter_4bit`), except modules whose name contains an entry of its
    `llm_int8_skip_modules` and weights already quantised. Works on the reference classes' experts as well."""
    from bitsandbytes.nn.parametrize import replace_parameter_4bit

    for name, module in expert_modules(model).items():
        if any(entry in name for entry in config.llm_int8_skip_modules or ()) or experts_quantized(module):
            continue
        for weight in expert_weights(module):
            replace_parameter_4bit(
                module,
                weight,
                compress_statistics=config.bnb_4bit_use_double_quant,
                quant_type=config.bnb_4bit_quant_type,
            )


def refuse_unloadable_experts(model: nn.Module) -> None:
    """Before a save: experts stored 4-bit by bitsandbytes would be written packed, and transformers can load packed
    4-bit weights into Linear layers only, so the checkpoint could not be loaded back. Refused before anything is
    written, naming what to save instead."""
    packed = [name for name, module in expert_modules(model).items() if parametrize.is_parametrized(module)]
    if packed:
        raise ValueError(
            f"{packed[0]}: the experts are stored 4-bit by bitsandbytes (a QLoRA load), and transformers cannot load "
            "such experts back. Save the adapter instead (a PeftModel's save_pretrained writes only the adapter), "
            "or save the full-precision model the 4-bit one was loaded from."
        )
