"""What every exact-parity converter shares: refuse configs that cannot be expressed, and load weights strictly."""

import torch
from torch import nn


def require_compatible(source: str, target: str, mismatches: dict[str, object]) -> None:
    """Raise one ValueError listing every config field whose value the target architecture cannot express."""
    bad = {field: value for field, value in mismatches.items() if value}
    if bad:
        details = ", ".join(f"{field}={value!r}" for field, value in bad.items())
        raise ValueError(f"Cannot convert {source} to {target} exactly: unsupported {details}")


def load_exact(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> nn.Module:
    """Load a converted state dict; any missing or unexpected key is a converter bug, never silently ignored."""
    result = model.load_state_dict(state_dict, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    missing = set(result.missing_keys) - tied
    if missing or result.unexpected_keys:
        raise ValueError(
            f"Converted weights do not fit {type(model).__name__}: missing {sorted(missing)}, "
            f"unexpected {sorted(result.unexpected_keys)}"
        )
    if tied:
        model.tie_weights()
    return model.eval()
