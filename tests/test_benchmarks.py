"""The benchmark harness (benchmarks/) at toy shapes: every pair and measure runs, the paired models really are
the same function, the quality study's parameter matching holds, and the report reads what the runs wrote.
No test looks at a time."""

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from benchmarks import (
    chunked_loss,
    linear_cross_entropy,
    nanogpt_setting,
    profile_gap,
    quality,
    report,
    speed,
    techniques,
)
from benchmarks.pairs import KINDS, PROFILES, build_pair, parameter_count, train_flops_per_token

# one xdist worker runs this module, so its module-scoped fixture runs once
pytestmark = [pytest.mark.xdist_group("benchmarks"), pytest.mark.filterwarnings("ignore")]


@pytest.fixture(scope="module")
def speed_record(tmp_path_factory):
    output = tmp_path_factory.mktemp("speed") / "cpu-2026-01-01.json"
    record = speed.run("smoke", output=output)
    assert json.loads(output.read_text()) == json.loads(json.dumps(record))
    return record


@pytest.mark.slow
def test_every_pair_measures_everything_without_errors(speed_record):
    assert {"hf_tfm", "commit"} <= set(speed_record["versions"])
    assert set(speed_record["pairs"]) == set(KINDS)
    assert {"device", "versions", "command", "settings"} <= set(speed_record)
    for name, pair in speed_record["pairs"].items():
        assert pair["errors"] == [], name
        measures = {(row["measure"], row.get("variant")) for row in pair["rows"]}
        expected = {
            ("train", "eager"),
            ("train peak memory", None),
            ("forward latency", "eager"),
            ("forward peak memory", None),
            ("max logit difference", None),
        }
        if KINDS[name].task != "masked":
            expected |= {(f"generate batch {b}", f"{c} cache") for b in (1, 2) for c in ("dynamic", "static")}
        assert measures == expected, name
        for row in report.compared(pair):
            ratio = row.get("time_ratio", row.get("memory_ratio"))
            assert ratio > 0 and math.isfinite(ratio), (name, row)
        assert pair["active_parameters"]["ours"] > 0


@pytest.mark.slow
def test_paired_models_compute_the_same_function(speed_record):
    for name, pair in speed_record["pairs"].items():
        [logits] = [row for row in pair["rows"] if row["measure"] == "max logit difference"]
        assert logits["ours"] <= 1e-4 * max(1.0, logits["reference"]), name
        for row in pair["rows"]:
            if "same_tokens" in row:
                assert row["same_tokens"], (name, row["measure"], row["variant"])


@pytest.mark.parametrize("name", sorted(KINDS))
def test_pairs_hold_the_same_parameters(name):
    reference, ours = build_pair(name, PROFILES["smoke"]["pairs"][name]["config"])
    extra = (
        97 if name == "bart" else 0
    )  # BART keeps final_logits_bias as a buffer; hf_tfm's LM-head bias is a parameter
    assert parameter_count(ours) == parameter_count(reference) + extra


def test_training_flops_follow_the_nanogpt_accounting():
    """6 flops per parameter except the position table (the tied token table counts once, as the LM head's
    matmul), plus 12 x layers x width x length for attention: nanoGPT's estimate_mfu."""
    config = GPT2Config(n_embd=64, n_layer=3, n_head=4, vocab_size=1000, n_positions=128)
    model = GPT2LMHeadModel(config)
    non_position = sum(p.numel() for p in model.parameters()) - 128 * 64
    assert train_flops_per_token(model, 100) == 6 * non_position + 12 * 3 * 64 * 100


def test_gpu_calls_add_pairs_to_one_file_and_never_overwrite_another_setup(tmp_path, monkeypatch):
    monkeypatch.setattr(speed, "RESULTS", tmp_path)
    monkeypatch.setattr(speed, "write", lambda record, stem, path: path.write_text(json.dumps(record)))
    first = {
        "profile": "gpu",
        "date": "2026-01-01",
        "command": "a",
        "device": "H100",
        "versions": {},
        "settings": {},
        "pairs": {"gpt2": {"rows": []}},
    }
    path = speed.results_path(first, None)
    speed.merge_and_write(first, path)
    second = dict(first, command="b", pairs={"bert": {"rows": []}})
    merged = speed.merge_and_write(second, speed.results_path(second, None))
    assert set(merged["pairs"]) == {"gpt2", "bert"} and merged["commands"] == ["a", "b"]
    # a call that measured one part of a pair (make bench-gpu-all: training, then inference) keeps the other's rows
    training = {"parts": ["training"], "rows": [{"measure": "train"}], "errors": ["training: E"], "train_kernels": 1}
    inference = {"parts": ["inference"], "rows": [{"measure": "forward latency"}], "errors": []}
    speed.merge_and_write(dict(first, command="c", pairs={"t5": training}), path)
    merged = speed.merge_and_write(dict(first, command="d", pairs={"t5": inference}), path)["pairs"]["t5"]
    assert [row["measure"] for row in merged["rows"]] == ["forward latency", "train"]
    assert merged["parts"] == ["inference", "training"] and merged["errors"] == ["training: E"]
    assert merged["train_kernels"] == 1
    again = {"parts": ["training"], "rows": [{"measure": "train peak memory"}], "errors": []}
    merged = speed.merge_and_write(dict(first, command="e", pairs={"t5": again}), path)["pairs"]["t5"]
    assert [row["measure"] for row in merged["rows"]] == ["forward latency", "train peak memory"]
    assert merged["errors"] == []
    other = dict(first, device="H200", pairs={"t5": {"rows": []}})
    assert speed.results_path(other, None) == tmp_path / "gpu-2026-01-01-2.json"
    with pytest.raises(SystemExit, match="another device"):
        speed.merge_and_write(other, path)
    assert set(json.loads(path.read_text())["pairs"]) == {"gpt2", "bert", "t5"}


@pytest.mark.slow
def test_quality_study_matches_parameters_and_reports_every_seed(tmp_path):
    record = quality.run("smoke", work=tmp_path / "runs", output=tmp_path / "quality-cpu-2026-01-01.json")
    rows = {(row["study"], row["model"]): row for row in record["summary"]}
    references = {("decoders", "gpt2 (transformers)"), ("encoders", "bert (transformers)")}
    assert set(rows) == {(s, m) for s, study in quality.STUDIES.items() for m in study["models"]} | references
    for row in rows.values():
        assert row["seeds"] == len(quality.PROFILES["smoke"]["seeds"]) and math.isfinite(row["mean_loss"])
    decoders = [rows["decoders", m]["active_parameters"] for m in ("gpt2-style", "modern", "moe (same active)")]
    encoders = [rows["encoders", m]["parameters"] for m in ("bert-style", "modern")]
    for counts in (decoders, encoders):
        assert max(counts) / min(counts) < 1.01, counts
    assert rows["decoders", "moe (same active)"]["parameters"] > 2 * decoders[0]  # sparse: far more in total
    for study, reference in references:
        assert abs(rows[study, reference]["parameters"] / rows[study, "modern"]["parameters"] - 1) < 0.05
    for run in record["runs"]:
        assert run["curve"], run["model"]  # the learning curve was logged


@pytest.mark.slow
def test_report_reads_the_results(tmp_path, speed_record):
    results = tmp_path / "results"
    results.mkdir()
    (results / "cpu-2026-01-01.json").write_text(json.dumps({**speed_record, "profile": "cpu"}))
    text = report.build(results, tmp_path / "REPORT.md")
    assert "## Speed and memory: cpu profile" in text and "| gpt2 | GPT2LMHeadModel | train (eager) |" in text
    assert "## Speed and memory: gpu profile\n\nNot measured yet" in text
    assert (tmp_path / "charts" / "cpu-2026-01-01-ratios.png").stat().st_size > 0


@pytest.mark.slow
def test_profile_gap_takes_apart_each_causal_pair(tmp_path, monkeypatch):
    monkeypatch.setattr(profile_gap, "STEPS", 3)
    monkeypatch.setattr(profile_gap, "GENERATE_REPEATS", 1)
    record = profile_gap.main("smoke", tmp_path / "profile-cpu-2026-01-01.json")
    assert [row["pair"] for row in record["rows"]] == [n for n, kind in KINDS.items() if kind.task == "causal"]
    for row in record["rows"]:
        for side in ("reference", "ours"):
            assert row[side]["python_calls"] > 0 and row[side]["aten_ops"] > 0 and row[side]["operator_us"] > 0
            assert all(times[side] > 0 for times in row["generate_token_us"].values())
    assert "## Where the batch-1 decoding gap comes from (CPU)" in report.gap_section(record, tmp_path / "x.json")[0]


@pytest.mark.parametrize("name", [name for name, kind in KINDS.items() if kind.task == "causal"])
def test_gpu_depth_gives_the_tiny_pair_the_gpu_profiles_layers(name):
    """`profile_gap --gpu-depth`: the smoke pair, as many layers as the GPU profile's (GPT-2 124M's 12), both sides."""
    kind = KINDS[name]
    expected = kind.config_class(**kind.defaults, **PROFILES["gpu"]["pairs"][name]["config"]).num_hidden_layers
    reference, ours = build_pair(name, profile_gap.at_gpu_depth(name, PROFILES["smoke"]["pairs"][name]["config"]))
    assert reference.config.num_hidden_layers == ours.config.num_hidden_layers == expected
    assert reference.config.hidden_size == PROFILES["smoke"]["pairs"][name]["config"].get("hidden_size", 32)


def test_techniques_measures_every_chunked_loss_variant_and_reports_it(tmp_path):
    """benchmarks/techniques.py at toy shapes: for each pair, the default, plain and swept loss_chunk_size each get a
    train-step row and a peak-memory row against the reference, and each trains the reference's function."""
    output = tmp_path / "results" / "techniques-cpu-2026-01-01.json"
    record = techniques.main(["--profile", "smoke", "--only", "chunked loss", "--output", str(output)])
    assert json.loads(output.read_text()) == json.loads(json.dumps(record))
    assert {"device", "versions", "command", "settings"} <= set(record) and record["errors"] == []
    profile = chunked_loss.PROFILES["smoke"]["pairs"]
    evidence = record["techniques"]["chunked loss"]["evidence"]
    assert set(evidence) == set(profile)
    for name, pair in evidence.items():
        default = pair["default_loss_chunk_size"]
        assert default is None  # chunked, sized by the memory budget, unless a user asks for the plain path
        sizes = [variant["loss_chunk_size"] for variant in pair["variants"].values()]
        assert sizes == list(dict.fromkeys([default, 0, *profile[name]["sweep"]])), name
        for label, variant in pair["variants"].items():
            assert variant["loss_difference"] <= 1e-5 and variant["head_gradient_difference"] <= 1e-5, (name, label)
            assert variant["logits_returned"] == (variant["loss_chunk_size"] == 0), (name, label)
        rows = {(row["measure"], row["variant"]) for row in record["rows"] if row["pair"] == name}
        assert rows == {(m, label) for m in ("train step", "train peak memory") for label in pair["variants"]}, name
    for row in record["rows"]:
        ratio = row.get("time_ratio", row.get("memory_ratio"))
        assert row["technique"] == "chunked loss" and ratio > 0 and math.isfinite(ratio), row
    text = report.build(output.parent, tmp_path / "REPORT.md")
    assert "## Beyond parity: cpu profile\n\n- Results:" in text
    assert "| chunked loss | gpt2 | train step, ms (loss_chunk_size 0, plain) |" in text
    assert "\n  - gpt2: memory " in text and "\n  - llama: memory " in text  # the default against issue 14's target
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "## Beyond parity: cpu profile\n\nNot measured yet" in report.build(empty, tmp_path / "EMPTY.md")


def test_linear_cross_entropy_compares_the_three_losses_under_each_dtype_policy(tmp_path):
    """benchmarks/linear_cross_entropy.py at a toy shape: the reference's, hf_tfm's and torch's loss under each dtype
    policy, each step timed, its peak and its difference from float64 measured; hf_tfm's chunked loss hands its
    vocabulary matmul the dtypes the reference's gets (autocast's under autocast)."""
    output = tmp_path / "linear-cross-entropy-smoke.json"
    record = linear_cross_entropy.main(["--profile", "smoke", "--output", str(output)])
    assert json.loads(output.read_text()) == json.loads(json.dumps(record))
    assert set(record["policies"]) == set(linear_cross_entropy.POLICIES)
    for policy, row in record["policies"].items():
        assert set(row) == {"reference", "hf_tfm", "torch"}, policy
        for name, measured in row.items():
            assert measured["time_ratio"] > 0 and measured["peak_bytes"] > 0, (policy, name)
            assert all(math.isfinite(value) for value in measured["largest_difference_from_float64"].values())
        assert row["hf_tfm"]["vocabulary_matmul_dtypes"] == row["reference"]["vocabulary_matmul_dtypes"], policy
    assert record["policies"]["float32 weights, bf16 autocast"]["reference"]["vocabulary_matmul_dtypes"] == [
        "bfloat16/bfloat16"
    ]


def test_the_report_reads_the_newest_file_of_a_kind(tmp_path):
    """The latest date wins, and on one date the highest numbered sibling (`speed.results_path` writes `-2` for a
    second setup), which plain string order would put first ("-" sorts before ".")."""
    for name in ("cpu-2026-01-01.json", "cpu-2026-01-02.json", "cpu-2026-01-02-2.json", "cpu-2026-01-02-10.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "techniques-cpu-2026-02-01.json").write_text("{}")  # another kind, whose name also starts with "cpu"
    assert report.latest("cpu", tmp_path).name == "cpu-2026-01-02-10.json"
    assert report.latest("gpu", tmp_path) is None


def test_committed_report_is_current(tmp_path):
    """benchmarks/REPORT.md is what `python -m benchmarks.report` makes of the committed results."""
    assert report.build(report.RESULTS, tmp_path / "REPORT.md") == report.REPORT.read_text()


def test_gpu_profile_refuses_to_run_without_a_gpu(monkeypatch):
    monkeypatch.setattr(speed.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        speed.main(["--profile", "gpu"])


def test_host_sync_smoke():
    """benchmarks/host_sync.py at toy shapes: a generate() row per cache against LlamaForCausalLM on the same
    tokens, and the evidence that hf_tfm's decode steps make no host sync through generate()."""
    from benchmarks import host_sync

    evidence, rows = host_sync.measure("smoke")
    assert all(evidence["same_tokens"].values())
    assert [row["variant"] for row in rows] == ["batch 1, dynamic cache", "batch 1, static cache"]
    for row in rows:
        assert row["technique"] == "no host sync" and row["time_ratio"] > 0 and math.isfinite(row["time_ratio"])
    for counts in evidence["host_syncs"].values():
        assert counts["ours"]["generate() forwards"]["per_decode_step"] == 0
        ours, reference = (counts[side]["forwards given a padding mask"] for side in ("ours", "reference"))
        assert ours["per_decode_step"] <= reference["per_decode_step"]


def test_packing_smoke():
    """benchmarks/packing.py at toy shapes: per pair and batch size a real-tokens/s row, packed against
    padded, on the same real tokens, packed with no more padding than padded."""
    from benchmarks import packing

    evidence, rows = packing.measure("smoke")
    assert set(evidence) == set(packing.PROFILES["smoke"]["pairs"])
    for pair in evidence.values():
        for batch in pair["batches"].values():
            tokens = batch["tokens"]
            assert 0 <= tokens["packed"]["padding_fraction"] <= tokens["padded"]["padding_fraction"] < 1
    for row in rows:
        assert row["technique"] == "packing" and row["speedup"] > 0 and math.isfinite(row["speedup"])


@pytest.mark.slow
def test_bench_gpu_runs_its_arguments_on_the_cpu(tmp_path):
    """`make bench-gpu`'s arguments (the Makefile's BENCH_GPU_ARGS) at the smoke shapes on the CPU, one pair with a
    compiled row: the training rows, the check that the compiled row really ran compiled code, and a kernel table per
    variant and side, so that the command cannot fail on its first GPU run for a reason a CPU can show."""
    makefile = (Path(__file__).parent.parent / "Makefile").read_text()
    arguments = next(line for line in makefile.splitlines() if line.startswith("BENCH_GPU_ARGS :=")).split(":=")[1]
    arguments = arguments.split()
    assert arguments[:2] == ["--train-only", "--pairs"] and "--kernels" in arguments
    compiled = arguments[arguments.index("--compiled-pairs") + 1 : arguments.index("--kernels")]
    assert compiled == ["gpt2", "llama"]
    output = tmp_path / "gpu.json"
    speed.main(
        ["--profile", "smoke", "--train-only", "--pairs", "gpt2", "--compiled-pairs", "gpt2", "--kernels"]
        + ["--output", str(output)]
    )
    pair = json.loads(output.read_text())["pairs"]["gpt2"]
    assert pair["errors"] == []
    assert {(row["measure"], row.get("variant")) for row in pair["rows"]} == {
        ("train", "eager"),
        ("train peak memory", None),
        ("train", "compiled"),
    }
    for variant in ("eager", "compiled"):
        for side in ("reference", "ours"):
            table = pair["train_kernels"][variant][side]
            assert table["kernels"] > 0 and table["top"], (variant, side)
    # make bench-gpu-all: the inference rows join the same file and pair, beside the training rows
    recipe = makefile.split("\nbench-gpu-all:")[1].split("\n\n")[0]
    assert recipe.count("--output $(OUT)/gpu.json") == 2 and "bench-gpu-nanogpt" in recipe
    speed.main(["--profile", "smoke", "--inference-only", "--pairs", "gpt2", "--output", str(output)])
    pair = json.loads(output.read_text())["pairs"]["gpt2"]
    measures = [row["measure"] for row in pair["rows"]]
    assert measures[0] == "max logit difference" and measures.count("train") == 2 and "train_kernels" in pair


def test_bench_gpu_inference_runs_its_arguments_on_the_cpu(tmp_path, monkeypatch):
    """`make bench-gpu-inference`'s arguments at the smoke shapes on the CPU, for its encoder-decoder pair: forward
    and generation rows, no training row. `--compiled-pairs` reaches the forward rows as it does the training rows:
    a pair it leaves out gets no compiled row even where the profile compiles (it once compiled every pair)."""
    makefile = (Path(__file__).parent.parent / "Makefile").read_text()
    line = next(line for line in makefile.splitlines() if line.startswith("BENCH_GPU_INFERENCE_ARGS :="))
    arguments = line.split(":=")[1].split()
    assert arguments[:2] == ["--inference-only", "--pairs"] and "t5" in arguments
    monkeypatch.setitem(speed.PROFILES["smoke"], "compile", True)
    output = tmp_path / "gpu-inference.json"
    speed.main(
        [
            "--profile",
            "smoke",
            "--inference-only",
            "--pairs",
            "t5",
            "--compiled-pairs",
            "gpt2",
            "--output",
            str(output),
        ]
    )
    pair = json.loads(output.read_text())["pairs"]["t5"]
    assert pair["errors"] == []
    measures = {row["measure"] for row in pair["rows"]}
    assert {"forward latency", "forward peak memory", "max logit difference"} <= measures
    assert "generate batch 1" in measures
    assert not any(measure.startswith("train") for measure in measures)
    assert {row.get("variant") for row in pair["rows"] if row["measure"] == "forward latency"} == {"eager"}


@pytest.mark.slow
def test_nanogpt_setting_runs_on_the_cpu(tmp_path):
    """`make bench-gpu-nanogpt` at the smoke shape on the CPU: the three models hold one function (the nanoGPT-style
    model's weights copied from the reference, hf_tfm's converted), each trains compiled, and the record holds each
    model's tokens/s, peak memory and the ratios the issue's targets read."""
    makefile = (Path(__file__).parent.parent / "Makefile").read_text()
    assert "python3 -m benchmarks.nanogpt_setting --profile gpu" in makefile.split("\nbench-gpu-nanogpt:")[1]
    models = nanogpt_setting.build_models(nanogpt_setting.PROFILES["smoke"]["model"])
    ids = torch.randint(0, 50257, (2, 16))
    assert nanogpt_setting.largest_logit_difference(models, ids) < 1e-4
    labels = ids.clone()
    losses = [model.train()(input_ids=ids, labels=labels).loss for model in models.values()]
    assert max(losses) - min(losses) < 1e-4, losses  # the same scored tokens: each token's successor
    output = tmp_path / "nanogpt.json"
    nanogpt_setting.main(["--profile", "smoke", "--output", str(output)])
    record = json.loads(output.read_text())
    assert record["errors"] == {} and set(record["compile_seconds"]) == {"reference", "ours", "nanogpt_style"}
    assert set(record["models"]) == {"reference", "ours", "nanogpt_style"}
    assert record["setting"]["vocabulary_rows"] == 50304 and record["max_logit_difference"] < 1e-4
    for row in record["models"].values():
        assert row["tokens_per_s"] > 0 and row["peak_memory_mib"] > 0 and row["mfu"] is None  # no MFU on a CPU
    assert set(record["ratios"]) == {"ours_over_nanogpt_style_tokens_per_s", "ours_over_reference_tokens_per_s"}
    assert all(math.isfinite(ratio) and ratio > 0 for ratio in record["ratios"].values())
    # the CPU's prediction of hf_tfm's compiled step (the other two models take the same path: a compile each per
    # batch), at the shape the timed run just compiled: inductor's caches would hand that graph back uncounted, so
    # every batch must count bytes
    predicted = tmp_path / "predicted.json"
    arguments = ["--profile", "smoke", "--predict", "--models", "ours", "--batches", "2", "3", "--length", "16"]
    nanogpt_setting.main(arguments + ["--output", str(predicted)])
    counts = json.loads(predicted.read_text())["models"]
    assert list(counts) == ["ours"] and counts["ours"]["graph_breaks"] == 0 and counts["ours"]["kernels"] > 0
    assert all(gb > 0 for gb in counts["ours"]["gb_by_batch"].values())


def test_a_compiled_row_that_ran_eagerly_fails_loudly(monkeypatch):
    monkeypatch.setattr(speed, "ran_compiled", lambda work, device: False)
    with pytest.raises(RuntimeError, match="ran eagerly"):
        speed.require_compiled({"ours": lambda: None}, speed.torch.device("cpu"))


def test_device_gaps_count_the_idle_device_and_the_hosts_non_launch_calls():
    """The kernel table's figures for a bubble (a GPU run's compiled step took longer than its kernels), from made-up
    profiler events: two kernels 10 us apart, a synchronisation and a copy among the launches."""
    from types import SimpleNamespace

    from benchmarks.measure import device_gaps

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(name, device_type, start=0, end=0):
        span = SimpleNamespace(start=start, end=end)
        return SimpleNamespace(name=name, device_type=device_type, time_range=span, device_time_total=end - start)

    kernels = [event("gemm", cuda, 0, 30), event("softmax", cuda, 40, 50)]
    host = [event(name, cpu) for name in ("cudaLaunchKernel", "cudaStreamSynchronize", "cudaMemcpyAsync")]
    gaps = device_gaps(kernels, kernels + host + [event("aten::mm", cpu)])
    assert gaps == {"idle_ms": 0.01, "host_calls": {"cudaMemcpyAsync": 1, "cudaStreamSynchronize": 1}}
    assert device_gaps([], host) == {}
