"""Trainer features on hf_tfm models, at tiny sizes on CPU: bf16 autocast (and what fp16 does on CPU), activation
(gradient) checkpointing, torch.compile, TensorBoard logging and the progress bar. Gradient accumulation is in
test_training.py.

transformers 5.23 renamed `gradient_checkpointing` to `activation_checkpointing` (the old names are deprecated
aliases) and dropped `TrainingArguments.logging_dir` (TensorBoard writes under `TENSORBOARD_LOGGING_DIR`, else
`output_dir/runs/<date>_<host>`); the tests below pin both.
"""

import math

import pytest
import torch
from conftest import VOCAB, tiny_config
from peft import LoraConfig, get_peft_model
from support.families import tiny_reference
from support.trainer import ListDataset, logged_losses, training_args
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import Trainer, TrainingArguments

from hf_tfm import (
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
)
from hf_tfm.convert import to_tfm
from hf_tfm.model.modeling_tfm_stack import TfmBlock

PATTERN = torch.tensor([3, 4, 5, 6, 7, 8, 9, 10] * 2)


def lm_rows():
    return [{"input_ids": PATTERN, "labels": PATTERN.clone()} for _ in range(8)]


def masked_rows():
    rows = []
    for _ in range(8):
        ids, labels = PATTERN.clone(), torch.full_like(PATTERN, -100)
        labels[[1, 6, 12]] = PATTERN[[1, 6, 12]]
        ids[[1, 6, 12]] = 96  # a [MASK] id
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def seq2seq_rows():
    return [{"input_ids": PATTERN, "labels": PATTERN.flip(0)} for _ in range(8)]


# paradigm -> (model class, config overrides' config class, rows)
PARADIGMS = {
    "decoder": (TfmDecoderForCausalLM, {}, lm_rows),
    "encoder": (TfmEncoderForMaskedLM, {"config_class": TfmEncoderConfig}, masked_rows),
    "encoder_decoder": (
        TfmEncoderDecoderForConditionalGeneration,
        {"config_class": TfmEncoderDecoderConfig, "decoder_start_token_id": 0},
        seq2seq_rows,
    ),
    "moe": (TfmDecoderForCausalLM, {"num_experts": 4}, lm_rows),
}


def build(paradigm: str, seed: int = 0, **overrides):
    model_class, fields, _ = PARADIGMS[paradigm]
    torch.manual_seed(seed)
    return model_class(tiny_config(**{**fields, **overrides})).train()


def train(model, tmp_path, rows, **overrides) -> Trainer:
    fields = {"per_device_train_batch_size": 4, "max_steps": 2, "learning_rate": 1e-2}
    fields.update(overrides)
    trainer = Trainer(model=model, args=training_args(tmp_path, **fields), train_dataset=ListDataset(rows))
    trainer.train()
    return trainer


def record_linear_dtypes(model) -> list[torch.dtype]:
    """The output dtype of every call of the first block's first linear layer (the LM head is not called as a module
    in training: its loss is computed chunk by chunk)."""
    dtypes = []
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    first.register_forward_hook(lambda module, args, output: dtypes.append(output.dtype))
    return dtypes


def count_sublayer_calls(model) -> list[int]:
    """One counter per block; a pre-hook on the block's self-attention. Checkpointing wraps the block's `forward`
    (not `__call__`), so a hook on the block itself fires once either way, while the sublayers run again when the
    backward pass recomputes the block. A pre-hook, because the non-reentrant recompute stops early, right after
    the last tensor the backward needs, before the sublayer's forward hooks would fire."""
    blocks = [m for m in model.modules() if isinstance(m, TfmBlock)]
    calls = [0] * len(blocks)

    def hook(i):
        def count(module, args):
            calls[i] += 1

        return count

    for i, block in enumerate(blocks):
        block.self_attn.register_forward_pre_hook(hook(i))
    return calls


# ------------------------------------------------------------------------------------------------ mixed precision


@pytest.mark.parametrize("paradigm", list(PARADIGMS))
def test_bf16_autocast_trains(tmp_path, paradigm):
    """bf16=True with use_cpu: accelerate runs the forward under CPU autocast (bf16 matmuls, fp32 master weights);
    the loss stays finite, falls, and starts where the fp32 run starts."""
    rows = PARADIGMS[paradigm][2]()
    model = build(paradigm)
    dtypes = record_linear_dtypes(model)
    trainer = train(model, tmp_path / "bf16", rows, bf16=True, max_steps=5)
    assert trainer.accelerator.mixed_precision == "bf16" and trainer.accelerator.native_amp
    assert set(dtypes) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    losses = logged_losses(trainer)
    assert len(losses) == 5 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.9 * losses[0], losses
    with torch.no_grad():  # the first logged loss is the untrained model's loss on one batch (all rows are equal)
        reference = build(paradigm)(**{key: torch.stack([r[key] for r in rows[:4]]) for key in rows[0]}).loss
    assert losses[0] == pytest.approx(reference.item(), abs=2e-2)


def test_fp16_on_cpu_is_a_silent_no_op(tmp_path):
    """fp16=True with use_cpu is not refused (neither transformers 5.23 nor accelerate 1.15 raise), but accelerate
    enables fp16 autocast only off-CPU: the run is plain fp32, bit for bit, with no grad scaler."""
    model = build("decoder")
    dtypes = record_linear_dtypes(model)
    trainer = train(model, tmp_path / "fp16", lm_rows(), fp16=True, max_steps=3)
    assert trainer.accelerator.mixed_precision == "fp16"
    assert not trainer.accelerator.native_amp and trainer.accelerator.scaler is None
    assert set(dtypes) == {torch.float32}
    reference = train(build("decoder"), tmp_path / "fp32", lm_rows(), max_steps=3)
    assert logged_losses(trainer) == logged_losses(reference)


# ------------------------------------------------------------------------------------------ activation checkpointing


STEP = {
    "max_steps": 2,
    "optim": "sgd",
    "learning_rate": 0.5,
    "max_grad_norm": 0.0,  # no clipping: compare raw gradient steps
    "train_sampling_strategy": "sequential",
}
_plain_runs = {}


def plain_run(tmp_path, paradigm, **overrides):
    """Two SGD steps without checkpointing: the reference, computed once per model and shared between tests."""
    key = (paradigm, tuple(sorted(overrides.items())))
    if key not in _plain_runs:
        model = build(paradigm, **overrides)
        calls = count_sublayer_calls(model)
        trainer = train(model, tmp_path / "plain", PARADIGMS[paradigm][2](), **STEP)
        assert calls == [2] * len(calls)  # one forward per step
        assert not model.is_activation_checkpointing
        _plain_runs[key] = model, logged_losses(trainer)
    return _plain_runs[key]


def checkpointing_pair(tmp_path, paradigm, checkpointing_kwargs=None, **overrides):
    """The same two SGD steps with and without activation checkpointing (dropout is 0 in tiny configs)."""
    checkpointed = build(paradigm, **overrides)
    calls = count_sublayer_calls(checkpointed)
    trainer = train(
        checkpointed,
        tmp_path / "checkpointed",
        PARADIGMS[paradigm][2](),
        activation_checkpointing=True,
        activation_checkpointing_kwargs=checkpointing_kwargs,
        **STEP,
    )
    assert calls == [4] * len(calls), "each block's sublayers run again in the backward pass"
    assert checkpointed.is_activation_checkpointing
    plain, plain_losses = plain_run(tmp_path, paradigm, **overrides)
    return plain, checkpointed, plain_losses, logged_losses(trainer)


def assert_same_parameters(plain, checkpointed):
    start = build_like(plain)
    moved = False
    for (name, p), q, s in zip(plain.named_parameters(), checkpointed.parameters(), start.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
        moved |= not torch.equal(p, s)
    assert moved


def build_like(model):
    torch.manual_seed(0)
    return type(model)(model.config)


@pytest.mark.parametrize("paradigm", list(PARADIGMS))
def test_activation_checkpointing_matches_plain_step(tmp_path, paradigm):
    """Trainer's default (non-reentrant) checkpointing recomputes every block in the backward pass and leaves the
    parameters after two optimizer steps as they are without it."""
    plain, checkpointed, plain_losses, losses = checkpointing_pair(tmp_path, paradigm)
    assert losses == pytest.approx(plain_losses, abs=1e-6)
    assert_same_parameters(plain, checkpointed)


@pytest.mark.parametrize("paradigm", ["decoder", "encoder", "encoder_decoder"])
def test_reentrant_checkpointing_matches_plain_step(tmp_path, paradigm):
    """use_reentrant=True only lets gradients through a block's positional inputs: the hidden states, and the
    encoder output that the encoder-decoder's blocks take positionally for this reason (its encoder moves alike)."""
    plain, checkpointed, plain_losses, losses = checkpointing_pair(tmp_path, paradigm, {"use_reentrant": True})
    assert losses == pytest.approx(plain_losses, abs=1e-6)
    assert_same_parameters(plain, checkpointed)


def test_reentrant_checkpointing_moe_without_router_losses(tmp_path):
    """MoE under reentrant checkpointing matches when the router losses are off (see the xfail below)."""
    plain, checkpointed, plain_losses, losses = checkpointing_pair(
        tmp_path, "moe", {"use_reentrant": True}, router_aux_loss_coef=0.0
    )
    assert losses == pytest.approx(plain_losses, abs=1e-6)
    assert_same_parameters(plain, checkpointed)


def test_reentrant_checkpointing_moe_with_router_losses(tmp_path):
    """Reentrant checkpointing runs the first forward under no_grad, so the recorded router logits carry no graph and
    the router losses would reach the loss value but not the gradient (transformers' Mixtral silently trains so).
    hf_tfm refuses instead, naming the fix."""
    with pytest.raises(ValueError, match="use_reentrant': False"):
        checkpointing_pair(tmp_path, "moe", {"use_reentrant": True})


@pytest.mark.parametrize("paradigm", ["decoder", "encoder_decoder"])
def test_reentrant_checkpointing_relative_bias(tmp_path, paradigm):
    """The learned relative bias, shared by all blocks, reaches each block positionally, so reentrant checkpointing
    treats it as an input (as a keyword it backpropagated through the shared graph once per block and crashed)."""
    plain, checkpointed, _, _ = checkpointing_pair(
        tmp_path, paradigm, {"use_reentrant": True}, position_embedding_type="relative_bias"
    )
    assert_same_parameters(plain, checkpointed)


def test_relative_bias_non_reentrant_checkpointing_matches(tmp_path):
    """The default non-reentrant checkpointing handles the shared relative bias."""
    plain, checkpointed, _, _ = checkpointing_pair(
        tmp_path, "encoder_decoder", position_embedding_type="relative_bias"
    )
    assert_same_parameters(plain, checkpointed)


def test_gradient_checkpointing_deprecated_alias(tmp_path):
    """`gradient_checkpointing=True` still switches checkpointing on (with a FutureWarning), and the deprecated
    `is_gradient_checkpointing` property still answers."""
    with pytest.warns(FutureWarning, match="`gradient_checkpointing` is deprecated"):
        args = training_args(tmp_path, gradient_checkpointing=True, per_device_train_batch_size=4, max_steps=1)
    assert args.activation_checkpointing
    model = build("decoder")
    calls = count_sublayer_calls(model)
    trainer = Trainer(model=model, args=args, train_dataset=ListDataset(lm_rows()))
    assert not model.is_activation_checkpointing  # Trainer switches it on in train(), not in __init__
    trainer.train()
    with pytest.warns(FutureWarning):
        assert model.is_gradient_checkpointing
    assert calls == [2, 2]


# ------------------------------------------------------------------------------------------------- torch.compile


@pytest.mark.slow
def test_torch_compile_matches_eager(tmp_path):
    """torch_compile=True (inductor on CPU) compiles the model into one graph with no graph break and reproduces
    the eager losses. The one compile test: the smallest model, three steps."""
    import torch._dynamo

    rows = [{"input_ids": PATTERN[:8], "labels": PATTERN[:8].clone()} for _ in range(6)]
    small = {"num_hidden_layers": 1}
    steps = {"per_device_train_batch_size": 2, "max_steps": 3}
    eager = logged_losses(train(build("decoder", **small), tmp_path / "eager", rows, **steps))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    trainer = train(build("decoder", **small), tmp_path / "compiled", rows, torch_compile=True, **steps)
    assert isinstance(trainer.model_wrapped, torch._dynamo.eval_frame.OptimizedModule)
    assert trainer.args.torch_compile_backend == "inductor"
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # no recompilation across the steps
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    assert logged_losses(trainer) == pytest.approx(eager, abs=1e-4)


@pytest.mark.parametrize("peft", [False, True])
@pytest.mark.parametrize("family", ["llama", "bert", "bart"])
def test_label_smoothing_scores_as_the_reference(tmp_path, family, peft):
    """With `label_smoothing_factor`, Trainer takes the labels from the batch and smooths the model's logits itself,
    shifting them first only for a class its causal-LM table of names holds (a PEFT model by its base model's class):
    an hf_tfm causal LM must be named there, or it silently trains on unshifted labels. The step's loss is the
    reference class's on the same weights, for a causal LM, a masked LM and a seq2seq model, with and without LoRA."""
    reference = tiny_reference(family)
    ours = to_tfm(reference)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, VOCAB, (2, 9), generator=generator)
    labels = torch.where(torch.rand(2, 9, generator=generator) < 0.3, -100, input_ids)
    batch = {"input_ids": input_ids, "labels": labels}
    if ours.config.is_encoder_decoder:  # a seq2seq collator passes the decoder's inputs: Trainer takes the labels
        batch["decoder_input_ids"] = ours.prepare_decoder_input_ids_from_labels(labels)
    losses = []
    for model in (reference, ours):
        if peft:
            model = get_peft_model(model, LoraConfig(r=2, target_modules="all-linear"))
        model.train()  # the tiny models have no dropout
        trainer = Trainer(model=model, args=training_args(tmp_path, label_smoothing_factor=0.1))
        losses.append(trainer.compute_loss(model, dict(batch)))
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------- logging, progress


def test_tensorboard_logs_the_loss(tmp_path, monkeypatch):
    """report_to=["tensorboard"] writes event files whose train/loss scalars are the losses Trainer logged."""
    with pytest.raises(TypeError, match="logging_dir"):  # gone in transformers 5.23
        TrainingArguments(output_dir=str(tmp_path), logging_dir=str(tmp_path / "tb"))
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    trainer = train(build("decoder"), tmp_path / "out", lm_rows(), max_steps=3, report_to=["tensorboard"])
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert "train/loss" in events.Tags()["scalars"]
    scalars = events.Scalars("train/loss")
    assert [s.step for s in scalars] == [1, 2, 3]
    assert [s.value for s in scalars] == pytest.approx(logged_losses(trainer), rel=1e-6)


def test_tensorboard_default_directory(tmp_path, monkeypatch):
    """Without TENSORBOARD_LOGGING_DIR the events go to output_dir/runs/<date>_<host>."""
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    train(build("decoder"), tmp_path, lm_rows(), max_steps=1, report_to=["tensorboard"])
    assert list((tmp_path / "runs").glob("*/events.out.tfevents.*"))


def test_progress_bar_on_stderr(tmp_path, capsys):
    train(build("decoder"), tmp_path, lm_rows(), max_steps=3, disable_tqdm=False)
    err = capsys.readouterr().err
    assert "3/3" in err and "100%" in err


def test_no_progress_bar_when_disabled(tmp_path, capsys):
    train(build("decoder"), tmp_path, lm_rows(), max_steps=3)  # training_args() sets disable_tqdm=True
    assert "3/3" not in capsys.readouterr().err
