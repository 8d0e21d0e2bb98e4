"""`hf-tfm scaling`: scaling curves against transformers' GPT-2, BERT, T5 or BART, as architecture papers draw them.

For each size of a ladder (`sizes`: non-embedding parameters), every hf_tfm model is scaled along its own width and
depth, and the references are matched to the first model at that size as `hf-tfm compare` matches them (its width,
depth and heads, the feed-forward width that gives the same parameter count). Every model trains at every size for the
same number of tokens (`tokens_per_parameter` times the first model's non-embedding parameters at that size), once
per learning rate and seed, on one tokenizer and the same batches; the learning rate with the lowest validation loss
(mean over seeds) is each model's point at that size, the others are kept in the record.

Compute is measured, not assumed: the floating-point operations of one training step (forward and backward, the
attention's matmuls included, an MoE's routed experts only), counted once per model and size by torch's
`FlopCounterMode` on a batch of the run's shape with eager attention and eager experts, times the steps.

The fit is `L(C) = E + A * C^-alpha` per model, least squares in L over a grid of E below the smallest loss (for each
E, log(L - E) is linear in log C); a fit whose alpha is not positive or whose E presses against the smallest loss did
not converge, and is said so. The compute multiplier of a model against a reference is how much more compute the
reference's fit needs for the loss the model's fit reaches at the model's largest measured compute; its interval is a
bootstrap over seeds (each point's mean recomputed from seeds drawn with replacement, both fits refitted).

Runs live under OUTPUT/runs/<label>/size-<i>/lr-<lr>/seed-<seed>; a killed ladder, run again, resumes (finished runs
are read back). OUTPUT gets scaling.json (the record), scaling.md (the tables) and scaling.png (loss against compute).
"""

import json
import math
import random
import statistics
from dataclasses import replace
from pathlib import Path

import torch
import transformers
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hf_tfm_cli.spec import RunSpec

from ..hub.card import active_parameters
from ..model.modeling_tfm_loading import AUTO_CLASSES
from .compare import finished, folder_name, prepared, reference_config, run_spec
from .run import data_settings, train
from .tasks import MLM_PROBABILITY, TASKS

MIN_SIZES = 3  # E, A and alpha: no power law is fitted to fewer points
SIZE_TOLERANCE = 0.2  # a scaled model within 20% of the size asked for
MIN_STEPS = 10
BOOTSTRAP_SAMPLES = 1000
E_GRID = 400  # candidate irreducible losses between 0 and the smallest loss
REFINEMENTS = 4  # finer grids around the best E, each spanning two steps of the one before
SCALED_TASKS = ("causal-lm", "masked-lm")


def check_ladder(sizes: list[int], learning_rates: list[float]) -> None:
    if len(set(sizes)) < MIN_SIZES:
        raise ValueError(
            f"--sizes gives {len(set(sizes))} distinct size(s): a power law E + A*C^-alpha needs at least {MIN_SIZES}"
        )
    bad = [
        rate for rate in learning_rates if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0)
    ]
    if bad or not learning_rates:
        raise ValueError(f"--learning-rates must be positive numbers, got {bad or learning_rates}")


# ------------------------------------------------------------------------------------------------ parameters, sizes
def embedding_parameters(model: nn.Module) -> int:
    """Parameters of every embedding table, and of an output head that is not tied to one."""
    tables = {id(p): p.numel() for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and id(head.weight) not in tables:
        tables[id(head.weight)] = head.weight.numel()
    return sum(tables.values())


def built(config, task: str) -> nn.Module:
    return getattr(transformers, TASKS[task].head.auto_class).from_config(config)


def counted(config, task: str) -> dict[str, int]:
    """Total, non-embedding and active non-embedding parameters of the task's model (built on the meta device)."""
    with torch.device("meta"):
        model = built(config, task)
    total, embeddings = model.num_parameters(), embedding_parameters(model)
    active = active_parameters(model) if config.model_type in AUTO_CLASSES else total
    return {"total": total, "non_embedding": total - embeddings, "active_non_embedding": active - embeddings}


def scaled(config, width: int, depth: int):
    """`config` at another width and depth: the head width, the query heads per key/value head and the feed-forward
    widths' ratios to the width kept (the rule the docs state)."""
    head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
    heads = max(1, width // head_dim)
    group = config.num_attention_heads // (config.num_key_value_heads or config.num_attention_heads)
    fields = dict(
        hidden_size=heads * head_dim,
        num_hidden_layers=depth,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // group),
        head_dim=head_dim,
        intermediate_size=8 * max(1, round(config.intermediate_size / config.hidden_size * heads * head_dim / 8)),
    )
    if getattr(config, "moe_intermediate_size", None):
        ratio = config.moe_intermediate_size / config.hidden_size
        fields["moe_intermediate_size"] = 8 * max(1, round(ratio * heads * head_dim / 8))
    if getattr(config, "decoder_layers", None):  # an encoder-decoder's decoder keeps its depth's share
        fields["decoder_layers"] = max(1, round(config.decoder_layers / config.num_hidden_layers * depth))
    if getattr(config, "layer_types", None):
        fields["layer_types"] = None  # the config's own pattern, at the new depth
    return config.__class__(**{**config.to_dict(), **fields})


def scale_to(config, target: int, task: str, label: str):
    """`config` at about `target` non-embedding parameters: widths in steps of one key/value head's group of query
    heads and, for each width, the
    depths whose size is nearest the target (the count is linear in depth); of the shapes within 10% of the target,
    the one whose width-to-depth ratio is nearest the config's own. Refused, naming the model and the nearest size,
    when none comes within 20%."""
    head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
    group = config.num_attention_heads // (config.num_key_value_heads or config.num_attention_heads)
    aspect = config.hidden_size / config.num_hidden_layers
    shapes = []  # (size, width, depth)
    for key_value_heads in range(1, 257):
        width = key_value_heads * group * head_dim
        one, two = (counted(scaled(config, width, depth), task)["non_embedding"] for depth in (1, 2))
        per_layer = two - one
        exact = (target - (one - per_layer)) / per_layer
        for depth in {max(1, math.floor(exact)), max(1, math.ceil(exact))}:
            shapes.append((one + (depth - 1) * per_layer, width, depth))
        if one > target * (1 + SIZE_TOLERANCE):
            break
    near = [shape for shape in shapes if abs(shape[0] - target) <= SIZE_TOLERANCE / 2 * target]
    if near:
        _, width, depth = min(near, key=lambda shape: abs(math.log(shape[1] / shape[2] / aspect)))
    else:
        size, width, depth = min(shapes, key=lambda shape: abs(shape[0] - target))
        if abs(size - target) > SIZE_TOLERANCE * target:
            raise ValueError(
                f"model {label} cannot be scaled to {target:,} non-embedding parameters along its width and depth: "
                f"the nearest is {size:,} (width {width}, depth {depth}); choose sizes nearer that"
            )
    return scaled(config, width, depth)


# ---------------------------------------------------------------------------------------------------------- compute
def training_flops(config, task: str, batch: dict) -> int:
    """The floating-point operations of one training step of `config`'s task model on `batch`: forward and backward,
    counted by `FlopCounterMode` with eager attention (its matmuls counted as such) and eager experts (only the experts
    each token is routed to run)."""
    torch.manual_seed(0)
    model = built(config, task).train()
    model.set_attn_implementation("eager")
    if hasattr(model, "set_experts_implementation") and getattr(config, "num_experts", 0):
        model.set_experts_implementation("eager")
    with FlopCounterMode(display=False) as counter:
        model(**batch).loss.backward()
    return counter.get_total_flops()


def flop_batch(task: str, vocab_size: int, batch_size: int, length: int) -> dict:
    """A batch of the run's shape: ids drawn over the vocabulary, labels as the task scores them (a masked LM scores
    the masked share of its tokens, and a head that computes logits only where it scores does only that work)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab_size, (batch_size, length), generator=generator)
    if task == "masked-lm":
        masked = torch.rand(ids.shape, generator=generator) < MLM_PROBABILITY
        return {"input_ids": ids, "labels": ids.masked_fill(~masked, -100)}
    return {"input_ids": ids, "labels": ids.clone()}


# -------------------------------------------------------------------------------------------------------------- fit
def fit_power_law(compute: list[float], loss: list[float]) -> dict:
    """`L = E + A * C^-alpha` by least squares in L: for each E below the smallest loss, the line through
    (log C, log(L - E)) gives A and alpha; the E with the least squared error in L wins (a grid, then finer grids
    between the neighbours of the best, each one tensor operation: the bootstrap fits thousands of times). Not
    converged (said, never drawn) when alpha is not positive or the best E presses against the smallest loss (the
    points want an E at or above a loss)."""
    points = sorted(zip(compute, loss))
    if len(points) < MIN_SIZES:
        return {"converged": False, "reason": f"{len(points)} points: a power law needs at least {MIN_SIZES}"}
    x = torch.tensor([math.log(c) for c, _ in points], dtype=torch.float64)
    y = torch.tensor([value for _, value in points], dtype=torch.float64)
    grid = float(y.min()) * torch.arange(E_GRID, dtype=torch.float64) / E_GRID
    errors = _fitted(x, y, grid)[0]
    step = int(errors.argmin())
    if step == E_GRID - 1:
        fit = _fit_at(x, y, float(grid[step]))
        return {**fit, "converged": False, "reason": "the fitted E presses against the smallest loss"}
    at_zero = step == 0  # the error falls all the way to E = 0: a pure power law fits best, and E is not measured
    for _ in range(REFINEMENTS):  # the error is smooth in E near its minimum
        low, high = float(grid[max(step - 1, 0)]), float(grid[min(step + 1, E_GRID - 1)])
        grid = torch.linspace(low, high, E_GRID, dtype=torch.float64)
        step = int(_fitted(x, y, grid)[0].argmin())
    fit = _fit_at(x, y, float(grid[step]))
    if at_zero:
        fit["E_at_zero"] = True
    if fit["alpha"] <= 0:
        return {
            **fit,
            "converged": False,
            "reason": f"alpha = {fit['alpha']:.3g}: the loss does not fall with compute",
        }
    return fit


def _fitted(x: torch.Tensor, y: torch.Tensor, irreducible: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """For each E of `irreducible`: the squared error in L, log A and the slope (-alpha) of the least-squares line."""
    logs = torch.log(y[None, :] - irreducible[:, None])
    x_centred = x - x.mean()
    slope = (x_centred * (logs - logs.mean(1, keepdim=True))).sum(1) / (x_centred**2).sum()
    intercept = logs.mean(1) - slope * x.mean()
    predicted = irreducible[:, None] + torch.exp(intercept[:, None] + slope[:, None] * x[None, :])
    return ((predicted - y[None, :]) ** 2).sum(1), intercept, slope


def _fit_at(x: torch.Tensor, y: torch.Tensor, irreducible: float) -> dict:
    error, intercept, slope = (value[0] for value in _fitted(x, y, torch.tensor([irreducible], dtype=torch.float64)))
    return {
        "E": irreducible,
        "A": math.exp(float(intercept)),
        "alpha": -float(slope),
        "squared_error": float(error),
        "converged": True,
    }


def loss_at(fit: dict, compute: float) -> float:
    return fit["E"] + fit["A"] * compute ** -fit["alpha"]


def compute_for(fit: dict, loss: float) -> float:
    """The compute at which `fit` reaches `loss`; infinite where it never does (at or below its E)."""
    if loss <= fit["E"]:
        return math.inf
    return (fit["A"] / (loss - fit["E"])) ** (1 / fit["alpha"])


def multiplier(model_fit: dict, reference_fit: dict, largest_compute: float) -> float:
    """How many times the model's largest measured compute the reference's fit needs for the model's fitted loss
    there (above 1: the model needs less compute for the same loss)."""
    return compute_for(reference_fit, loss_at(model_fit, largest_compute)) / largest_compute


# ---------------------------------------------------------------------------------------------------------- the runs
def scaling(
    base: RunSpec,
    models: list[str],
    sizes: list[int],
    learning_rates: list[float],
    seeds: list[int],
    tokens_per_parameter: float,
    output: str | Path,
    progress=None,
) -> dict:
    """Train the ladder (see the module's docstring); the record, table and figure in `output`. `progress(done,
    total, seconds)` is told after every run."""
    import time

    check_ladder(sizes, learning_rates)
    if base.task not in SCALED_TASKS:
        raise ValueError(
            f"scaling compares language models ({', '.join(SCALED_TASKS)}), not {base.task}: an encoder-decoder's "
            "compute depends on its targets' lengths, which a ladder does not yet measure"
        )
    if tokens_per_parameter <= 0:
        raise ValueError(f"--tokens-per-parameter must be a positive number, got {tokens_per_parameter}")
    output = Path(output)
    entries, tokenizer, bases = prepared(base, models, output, "scaling")
    ours = [entry for entry in entries if not entry.reference]

    # every model's config at every size, written where its runs read it
    ladder = []
    for index, target in enumerate(sorted(set(sizes))):
        configs = {entry.label: scale_to(bases[entry.label], target, base.task, entry.label) for entry in ours}
        first = configs[ours[0].label]
        counts = counted(first, base.task)  # matched as compare matches: the active parameters, embeddings in
        matched = counts["active_non_embedding"] + counts["total"] - counts["non_embedding"]
        for entry in entries:
            if entry.reference:
                configs[entry.label] = reference_config(
                    entry.name, base.task, first, matched, tokenizer, base.max_length
                )
        tokens = tokens_per_parameter * counted(first, base.task)["non_embedding"]
        steps = max(MIN_STEPS, math.ceil(tokens / (base.batch_size * base.max_length)))
        folder = output / "configs" / f"size-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        batch = flop_batch(base.task, len(tokenizer), base.batch_size, base.max_length)
        models_here = {}
        for entry in entries:
            config = configs[entry.label]
            path = folder / f"{folder_name(entry.label)}.json"
            config.to_json_file(path)
            flops = training_flops(config, base.task, batch)
            models_here[entry.label] = {
                "config": str(path),
                "parameters": counted(config, base.task),
                "width": config.to_dict().get("hidden_size") or config.to_dict().get("n_embd"),
                "flops_per_step": flops,
                "compute": flops * steps,
            }
        ladder.append({"target": target, "steps": steps, "tokens": steps * base.batch_size * base.max_length,
                       "models": models_here})  # fmt: skip

    total = len(ladder) * len(entries) * len(learning_rates) * len(seeds)
    done, started = 0, time.time()
    for index, rung in enumerate(ladder):
        for entry in entries:
            row = rung["models"][entry.label]
            row["runs"] = {}
            for rate in learning_rates:
                losses = []
                for seed in seeds:
                    folder = output / "runs" / folder_name(entry.label) / f"size-{index}" / f"lr-{rate:g}"
                    # one evaluation, at the end: the validation loss is the point; no untrained baseline
                    budget = dict(max_steps=rung["steps"], eval_steps=rung["steps"], save_steps=rung["steps"])
                    spec = run_spec(
                        replace(base, **budget, learning_rate=rate, evaluate_before=False),
                        replace(entry, overrides={}),
                        row["config"],
                        seed,
                        folder,
                        output / "tokenizer",
                    )  # fmt: skip  (the written config holds the model's overrides already)
                    result = finished(spec) or train(spec)
                    losses.append(next(r["value"] for r in result["results"] if r["metric"] == "loss"))
                    done += 1
                    if progress:
                        progress(done, total, time.time() - started)
                row["runs"][f"{rate:g}"] = losses
            best = best_learning_rate(row["runs"])
            row["best_learning_rate"] = float(best)
            row["loss"] = statistics.fmean(row["runs"][best])

    record = {
        "task": base.task,
        "data": data_settings(base),
        "budget": {**_budget(base), "tokens_per_parameter": tokens_per_parameter},
        "seeds": seeds,
        "learning_rates": learning_rates,
        "models": [entry.label for entry in entries],
        "references": [entry.label for entry in entries if entry.reference],
        "ladder": ladder,
    }
    record["fits"] = fits(record)
    record["multipliers"] = multipliers(record)
    (output / "scaling.json").write_text(json.dumps(record, indent=2))
    (output / "scaling.md").write_text(table(record))
    plot(record, output / "scaling.png")
    return record


def best_learning_rate(runs: dict[str, list[float]]) -> str:
    """The learning rate (as recorded) whose validation loss, mean over the seeds, is lowest."""
    return min(runs, key=lambda rate: statistics.fmean(runs[rate]))


def _budget(base: RunSpec) -> dict:
    return {"batch_size": base.batch_size, "max_length": base.max_length, "lr_scheduler_type": base.lr_scheduler_type}


def title(record: dict) -> str:
    """What the figure compares: the task, the data and the budget rule."""
    data, budget = record["data"].get("data") or "the embedded corpus", record["budget"]
    return (
        f"{record['task']}: validation loss against training compute, best of {len(record['learning_rates'])} "
        f"learning rate(s), mean over {len(record['seeds'])} seed(s)\ndata: {data}; "
        f"{budget['tokens_per_parameter']:g} tokens per non-embedding parameter of {budget['batch_size']} x "
        f"{budget['max_length']}-token batches"
    )


def points(record: dict, label: str, losses: dict | None = None) -> tuple[list[float], list[float]]:
    """A model's (compute, loss) points at its best learning rate; `losses` replaces the loss of each size."""
    compute = [rung["models"][label]["compute"] for rung in record["ladder"]]
    loss = [rung["models"][label]["loss"] for rung in record["ladder"]] if losses is None else losses
    return compute, loss


def fits(record: dict) -> dict:
    return {label: fit_power_law(*points(record, label)) for label in record["models"]}


def multipliers(record: dict, samples: int = BOOTSTRAP_SAMPLES) -> dict:
    """Each hf_tfm model's compute multiplier against each reference, with a 95% bootstrap interval over seeds."""
    results = {}
    draw = random.Random(0)
    for reference in record["references"]:
        for label in record["models"]:
            if label in record["references"]:
                continue
            model_fit, reference_fit = record["fits"][label], record["fits"][reference]
            key = f"{label} vs {reference}"
            if not (model_fit["converged"] and reference_fit["converged"]):
                results[key] = {"multiplier": None, "reason": "a fit did not converge"}
                continue
            largest = max(points(record, label)[0])
            estimate = multiplier(model_fit, reference_fit, largest)
            sampled = []
            for _ in range(samples):
                refits = [fit_power_law(*points(record, name, _resampled(record, name, draw)))
                          for name in (label, reference)]  # fmt: skip
                if all(fit["converged"] for fit in refits):
                    sampled.append(multiplier(*refits, largest))
            finite = sorted(value for value in sampled if math.isfinite(value))
            interval = [finite[int(0.025 * len(finite))], finite[int(0.975 * len(finite)) - 1]] if finite else None
            results[key] = {
                "multiplier": estimate,
                "interval_95": interval,
                "bootstrap_samples": len(sampled),
                "unreachable_fraction": (len(sampled) - len(finite)) / len(sampled) if sampled else None,
                "at_compute": largest,
            }
    return results


def _resampled(record: dict, label: str, draw: random.Random) -> list[float]:
    """Each size's loss, the mean of its best learning rate's seeds drawn with replacement."""
    losses = []
    for rung in record["ladder"]:
        row = rung["models"][label]
        seeds = row["runs"][f"{row['best_learning_rate']:g}"]
        losses.append(statistics.fmean(draw.choice(seeds) for _ in seeds))
    return losses


# ------------------------------------------------------------------------------------------------------ the outputs
def table(record: dict) -> str:
    lines = [
        f"# Scaling: {record['task']}",
        "",
        "| size | model | parameters (non-embedding, active) | steps | training FLOPs | best learning rate | "
        "validation loss (mean over seeds) | every learning rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rung in record["ladder"]:
        for label, row in rung["models"].items():
            counts = row["parameters"]
            sweep = "; ".join(f"{rate}: {statistics.fmean(losses):.4f}" for rate, losses in row["runs"].items())
            lines.append(
                f"| {rung['target']:,} | {label} | {counts['total']:,} ({counts['non_embedding']:,}, "
                f"{counts['active_non_embedding']:,}) | {rung['steps']} | {row['compute']:.3g} | "
                f"{row['best_learning_rate']:g} | {row['loss']:.4f} | {sweep} |"
            )
    lines += ["", "| model | E | A | alpha | fit |", "|---|---|---|---|---|"]
    for label, fit in record["fits"].items():
        if "E" in fit:
            state = "converged" if fit["converged"] else f"did not converge: {fit['reason']}"
            if fit.get("E_at_zero"):
                state += " (E at its bound 0: the points fit a pure power law, E is not measured)"
            lines.append(f"| {label} | {fit['E']:.4f} | {fit['A']:.4g} | {fit['alpha']:.4f} | {state} |")
        else:
            lines.append(f"| {label} | | | | did not converge: {fit['reason']} |")
    lines += ["", "| model vs reference | compute multiplier | 95% bootstrap interval over seeds |", "|---|---|---|"]
    for key, value in record["multipliers"].items():
        if value["multiplier"] is None:
            lines.append(f"| {key} | - | {value['reason']} |")
            continue
        interval = value["interval_95"]
        shown = f"{interval[0]:.3g} to {interval[1]:.3g}" if interval else "-"
        lines.append(f"| {key} | {value['multiplier']:.3g} | {shown} ({value['bootstrap_samples']} samples) |")
    lines += [
        "",
        "The multiplier is how many times its compute the reference needs, by its fit, for the loss the model's fit "
        "reaches at the model's largest measured compute (above 1: the model is the more compute-efficient).",
    ]
    return "\n".join(lines) + "\n"


def plot(record: dict, path: Path) -> None:
    """Loss against training compute, log-log: each model's best points and fitted curve, the references dashed,
    every learning rate's other points faint."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, ScalarFormatter

    figure = Figure(figsize=(7.5, 5), layout="tight")
    axes = figure.add_subplot()
    axes.set_title(title(record), fontsize=9)
    for number, label in enumerate(record["models"]):
        colour = f"C{number}"
        reference = label in record["references"]
        compute, loss = points(record, label)
        for rung in record["ladder"]:
            row = rung["models"][label]
            others = [
                statistics.fmean(v) for rate, v in row["runs"].items() if float(rate) != row["best_learning_rate"]
            ]
            axes.scatter([row["compute"]] * len(others), others, color=colour, alpha=0.2, s=14)
        name = label + (" (transformers)" if reference else "")
        axes.scatter(compute, loss, color=colour, marker="s" if reference else "o", label=name, zorder=3)
        fit = record["fits"][label]
        if fit["converged"]:
            grid = [min(compute) * (max(compute) / min(compute)) ** (i / 50) for i in range(51)]
            axes.plot(grid, [loss_at(fit, c) for c in grid], color=colour, linestyle="--" if reference else "-")
    axes.set_xscale("log")
    axes.set_yscale("log")
    # a ladder spans a decade or two of compute and less than one of loss: labels at 1, 2 and 5 of each decade on x,
    # plain numbers on y, instead of matplotlib's crowded minor labels in powers of ten
    axes.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.0e}".replace("e+", "e")))
    axes.xaxis.set_minor_formatter(NullFormatter())
    for formatter in (axes.yaxis.set_major_formatter, axes.yaxis.set_minor_formatter):
        formatter(ScalarFormatter())
    axes.set_xlabel("training compute (FLOPs, counted)")
    axes.set_ylabel("validation loss")
    axes.legend(fontsize=8)
    FigureCanvasAgg(figure).print_png(str(path))
