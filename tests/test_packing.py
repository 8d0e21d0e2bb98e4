"""Padding-free packed training: several examples in a row, position_ids restarting at each (the layout of
transformers' DataCollatorWithFlattening, one row, and of `hf-tfm train --packing`, rows of --max-length with a
padding tail), give every example exactly what it gives padded, for each position scheme and attention backend;
attention never crosses an example; `hf-tfm train --packing` trains that way."""

import json

import pytest
import torch
from conftest import VOCAB, require_flex_attention, tiny_config
from datasets import Dataset
from support.runs import tiny_config_file, tiny_spec
from transformers import AttentionInterface, DataCollatorWithFlattening, default_data_collator
from transformers.cache_utils import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from hf_tfm import (
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
)
from hf_tfm.compat import CACHE_NAME
from hf_tfm.training import run as run_module
from hf_tfm.training.data import best_fit_decreasing, document_examples, pack_examples, packing_collator
from hf_tfm.training.tokenizers import train_byte_level_bpe, train_wordpiece
from hf_tfm_cli.entry import main

# one packed row of 16 tokens: torch 2.13's CPU flex_attention kernel is unreliable at some tiny lengths (8, 24)
LENGTHS = (3, 5, 8)
POSITIONS = ["learned", "sinusoidal", "rope", "alibi", "relative_bias"]
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def example_ids(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (length,), generator=generator) for length in LENGTHS]


def mlm_labels(examples: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every third token scored, the first of each example included (a packed row must not blank it)."""
    return [torch.where(torch.arange(len(ids)) % 3 == 0, ids, -100) for ids in examples]


def packed(examples: list[torch.Tensor], labels: list[torch.Tensor] | None = None) -> dict:
    """One row of all examples; causal-LM labels as DataCollatorWithFlattening makes them, else the given ones."""
    batch = DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": ids.tolist()} for ids in examples])
    if labels is not None:
        batch["labels"] = torch.cat(labels)[None]
    return batch


def padded(examples: list[torch.Tensor], labels: list[torch.Tensor] | None = None) -> dict:
    """The same examples right-padded (pad id 0), padding unscored."""
    width = max(len(ids) for ids in examples)
    input_ids = torch.zeros(len(examples), width, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    scored = torch.full_like(input_ids, -100)
    for row, ids in enumerate(examples):
        input_ids[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = 1
        scored[row, : len(ids)] = ids if labels is None else labels[row]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": scored}


def decoder(implementation: str = "sdpa", **overrides) -> TfmDecoderForCausalLM:
    torch.manual_seed(0)
    model = TfmDecoderForCausalLM(tiny_config(**overrides)).eval()
    model.set_attn_implementation(implementation)
    return model


def encoder(implementation: str = "sdpa", **overrides) -> TfmEncoderForMaskedLM:
    torch.manual_seed(0)
    model = TfmEncoderForMaskedLM(tiny_config(TfmEncoderConfig, **overrides)).eval()
    model.set_attn_implementation(implementation)
    return model


def logits_of(model, batch: dict) -> torch.Tensor:
    """Logits of the real tokens, in example order: [tokens, vocab]."""
    with torch.no_grad():
        logits = model(**{key: value for key, value in batch.items() if key != "labels"}).logits
    return logits[batch["attention_mask"].bool()] if "attention_mask" in batch else logits[0]


def loss_and_gradients(model, batch: dict) -> tuple[torch.Tensor, dict]:
    model.train()
    loss = model(**batch).loss
    loss.backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    model.eval()
    return loss.detach(), gradients


def assert_same_training(model, packed_batch: dict, padded_batch: dict) -> None:
    """The same logits, loss and gradients from the packed row as from the padded batch."""
    torch.testing.assert_close(logits_of(model, packed_batch), logits_of(model, padded_batch), **TOLERANCE)
    packed_loss, packed_gradients = loss_and_gradients(model, packed_batch)
    padded_loss, padded_gradients = loss_and_gradients(model, padded_batch)
    torch.testing.assert_close(packed_loss, padded_loss, rtol=1e-5, atol=0)
    assert packed_gradients.keys() == padded_gradients.keys()
    for name, gradient in padded_gradients.items():
        torch.testing.assert_close(packed_gradients[name], gradient, rtol=1e-5, atol=1e-6, msg=name)


# ------------------------------------------------------------------------------------------------ the models


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("position", POSITIONS)
def test_packed_decoder_trains_as_padded(position, implementation):
    """A causal LM on a packed row (the model's defaults: use_cache on) == the same examples padded."""
    examples = example_ids()
    assert_same_training(decoder(implementation, position_embedding_type=position), packed(examples), padded(examples))


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("position", POSITIONS)
def test_packed_encoder_trains_as_padded(position, implementation):
    """A masked LM on a packed row == padded: transformers' bidirectional mask helpers know no packing, hf_tfm
    adds the block-diagonal mask."""
    examples = example_ids()
    labels = mlm_labels(examples)
    model = encoder(implementation, position_embedding_type=position)
    assert_same_training(model, packed(examples, labels), padded(examples, labels))


# flex_attention compiles on the CPU (about 20 s a model): one decoder and one encoder, each with a score_mod bias
@pytest.mark.parametrize(
    ("build", "position"), [(decoder, "alibi"), (encoder, "relative_bias")], ids=["decoder", "encoder"]
)
def test_packed_flex_attention_matches_padded(build, position):
    """flex_attention (a BlockMask; ALiBi and relative bias as its score_mod) on a packed row == eager padded."""
    examples = example_ids()
    labels = None if build is decoder else mlm_labels(examples)
    expected = logits_of(build("eager", position_embedding_type=position), padded(examples, labels))
    require_flex_attention()
    actual = logits_of(build("flex_attention", position_embedding_type=position), packed(examples, labels))
    torch.testing.assert_close(actual, expected, **TOLERANCE)


@pytest.mark.parametrize("build", [decoder, encoder], ids=["decoder", "encoder"])
def test_attention_never_crosses_an_example(build):
    """Changing one example's tokens changes no other example's logits."""
    examples, changed = example_ids(), example_ids()
    changed[1] = torch.randint(3, VOCAB, (LENGTHS[1],), generator=torch.Generator().manual_seed(7))
    model = build()
    before, after = logits_of(model, packed(examples)), logits_of(model, packed(changed))
    first, second = LENGTHS[0], LENGTHS[0] + LENGTHS[1]
    torch.testing.assert_close(after[:first], before[:first], rtol=0, atol=1e-6)
    torch.testing.assert_close(after[second:], before[second:], rtol=0, atol=1e-6)
    assert (after[first:second] - before[first:second]).abs().max() > 1e-3


@pytest.mark.parametrize("build", [decoder, encoder], ids=["decoder", "encoder"])
def test_packed_sliding_windows_count_per_example(build):
    """Sliding layers next to full ones: the window slides within each example."""
    examples = example_ids()
    labels = None if build is decoder else mlm_labels(examples)
    model = build(
        sliding_window=2, layer_types=["sliding_attention", "full_attention"], position_embedding_type="rope"
    )
    assert_same_training(model, packed(examples, labels), padded(examples, labels))


def test_packed_moe_router_losses_count_real_tokens():
    """An MoE decoder: the router's aux loss over a packed row (no attention_mask) is the padded batch's, which
    leaves padding out; so is the loss it joins."""
    examples = example_ids()
    model = decoder(num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.1, router_z_loss_coef=0.01)
    with torch.no_grad():
        packed_output, padded_output = model(**packed(examples)), model(**padded(examples))
    torch.testing.assert_close(packed_output.aux_loss, padded_output.aux_loss, rtol=1e-5, atol=0)
    assert_same_training(model, packed(examples), padded(examples))


def test_explicit_positions_win_over_padding_aware_ones():
    """RoBERTa's positions are counted over non-padding tokens when none are given; a packed row gives its own
    (0-based, as DataCollatorWithFlattening's default: the offset is the model's business)."""
    examples = example_ids()
    labels = mlm_labels(examples)
    model = encoder(position_ids_from_padding=True, position_offset=1, max_position_embeddings=64)
    assert_same_training(model, packed(examples, labels), padded(examples, labels))


def test_position_ids_reach_the_attention_function():
    """Flash attention's varlen path reads the examples' boundaries from `position_ids` in its kwargs (there is no
    mask for it): a packed row passes them to every layer's attention function."""
    seen = []

    def recording(module, *args, **kwargs):
        seen.append(kwargs.get("position_ids"))
        return sdpa_attention_forward(module, *args, **kwargs)

    AttentionInterface.register("packing_recording", recording)
    AttentionMaskInterface.register("packing_recording", sdpa_mask)
    model = decoder("packing_recording")
    batch = packed(example_ids())
    logits_of(model, batch)
    assert len(seen) == model.config.num_hidden_layers
    assert all(torch.equal(positions, batch["position_ids"]) for positions in seen)


@pytest.mark.parametrize("build", [decoder, encoder], ids=["decoder", "encoder"])
def test_positions_that_jump_ahead_are_one_example(build):
    """Only positions that fall back start a new example: a stretched row attends across its jumps, as it does
    with an all-ones attention_mask (transformers' own detection would cut it at every jump)."""
    input_ids = torch.randint(3, VOCAB, (2, 6))
    stretched = torch.arange(6)[None] * 3
    model = build(position_embedding_type="rope")
    with torch.no_grad():
        alone = model(input_ids, position_ids=stretched).logits
        masked = model(input_ids, position_ids=stretched, attention_mask=torch.ones_like(input_ids)).logits
    torch.testing.assert_close(alone, masked, rtol=0, atol=1e-6)


def test_packed_rows_are_never_cached():
    """A cache of several examples in one row could not be continued: none is made, and a given one is refused."""
    model = decoder()
    batch = packed(example_ids())
    with torch.no_grad():
        assert model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).get(CACHE_NAME) is None
        with pytest.raises(ValueError, match="position_ids restart inside a row .* a cache was given"):
            model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], past_key_values=DynamicCache())


def test_encoder_decoder_refuses_packed_decoder_rows():
    torch.manual_seed(0)
    model = TfmEncoderDecoderForConditionalGeneration(tiny_config(TfmEncoderDecoderConfig)).eval()
    batch = packed(example_ids())
    with pytest.raises(ValueError, match="decoder_position_ids restart inside a row .* encoder-decoder"):
        model(
            input_ids=batch["input_ids"],
            decoder_input_ids=batch["input_ids"],
            decoder_position_ids=batch["position_ids"],
        )


# -------------------------------------------------------------------------------------------- the training data

TEXTS = [f"def function_{i}(argument): returns the {i}th value of the argument list" * (1 + i % 3) for i in range(12)]


def test_causal_lm_packing_trains_on_whole_documents():
    tokenizer = train_byte_level_bpe(TEXTS, vocab_size=300)
    examples = document_examples(tokenizer, TEXTS, max_length=16)
    assert len(examples) == len(TEXTS)
    for text, row in zip(TEXTS, examples["input_ids"], strict=True):
        whole = [*tokenizer(text)["input_ids"], tokenizer.eos_token_id]
        assert row == whole[:16]


def split_rows(batch: dict, column: str = "input_ids") -> list[list[int]]:
    """The examples of packed rows, cut where position_ids restart: [[tokens of one example], ...]."""
    examples = []
    for values, positions in zip(batch[column], batch["position_ids"], strict=True):
        for value, position in zip(values, positions, strict=True):
            if position == 0:
                examples.append([])
            examples[-1].append(int(value))
    return examples


def test_packer_keeps_every_example_whole():
    """Best fit decreasing puts every example in exactly one row of at most `capacity`; the packed rows are exactly
    --max-length, each example whole with positions from 0, the rest one padding example scored nowhere."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 17, (200,), generator=generator).tolist()
    bins = best_fit_decreasing(lengths, 16)
    assert sorted(i for members in bins for i in members) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in members) <= 16 for members in bins)
    assert len(bins) <= sum(lengths) / 16 * 1.1  # nearly full: within 10% of the fewest rows possible

    PAD = 0
    examples = [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in lengths[:40]]
    rows = pack_examples(Dataset.from_dict({"input_ids": [*examples, []]}), 16, PAD, causal_lm_labels=True)
    assert set(rows.column_names) == {"input_ids", "labels", "position_ids"}
    assert all(len(row) == 16 for column in rows.column_names for row in rows[column])
    pieces = split_rows(rows[:])
    real = [piece for piece in pieces if piece[0] != PAD]  # the empty example is dropped
    assert sorted(real) == sorted(examples)
    assert all(set(piece) == {PAD} for piece in pieces if piece[0] == PAD)
    for piece, labels in zip(pieces, split_rows(rows[:], "labels"), strict=True):
        assert labels == ([-100] * len(piece) if piece[0] == PAD else [-100, *piece[1:]])
    with pytest.raises(ValueError, match="an example of 17 tokens; packed examples hold 1 to 16"):
        best_fit_decreasing([3, 17], 16)


# several rows of 10 tokens, one ending in a padding tail
ROW_LENGTHS = (3, 5, 8, 2, 6, 4, 7)


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
@pytest.mark.parametrize("build", [decoder, encoder], ids=["decoder", "encoder"])
def test_packed_rows_train_as_padded(build, position):
    """`hf-tfm train --packing`'s layout, several rows of whole examples and a padding tail, no attention_mask: the
    loss and gradients are the padded batch's."""
    generator = torch.Generator().manual_seed(1)
    examples = [torch.randint(3, VOCAB, (n,), generator=generator) for n in ROW_LENGTHS]
    if build is decoder:
        columns, labels = {}, None
    else:
        labels = mlm_labels(examples)
        columns = {"labels": [ids.tolist() for ids in labels]}
    data = Dataset.from_dict({"input_ids": [ids.tolist() for ids in examples], **columns})
    rows = pack_examples(data, 10, pad_token_id=0, causal_lm_labels=build is decoder)
    batch = default_data_collator([dict(row) for row in rows])
    assert batch["input_ids"].shape == (4, 10) and (batch["input_ids"] == 0).sum() == 40 - sum(ROW_LENGTHS)
    model = build(position_embedding_type=position)
    packed_loss, packed_gradients = loss_and_gradients(model, batch)
    padded_loss, padded_gradients = loss_and_gradients(model, padded(examples, labels))
    torch.testing.assert_close(packed_loss, padded_loss, rtol=1e-5, atol=0)
    for name, gradient in padded_gradients.items():
        torch.testing.assert_close(packed_gradients[name], gradient, rtol=1e-5, atol=1e-6, msg=name)


def test_packed_masked_lm_rows_are_masked_as_padded():
    """Masked-LM packed rows are masked by the padded path's collator: never a special token nor the padding tail;
    the rows' positions pass through, with no attention_mask."""
    tokenizer = train_wordpiece(TEXTS, vocab_size=200)
    features = Dataset.from_dict({"text": TEXTS}).map(
        lambda batch: tokenizer(batch["text"], truncation=True, max_length=24, return_special_tokens_mask=True),
        batched=True,
        remove_columns=["text"],
    )
    rows = pack_examples(features, 32, tokenizer.pad_token_id)
    torch.manual_seed(0)
    batch = packing_collator("masked-lm", tokenizer)([dict(row) for row in rows])
    assert set(batch) == {"input_ids", "token_type_ids", "position_ids", "labels"}
    assert torch.equal(batch["position_ids"], torch.tensor(rows["position_ids"]))
    special = torch.isin(torch.tensor(rows["input_ids"]), torch.tensor(tokenizer.all_special_ids))
    scored = batch["labels"] != -100
    assert scored.any() and not (scored & special).any()
    assert torch.equal(batch["input_ids"][special], torch.tensor(rows["input_ids"])[special])


@pytest.mark.parametrize("task", ["causal-lm", "masked-lm"])
def test_cli_trains_with_packing(tmp_path, monkeypatch, capsys, task):
    """`hf-tfm train --packing`: every training batch is --batch-size rows of --max-length tokens, whole examples
    with restarting positions and no attention_mask; evaluation stays padded; the run record says so."""
    batches = []
    make = run_module.packing_collator

    def recording(*args):
        collate = make(*args)

        def collate_and_record(rows):
            batches.append(collate(rows))
            return batches[-1]

        return collate_and_record

    monkeypatch.setattr(run_module, "packing_collator", recording)
    spec = tiny_spec(tmp_path, task)
    output = tmp_path / "run"
    options = ["--max-files", "40", "--vocab-size", "300", "--max-length", "32", "--batch-size", "4"]
    model = ["--model", spec.model, "--output-dir", str(output), "--max-steps", "2", "--max-eval-samples", "4"]
    main(["train", "--task", task, *model, *options, "--use-cpu", "--packing"])
    assert f"| {task} |" in capsys.readouterr().out
    assert len(batches) >= 2
    for batch in batches:
        assert batch["input_ids"].shape == (4, 32) and "attention_mask" not in batch
        positions = batch["position_ids"]
        steps = positions.diff(dim=-1)
        assert (positions[:, 0] == 0).all() and ((steps == 1) | (positions[:, 1:] == 0)).all()
        assert (batch["labels"] != -100).any()
    record = json.loads((output / "model" / "hf_tfm_run.json").read_text())
    assert record["training"]["packing"] is True


@pytest.mark.parametrize("task", ["seq2seq", "sequence-classification"])
def test_packing_refused_for_tasks_it_cannot_train(tmp_path, task):
    config = tiny_config_file(tmp_path, "tfm_encoder_decoder" if task == "seq2seq" else "tfm_encoder")
    with pytest.raises(SystemExit, match=f"--packing: task {task} cannot be packed"):
        main(["train", "--task", task, "--model", config, "--output-dir", str(tmp_path / "run"), "--packing"])
    assert not (tmp_path / "run").exists()  # refused before anything was written
