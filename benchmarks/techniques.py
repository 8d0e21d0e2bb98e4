"""What hf_tfm's training and serving techniques buy against the transformers reference classes, as ratios measured
in one process with alternating repeats (benchmarks/measure.py), on identical weights.

    python -m benchmarks.techniques --profile cpu                 # every technique: results/techniques-cpu-<date>.json
    python -m benchmarks.techniques --profile cpu --only packing  # one technique (a partial record, for a look)
    python -m benchmarks.report                                   # its "Beyond parity" section in REPORT.md

Each technique is one module named by what it measures (`chunked_loss`, `packing`, `host_sync`, `compiled_cpu`),
with the same two names: `PROFILES` (its shapes per profile) and `measure(profile) -> (evidence, rows)`. A row compares
hf_tfm against the reference (the transformers class, or hf_tfm without the technique where the technique has no
reference counterpart) by one of `time_ratio`, `memory_ratio` (ours / reference) or `speedup` (ours / reference
throughput).
"""

import argparse
import importlib
import sys
from pathlib import Path

import torch

from benchmarks.record import header, write
from benchmarks.report import ratio_of
from benchmarks.speed import error_line

# technique -> module; the order is the report's
TECHNIQUES = {
    "chunked loss": "benchmarks.chunked_loss",
    "packing": "benchmarks.packing",
    "no host sync": "benchmarks.host_sync",
    "compile": "benchmarks.compiled_cpu",
}


def run(profile_name: str, output: Path | None = None, command: str | None = None, only: list[str] = ()) -> dict:
    command = command or f"python -m benchmarks.techniques --profile {profile_name}"
    record = {
        **header(profile_name, command, torch.device("cpu")),
        "settings": {"dtype": "float32"},
        "techniques": {},
        "rows": [],
        "errors": [],
    }
    for technique, module_name in TECHNIQUES.items():
        if only and technique not in only:
            continue
        module = importlib.import_module(module_name)
        profile = module.PROFILES[profile_name]
        try:
            evidence, rows = module.measure(profile_name)
        except Exception as error:  # a crash is a result, not the end of the run
            record["errors"].append(error_line(technique, error))
            continue
        settings = {key: value for key, value in profile.items() if not isinstance(value, dict | list)}
        record["techniques"][technique] = {"settings": settings, "evidence": evidence}
        record["rows"] += rows
        for row in rows:
            print(
                f"{technique:14s} {row['pair']:10s} {row['measure']:18s} {row['variant']:32s} "
                f"ref {row['reference']:9.4g}  ours {row['ours']:9.4g} {row['unit']:9s} ratio {ratio_of(row):.3f}",
                flush=True,
            )
    # a partial record never shadows the full one that the report reads (`techniques-<profile>-<date>.json`)
    write(record, f"techniques-{profile_name}" + ("-partial" if only else ""), output)
    return record


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=["cpu", "smoke"], default="cpu")
    parser.add_argument("--only", action="append", choices=list(TECHNIQUES), help="measure only this technique")
    parser.add_argument("--output", type=Path, help="default: benchmarks/results/techniques-<profile>-<date>.json")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.techniques " + " ".join(argv)
    return run(args.profile, args.output, command, args.only or ())


if __name__ == "__main__":
    main()
