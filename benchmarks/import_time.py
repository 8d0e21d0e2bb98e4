"""How long `import hf_tfm` takes beside what transformers itself costs: fresh processes, alternating, each timing
its own import (the interpreter's start-up left out). The baseline is `from transformers import LlamaForCausalLM`,
the least a user of a transformers model imports; hf_tfm's row adds `import hf_tfm` to it. The goal: at most 0.5 s
more, in the median over the repeats, with the spread reported.

    python -m benchmarks.import_time [--repeats 7] [--output benchmarks/results/import-time-cpu-<date>.json]
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

STATEMENTS = {
    "transformers + LlamaForCausalLM": "from transformers import LlamaForCausalLM",
    "transformers + LlamaForCausalLM + hf_tfm": "from transformers import LlamaForCausalLM\nimport hf_tfm",
    "hf_tfm alone": "import hf_tfm",
}
TIMED = "import time\nstarted = time.perf_counter()\n{statement}\nprint(time.perf_counter() - started)"
GOAL_S = 0.5


def timed_import(statement: str) -> float:
    code = TIMED.format(statement=statement)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(result.stdout.splitlines()[-1])


def measure(repeats: int) -> dict:
    seconds = {name: [] for name in STATEMENTS}
    timed_import(STATEMENTS["hf_tfm alone"])  # a first run fills the file system's cache for every row
    for _ in range(repeats):  # alternating: a slow moment of the machine falls on every row alike
        for name, statement in STATEMENTS.items():
            seconds[name].append(timed_import(statement))
    rows = {
        name: {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "runs_s": times}
        for name, times in seconds.items()
    }
    baseline, ours = (rows[name]["median_s"] for name in list(STATEMENTS)[:2])
    return {"rows": rows, "added_by_hf_tfm_s": ours - baseline, "goal_s": GOAL_S, "met": ours - baseline <= GOAL_S}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    record = measure(args.repeats)
    for name, row in record["rows"].items():
        print(f"{name:42s} median {row['median_s']:.2f} s  (min {row['min_s']:.2f}, max {row['max_s']:.2f})")
    verdict = "met" if record["met"] else "NOT met"
    print(
        f"hf_tfm adds {record['added_by_hf_tfm_s']:+.2f} s to transformers' own (goal: at most {GOAL_S} s: {verdict})"
    )
    if args.output:
        args.output.write_text(json.dumps(record, indent=2) + "\n")
    return record


if __name__ == "__main__":
    main()
