"""The chunked linear + cross-entropy loss (modeling_tfm_lm_head.py) gives the loss and gradients of the full-logits
path, for every language-model head and head option, and logits come back wherever a caller reads them."""

import pytest
import torch
from conftest import VOCAB, perturb, tiny_config
from transformers import GPT2Config, GPT2LMHeadModel

from hf_tfm import (
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
)
from hf_tfm.convert import to_tfm
from hf_tfm.model.modeling_tfm_lm_head import linear_cross_entropy

RTOL, ATOL = 1e-5, 1e-6
NO_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # train mode, both sides alike
MOE = dict(num_experts=4, num_experts_per_tok=2, router_z_loss_coef=0.01)
HEADS = {
    "causal-tied": (TfmDecoderForCausalLM, {}),
    "causal-untied-bias": (TfmDecoderForCausalLM, dict(tie_word_embeddings=False, lm_head_bias=True)),
    "causal-softcapped": (TfmDecoderForCausalLM, dict(final_logit_softcapping=2.0)),
    "causal-moe": (TfmDecoderForCausalLM, MOE),
    "masked": (TfmEncoderForMaskedLM, dict(config_class=TfmEncoderConfig)),
    "seq2seq-t5-rescaled": (
        TfmEncoderDecoderForConditionalGeneration,
        dict(
            config_class=TfmEncoderDecoderConfig,
            scale_lm_head_input=True,
            decoder_start_token_id=0,
            position_embedding_type="relative_bias",
        ),
    ),
}


def model_and_batch(head: str, chunk: int):
    model_class, overrides = HEADS[head]
    torch.manual_seed(0)
    model = perturb(model_class(tiny_config(**{**overrides, "loss_chunk_size": chunk})))
    torch.manual_seed(3)
    input_ids = torch.randint(3, VOCAB, (2, 7))
    labels = input_ids.clone()
    labels[0, :2] = -100  # some tokens unscored
    if model_class is TfmEncoderForMaskedLM:
        labels[torch.rand(labels.shape) < 0.5] = -100
    return model.train(), dict(input_ids=input_ids, labels=labels)


def loss_and_grads(model, batch, **kwargs):
    model.zero_grad()
    output = model(**batch, **kwargs)
    output.loss.backward()
    return output, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("num_items", [None, 17], ids=["mean", "num_items_in_batch"])
def test_chunked_loss_and_gradients_equal_the_full_logits_path(head, num_items):
    """Chunks of 3 tokens (not dividing the scored count) against the full logits: same loss, same gradient of every
    parameter; under Trainer's num_items_in_batch too (gradient accumulation stays exact)."""
    kwargs = {} if num_items is None else {"num_items_in_batch": torch.tensor(num_items)}
    full, expected = loss_and_grads(*model_and_batch(head, chunk=0), **kwargs)
    chunked, actual = loss_and_grads(*model_and_batch(head, chunk=3), **kwargs)
    assert chunked.logits is None and full.logits is not None  # training never held the full logits
    torch.testing.assert_close(chunked.loss, full.loss, rtol=RTOL, atol=0)
    assert sorted(actual) == sorted(expected)
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, rtol=RTOL, atol=ATOL, msg=name)


@pytest.mark.parametrize("head", ["causal-tied", "masked"])
def test_no_scored_label_gives_zero_loss_and_gradients(head):
    model, batch = model_and_batch(head, chunk=3)
    batch["labels"][:] = -100
    output, grads = loss_and_grads(model, batch)
    assert output.loss.item() == 0.0
    assert all(torch.count_nonzero(grad) == 0 for grad in grads.values())


def test_evaluation_and_generation_get_logits():
    """Eval mode computes the logits (Trainer's compute_metrics reads them) and the same loss as training."""
    model, batch = model_and_batch("causal-tied", chunk=3)
    training_loss = model(**batch).loss
    model.eval()
    output = model(**batch)
    assert output.logits.shape == (2, 7, VOCAB)
    torch.testing.assert_close(output.loss, training_loss, rtol=RTOL, atol=0)
    assert model.generate(batch["input_ids"], max_new_tokens=2, do_sample=False).shape == (2, 9)


def test_training_loss_equals_gpt2():
    """The chunked loss of a converted GPT-2 is GPT2LMHeadModel's loss on the same batch."""
    torch.manual_seed(0)
    reference = perturb(
        GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64, **NO_DROPOUT))
    )
    ours = to_tfm(reference)
    ours.config.loss_chunk_size = 4
    input_ids = torch.randint(3, VOCAB, (2, 9))
    reference.train(), ours.train()
    expected, actual = reference(input_ids, labels=input_ids).loss, ours(input_ids, labels=input_ids).loss
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=0)


def test_masked_path_of_compiled_graphs_is_exact(monkeypatch):
    """Under torch.compile every token is projected and the unscored ones masked (no data-dependent selection):
    the same loss and gradients."""
    full, expected = loss_and_grads(*model_and_batch("masked", chunk=0))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    chunked, actual = loss_and_grads(*model_and_batch("masked", chunk=3))
    torch.testing.assert_close(chunked.loss, full.loss, rtol=RTOL, atol=0)
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, rtol=RTOL, atol=ATOL, msg=name)


def test_one_chunk_of_vocabulary_sized_buffers_is_alive_at_a_time():
    """A chunk's [rows, vocab] buffers are freed before the next chunk projects: at most the projection and its
    float32 log-probabilities live at once (names left bound across the loop once held the previous chunk's too,
    three buffers where two suffice). Peak bytes from the profiler's allocation records: exact, not timed."""
    from benchmarks.measure import peak_bytes

    rows, width, vocab, chunk = 512, 32, 4096, 128
    torch.manual_seed(0)
    hidden = torch.randn(rows, width, requires_grad=True)
    weight = (torch.randn(vocab, width) * 0.02).requires_grad_()
    labels = torch.randint(0, vocab, (rows,))

    def step():
        linear_cross_entropy(hidden, weight, None, labels, chunk).backward()
        hidden.grad = weight.grad = None

    step()
    buffer = chunk * vocab * 4
    gradients = (vocab + rows) * width * 4
    assert peak_bytes(step, torch.device("cpu")) <= gradients + 2.25 * buffer


@pytest.mark.parametrize(
    "options",
    [{}, {"bias": True}, {"softcap": 3.0}, {"vocab_size": 90}, {"bias": True, "bias_after_matmul": True}],
    ids=["plain", "bias", "softcapped", "padded-table", "bias-after"],
)
@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16], ids=["fp32-weights", "bf16-weights"])
def test_rows_aligned_for_16_bit_matmuls_change_nothing(options, weights, monkeypatch):
    """A 16-bit projection of a 101-token table runs on 104 rows (`aligned_rows`: 16-byte-aligned rows for GPU
    matmul kernels): the loss and every gradient equal those of the unaligned 101 rows, under bf16 autocast (fp32
    weights) and with bf16 weights."""
    from hf_tfm.model import modeling_tfm_lm_head

    rows, width, table = 37, 16, 101
    torch.manual_seed(0)
    hidden = torch.randn(rows, width, dtype=weights)
    weight = (torch.randn(table, width) * 0.3).to(weights)
    bias = torch.randn(table).to(weights) if options.get("bias") else None
    labels = torch.randint(0, options.get("vocab_size", table), (rows,))
    labels[:5] = -100

    def loss_and_grads():
        given = (hidden, weight) if bias is None else (hidden, weight, bias)
        leaves = [tensor.clone().requires_grad_() for tensor in given]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=weights == torch.float32):
            loss = linear_cross_entropy(
                leaves[0],
                leaves[1],
                leaves[2] if bias is not None else None,
                labels,
                8,
                vocab_size=options.get("vocab_size"),
                softcap=options.get("softcap"),
                bias_after_matmul=options.get("bias_after_matmul", False),
            )
        loss.backward()
        return [loss.detach()] + [leaf.grad for leaf in leaves]

    assert modeling_tfm_lm_head.aligned_rows(weight, torch.bfloat16).shape[0] == 104
    aligned = loss_and_grads()
    if "vocab_size" in options:  # a padded table's own rows: projected, never scored, no gradient
        assert aligned[2][options["vocab_size"] :].abs().max() == 0
    shapes = []
    monkeypatch.setattr(modeling_tfm_lm_head, "aligned_rows", lambda t, dtype: shapes.append(t.shape) or t.to(dtype))
    unaligned = loss_and_grads()
    assert shapes and shapes[0][0] == table  # the control ran unaligned
    for ours, theirs in zip(aligned, unaligned, strict=True):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_a_step_scored_against_labels_builds_no_cache_unless_asked():
    """As BART's and T5's heads: with labels a decoder copies no layer's keys and values into a cache that a training
    step never reads (two copies a layer, kept through the loss), unless `use_cache=True` asks for one; without
    labels the cache comes back as transformers' does. The sequence classifier's head alike."""
    from hf_tfm import TfmDecoderForSequenceClassification
    from hf_tfm.compat import CACHE_NAME

    model, batch = model_and_batch("causal-tied", 0)
    assert model(**batch).get(CACHE_NAME) is None
    assert model(**batch, use_cache=True).get(CACHE_NAME).get_seq_length() == 7
    assert model(input_ids=batch["input_ids"]).get(CACHE_NAME).get_seq_length() == 7
    torch.manual_seed(0)
    classifier = TfmDecoderForSequenceClassification(tiny_config(num_labels=2, pad_token_id=0)).train()
    assert classifier(input_ids=batch["input_ids"], labels=torch.tensor([0, 1])).get(CACHE_NAME) is None
    assert classifier(input_ids=batch["input_ids"]).get(CACHE_NAME).get_seq_length() == 7


def test_aligned_rows_cost_a_step_no_memory(monkeypatch):
    """The weight gradient summed over the aligned rows goes to the head's weight without them, as a tensor of its
    own: a view of the padded sum would be copied by autograd into the parameter's gradient (a whole weight gradient
    more at the step's peak). The step under bf16 autocast peaks where the unaligned step does, give or take the 7
    zero rows. Peak bytes from the profiler's allocation records: exact, not timed."""
    from benchmarks.measure import peak_bytes
    from hf_tfm.model import modeling_tfm_lm_head

    torch.manual_seed(0)
    # a large table and few tokens: the step peaks in backward, where the head's gradient arrives
    config = tiny_config(vocab_size=20001, hidden_size=64, num_hidden_layers=1, loss_chunk_size=None)
    model = TfmDecoderForCausalLM(config).train()
    input_ids = torch.randint(3, 20001, (2, 8))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    step()
    aligned = peak_bytes(step, torch.device("cpu"))
    monkeypatch.setattr(modeling_tfm_lm_head, "aligned_rows", lambda table, dtype: table.to(dtype))
    unaligned = peak_bytes(step, torch.device("cpu"))
    weight_gradient = 20001 * 64 * 4
    assert aligned <= unaligned + weight_gradient / 8, (aligned, unaligned)
