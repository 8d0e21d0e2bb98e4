"""hf_tfm's two layouts of a self-attention's query, key and value projections: three layers (`q_proj`, `k_proj`,
`v_proj`) or one whose rows stack them (`qkv_proj`, `fused_qkv_proj=True`, as GPT-2's `c_attn`). The same function:
a state dict of one layout becomes the other's by splitting or joining rows. The conversion engine reads every model
in the three-layer form (the family records name q, k and v), and `with_fused_qkv` switches a model's layout.
"""

import re

import torch

from ..model.modeling_tfm_attention import qkv_widths
from .common import config_with, load_exact

FUSED = re.compile(r"(.*self_attn\.)qkv_proj\.(weight|bias)")
PARTS = ("q_proj", "k_proj", "v_proj")


def split_qkv(state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """`state` with each self-attention's `qkv_proj` tensors as `q_proj`, `k_proj` and `v_proj` ones (views);
    other keys as they are."""
    split = {}
    for key, tensor in state.items():
        match = FUSED.fullmatch(key)
        if match is None:
            split[key] = tensor
            continue
        prefix, leaf = match.groups()
        split |= {f"{prefix}{part}.{leaf}": rows for part, rows in zip(PARTS, tensor.split(qkv_widths(config)))}
    return split


def join_qkv(state: dict[str, torch.Tensor], keys) -> dict[str, torch.Tensor]:
    """`state` (in the three-layer form) with the q, k and v tensors joined into each `qkv_proj` key among `keys`
    (the target model's state-dict keys: for a model without `qkv_proj`, `state` as it is)."""
    joined = dict(state)
    for key in keys:
        match = FUSED.fullmatch(key)
        if match is not None:
            prefix, leaf = match.groups()
            joined[key] = torch.cat([joined.pop(f"{prefix}{part}.{leaf}") for part in PARTS])
    return joined


def with_fused_qkv(model, fused: bool):
    """A model of the same class and weights with `fused_qkv_proj=fused`: one `qkv_proj` per self-attention, or
    `q_proj`, `k_proj` and `v_proj` (which tensor parallelism and per-projection PEFT targets need)."""
    config = model.config
    target = type(model)(config_with(config, fused_qkv_proj=fused)).to(model.device, model.dtype)
    state = join_qkv(split_qkv(model.state_dict(), config), target.state_dict().keys())
    return load_exact(target, state, generation_config=model.generation_config).train(model.training)
