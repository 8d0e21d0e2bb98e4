"""What every exact-parity converter shares: refuse configs that cannot be expressed, rename fields and weights, and
load weights strictly."""

import copy

import torch
from torch import nn

# score scaling and LM-head options that GPT-2, Llama and Mixtral do not have
PLAIN_LM_HEAD = {"attention_multiplier": None, "scale_lm_head_input": False, "lm_head_bias": False}
# what every Llama-family decoder is beyond its blocks: a final norm, bare token embeddings, attention dropout only
LLAMA_FAMILY_STACK = {
    "final_norm": True,
    "embedding_norm": False,
    "scale_embeddings": False,
    "type_vocab_size": 0,
    "embedding_dropout": 0.0,
    "hidden_dropout": 0.0,
    **PLAIN_LM_HEAD,
}


def require_compatible(config, target: str, expected: dict[str, object], unsupported: dict[str, bool] | None = None):
    """Raise one ValueError naming every field of `config` the target cannot express exactly: each field in
    `expected` whose value differs, and each field flagged True in `unsupported`."""
    bad = [field for field, value in expected.items() if getattr(config, field) != value]
    bad += [field for field, flagged in (unsupported or {}).items() if flagged]
    if bad:
        details = ", ".join(f"{field}={getattr(config, field)!r}" for field in bad)
        raise ValueError(f"Cannot convert {type(config).__name__} to {target} exactly: unsupported {details}")


def renamed_fields(config, names: dict[str, str]) -> dict[str, object]:
    """Read `config.<source name>` for each entry of a `{source name: target name}` table, keyed by target name."""
    return {target: getattr(config, source) for source, target in names.items()}


def inverted(names: dict[str, str]) -> dict[str, str]:
    """A `{source name: target name}` table read the other way, for the converter back."""
    return {target: source for source, target in names.items()}


def renamed_keys(state: dict[str, torch.Tensor], renames: dict[str, str]) -> dict[str, torch.Tensor]:
    """The state dict with every key's substrings replaced per `renames` (for layouts that differ only in names)."""
    renamed = {}
    for key, value in state.items():
        for old, new in renames.items():
            key = key.replace(old, new)
        renamed[key] = value
    return renamed


def require_one_token_table(state: dict[str, torch.Tensor], shared: str, copies: list[str]) -> None:
    """hf_tfm keeps one token table for encoder and decoder: every copy must equal `shared`."""
    for key in copies:
        if not torch.equal(state[key], state[shared]):
            raise ValueError(
                f"Cannot convert exactly: {key} differs from {shared}, and hf_tfm keeps one token table "
                "shared by encoder and decoder"
            )


def load_exact(
    model: nn.Module,
    state_dict: dict[str, torch.Tensor],
    tie: bool = True,
    generation_config=None,
    may_miss: frozenset[str] = frozenset(),
) -> nn.Module:
    """Load a converted state dict; any missing or unexpected key is a converter bug, never silently ignored.
    With `tie`, a head tied by the config may be absent and is re-tied after loading; without, every tensor
    is loaded as given (for a target whose config claims a tie its weights do not have: T5). `generation_config`
    (the source model's) is copied onto the model; `may_miss` names weights the caller sets itself."""
    result = model.load_state_dict(state_dict, strict=False)
    tied = {"lm_head.weight"} if tie and getattr(model.config, "tie_word_embeddings", False) else set()
    missing = set(result.missing_keys) - tied - may_miss
    if missing or result.unexpected_keys:
        raise ValueError(
            f"Converted weights do not fit {type(model).__name__}: missing {sorted(missing)}, "
            f"unexpected {sorted(result.unexpected_keys)}"
        )
    if tied:
        model.tie_weights()
    if generation_config is not None:
        model.generation_config = copy.deepcopy(generation_config)
    return model.eval()


def renamed_model(model: nn.Module, target: nn.Module, renames: dict[str, str]) -> nn.Module:
    """`target` loaded with `model`'s weights, for layouts that differ only in names (`renames`: as `renamed_keys`)."""
    return load_exact(target, renamed_keys(model.state_dict(), renames))


# config.json keys that describe a file, a run or a task, not the function the weights compute
NOT_ARCHITECTURE = frozenset(
    {
        "_name_or_path", "architectures", "dtype", "torch_dtype", "transformers_version", "model_type", "auto_map",
        "use_cache", "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward",
        "id2label", "label2id", "problem_type", "tokenizer_class", "is_decoder", "is_encoder_decoder",
    }
)  # fmt: skip


def converted_config(config, to_other, back, irrelevant: dict[str, str] | None = None):
    """`to_other(config)`, refused when it cannot express `config` exactly. Every key of both configs' `to_dict()`
    is checked, not a hand-kept list: `config -> to_other -> back` must give `config` again, so a field the mapping
    drops or cannot represent comes back changed and is named in the error. `irrelevant` names (with the reason)
    the fields that may change because the architecture never reads them (Qwen2's `max_window_layers` without a
    sliding window)."""
    other = to_other(config)
    before, after = config.to_dict(), back(other).to_dict()
    skip = NOT_ARCHITECTURE | set(irrelevant or {})
    lost = sorted(key for key in before.keys() | after.keys() if key not in skip and before.get(key) != after.get(key))
    if lost:
        details = ", ".join(f"{key}={before.get(key)!r}" for key in lost)
        raise ValueError(f"Cannot convert {type(config).__name__} to {type(other).__name__} exactly: {details}")
    return other
