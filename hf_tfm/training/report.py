"""What a run prints and draws: the summary table (trained model against its untrained self and trivial
baselines) and loss curves read back from each run's CSV log."""

from pathlib import Path

from .callbacks import logged
from .tasks import TASKS


def _score(entries: list[dict], metric: str) -> float | None:
    return next((e["value"] for e in entries if e["metric"] == metric), None)


def summary_rows(results: list[dict]) -> list[dict]:
    rows = []
    for result in results:
        task = TASKS[result["task"]]
        metric, higher_is_better = task.headline, task.higher_is_better
        candidates = [(b["name"], b["value"]) for b in result["baselines"] if b["metric"] == metric]
        best = (max if higher_is_better else min)(candidates, key=lambda c: c[1]) if candidates else (None, None)
        rows.append(
            {
                "task": result["task"],
                "model": result["model"],
                "metric": metric,
                "before": _score(result.get("before_training", []), metric),
                "after": _score(result["results"], metric),
                "best_baseline": best[0],
                "baseline": best[1],
                "loss": _score(result["results"], "loss"),
                "seconds": result["seconds"],
                "model_dir": result["model_dir"],
            }
        )
    return rows


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def summary_markdown(results: list[dict]) -> str:
    """The scores, which the same job on the same machine reproduces exactly, then each run's time, which it does
    not."""
    lines = [
        "| task | model | metric | untrained | trained | best trivial baseline | val loss |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = summary_rows(results)
    for row in rows:
        baseline = f"{_fmt(row['baseline'])} ({row['best_baseline']})" if row["best_baseline"] else "-"
        lines.append(
            f"| {row['task']} | {row['model']} | {row['metric']} | {_fmt(row['before'])} | {_fmt(row['after'])} | "
            f"{baseline} | {_fmt(row['loss'])} |"
        )
    lines += ["", "| task | model | seconds (varies run to run) |", "|---|---|---|"]
    lines += [f"| {row['task']} | {row['model']} | {row['seconds']:.0f} |" for row in rows]
    return "\n".join(lines)


def print_summary(results: list[dict]) -> None:
    print("\n" + summary_markdown(results))
    for result in results:
        print(f"{result['task']}: model, tokenizer, card -> {result['model_dir']}; log -> {result['log']}")


def plot_loss_curves(logs: dict[str, str | Path], path: str | Path) -> Path:
    """One panel per run: training loss per logged step and validation loss per evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, len(logs))  # a grid that reads at screen width, not a strip of every run
    rows = -(-len(logs) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.4 * rows), squeeze=False)
    for axis in axes.flat[len(logs) :]:
        axis.set_visible(False)
    for axis, (name, log) in zip(axes.flat, logs.items()):
        for quantity, style in (("loss", "-"), ("eval_loss", "o--")):
            points = logged(log, quantity)
            if points:
                axis.plot(*zip(*points), style, label="train" if quantity == "loss" else "validation")
        axis.set_title(name)
        axis.set_xlabel("step")
        axis.set_ylabel("loss")
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)
