"""A GPU training step, traced on the CPU (benchmarks/trace.py): for the causal, masked, seq2seq and MoE pairs of the
GPU profile, at their real shapes and dtype policy (fp32 weights under bf16 autocast; bf16 weights for MoE), one
hf_tfm step costs at most the reference's bytes, runs no matmul in a wider dtype than the reference's, and makes no
host synchronisation (a masked-LM step one: the selection of its scored rows), and hands sdpa no input that a GPU's
fused kernels refuse. Counts of a fake-tensor trace are exact, so they hold on a loaded machine; each pair costs
about a second."""

import functools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from benchmarks import trace
from benchmarks.pairs import KINDS, PROFILES
from hf_tfm.model import modeling_tfm_lm_head

PAIRS = ["gpt2", "llama", "bert", "t5", "bart", "mixtral", "gpt_oss"]
# Kernels at or below the reference's, but for GPT-2: its 50257-token vocabulary takes six loss chunks of about ten
# kernels each at 16 x 1024 tokens, where the reference's loss is about ten kernels in one pass: 1017 against 993
# kernels (1449 against 1401 while the trace ran GPT-2's dropout attention on the CPU's math path, which copied
# hf_tfm's strided keys and values), while its bytes are below the reference's.
KERNEL_RATIO = {"gpt2": 1.025}
SYNCS = {"causal": 0, "seq2seq": 0, "masked": 1}
# Issue 29's GPU memory target (at most 0.65x the reference's peak). Without attention dropout the traced peak is the
# GPU's: the H200 run (gpu-2026-11-27-2.json, ac61c4d) measured 0.609x (Llama) and 0.614x (Mixtral), the trace 0.608x
# and 0.614x. With it (GPT-2, BERT) the trace counts the GPU's fused kernel, and both sides' peaks differ from the
# H200's by about the same amount, so the ratio does not match to the digit: GPT-2 0.567x traced, 0.627x measured;
# BERT 0.607x and 0.569x. T5 is not held to it here: its attention takes a position bias that needs a gradient, which
# the CPU's fused kernel refuses, so both sides hold their scores (the H200 measured 0.406x).
PEAK_RATIO = {"llama": 0.65, "mixtral": 0.65, "gpt2": 0.65, "bert": 0.65}
# the share of a step's matmul FLOPs that 7 zero rows of the head add at the largest vocabulary here (GPT-2 and BART:
# about 1.4e-4 of the head's matmuls, which are a third of the step's), with room
ALIGNED_ROWS = 1e-4


def traced(name: str) -> dict:
    return trace.trace_pair(name, PROFILES["gpu"]["pairs"][name])


traced_once = functools.cache(traced)  # the pairs' own traces, shared by the tests that read them unchanged


@pytest.mark.parametrize("name", PAIRS)
@pytest.mark.slow
def test_a_gpu_training_step_costs_no_more_than_the_references(name):
    result = traced_once(name)
    ours, reference = result["ours"], result["reference"]
    assert ours["bytes_gib"] <= reference["bytes_gib"], (ours["bytes_gib"], reference["bytes_gib"])
    peaks = (ours["peak_gib"], reference["peak_gib"])
    assert peaks[0] <= peaks[1] * PEAK_RATIO.get(name, 1.0), peaks
    kernels = (ours["kernels"], reference["kernels"])
    assert kernels[0] <= kernels[1] * KERNEL_RATIO.get(name, 1.0), kernels
    wide = {dtype: flops for dtype, flops in ours["matmul_tflops"].items() if dtype == "float32"}
    assert wide.get("float32", 0.0) <= reference["matmul_tflops"].get("float32", 0.0) * (1 + 1e-9), (wide, reference)
    # the loss's 16-bit matmuls project up to 7 zero rows more (aligned_rows: GPT-2's 50257 tokens on 50264 rows)
    assert sum(ours["matmul_tflops"].values()) <= sum(reference["matmul_tflops"].values()) * (1 + ALIGNED_ROWS)
    assert ours["host_syncs"] <= SYNCS[KINDS[name].task], ours["sync_places"]
    assert not ours["unfused_attention"], ours["unfused_attention"]


# An inference forward moves at most the reference's bytes (and the input check's few bytes) at no higher peak, with a
# few kernels more: the input check's bounds (BERT 160 against 155, GPT-2 262 against 259). With three q/k/v layers
# GPT-2 launched 286 and moved 32.31 against 31.75 GiB (fused_qkv_proj: one matrix, as the reference's c_attn).
FORWARD_RATIO = {("gpt2", "kernels"): 1.02, ("gpt2", "bytes_gib"): 1.0001, ("bert", "kernels"): 1.04}
FORWARD_KERNELS = 1.01


@pytest.mark.parametrize("name", PAIRS)
@pytest.mark.slow
def test_an_inference_forward_costs_about_the_references(name):
    forward = traced_once(name)["forward"]
    ours, reference = forward["ours"], forward["reference"]
    for count in ("kernels", "bytes_gib", "peak_gib"):
        slack = FORWARD_RATIO.get((name, count), FORWARD_KERNELS if count == "kernels" else 1.0)
        assert ours[count] <= reference[count] * slack, (count, ours[count], reference[count])
    assert not ours["unfused_attention"], ours["unfused_attention"]


# A decode step launches at most the reference's kernels (GPT-2 too since fused_qkv_proj: it launched 303 against 279
# with three q/k/v matmuls a layer), but for T5's key positions, counted back from the newest token so that a
# left-padded row keeps its own (+1); no host sync, no unfused attention
DECODE_EXTRA = {"t5": 1}


@pytest.mark.parametrize("name", [name for name in PAIRS if KINDS[name].task != "masked"])
def test_a_decode_step_launches_about_the_references_kernels(name):
    decode = traced_once(name)["decode"]
    ours, reference = decode["ours"], decode["reference"]
    assert ours["kernels"] <= reference["kernels"] + DECODE_EXTRA.get(name, 0), (ours["kernels"], reference["kernels"])
    assert ours["host_syncs"] == 0, ours["sync_places"]
    assert not ours["unfused_attention"], ours["unfused_attention"]


def test_the_trace_sees_attention_a_gpu_would_not_fuse():
    """The control: a mask whose last dimension is strided (heads innermost, as an embedding's output permuted) is an
    sdpa call CUDA's fused kernels refuse; a contiguous one is not."""
    with FakeTensorMode(), trace.StepTrace() as step:
        query = torch.ones(2, 4, 8, 16)
        strided = torch.zeros(1, 8, 8, 4).permute(0, 3, 1, 2)  # [1, heads, q, kv], heads innermost
        torch.nn.functional.scaled_dot_product_attention(query, query, query, attn_mask=strided)
        torch.nn.functional.scaled_dot_product_attention(query, query, query, attn_mask=strided.contiguous())
    assert len(step.attention.places) == 1 and step.attention.calls == 2


def test_a_dropout_attention_a_gpu_would_fuse_is_traced_as_its_fused_kernel():
    """The control: CUDA's fused kernels take attention dropout inside the kernel; the CPU's would fall back to the
    math path (the scores, their softmax, a dropout mask: more kernels and the scores' memory). The trace runs such a
    call without dropout, so it costs what the call without dropout costs."""

    def attention_step(dropout: float, as_on_a_gpu: bool = True) -> trace.StepTrace:
        with FakeTensorMode(), trace.StepTrace() as step:
            if not as_on_a_gpu:  # the CPU's own choice of kernel
                step.attention.__exit__(None, None, None)
            query, key, value = (torch.ones(2, 4, 64, 16, requires_grad=True) for _ in range(3))
            torch.nn.functional.scaled_dot_product_attention(query, key, value, dropout_p=dropout).sum().backward()
            if not as_on_a_gpu:
                step.attention.__enter__()
        return step

    with_dropout, without, math_path = attention_step(0.1), attention_step(0.0), attention_step(0.1, False)
    assert (with_dropout.kernels, with_dropout.peak) == (without.kernels, without.peak)
    assert with_dropout.attention.calls == 1
    assert "bernoulli_" in math_path.operators and math_path.kernels > without.kernels, math_path.operators


@pytest.mark.slow
def test_the_trace_sees_small_loss_chunks(monkeypatch):
    """The control: chunks of 256 tokens (the default before issue 29) cost Llama's step more kernels and bytes than
    the reference's, and the trace says so."""
    chunked = modeling_tfm_lm_head.linear_cross_entropy  # called with the config's loss_chunk_size fifth
    with_chunks_of_256 = lambda *args, **kwargs: chunked(*args[:4], 256, *args[5:], **kwargs)  # noqa: E731
    monkeypatch.setattr(modeling_tfm_lm_head, "linear_cross_entropy", with_chunks_of_256)
    result = traced("llama")
    assert result["ours"]["kernels"] > result["reference"]["kernels"]
    assert result["ours"]["bytes_gib"] > result["reference"]["bytes_gib"]


@pytest.mark.slow
def test_a_host_sync_is_counted_with_its_place():
    """The control for syncs: a step with the input-value check on every training step (the rule before issue 29)
    shows its reads, named by the function that made them."""
    result = traced("llama")
    assert result["ours"]["host_syncs"] == 0
    from hf_tfm.model.modeling_tfm_inputs import InputRules

    # every training step is taken for the first: the validator never remembers having trained
    InputRules.trained_a_step = property(lambda rules: False, lambda rules, value: None)
    try:
        result = traced("llama")
    finally:
        del InputRules.trained_a_step
    assert result["ours"]["host_syncs"] > 0
    assert any("read_bounds" in place for place, _ in result["ours"]["sync_places"])


def test_the_peak_is_what_is_alive_at_once():
    """The control for peak memory: storages count from the operator that makes them until they are freed; views and
    in-place results add nothing."""
    with FakeTensorMode(), trace.StepTrace() as counted:
        first = torch.ones(1024)  # 4 KiB
        second = first * 2  # 8 KiB alive
        second.view(32, 32).add_(1)  # a view, in place: nothing new
        del first
        third = second + 1  # 8 KiB alive: the first was freed
        del second, third
        fourth = torch.ones(512)  # 2 KiB
    assert counted.peak == 8192
    assert counted.live == 2048
    del fourth


def test_a_reshape_that_copies_is_one_kernel():
    """reshape of a strided tensor is a copy (clone) and `_unsafe_view`, which aliases the copy: one kernel, whose
    bytes are the copy's. Counting the alias too gave every such reshape a phantom kernel and a second pass."""
    with FakeTensorMode():
        strided = torch.ones(64, 32).t()  # made before counting
        with trace.StepTrace() as counted:
            strided.reshape(-1)
    assert counted.kernels == 1
    assert counted.bytes_read == counted.bytes_written == 64 * 32 * 4


def test_an_eval_dropout_keeps_the_input_it_hands_back():
    """An eval-mode dropout returns its input on a device; a fake one returns a new tensor. The input must stay
    counted while that output lives (T5's reference ends each stack with one: uncounted, its final states looked
    freed, 15 MiB under its real peak). Under inference_mode, as the forward trace runs, dropout reaches the
    dispatcher."""
    with FakeTensorMode(), torch.inference_mode(), trace.StepTrace() as counted:
        first = torch.ones(1024)  # 4 KiB
        second = torch.nn.functional.dropout(first * 2, p=0.1, training=False)  # the product (4 KiB), handed back
        third = second + 1  # 4 KiB more: 12 KiB alive
    assert counted.peak == 3 * 4096
    del first, second, third


def test_the_peak_is_told_by_the_lines_that_allocated_it():
    """`--peak-places`: what each side's peak holds, summed by allocating line, adds up to no more than the peak, and
    ours is named in hf_tfm's modeling files."""
    result = trace.trace_pair("llama", PROFILES["smoke"]["pairs"]["llama"], places=True)
    for side in ("ours", "reference"):
        places = result[side]["peak_places"]
        assert places and all(gib > 0 for _, gib in places), places
        assert sum(gib for _, gib in places) <= result[side]["peak_gib"] * (1 + 1e-9), places
    assert any(place.startswith("modeling_tfm") for place, _ in result["ours"]["peak_places"])
    assert "peak_places" not in traced_once("llama")["ours"]  # only when asked
