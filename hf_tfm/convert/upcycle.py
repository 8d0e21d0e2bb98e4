"""Sparse upcycling (Komatsuzaki et al., 2022): turn a trained dense hf_tfm model into an MoE model whose every
expert starts as a copy of the dense feed-forward layer, with a freshly initialised router.

With normalised top-k weights (they sum to 1 per token) the upcycled model computes exactly what the dense one
did, so training resumes from the dense model's quality and the experts diverge from there.
"""

import torch

from ..model.modeling_tfm_moe import TfmMoE
from ..model.modeling_tfm_stack import TfmPreTrainedModel
from .common import load_exact, require_compatible


def upcycle(
    model: TfmPreTrainedModel, num_experts: int, num_experts_per_tok: int = 2, **moe_fields
) -> TfmPreTrainedModel:
    """Return a model of the same class with MoE feed-forward layers (every layer unless `moe_fields` choose
    with `decoder_sparse_step` / `moe_layers`), each expert a copy of that layer's dense feed-forward (gated or not,
    as the dense layers are)."""
    config = model.config
    # the experts carry no feed-forward bias: only a bias-free feed-forward can be copied into them exactly
    require_compatible(config, "an upcycled MoE model", {"mlp_bias": False, "num_experts": 0})
    fields = {
        **config.to_dict(),
        "moe_ffn_type": config.ffn_type,
        "num_experts": num_experts,
        "num_experts_per_tok": num_experts_per_tok,
        "moe_intermediate_size": config.intermediate_size,
        "norm_topk_prob": True,
        **moe_fields,
    }
    upcycled = type(model)(type(config).from_dict(fields))
    state = model.state_dict()
    moe_keys = set()  # experts copied here and fresh routers: not in `state`
    with torch.no_grad():
        for name, moe in upcycled.named_modules():
            if not isinstance(moe, TfmMoE):
                continue
            dense = model.get_submodule(name)
            if moe.experts.has_gate:
                gate_up = torch.cat([dense.gate_proj.weight, dense.up_proj.weight])
                moe.experts.gate_up_proj.copy_(gate_up.expand_as(moe.experts.gate_up_proj))
            else:
                moe.experts.up_proj.copy_(dense.up_proj.weight.expand_as(moe.experts.up_proj))
            moe.experts.down_proj.copy_(dense.down_proj.weight.expand_as(moe.experts.down_proj))
            for key in dense.state_dict():
                del state[f"{name}.{key}"]
            moe_keys.update(f"{name}.{key}" for key in moe.state_dict())
    return load_exact(upcycled, state, may_miss=frozenset(moe_keys)).train(model.training)
