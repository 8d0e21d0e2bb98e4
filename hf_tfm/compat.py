"""Everything in hf_tfm that depends on which transformers (or torch) release is installed, in one table.

`TABLE` holds every version decision and every transformers internal hf_tfm touches: the model bundle's (decided in
`hf_tfm/model/compat.py`, which ships with every checkpoint as remote code), then those of the code outside it
(training, publishing, conversion). Each row says what it is, which releases need it and what replaces it; its probe
fails naming the row when a release removes or changes what it relies on (`tests/test_compat.py`, run on every minor
release by `make test-matrix`). Decisions ask the installed transformers what it does, never a version number.

Nothing else in hf_tfm imports a transformers underscore name or another model's module: where a small function of
another model was needed (T5's position buckets, Mixtral's balancing loss, BART's label shift, Llama's rotation,
Gemma 2's capped eager attention), hf_tfm owns a copy, tested against the reference in tests/test_compat.py.
"""

import functools
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import masking_utils
from transformers.distributed import DistributedConfig
from transformers.generation import GenerationMixin
from transformers.modeling_utils import PreTrainedModel
from transformers.utils.deprecation import deprecate_kwarg

from .model.compat import (  # the model bundle's decisions, under the one name the package reads
    CACHE_NAME,
    CACHE_NAMES,
    MASK_CACHE_ARGUMENT,
    TASK_NAME_TABLES,
    TOKEN_DISPATCH,
    accepts_legacy_cache_argument,
    fold_layer_numbers,
    slice_logits_to_keep,
    task_name_table,
    vllm_mla_disabled,
)

__all__ = [
    "CACHE_NAME",
    "CACHE_NAMES",
    "MASK_CACHE_ARGUMENT",
    "TABLE",
    "TOKEN_DISPATCH",
    "accelerate_refuses_context_parallel",
    "accepts_legacy_cache_argument",
    "checkpointing_argument",
    "fold_layer_numbers",
    "gpt_oss_declares_swiglu",
    "phi3_recomputes_longrope_cache",
    "switch_routes_as_switch",
    "load_trainer_checkpoint",
    "slice_logits_to_keep",
    "upload_folder",
    "vllm_mla_disabled",
]


# ---------------------------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Row:
    name: str
    what: str
    releases: str
    replaced_by: str
    probe: Callable[[], Any]  # raises, or returns a problem string, when the installed transformers breaks the row


def has_parameters(function, *names) -> str | None:
    missing = [name for name in names if name not in inspect.signature(function).parameters]
    return f"{function.__qualname__} has no parameter {', '.join(missing)}" if missing else None


def _probe_cache_field() -> str | None:
    from transformers.generation import utils as generation

    names = generation.ALL_CACHE_NAMES
    if CACHE_NAME not in names:
        return f"generate() reads the cache as one of {names}, hf_tfm returns it as {CACHE_NAME!r}"
    return has_parameters(masking_utils.create_sliding_window_causal_mask, MASK_CACHE_ARGUMENT) or has_parameters(
        deprecate_kwarg, "old_name", "version", "new_name"
    )


def _probe_experts() -> str | None:
    for name in ("_can_set_experts_implementation", "get_correct_experts_implementation", "_grouped_mm_can_dispatch"):
        if not hasattr(PreTrainedModel, name):
            return f"PreTrainedModel.{name} is gone: hf_tfm's experts backend choice is no longer asked"
    if not isinstance(inspect.getattr_static(PreTrainedModel, "_can_set_experts_implementation"), classmethod):
        return "PreTrainedModel._can_set_experts_implementation is no longer a classmethod"
    if "_grouped_mm_can_dispatch" not in inspect.getsource(PreTrainedModel.get_correct_experts_implementation):
        return "get_correct_experts_implementation no longer asks _grouped_mm_can_dispatch"
    return None


def _probe_capturing_hooks() -> str | None:
    from transformers.utils import output_capturing

    return None if callable(getattr(output_capturing, "maybe_install_capturing_hooks", None)) else "gone"


def _probe_loading_report() -> str | None:
    folded = fold_layer_numbers(["a.0.b", "a.1.b"])
    return None if folded == ["a.{0, 1}.b"] else f"update_key_name folds a.0.b, a.1.b into {folded}"


def _probe_token_dispatch() -> str | None:
    fields = DistributedConfig.__dataclass_fields__
    return None if "ep_size" in fields or "enable_expert_parallel" in fields else "no expert-parallel option"


def _probe_rope_dict() -> str | None:
    from transformers.configuration_utils import PreTrainedConfig

    for name in ("convert_rope_params_to_dict", "standardize_rope_params", "default_theta"):
        if not hasattr(PreTrainedConfig, name):
            return f"PreTrainedConfig.{name} is gone: nested RoPE dicts are no longer completed"
    return None


def _probe_task_name_tables() -> str | None:
    gone = [table for auto_name, table in TASK_NAME_TABLES.items() if task_name_table(auto_name) is None]
    return (
        f"modeling_auto has no {', '.join(gone)}: those heads are not named where tasks are looked up"
        if gone
        else None
    )


def _probe_torch_linear_cross_entropy() -> str | None:
    """hf_tfm's chunked loss stays while torch's own chunked `linear_cross_entropy` hands its vocabulary matmul the
    weights' dtype under autocast (a float32 matmul where Trainer's `bf16=True` asks for bf16)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class OperandDtypes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.dtypes = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in ("mm", "addmm") or "linear_cross_entropy" in name:
                self.dtypes |= {arg.dtype for arg in args if isinstance(arg, torch.Tensor) and arg.is_floating_point()}
            return func(*args, **(kwargs or {}))

    hidden, weight = torch.randn(16, 8, requires_grad=True), torch.randn(32, 8, requires_grad=True)
    seen = OperandDtypes()
    with seen, torch.autocast("cpu", dtype=torch.bfloat16):
        torch.nn.functional.linear_cross_entropy(
            hidden, weight, torch.arange(16), options=torch.nn.LinearCrossEntropyOptions()
        ).backward()
    if torch.bfloat16 in seen.dtypes:
        return (
            "torch's chunked linear_cross_entropy now follows autocast: measure it against hf_tfm's chunked loss "
            "(python -m benchmarks.linear_cross_entropy), which it may replace"
        )
    return None


MODEL_ROWS = [  # the decisions of the model bundle (hf_tfm/model/compat.py) and the internals it touches
    Row(
        "cache argument",
        "the cache's keyword and output field (`cache` from 5.24, `past_key_values` before): CACHE_NAME, "
        "MASK_CACHE_ARGUMENT, accepts_legacy_cache_argument (transformers' deprecate_kwarg from 5.24)",
        "5.17-5.23 pass `past_key_values`; 5.24+ `cache` (the old name is removed in 5.40)",
        "forwards take `cache` only once the lower bound reaches 5.24",
        _probe_cache_field,
    ),
    Row(
        "task tables of class names",
        "name_in_task_tables: each head class is named in transformers.models.auto.modeling_auto's table of its task "
        "(TASK_NAME_TABLES), where Trainer looks a causal LM up to shift a label-smoothed loss's labels and model "
        "cards find their task tag",
        "all",
        "nothing while Trainer and model cards tell tasks apart by class name",
        _probe_task_name_tables,
    ),
    Row(
        "GenerationMixin.prepare_inputs_for_generation",
        "TfmGenerationMixin overrides it for LongRoPE (the step that crosses the pretraining length drops the cache "
        "and passes next_sequence_length=None, the whole sequence), as Phi-3 does",
        "all",
        "nothing: the override is transformers' documented way for a model to prepare its own inputs",
        lambda: has_parameters(GenerationMixin.prepare_inputs_for_generation, "input_ids", "next_sequence_length"),
    ),
    Row(
        "slice_logits_to_keep",
        "transformers.modeling_utils.slice_logits_to_keep, copied for releases that lack it",
        "5.17-5.20 (added in 5.21)",
        "the import alone once the lower bound reaches 5.21",
        lambda: None,
    ),
    Row(
        "PreTrainedModel.mark_tied_weights_as_initialized",
        "TfmLoadingMixin overrides it so that a tied source the checkpoint lacks (an encoder-decoder's `shared`, one "
        "module under three names) stays missing and is initialised, as T5 reports its own",
        "all (5.17+ call it from _finalize_model_loading)",
        "nothing while transformers marks tied parameters by object",
        lambda: has_parameters(PreTrainedModel.mark_tied_weights_as_initialized, "loading_info"),
    ),
    Row(
        "PreTrainedModel.get_correct_attn_implementation",
        "overridden to ask the capabilities table (capabilities.py) of every backend a model is built with, loaded "
        "with or switched to, and to default to eager where sdpa cannot run the config",
        "all",
        "a public backend-capability hook, if transformers adds one",
        lambda: has_parameters(
            PreTrainedModel.get_correct_attn_implementation, "requested_attention", "is_init_check"
        ),
    ),
    Row(
        "PreTrainedModel._can_set_experts_implementation",
        "a classmethod answering True for every hf_tfm class (any config can have experts): transformers' own greps "
        "the class's file for the experts decorator, which hf_tfm's heads do not hold; and _grouped_mm_can_dispatch, "
        "which refuses expert widths torch's grouped matmul cannot run (capabilities.experts_refusal), so the "
        "default backend is eager for them and a request by name names the field",
        "all",
        "a public flag for 'this class can have experts'",
        _probe_experts,
    ),
    Row(
        "output_capturing.maybe_install_capturing_hooks",
        "installs the router-logit capture hooks in train(), outside any compiled graph (transformers installs "
        "them on first use under a lock dynamo cannot trace)",
        "all",
        "capture hooks installed at construction",
        _probe_capturing_hooks,
    ),
    Row(
        "loading_report.update_key_name",
        "fold_layer_numbers: layer numbers folded in the weights a loading error lists (modeling_tfm_loading)",
        "all",
        "a local folding function",
        _probe_loading_report,
    ),
    Row(
        "DistributedConfig expert parallelism",
        "TOKEN_DISPATCH: `ep_size` with token dispatch (5.21+) or `enable_expert_parallel` with router masking",
        "5.17-5.20 router masking; 5.21+ token dispatch",
        "token dispatch alone once the lower bound reaches 5.21",
        _probe_token_dispatch,
    ),
    Row(
        "PreTrainedConfig.convert_rope_params_to_dict",
        "nested_rope_params_to_dict: a RoPE dict per layer type gets its defaults per entry (5.17 fails to validate "
        "the nest it completes itself)",
        "5.17 (later releases complete nested dicts themselves)",
        "transformers' own conversion once the lower bound completes nested dicts",
        _probe_rope_dict,
    ),
    Row(
        "torch.nn.functional.linear_cross_entropy (not used)",
        "the LM head trains with its own chunked loss (modeling_tfm_lm_head.ChunkedLinearCrossEntropy), not torch's: "
        "torch's chunked operator runs outside autocast (a float32 vocabulary matmul under bf16 autocast), sums "
        "a bf16 loss in bf16 on the CPU, and has no soft cap, input scale, bias after the matmul or padded rows "
        "(benchmarks/linear_cross_entropy.py measures it)",
        "torch 2.13 and later (hf_tfm's lower bound; 2.13 has the operator)",
        "torch's operator where it follows autocast and matches the reference's rounding",
        _probe_torch_linear_cross_entropy,
    ),
]


# -------------------------------------------------------------------------------------- the rest of the package


def upload_folder(model, folder, repo_id: str, *, token=None, keep_hub_card: bool = False, **commit):
    """Upload every file of `folder` to `repo_id` in one commit, as transformers' push_to_hub does it (its private
    `_upload_modified_files`: one create_commit, an error at once when the Hub refuses it; huggingface_hub's public
    `upload_folder` retries a refused commit instead). The README is left out when the Hub's card is kept."""
    skip = {"README.md": float("inf")} if keep_hub_card else {}  # a file is uploaded when newer than its entry here
    return model._upload_modified_files(folder, repo_id, files_timestamps=skip, token=token, **commit)


def checkpointing_argument(enabled: bool) -> dict:
    """TrainingArguments' activation checkpointing switch: `activation_checkpointing` from transformers 5.23 (the old
    `gradient_checkpointing` warns there), `gradient_checkpointing` before."""
    from transformers import TrainingArguments

    fields = TrainingArguments.__dataclass_fields__
    return {"activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing": enabled}


def load_trainer_checkpoint(trainer, checkpoint: str) -> None:
    """Load a Trainer checkpoint's weights into `trainer.model` without training (a run resumed at its last step).
    transformers has no public call for it; `Trainer._load_from_checkpoint` is what `train(resume_from_checkpoint=)`
    uses."""
    trainer._load_from_checkpoint(checkpoint)


# GPT-OSS's experts clamp and scale their SwiGLU by `swiglu_limit` and `swiglu_alpha`. Newer GptOssConfig declares
# both; older releases (5.17 among them) have no such fields and fix them in the experts at these values.
GPT_OSS_FIXED_SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}


@functools.cache
def gpt_oss_declares_swiglu() -> bool:
    import transformers

    return "swiglu_limit" in transformers.GptOssConfig.__dataclass_fields__


@functools.cache
def switch_routes_as_switch() -> bool:
    """Whether the installed SwitchTransformers' router returns (dispatch mask, top probability, router logits) with
    the capacity applied per sequence, as Switch Transformer routes: asked of its router on a two-token sequence with
    room for one token per expert (5.17's returns max probabilities as its logits and applies no capacity)."""
    import torch
    from transformers import SwitchTransformersConfig
    from transformers.models.switch_transformers import modeling_switch_transformers as switch

    config = SwitchTransformersConfig(d_model=2, num_experts=2, expert_capacity=1, router_jitter_noise=0.0)
    router = switch.SwitchTransformersTop1Router(config)
    with torch.no_grad():
        router.classifier.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        hidden = torch.tensor([[[2.0, 0.0], [3.0, 0.0]]])  # both tokens choose expert 0; it has room for one
        dispatch, _, logits = router(hidden)
    return tuple(logits.shape) == (1, 2, 2) and dispatch[0].tolist() == [[1, 0], [0, 0]]


@functools.cache
def phi3_recomputes_longrope_cache() -> bool:
    """Whether the installed Phi-3 feeds the whole sequence, without a cache, to the generation step on which LongRoPE
    turns to its long factors, as hf_tfm does: asked of its `prepare_inputs_for_generation` with two cached tokens
    and a third past a pretraining length of two (5.17-5.19 drop the cache there but feed the new token alone)."""
    import torch
    from transformers import Phi3Config, Phi3ForCausalLM
    from transformers.cache_utils import DynamicCache

    rope = dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0], long_factor=[2.0])
    config = Phi3Config(
        vocab_size=8, hidden_size=4, intermediate_size=4, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=4, original_max_position_embeddings=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rope_parameters=rope,
    )  # fmt: skip
    cache = DynamicCache()
    cache.update(torch.zeros(1, 2, 2, 2), torch.zeros(1, 2, 2, 2), 0)
    input_ids = torch.zeros(1, 3, dtype=torch.long)
    inputs = Phi3ForCausalLM(config).prepare_inputs_for_generation(
        input_ids, next_sequence_length=1, **{CACHE_NAME: cache}
    )
    return inputs["input_ids"].shape[1] == 3 and inputs.get(CACHE_NAME) is None


@functools.cache
def accelerate_refuses_context_parallel() -> bool:
    """Whether the installed accelerate refuses to attach its context-parallel hooks to a model whose
    `supports_context_parallel` is False (1.16+), rather than attaching them and dropping its masks: asked of an
    empty module that says False."""
    from accelerate.big_modeling import _attach_context_parallel_hooks
    from torch import nn

    model = nn.Module()
    model.supports_context_parallel = False
    try:
        _attach_context_parallel_hooks(model)
    except ValueError:
        return True
    return False


def _probe_trainer_checkpoint() -> str | None:
    from transformers import Trainer

    method = getattr(Trainer, "_load_from_checkpoint", None)
    return (
        "Trainer._load_from_checkpoint is gone" if method is None else has_parameters(method, "resume_from_checkpoint")
    )


def _has_training_field(*names) -> str | None:
    from transformers import TrainingArguments

    fields = TrainingArguments.__dataclass_fields__
    return None if any(name in fields for name in names) else f"TrainingArguments has none of {names}"


def _probe_upload() -> str | None:
    method = getattr(PreTrainedModel, "_upload_modified_files", None)
    if method is None:
        return "PreTrainedModel._upload_modified_files is gone: push_to_hub with hf_tfm's card cannot upload"
    return has_parameters(method, "working_dir", "repo_id", "files_timestamps", "token", "create_pr", "revision")


TABLE = [
    *MODEL_ROWS,
    Row(
        "GptOssConfig swiglu fields",
        "gpt_oss_declares_swiglu: GPT-OSS's SwiGLU clamp and slope, config fields or fixed (GPT_OSS_FIXED_SWIGLU); "
        "the GPT-OSS record converts other values only where the config declares them (convert/decoder.py)",
        "5.17 and other releases before the fields: fixed at 1.702 and 7.0",
        "the fields alone once the lower bound declares them",
        lambda: None if isinstance(gpt_oss_declares_swiglu(), bool) else "no answer",
    ),
    Row(
        "SwitchTransformers routing",
        "switch_routes_as_switch: whether the installed SwitchTransformers routes as Switch Transformer does (the "
        "parity tests of the switch_transformers record run only where it does; the conversion itself reads no "
        "reference code)",
        "5.17: its router returns max probabilities as logits and applies no capacity; 5.18+ route correctly",
        "nothing once the lower bound routes correctly",
        lambda: None if isinstance(switch_routes_as_switch(), bool) else "no answer",
    ),
    Row(
        "Phi-3's LongRoPE generation",
        "phi3_recomputes_longrope_cache: whether the installed Phi-3 computes every position again on the step that "
        "crosses LongRoPE's pretraining length, as hf_tfm does (TfmGenerationMixin.prepare_inputs_for_generation); "
        "the Phi-3 parity test of that step runs only where it does",
        "5.17-5.19: Phi-3 drops the cache there but feeds the new token alone; 5.20+ the whole sequence",
        "nothing once the lower bound reaches 5.20",
        lambda: None if isinstance(phi3_recomputes_longrope_cache(), bool) else "no answer",
    ),
    Row(
        "accelerate's context-parallel refusal",
        "accelerate_refuses_context_parallel: whether accelerate itself refuses its context-parallel hooks (what "
        "Accelerator.prepare attaches for cp_size > 1) for a model whose supports_context_parallel is False, which "
        "hf_tfm declares per model (capabilities.parallel_refusal); tests/test_context_parallel.py proves the "
        "declaration either way",
        "accelerate < 1.16 attaches the hooks whatever the model says (sliding windows refused by name); 1.16+ "
        "refuses",
        "nothing: hf_tfm's declaration holds on both",
        lambda: (
            None  # accelerate is the training extra's: a core install has nothing to ask
            if importlib.util.find_spec("accelerate") is None
            or isinstance(accelerate_refuses_context_parallel(), bool)
            else "no answer"
        ),
    ),
    Row(
        "Trainer._load_from_checkpoint",
        "loads a finished run's last checkpoint without training a step past max_steps (training/run.py)",
        "all",
        "a public Trainer load call",
        _probe_trainer_checkpoint,
    ),
    Row(
        "TrainingArguments checkpointing",
        "checkpointing_argument: `activation_checkpointing` (5.23+) or `gradient_checkpointing` (5.17-5.22)",
        "5.17-5.22 `gradient_checkpointing`; 5.23+ `activation_checkpointing` (the old name deprecated)",
        "`activation_checkpointing` alone once the lower bound reaches 5.23",
        lambda: _has_training_field("activation_checkpointing", "gradient_checkpointing"),
    ),
    Row(
        "PreTrainedModel._upload_modified_files",
        "push_to_hub's one-commit upload, with hf_tfm's model card in the folder (hf_tfm/saving.py)",
        "all",
        "huggingface_hub.upload_folder, once a refused commit may be retried (it retries; transformers fails fast)",
        _probe_upload,
    ),
]
