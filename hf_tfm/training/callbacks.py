"""Trainer callbacks for hf_tfm models (not shipped as remote code: they are training-side tools)."""

import csv
import math
from pathlib import Path

import torch
from transformers import TrainerCallback

from ..model.modeling_tfm_moe import TfmRouter

LOG_FIELDS = ("step", "epoch", "name", "value")


class CSVLogCallback(TrainerCallback):
    """Append every logged number to a CSV file (`step, epoch, name, value`), flushed per row, so the record of a
    run survives the process being killed. `truncate_after(step)` drops rows a resumed run will log again."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def truncate_after(self, step: int) -> None:
        if self.path.is_file():
            rows = [row for row in read_log(self.path) if row["step"] <= step]
            with self.path.open("w", newline="") as handle:
                writer = csv.DictWriter(handle, LOG_FIELDS)
                writer.writeheader()
                writer.writerows(rows)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            self.write(state.global_step, state.epoch, logs)

    def write(self, step: int, epoch: float | None, logs: dict) -> None:
        """Append the numbers of `logs` as they are (nan and inf included) for `step`."""
        fresh = not self.path.is_file()
        with self.path.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, LOG_FIELDS)
            if fresh:
                writer.writeheader()
            for name, value in logs.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    writer.writerow({"step": step, "epoch": epoch, "name": name, "value": repr(float(value))})


def read_log(path: str | Path) -> list[dict]:
    with Path(path).open(newline="") as handle:
        return [
            {
                "step": int(row["step"]),
                "epoch": float(row["epoch"] or "nan"),
                "name": row["name"],
                "value": float(row["value"]),
            }
            for row in csv.DictReader(handle)
        ]


def logged(path: str | Path, name: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one logged quantity, e.g. "loss" or "eval_loss"."""
    return [
        (row["step"], row["value"]) for row in read_log(path) if row["name"] == name and not math.isnan(row["value"])
    ]


class RouterBiasCallback(TrainerCallback):
    """Auxiliary-loss-free MoE balancing (DeepSeek-V3): after every optimizer step, move each router's per-expert
    bias against the load it saw during that step. A no-op for models without `router_bias_update_rate`. Trainer
    calls callbacks on every rank, as `update_router_biases` needs: it sums the loads over the data-parallel ranks
    (DDP, FSDP) so that every replica keeps the same biases."""

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        if model is not None and getattr(model.config, "router_bias_update_rate", 0) > 0:
            model.update_router_biases()


class RouterStatsCallback(TrainerCallback):
    """Router statistics to watch during MoE training. Forward hooks on every `TfmRouter` count each expert's top-k
    assignments and the mean router entropy (softmax over experts, per token) of the training steps since the last
    log; `on_log` adds `router/<layer>/max_load` (the busiest expert's load fraction times E, so 1.0 = perfectly
    balanced, E = all load on one expert) and `router/<layer>/entropy` (0 = one-hot, ln E = uniform) to the logs,
    and keeps the per-layer load fractions in `history` for `save_heatmap`. Padding tokens count too: the router
    sees them. A no-op for dense models.

    Trainer copies `logs` into `state.log_history` and runs the report_to integrations before user callbacks, so
    this callback also writes its keys into the latest `log_history` entry; to send them to TensorBoard or W&B as
    well, run it first: `trainer.callback_handler.callbacks.insert(0, trainer.pop_callback(RouterStatsCallback))`.
    """

    def __init__(self):
        self.layer_names: list[str] = []  # row order of every `history` entry's "load"
        self.history: list[dict] = []  # {"step": global_step, "load": tensor [layers, experts] of load fractions}
        self._handles = []
        self._stats: dict[str, dict] = {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._remove_hooks()  # a second train() must not stack a second set of hooks
        self.layer_names, self._stats = [], {}
        for path, module in model.named_modules():
            if isinstance(module, TfmRouter):
                # "model.layers.3.mlp.router" -> "layers.3" ("encoder.layers.0"... in an encoder-decoder)
                name = path.removesuffix(".router").removesuffix(".mlp").removeprefix("model.")
                self.layer_names.append(name)
                self._stats[name] = self._empty(module)
                self._handles.append(module.register_forward_hook(self._hook(name)))

    @staticmethod
    def _empty(router) -> dict:
        # Accumulated as tensors on the router's device: no host sync per step, only one per log.
        device = router.weight.device
        return {
            "counts": torch.zeros(router.num_experts, device=device),
            "entropy": torch.zeros((), device=device),
            "tokens": 0,
        }

    def _hook(self, name):
        def hook(module, args, output):
            if not module.training:  # evaluation and generation forwards are not training load
                return
            router_logits, _, top_k_index = output
            with torch.no_grad():  # statistics only: never extend the autograd graph
                stats = self._stats[name]
                stats["counts"] += torch.bincount(top_k_index.flatten(), minlength=module.num_experts)
                probs = torch.softmax(router_logits.detach().float(), dim=-1)
                stats["entropy"] += -(probs * torch.log(probs.clamp_min(1e-12))).sum()
                stats["tokens"] += router_logits.shape[0]

        return hook

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:
            return  # an evaluation or end-of-training summary log: the statistics belong to the next training log
        if not any(stats["tokens"] for stats in self._stats.values()):
            return  # nothing trained since the last log
        loads, new = [], {}
        for name in self.layer_names:
            stats = self._stats[name]
            counts = stats["counts"].cpu()
            load = counts / counts.sum().clamp_min(1)
            loads.append(load)
            if stats["tokens"]:
                new[f"router/{name}/max_load"] = load.max().item() * len(load)
                new[f"router/{name}/entropy"] = stats["entropy"].item() / stats["tokens"]
            stats["counts"].zero_()
            stats["entropy"].zero_()
            stats["tokens"] = 0
        self.history.append({"step": state.global_step, "load": torch.stack(loads)})
        logs.update(new)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(new)  # Trainer appended its copy of `logs` before calling callbacks

    def on_train_end(self, args, state, control, **kwargs):
        self._remove_hooks()

    def _remove_hooks(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def save_heatmap(self, path) -> None:
        """A PNG with one heat map per MoE layer: x = logging step, y = expert, colour = load fraction."""
        if not self.history:
            raise ValueError(
                "RouterStatsCallback has no router statistics yet: train an MoE model with it and "
                "log at least once (logging_steps) before calling save_heatmap"
            )
        # Agg directly, without pyplot: headless-safe, and the user's global matplotlib backend stays untouched.
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        steps = [entry["step"] for entry in self.history]
        load = torch.stack([entry["load"] for entry in self.history], dim=-1).numpy()  # [layers, experts, logs]
        layers, experts, _ = load.shape
        fig = Figure(figsize=(min(14, max(6, 0.4 * len(steps) + 3)), 0.8 + layers * (0.6 + 0.35 * experts)))
        FigureCanvasAgg(fig)
        axes = fig.subplots(layers, 1, squeeze=False, sharex=True)
        for row, (ax, name) in enumerate(zip(axes[:, 0], self.layer_names)):
            # One colour scale for all layers, from 0, so that layers compare at a glance.
            image = ax.imshow(
                load[row],
                aspect="auto",
                origin="lower",
                cmap="viridis",
                vmin=0,
                vmax=load.max(),
                interpolation="nearest",
            )
            ax.set_title(f"{name}: expert load fraction (uniform = {1 / experts:.3g})")
            ax.set_ylabel("expert")
            ax.set_yticks(range(experts))
            fig.colorbar(image, ax=ax, label="load fraction")
        ticks = range(0, len(steps), max(1, len(steps) // 12))  # at most ~12 step labels stay legible
        axes[-1, 0].set_xticks(list(ticks), [str(steps[i]) for i in ticks])
        axes[-1, 0].set_xlabel("training step (one column per log)")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
