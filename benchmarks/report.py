"""Turn the latest results files into benchmarks/REPORT.md and its PNG charts (benchmarks/charts/).

    python -m benchmarks.report        # reads benchmarks/results/{cpu,gpu,techniques-cpu,quality-*}-<latest date>.json

Every number in the report is read from a results file; the report names the file and the command that wrote it.
"""

import argparse
import json
import os
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).parent / "results"
REPORT = Path(__file__).parent / "REPORT.md"
SPEED_PROFILES = ("cpu", "gpu")  # results/<profile>-<date>.json
QUALITY_PROFILES = ("quality-cpu", "quality-gpu")


def latest(prefix: str, folder: Path = RESULTS) -> Path | None:
    """The newest `<prefix>-<YYYY-MM-DD>[-N].json`: the latest date, and on that date the highest number (a run on
    another setup the same day writes `-2`, `-3`, ...; the file without a number is the first)."""

    def date_and_number(path: Path) -> tuple[str, int]:
        stamp = path.stem[len(prefix) + 1 :]
        date, number = stamp[:10], stamp[11:]
        return date, int(number) if number.isdigit() else 1

    found = [p for p in folder.glob(f"{prefix}-*.json") if p.stem[len(prefix) + 1 :][:4].isdigit()]
    return max(found, key=date_and_number, default=None)


def shown(path: Path) -> str:
    """A path as the report prints it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(REPORT.parent.parent.resolve()))
    except ValueError:
        return str(path)


def compared(pair: dict) -> list[dict]:
    """A pair's speed and memory rows (the logit-difference row is evidence of equal work, not a ratio)."""
    return [row for row in pair["rows"] if "time_ratio" in row or "memory_ratio" in row]


def logit_line(record: dict) -> str:
    parts = [
        f"{name} {row['ours']:.1e} (of {row['reference']:.1f})"
        for name, pair in record["pairs"].items()
        for row in pair["rows"]
        if row["measure"] == "max logit difference"
    ]
    return (
        "- Same function: largest |logit difference| on the measured batch, hf_tfm vs reference: "
        + ", ".join(parts)
        + "."
    )


def ratio_of(row: dict) -> float:
    return next(row[key] for key in ("time_ratio", "memory_ratio", "speedup") if key in row)


def spread_of(row: dict) -> str:
    if "seconds" not in row:
        return ""
    return f"{max((t['max_s'] - t['min_s']) / t['median_s'] for t in row['seconds'].values()):.1%}"


def label_of(row: dict) -> str:
    return f"{row['measure']} ({row['variant']})" if row.get("variant") else row["measure"]


def speed_section(record: dict, source: Path, charts: Path, report: Path) -> list[str]:
    lines = [
        f"## Speed and memory: {record['profile']} profile",
        "",
        f"- Results: `{shown(source)}`, written by "
        + " and ".join(f"`{c}`" for c in record.get("commands", [record["command"]]))
        + f" on {record['date']}.",
        f"- Device: {record['device']}; " + ", ".join(f"{k} {v}" for k, v in record["versions"].items()) + ".",
        f"- Settings: {record['settings']['dtype']}, warm-up {record['settings']['warmup']}, median of "
        f"{record['settings']['repeats']} alternating repeats "
        f"({record['settings']['generate_repeats']} for generation); "
        f"generation: prompt {record['settings']['prompt_length']}, "
        f"{record['settings']['new_tokens']} new tokens, greedy.",
        *(f"- Note: {note}" for note in record.get("notes", [])),
        "- **ratio** = ours / reference in seconds (speed rows) or bytes (memory rows): below 1.0, hf_tfm is faster "
        "or smaller. Throughputs are tokens/s, latency ms, memory MiB above what was allocated before the step.",
        "",
        "- **spread** = (slowest - fastest repeat) / median, the larger of the two models': how far apart repeats of "
        "the same work landed on this machine.",
        "",
        logit_line(record),
        "",
        "| pair | reference | measure | reference | hf_tfm | unit | ratio | spread |",
        "|---|---|---|---|---|---|---|---|",
    ]
    worst = []
    for name, pair in record["pairs"].items():
        for row in compared(pair):
            ratio = ratio_of(row)
            worst.append((ratio, name, label_of(row)))
            above = round(ratio, 3) > 1.0  # as printed: 1.0004 is parity, not a gap
            flag = (" **(slower)**" if "time_ratio" in row else " **(larger)**") if above else ""
            same = "" if row.get("same_tokens", True) else " (tokens differ)"
            lines.append(
                f"| {name} | {pair['reference']} | {label_of(row)}{same} | {row['reference']:,.1f} | "
                f"{row['ours']:,.1f} | {row['unit']} | {ratio:.3f}{flag} | {spread_of(row)} |"
            )
        for error in pair["errors"]:
            lines.append(f"| {name} | {pair['reference']} | error: {error} | | | | | |")
    slower = [w for w in worst if round(w[0], 3) > 1.0]
    timed = [ratio_of(row) for pair in record["pairs"].values() for row in compared(pair) if "time_ratio" in row]
    above = sum(round(ratio, 3) > 1.0 for ratio in timed)
    median = f"{statistics.median(timed):.3f}" if timed else "n/a"
    lines += [
        "",
        f"Timed rows: {len(timed)}; median ratio {median}; at or below 1.0: {len(timed) - above}; above 1.0: {above}. "
        f"Memory rows above 1.0: {len(slower) - above}.",
        "",
        "Largest gaps (hf_tfm slower or larger):",
        "",
    ]
    lines += [f"- {name}, {label}: {ratio:.3f}" for ratio, name, label in sorted(slower, reverse=True)[:8]] or [
        "- none"
    ]
    chart = charts / f"{source.stem}-ratios.png"
    ratio_chart(record, chart)
    lines += ["", f"![ours / reference ratios]({os.path.relpath(chart, report.parent)})", ""]
    return lines


def ratio_chart(record: dict, path: Path) -> None:
    """One horizontal bar per (pair, measure): the ratio, with the parity line at 1.0."""
    labels, values = [], []
    for name, pair in record["pairs"].items():
        for row in compared(pair):
            labels.append(f"{name}: {label_of(row)}")
            values.append(ratio_of(row))
    figure, axis = plt.subplots(figsize=(9, 0.26 * len(labels) + 1.2))
    colours = ["#c0392b" if round(v, 3) > 1.0 else "#2e86c1" for v in values]
    axis.barh(range(len(values)), values, color=colours)
    axis.axvline(1.0, color="black", linewidth=1)
    axis.set_yticks(range(len(labels)), labels, fontsize=7)
    axis.invert_yaxis()
    axis.set_xlim(min(0.6, min(values) - 0.05), max(1.2, max(values) + 0.05))
    axis.set_xlabel("hf_tfm / reference (time or bytes; < 1 is better)")
    axis.set_title(f"{record['profile']} profile, {record['date']}: {record['device']}", fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


EARLIER_SCORE = (  # what records written before the studies ran as compares scored
    "token-weighted cross-entropy over the validation split (fixed masks for the encoders, router losses left out)"
)


def quality_section(record: dict, source: Path, charts: Path, report: Path) -> list[str]:
    settings = record["settings"]
    lines = [
        f"## Quality at equal compute: {record['profile']} profile",
        "",
        f"- Results: `{shown(source)}`, written by `{record['command']}` on {record['date']}.",
        f"- Device: {record['device']}. Each run: {settings['steps']} steps of {settings['batch_size']} x "
        f"{settings['max_length']} tokens ({record['tokens_per_run']:,} tokens), cosine schedule, seeds "
        f"{settings['seeds']}; one tokenizer per study; the embedded stdlib-docstring corpus.",
        f"- Validation loss: {record.get('score', EARLIER_SCORE)}; mean +- standard deviation over seeds, (min-max) "
        "in brackets.",
        "",
        "| study | model | parameters (active) | validation loss | perplexity |",
        "|---|---|---|---|---|",
    ]
    for row in record["summary"]:
        lines.append(
            f"| {row['study']} | {row['model']} | {row['parameters']:,} ({row['active_parameters']:,}) | "
            f"{row['mean_loss']:.3f} +- {row['std_loss']:.3f} ({row['min_loss']:.3f}-{row['max_loss']:.3f}) | "
            f"{row['perplexity']:.1f} |"
        )
    chart = charts / f"{source.stem}-curves.png"
    curves_chart(record, chart)
    lines += ["", f"![validation loss during training]({os.path.relpath(chart, report.parent)})", ""]
    return lines


def curves_chart(record: dict, path: Path) -> None:
    """Per study, each model's eval loss against step: the mean over seeds, and the band between min and max."""
    studies = list(record["studies"])
    figure, axes = plt.subplots(1, len(studies), figsize=(5.5 * len(studies), 3.8), squeeze=False)
    for axis, study in zip(axes[0], studies):
        for model in dict.fromkeys(r["model"] for r in record["runs"] if r["study"] == study):
            curves = [dict(r["curve"]) for r in record["runs"] if r["study"] == study and r["model"] == model]
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            values = [[c[s] for c in curves] for s in steps]
            axis.plot(steps, [statistics.fmean(v) for v in values], label=model)
            axis.fill_between(steps, [min(v) for v in values], [max(v) for v in values], alpha=0.2)
        axis.set_title(f"{study} ({record['studies'][study]['task']})")
        axis.set_xlabel("step")
        axis.set_ylabel("Trainer eval_loss")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def find_row(record: dict | None, pair: str, measure: str, variant: str | None = None) -> dict | None:
    if record is None or pair not in record["pairs"]:
        return None
    return next(
        (r for r in record["pairs"][pair]["rows"] if r["measure"] == measure and r.get("variant") == variant), None
    )


def speedup(row: dict | None) -> str:
    return "not measured" if row is None else f"{1 / row['time_ratio']:.2f}x"


def targets_section(cpu: dict | None, gpu: dict | None) -> list[str]:
    """Issue 7's goals next to what the newest results say (goals, not tests)."""
    lines = ["## Targets", "", "| target | measured |", "|---|---|"]
    if cpu is not None:
        rows = [row for pair in cpu["pairs"].values() for row in compared(pair)]
        slower = [r for r in rows if "time_ratio" in r and round(r["time_ratio"], 3) > 1.0]
        larger = [r for r in rows if "memory_ratio" in r and round(r["memory_ratio"], 3) > 1.0]
        timed = sum("time_ratio" in r for r in rows)
        worst = max((r["time_ratio"] for r in rows if "time_ratio" in r), default=float("nan"))
        lines.append(
            f"| CPU: no pair slower than its reference (ratio <= 1.0) | {timed - len(slower)} of {timed} timed rows "
            f"at or below 1.0; worst {worst:.3f} |"
        )
        lines.append(f"| CPU: peak memory no higher | {len(larger)} of {len(rows) - timed} memory rows higher |")
    gpt2 = find_row(gpu, "gpt2", "train", "compiled")
    mfu = (
        "not measured"
        if gpt2 is None or "mfu" not in gpt2
        else f"{gpt2['mfu']['ours']:.1%} (reference {gpt2['mfu']['reference']:.1%})"
    )
    lines += [
        f"| GPU: GPT-2 124M training, compiled, >= 1.5x the compiled reference | {speedup(gpt2)} |",
        f"| GPU: GPT-2 124M training MFU >= 40% | {mfu} |",
        f"| GPU: BERT-base MLM, compiled, >= 1.5x the compiled reference "
        f"| {speedup(find_row(gpu, 'bert', 'train', 'compiled'))} |",
        f"| GPU: MoE training >= 1.5x MixtralForCausalLM (grouped_mm) "
        f"| {speedup(find_row(gpu, 'mixtral', 'train', 'eager'))} eager, "
        f"{speedup(find_row(gpu, 'mixtral', 'train', 'compiled'))} compiled |",
    ]
    decode = find_row(gpu, "gpt2", "generate batch 1", "static cache")
    lines.append(
        "| GPU: GPT-2 124M batch-1 greedy >= 1,500 tokens/s | "
        + (
            "not measured"
            if decode is None
            else f"{decode['ours']:,.0f} tokens/s static cache (reference {decode['reference']:,.0f})"
        )
        + " |"
    )
    return lines + [""]


def gap_section(record: dict, source: Path) -> list[str]:
    """The profilers' account of one batch-1 decode step (benchmarks/profile_gap.py)."""
    lines = [
        "## Where the batch-1 decoding gap comes from (CPU)",
        "",
        f"- Results: `{shown(source)}`, written by `{record['command']}` on {record['date']}; {record['device']}.",
        f"- One cached decode step (prompt {record['prompt_length']}): median of {record['steps']} alternating steps; "
        "then, from one torch.profiler run of as many steps, the profiled step time, the CPU time inside top-level "
        "aten operators, and the rest (outside operators: Python module calls, output dataclasses, mask and cache "
        "bookkeeping), all slowed by the profiler.",
        "",
        "| pair | step us (ref -> ours) | ratio | Python calls / step | aten ops / step | profiled step us | "
        "inside operators us | outside us |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        ref, ours = row["reference"], row["ours"]
        cells = [
            f"{ref[k]:,.0f} -> {ours[k]:,.0f}"
            for k in ("python_calls", "aten_ops", "profiled_step_us", "operator_us", "overhead_us")
        ]
        lines.append(
            f"| {row['pair']} | {ref['step_us']:,.0f} -> {ours['step_us']:,.0f} | {row['time_ratio']:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    counted = [row for row in record["rows"] if "generate_step" in row]
    if counted:
        lines += [
            "",
            "Per decode step of a whole batch-1 greedy `generate()` loop (input preparation, model, logits "
            "processing), counted, not timed: the counts `tests/test_step_budget.py` holds to committed budgets.",
            "",
            "| pair | cache | Python calls / step (ref -> ours) | ratio | aten ops / step (ref -> ours) | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for row in counted:
            for cache, sides in row["generate_step"].items():
                ref, ours = sides["reference"], sides["ours"]
                lines.append(
                    f"| {row['pair']} | {cache} | {ref['python_calls']:,.0f} -> {ours['python_calls']:,.0f} | "
                    f"{ours['python_calls'] / ref['python_calls']:.3f} | {ref['aten_ops']:,.0f} -> "
                    f"{ours['aten_ops']:,.0f} | {ours['aten_ops'] / ref['aten_ops']:.3f} |"
                )
    return lines + [""]


def chunked_loss_lines(evidence: dict, rows: list[dict]) -> list[str]:
    """What each chunked-loss pair measured, evidence that it trains the reference's function, and the target."""
    lines = []
    for name, pair in evidence.items():
        shape = ", ".join(f"{key} {value}" for key, value in pair["shape"]["config"].items())
        same = "; ".join(
            f"{label}: loss {v['loss_difference']:.1e}, head gradient {v['head_gradient_difference']:.1e}, "
            + ("logits returned" if v["logits_returned"] else "no logits")
            for label, v in pair["variants"].items()
        )
        lines.append(
            f"- {name}: {pair['reference']} ({shape}), {pair['shape']['batch']} x {pair['shape']['length']} tokens "
            f"per step. Same function, largest difference from the reference on the untouched weights: {same}."
        )
    lines.append(
        "- Issue 14's target for the default `loss_chunk_size`: train peak memory <= 0.6x, time <= 1.0x. At 2 x 256 "
        "tokens the LM head's weight gradient, which both sides hold, is as large as the logits: the long rows are "
        "the training-sized case:"
    )
    for name in evidence:
        default = {
            row["measure"]: ratio_of(row)
            for row in rows
            if row["pair"] == name and row["technique"] == "chunked loss" and row["variant"].endswith("default")
        }
        met = default["train peak memory"] <= 0.6 and round(default["train step"], 3) <= 1.0
        lines.append(
            f"  - {name}: memory {default['train peak memory']:.3f}x, time {default['train step']:.3f}x: "
            + ("met" if met else "**not met**")
        )
    return lines


def packing_lines(evidence: dict, rows: list[dict]) -> list[str]:
    lines = []
    for name, pair in evidence.items():
        shape = pair["shape"]
        padding = "; ".join(
            f"batch {batch}: padding {part['tokens']['padded']['padding_fraction']:.1%} padded, "
            f"{part['tokens']['packed']['padding_fraction']:.1%} packed"
            for batch, part in pair["batches"].items()
        )
        lines.append(
            f"- packing, {name} ({pair['task']}, {pair['attn_implementation']}): {shape['examples']} examples of the "
            f"embedded corpus at their natural lengths, max_length {shape['max_length']}, the same examples padded "
            f"(reference) and packed into rows of max_length (hf_tfm); {padding}."
        )
    lines += target_lines("packing", rows, "real training tokens/s, packed / padded >= 1.4x", lambda r: r >= 1.4)
    return lines


def host_sync_lines(evidence: dict, rows: list[dict]) -> list[str]:
    lines = []
    for cache, sides in evidence["host_syncs"].items():
        counts = ", ".join(
            f"{side}: {sides[key]['generate() forwards']['per_decode_step']:g} per decode step "
            f"({sides[key]['forwards given a padding mask']['per_decode_step']:g} given a padding mask), "
            f"{sides[key]['generate() forwards']['first_forward']} in the first forward"
            for side, key in (("reference", "reference"), ("hf_tfm", "ours"))
        )
        same = "same tokens" if evidence["same_tokens"][cache] else "**different tokens**"
        lines.append(
            f"- no host sync, {cache} ({evidence['reference']}, {evidence['attn_implementation']}): host "
            f"synchronisations in the model's forwards inside generate(): {counts}; {same}. On the CPU a sync costs "
            "nothing measurable: the counts are the result, the times show that removing them cost nothing."
        )
    return lines


def compile_lines(evidence: dict, rows: list[dict]) -> list[str]:
    lines = []
    for name, pair in evidence.items():
        parts = []
        for measure in ("train step", "batch-1 decode"):
            part = pair[measure]
            graphs = ", ".join(
                f"{side} {part[key]['graphs']} graph(s) / {part[key]['graph_breaks']} break(s)"
                for side, key in (("reference", "reference"), ("hf_tfm", "ours"))
            )
            check = (
                f"loss difference {part['loss_difference']:.1e}"
                if "loss_difference" in part
                else ("same tokens" if part["same_tokens"] else "**different tokens**")
            )
            parts.append(f"{measure}: {graphs}, {check}")
        lines.append(f"- compile, {name} ({pair['reference']}): " + "; ".join(parts) + ".")
    lines += target_lines("compiled", rows, "compiled hf_tfm / compiled reference <= 1.0x", lambda r: r <= 1.0)
    return lines


def target_lines(technique: str, rows: list[dict], target: str, met) -> list[str]:
    lines = [f"- Issue 14's target for {technique}: {target}:"]
    for row in rows:
        if row["technique"] == technique:
            ratio = ratio_of(row)
            verdict = "met" if met(round(ratio, 3)) else "**not met**"
            lines.append(f"  - {row['pair']}, {row['measure']} ({row['variant']}): {ratio:.3f}x: {verdict}")
    return lines


TECHNIQUE_LINES = {
    "chunked loss": chunked_loss_lines,
    "packing": packing_lines,
    "no host sync": host_sync_lines,
    "compile": compile_lines,
}


def technique_lines(technique: str, evidence: dict, rows: list[dict]) -> list[str]:
    return TECHNIQUE_LINES[technique](evidence, rows)


def techniques_section(record: dict | None, source: Path | None, profile: str = "cpu") -> list[str]:
    """Issue 14's techniques, each row hf_tfm against the reference on the same weights (benchmarks/techniques.py)."""
    lines = [f"## Beyond parity: {profile} profile", ""]
    if record is None:
        return lines + ["Not measured yet: no results file.", ""]
    lines += [
        f"- Results: `{shown(source)}`, written by `{record['command']}` on {record['date']}.",
        f"- Device: {record['device']}; " + ", ".join(f"{k} {v}" for k, v in record["versions"].items()) + ".",
        f"- Settings: {record['settings']['dtype']}; "
        + "; ".join(
            f"{technique}: " + ", ".join(f"{key} {value}" for key, value in part["settings"].items())
            for technique, part in record["techniques"].items()
        )
        + ". Times are medians of alternating repeats.",
        "- **ratio** = hf_tfm / reference in seconds or bytes (below 1.0: faster or smaller), or for a **speedup** "
        "row hf_tfm's throughput / the reference's (above 1.0: faster); **spread** = (slowest - fastest repeat) / "
        "median, the larger of the two sides'. Memory: MiB above what was allocated before the step.",
    ]
    for technique, part in record["techniques"].items():
        lines += technique_lines(technique, part["evidence"], record["rows"])
    lines += [
        "",
        "| technique | pair | measure | reference | hf_tfm | ratio | spread |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        lines.append(
            f"| {row['technique']} | {row['pair']} | {row['measure']}, {row['unit']} ({row['variant']}) | "
            f"{row['reference']:,.1f} | {row['ours']:,.1f} | {ratio_of(row):.3f} | {spread_of(row)} |"
        )
    lines += [f"| error | {error} | | | | | |" for error in record["errors"]]
    return lines + [""]


def trace_section(record: dict, source: Path) -> list[str]:
    """The traced GPU training step (benchmarks/trace.py): per pair, hf_tfm against the reference on each count."""
    lines = [
        "## A GPU training step, traced on the CPU",
        "",
        f"- Results: `{shown(source)}` ({record['date']}, torch {record['versions']['torch']}, transformers "
        f"{record['versions']['transformers']}, commit {record['versions']['commit']}).",
        "- One step (forward with labels, backward, fused AdamW) at the GPU profile's shapes and dtype policy, under "
        "FakeTensorMode: counted, not timed. hf_tfm / reference; a count above the reference's is marked **bold**.",
        "",
        "- Peak GiB: the most bytes the step's own storages hold at once (above the weights and optimizer state); "
        "attention that a GPU fuses counts as its fused kernel, dropout included (CUDA's fused kernels apply it, the "
        "CPU's refuse it). T5's attention, whose position bias needs a gradient, takes the CPU's math path on both "
        "sides and holds [batch, heads, length, length] scores that the GPU's fused kernel does not, so its ratio "
        "understates the GPU's difference.",
        "",
        "| pair | kernels | GiB read + written | peak GiB | host syncs | float32 matmul TFLOP | all matmul TFLOP |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(ours: float, theirs: float, digits: int) -> str:
        text = f"{ours:.{digits}f} / {theirs:.{digits}f}"
        return f"**{text}**" if ours > theirs * (1 + 1e-9) else text

    for name, pair in record["pairs"].items():
        ours, theirs = pair["ours"], pair["reference"]
        rows = [
            cell(ours["kernels"], theirs["kernels"], 0),
            cell(ours["bytes_gib"], theirs["bytes_gib"], 1),
            cell(ours["peak_gib"], theirs["peak_gib"], 2) if "peak_gib" in ours else "not traced",
            cell(ours["host_syncs"], theirs["host_syncs"], 0),
            cell(ours["matmul_tflops"].get("float32", 0.0), theirs["matmul_tflops"].get("float32", 0.0), 2),
            cell(sum(ours["matmul_tflops"].values()), sum(theirs["matmul_tflops"].values()), 2),
        ]
        lines.append(f"| {name} | " + " | ".join(rows) + " |")
    # the inference forward and the decode step: (the record's key, the table's title, its columns as
    # (heading, count, digits))
    tables = [
        (
            "forward",
            "An inference forward of the same batch (eval mode, no labels, the profile's bf16 weights), traced alike:",
            [("kernels", "kernels", 0), ("GiB read + written", "bytes_gib", 2), ("peak GiB", "peak_gib", 3)],
        ),
        (
            "decode",
            "A batch-1 decode step after a prompt of the profile's length (a decoder on a static cache; an "
            "encoder-decoder with the prompt as its source, on dynamic caches), launch-bound on a GPU, so kernels are "
            "what it pays; traced alike:",
            [("kernels", "kernels", 0), ("GiB read + written", "bytes_gib", 3), ("host syncs", "host_syncs", 0)],
        ),
    ]
    for key, title, columns in tables:
        traced = {name: pair[key] for name, pair in record["pairs"].items() if key in pair}
        if not traced:
            continue
        header = "| pair | " + " | ".join(heading for heading, _, _ in columns) + " |"
        lines += ["", title, "", header, "|---" * (len(columns) + 1) + "|"]
        for name, sides in traced.items():
            rows = [cell(sides["ours"][count], sides["reference"][count], digits) for _, count, digits in columns]
            lines.append(f"| {name} | " + " | ".join(rows) + " |")
    return [*lines, ""]


def compiled_section(record: dict, source: Path) -> list[str]:
    """The compiled training step's inductor counts (benchmarks/compiled.py): per pair, hf_tfm against the
    reference."""
    lines = [
        "## A compiled training step, counted by inductor on the CPU",
        "",
        f"- Results: `{shown(source)}` ({record['date']}, torch {record['versions']['torch']}, transformers "
        f"{record['versions']['transformers']}, commit {record['versions']['commit']}), written by "
        f"`{record['command']}`.",
        "- One training step (forward with labels, backward) of each pair at its GPU-profile configuration and dtype "
        "policy, compiled by torch.compile's inductor on the CPU for two smaller batches; inductor's scheduler counts "
        "the bytes its kernels (fused kernels and the matmuls they call) read and write. Counted, not timed: a "
        "prediction for a GPU's compiled step, as the eager trace above is; as there, an attention a GPU fuses runs "
        "without its dropout, which the GPU's fused kernel applies inside. hf_tfm / reference; above the "
        "reference's is **bold**. Extrapolated: the bytes at the profile's token count (in brackets) if they grow "
        "linearly from one batch to the next, which the chunked loss's chunk count (one chunk at these batches, six "
        "for GPT-2 at 16 x 1024) and inductor's shape-dependent choices can break (BART's reference grows half as "
        "fast as hf_tfm's between these two batches): a hint, not a count.",
        *[f"- Note: {note}" for note in record.get("notes", [])],
        "",
        "| pair | GB read + written (larger batch) | ratio by batch | extrapolated to the profile's tokens | "
        "kernels generated | graphs | graph breaks |",
        "|---|---|---|---|---|---|---|",
    ]

    def marked(ratio: float) -> str:
        return f"**{ratio:.3f}**" if ratio > 1 else f"{ratio:.3f}"

    for name, pair in record["pairs"].items():
        ours, theirs, ratios = pair["ours"], pair["reference"], pair["ratios"]
        by_batch = ", ".join(
            f"{batch}: {marked(gb / theirs['gb_by_batch'][batch])}" for batch, gb in ours["gb_by_batch"].items()
        )
        lines.append(
            f"| {name} | {ours['gb']:.3f} / {theirs['gb']:.3f} | {by_batch} | "
            f"{marked(ratios['gb_at_profile_tokens'])} ({pair['profile_tokens']}) | "
            f"{ours['kernels']} / {theirs['kernels']} | {ours['graphs']} / {theirs['graphs']} | "
            f"{ours['graph_breaks']} / {theirs['graph_breaks']} |"
        )
    lines += [f"- {name}: not compiled here ({error})" for name, error in record.get("errors", {}).items()]
    return [*lines, ""]


def build(results: Path = RESULTS, report: Path = REPORT) -> str:
    charts = report.parent / "charts"
    lines = [
        "# hf_tfm benchmarks",
        "",
        "Generated by `python -m benchmarks.report` from the newest results file of each profile; "
        "do not edit by hand.",
        "Speed: `python -m benchmarks.speed --profile cpu|gpu`. Beyond parity: `python -m benchmarks.techniques`. "
        "Quality: `python -m benchmarks.quality --profile cpu|gpu`.",
        "Every pair holds identical weights (hf_tfm's converters) and identical configurations, dropout included.",
        "",
    ]
    sources = {profile: latest(profile, results) for profile in SPEED_PROFILES}
    records = {profile: json.loads(source.read_text()) if source else None for profile, source in sources.items()}
    lines += targets_section(records["cpu"], records["gpu"])
    for profile, source in sources.items():
        if source is None:
            lines += [f"## Speed and memory: {profile} profile", "", "Not measured yet: no results file.", ""]
            continue
        lines += speed_section(records[profile], source, charts, report)
    source = latest("trace-gpu", results)
    if source is not None:
        lines += trace_section(json.loads(source.read_text()), source)
    source = latest("compiled-gpu", results)
    if source is not None:
        lines += compiled_section(json.loads(source.read_text()), source)
    source = latest("techniques-cpu", results)
    lines += techniques_section(json.loads(source.read_text()) if source else None, source)
    source = latest("profile-cpu", results)
    if source is not None:
        lines += gap_section(json.loads(source.read_text()), source)
    for profile in QUALITY_PROFILES:
        source = latest(profile, results)
        if source is None:
            lines += [
                f"## Quality at equal compute: {profile.removeprefix('quality-')} profile",
                "",
                "Not measured yet: no results file.",
                "",
            ]
            continue
        lines += quality_section(json.loads(source.read_text()), source, charts, report)
    text = "\n".join(lines)
    report.write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--report", type=Path, default=REPORT)
    args = parser.parse_args(argv)
    build(args.results, args.report)
    print(f"written: {args.report}")


if __name__ == "__main__":
    main()
