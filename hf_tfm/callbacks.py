"""Trainer callbacks for hf_tfm models (not shipped as remote code: they are training-side tools)."""

from transformers import TrainerCallback


class RouterBiasCallback(TrainerCallback):
    """Auxiliary-loss-free MoE balancing (DeepSeek-V3): after every optimizer step, move each router's per-expert
    bias against the load it saw during that step. A no-op for models without `router_bias_update_rate`."""

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        if model is not None and getattr(model.config, "router_bias_update_rate", 0) > 0:
            model.update_router_biases()
