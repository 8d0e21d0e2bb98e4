"""torch.compile end to end, for every paradigm dense and MoE: the training forward (with its loss) and backward trace
into one graph with no graph break and give the eager loss and gradients; generate() with a static cache and a
compiled decode step gives the eager tokens from one graph for every step; Trainer's torch_compile trains the three
language-model paradigms.

Inductor compiles take tens of seconds on a small CPU, so these tests trace with the cheap backends ("eager" runs
the captured graph as it is, "aot_eager" also traces the backward through AOTAutograd, as inductor does):
`fullgraph=True` is the proof of "no graph break". The inductor runs are test_trainer_features.py's
test_torch_compile_matches_eager and test_generation.py's test_slow_compiled_static_cache_generate.
"""

import pytest
import torch
import torch._dynamo
from conftest import VOCAB, tiny_config
from support.runs import PARADIGM_FOR_TASK, tiny_config_file
from torch._dynamo.utils import counters
from transformers import CompileConfig

from hf_tfm import (
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
)
from hf_tfm.training import run
from hf_tfm_cli import build_parser, spec_from_args
from hf_tfm_cli.entry import main

SEQ2SEQ = {"config_class": TfmEncoderDecoderConfig, "decoder_start_token_id": 0}
# paradigm -> (model class, config fields): one layer each, the options whose code paths differ under compile
MODELS = {
    "decoder": (TfmDecoderForCausalLM, {"num_key_value_heads": 2}),  # RoPE, GQA
    # experts on transformers' default backend, grouped_mm (batched_mm compiles as well; the eager loop over the hit
    # experts has data-dependent shapes, as Mixtral's has, and breaks the graph)
    "decoder_moe": (TfmDecoderForCausalLM, {"num_experts": 4, "num_experts_per_tok": 2, "router_z_loss_coef": 0.01}),
    "encoder": (TfmEncoderForMaskedLM, {"config_class": TfmEncoderConfig, "type_vocab_size": 2}),
    "t5_like": (
        TfmEncoderDecoderForConditionalGeneration,
        {**SEQ2SEQ, "position_embedding_type": "relative_bias", "norm_type": "rmsnorm", "ffn_type": "glu"},
    ),
    "bart_like": (TfmEncoderDecoderForConditionalGeneration, {**SEQ2SEQ, "position_embedding_type": "learned"}),
    "seq2seq_moe": (TfmEncoderDecoderForConditionalGeneration, {**SEQ2SEQ, "num_experts": 4}),
}


def build(paradigm: str, **overrides):
    model_class, fields = MODELS[paradigm]
    torch.manual_seed(0)
    return model_class(tiny_config(**{"num_hidden_layers": 1, **fields, **overrides}))


def training_batch(paradigm: str, length: int = 8) -> dict:
    """A right-padded batch with labels (-100 on padding; a masked LM scores every other token), and Trainer's
    num_items_in_batch."""
    torch.manual_seed(1)
    input_ids = torch.randint(3, VOCAB, (2, length))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, length - 2 :] = 0
    labels = torch.where(attention_mask.bool(), input_ids, -100)
    if paradigm == "encoder":
        labels[:, ::2] = -100
    scored = (labels[:, 1:] if paradigm.startswith("decoder") else labels) != -100
    return dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels, num_items_in_batch=scored.sum())


def loss_and_gradients(model, forward, batch) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    loss = forward(**batch).loss
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


# "aot_eager" (the backward traced too) only where the backward differs most: the experts' grouped_mm
TRAINING_CASES = [(paradigm, "aot_eager" if paradigm == "decoder_moe" else "eager", False) for paradigm in MODELS]
TRAINING_CASES.append(("decoder", "eager", True))  # Trainer's compile turns dynamic when a batch has a new length


@pytest.mark.parametrize("paradigm, backend, dynamic", TRAINING_CASES)
def test_training_step_is_one_graph_and_exact(paradigm, backend, dynamic):
    """forward with labels (the loss included) compiles with fullgraph=True, and forward and backward give the eager
    loss and gradients. The compiled step runs first, on a fresh model: MoE router logits are recorded by hooks that
    transformers installs on first use, which a compiled first call could not do."""
    model = build(paradigm).train()
    batch = training_batch(paradigm)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=dynamic)
    loss, gradients = loss_and_gradients(model, compiled, batch)
    eager_loss, eager_gradients = loss_and_gradients(model, model, batch)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    assert gradients.keys() == eager_gradients.keys()
    for name, gradient in gradients.items():
        torch.testing.assert_close(gradient, eager_gradients[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("paradigm", ["decoder", "encoder", "bart_like"])
def test_training_step_under_bf16_autocast_is_one_graph_and_exact(paradigm):
    """Under bf16 autocast the loss projects onto the head's weight with zero rows up to a multiple of 8 (97 tokens
    on 104 rows, `aligned_rows`): still one graph, and the eager loss and gradients (exactly, but for the masked LM,
    whose eager step projects only its scored tokens and so sums in another order)."""
    model = build(paradigm).train()
    batch = training_batch(paradigm)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, gradients = loss_and_gradients(model, compiled, batch)
        eager_loss, eager_gradients = loss_and_gradients(model, model, batch)
    tolerance = dict(rtol=1e-5, atol=1e-6) if paradigm == "encoder" else dict(rtol=0, atol=0)
    torch.testing.assert_close(loss, eager_loss, **tolerance)
    assert gradients.keys() == eager_gradients.keys()
    for name, gradient in gradients.items():
        torch.testing.assert_close(gradient, eager_gradients[name], **tolerance, msg=name)


def generation_inputs(paradigm: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded batch of prompts: left-padded for a decoder, right-padded sources for an encoder-decoder."""
    torch.manual_seed(2)
    input_ids = torch.randint(3, VOCAB, (2, 6))
    attention_mask = torch.ones_like(input_ids)
    padding = slice(0, 2) if paradigm.startswith("decoder") else slice(4, 6)
    input_ids[1, padding], attention_mask[1, padding] = 0, 0
    return input_ids, attention_mask


@pytest.mark.parametrize("paradigm", ["decoder", "decoder_moe", "t5_like", "bart_like"])
def test_compiled_generate_matches_eager(paradigm):
    """generate() with a static cache and a fullgraph-compiled decode step gives the eager tokens, and every decode
    step runs one graph: no recompilation per token (dynamo gives up compiling after a few recompilations and runs
    the rest eagerly)."""
    model = build(paradigm, num_hidden_layers=2).eval()
    input_ids, attention_mask = generation_inputs(paradigm)
    greedy = dict(do_sample=False, max_new_tokens=5, min_new_tokens=5)
    options = dict(attention_mask=attention_mask, cache_implementation="static", **greedy)
    expected = model.generate(input_ids, **options)
    compile_config = CompileConfig(fullgraph=True, dynamic=False, backend="eager")
    # generate() auto-compiles only on accelerators unless this private flag is set (transformers' tests set it too)
    compile_config._compile_all_devices = True
    torch._dynamo.reset()
    counters.clear()
    actual = model.generate(input_ids, compile_config=compile_config, **options)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert torch.equal(actual, expected)


def test_compile_flag_and_its_old_name():
    for flag in ("--compile", "--torch-compile"):
        assert spec_from_args(build_parser().parse_args(["train", "--task", "causal-lm", flag])).torch_compile


@pytest.mark.parametrize("task", ["causal-lm", "masked-lm", "seq2seq"])
@pytest.mark.slow
def test_cli_train_compile(tmp_path, monkeypatch, task):
    """`hf-tfm train --compile` trains and evaluates each language-model paradigm through Trainer's torch_compile
    with no graph break. On dynamo's "eager" backend, to stay cheap: Trainer's default, inductor, is
    test_trainer_features.py's test_torch_compile_matches_eager."""
    build_arguments = run.training_arguments

    def eager_backend(spec, output):
        args = build_arguments(spec, output)
        assert args.torch_compile and args.torch_compile_backend == "inductor"
        args.torch_compile_backend = "eager"
        return args

    monkeypatch.setattr(run, "training_arguments", eager_backend)
    torch._dynamo.reset()
    counters.clear()
    run_options = [
        "--model",
        tiny_config_file(tmp_path, PARADIGM_FOR_TASK[task]),
        "--output-dir",
        str(tmp_path / "run"),
    ]
    sizes = ["--max-files", "40", "--vocab-size", "300", "--max-length", "32", "--batch-size", "4", "--use-cpu"]
    steps = ["--max-steps", "2", "--eval-steps", "2", "--save-steps", "2", "--max-eval-samples", "4"]
    main(["train", "--task", task, "--compile", *run_options, *sizes, *steps])
    assert counters["stats"]["unique_graphs"] >= 1, "the model was not compiled"
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert (tmp_path / "run" / "model" / "model.safetensors").exists()
