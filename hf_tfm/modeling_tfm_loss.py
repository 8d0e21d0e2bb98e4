"""hf_tfm's own losses: cross-entropy over a vocabulary projection without the full logits, and the MoE
load-balancing loss.

The cross-entropy projects the tokens a chunk at a time (a masked LM only its scored ones), and each chunk's gradients
are taken while its logits exist, so neither the `[tokens, vocab]` float32 logits nor their gradient is ever held whole
(Liger-Kernel's fused linear cross-entropy, in plain PyTorch so that it runs on any device). Same loss and gradients as
projecting everything and calling transformers' loss, to rounding.
"""

import math

import torch


def chunk_rows(rows: int, vocab: int, chunk_size: int | None, activation_width: int, min_rows: int) -> int:
    """Tokens per chunk: `chunk_size`, or (None) sized by the memory the model already holds for its backward: a
    chunk's logits hold no more values than the batch's hidden states of every layer (`activation_width` = layers x
    hidden per token), so the loss never dominates the step's memory, and a model whose layers outweigh its vocabulary
    projects everything at once. At least `min_rows` tokens a chunk (twice the hidden size: each chunk reads and writes
    the float32 [vocab, hidden] weight gradient once, which then stays under about a tenth of the chunk's own passes
    over its logits), evened out over the chunks it takes. GPT-2 124M at 16 x 1024 tokens: 6 chunks (the full float32
    logits would take 3.1 GiB)."""
    if chunk_size:
        return chunk_size
    most = max(min_rows, rows * activation_width // vocab)
    return math.ceil(rows / math.ceil(rows / most)) if rows else 1


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype autocast would run a matmul of `tensor` in: its own outside autocast."""
    device = tensor.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return tensor.dtype


def aligned_rows(table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The head's weight or bias (a row per token) in the matmul's `dtype`, and in a 16-bit dtype with zero rows up to
    a multiple of 8: a [tokens, table] product then has 16-byte-aligned rows, which the GPU's tensor-core matmul
    kernels need. GPT-2's 50257 tokens are not: in the H200 run (benchmarks/results/gpu-2026-11-27.json, eager
    kernel tables) the head's three matmuls ran in unaligned (align1) kernels for 30-31 of a step's 108 ms, on both
    sides, where the compiled reference's aligned ones took 5. The zero rows' logits are never scored (the loss
    biases them to -inf, or slices capped logits short of them) and their gradients are dropped. Under autocast the
    cast copies the weight anyway; bf16 weights pay a copy."""
    padding = -table.shape[0] % 8 if dtype.itemsize == 2 else 0
    if not padding:
        return table.to(dtype)
    aligned = table.new_empty((table.shape[0] + padding, *table.shape[1:]), dtype=dtype)
    aligned[: table.shape[0]] = table
    aligned[table.shape[0] :] = 0
    return aligned


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of `softcap(scale * hidden @ weight.T + bias)` against `labels`, over the labels that
    `scored` marks, and over the first `vocab_size` logits: rows of `weight` past them are the padding of a
    padded table (`pad_vocab_size_to_multiple_of`), projected (the matmuls keep the padded width, and
    `aligned_rows` may add zero rows) but never scored, and their gradient is 0.

    The gradients are computed chunk by chunk in the forward pass (when autograd will want them) and scaled by the
    incoming gradient in backward: one pass over the vocabulary instead of a forward and a recomputation. Matmuls run
    in `dtype` (autocast's, as transformers' head would), log_softmax and its gradient in float32 (one log_softmax
    pass per chunk, its exp the softmax), the weight gradient summed over chunks in float32 (then cast to the weight's
    dtype). Unscored rows take part like the others with their input zeroed, and get a zero gradient (no boolean
    selection: no host synchronisation, one graph under torch.compile)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, scored, scale, softcap, chunk: int, vocab_size, dtype, bias_after):
        wants = any(ctx.needs_input_grad[:3])  # autograd will ask for a gradient
        target = torch.where(scored, labels, 0)[:, None]  # 0 where not scored: a valid index, its row is dropped
        # cast once, not once per chunk; the input gradient is kept in the matmul's dtype (autograd casts it to the
        # input's once). An unscored token's input row is zeroed, so its softmax row adds nothing to the weight
        # gradient (its loss is dropped and its input gradient zeroed at the end): no per-chunk masking pass
        keep = scored[:, None].to(hidden.dtype)
        row_scale = keep * scale if scale != 1.0 else keep
        inputs_all = (hidden * row_scale).to(dtype)
        grad_hidden = torch.empty_like(inputs_all) if ctx.needs_input_grad[0] else None
        grad_weight = None  # the first chunk's product, then a sum in place: no [vocab, hidden] temporary per chunk
        summed = torch.promote_types(weight.dtype, torch.float32)  # chunks add up in float32 even for bf16 weights
        grad_bias = torch.zeros_like(bias) if bias is not None and ctx.needs_input_grad[2] else None
        weight_c, bias_c = aligned_rows(weight, dtype), None if bias is None else aligned_rows(bias, dtype)
        width = weight_c.shape[0]
        # the logits past the vocabulary (a padded table's rows, the rows aligned_rows added) are biased to -inf, so
        # log_softmax runs over whole rows and gives them probability 0 (aten's _log_softmax copies a sliced row into
        # a contiguous one first); a soft cap would bound the -inf, so capped logits are sliced instead
        sliced = softcap is not None and vocab_size < width
        if vocab_size < width and not sliced:
            beyond = torch.zeros(width, dtype=dtype, device=hidden.device)
            beyond[vocab_size:] = float("-inf")
            bias_c = beyond if bias_c is None else bias_c + beyond
        minus_one = torch.full((1, 1), -1.0, device=hidden.device).expand(target.shape)  # the one-hot, subtracted
        target_log_probs = []  # each chunk's [rows, 1], joined once at the end
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            inputs = inputs_all[rows]
            projected = torch.nn.functional.linear(inputs, weight_c, None if bias_after else bias_c)
            if bias_after and bias_c is not None:  # BART adds its final_logits_bias after the matmul
                projected += bias_c
            capped = None
            if softcap is not None:  # in the projection's dtype, as transformers' heads cap their logits
                capped = torch.tanh(projected / softcap)
                projected = capped * softcap
            logits = projected[:, :vocab_size] if sliced else projected
            # in float32, by the kernel transformers' loss (cross_entropy) runs
            log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
            target_log_prob = log_probs.gather(-1, target[rows])
            target_log_probs.append(target_log_prob)
            if not wants:
                del projected, logits, log_probs, capped
                continue
            # d(loss)/d(logits) = softmax - one_hot(target)
            # an unscored row's softmax is not 0: zeroed (`keep`), so that the bias gradient leaves it out
            if torch.compiler.is_compiling():
                # written over the logits, then the target's column (p - 1, rounded once as transformers' loss
                # rounds it): one kernel with log_softmax, in the matmul's dtype, the rows zeroed in it. A float32
                # buffer between them costs a write and a read: GPT-2's compiled step, 1.08x the compiled
                # reference's bytes with one, 1.00x without; a zeroing pass after the scatter, BERT's 1.04x
                # (benchmarks.compiled)
                row_keep = keep[rows]
                grad_logits = logits.copy_(torch.exp(log_probs) * row_keep)
                target_gradient = torch.expm1(target_log_prob) * row_keep
                grad_logits.scatter_(-1, target[rows], target_gradient.to(grad_logits.dtype))
            else:
                # eager: in float32 over the log-probabilities, cast into the projection's buffer below (a CPU
                # runs float32 math written as bf16 4x slower, and a scatter into bf16 orders of magnitude slower)
                grad_logits = log_probs.exp_().scatter_add_(-1, target[rows], minus_one[rows])
                if grad_bias is not None:
                    grad_logits.mul_(keep[rows])
            if softcap is not None:  # through the cap's 1 - tanh^2
                grad_logits.mul_(1.0 - capped[:, :vocab_size] * capped[:, :vocab_size])
            if grad_logits.dtype != dtype or sliced:  # the projection's buffer holds it, at the full width
                if grad_logits is not logits:
                    logits.copy_(grad_logits)
                if sliced and vocab_size < weight.shape[0]:  # a padded table's rows project values: gradient 0
                    projected[:, vocab_size:] = 0
                grad_logits = projected  # (sliced, the rows aligned_rows added project exactly 0 already)
            del log_probs, logits, projected  # one [rows, vocab] buffer left, whichever holds the gradient
            if grad_hidden is not None:
                torch.mm(grad_logits, weight_c, out=grad_hidden[rows])
            if ctx.needs_input_grad[1]:
                if grad_weight is None:
                    grad_weight = (grad_logits.t() @ inputs).to(summed)
                elif dtype == summed:
                    grad_weight.addmm_(grad_logits.t(), inputs)
                else:  # a low-precision product summed in float32
                    grad_weight += grad_logits.t() @ inputs
            if grad_bias is not None:
                grad_bias += grad_logits[:, : bias.shape[0]].sum(dim=0, dtype=grad_bias.dtype)
            # this chunk's [rows, vocab] buffers are freed before the next chunk projects: names left bound would
            # hold them through it, as many again as one chunk needs
            del grad_logits, capped
        if grad_hidden is not None:
            grad_hidden.mul_(row_scale)
        if grad_weight is not None:  # without the rows aligned_rows added
            if grad_weight.shape[0] != weight.shape[0]:
                # detached: autograd would copy a view (of the padded buffer) into the parameter's gradient
                grad_weight = grad_weight[: weight.shape[0]].detach()
            grad_weight = grad_weight.to(weight.dtype)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        if not target_log_probs:  # no token to score (a masked-LM batch that masks none)
            return torch.zeros((), device=hidden.device)
        return torch.where(scored, torch.cat(target_log_probs).squeeze(-1), 0.0).sum().neg()

    @staticmethod
    def backward(ctx, grad_output):
        grads = [None if grad is None else grad.mul_(grad_output.to(grad.dtype)) for grad in ctx.saved_tensors]
        return *grads, None, None, None, None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    chunk_size: int | None,
    num_items_in_batch=None,
    ignore_index: int = -100,
    vocab_size: int | None = None,
    scale: float = 1.0,
    softcap: float | None = None,
    select_scored: bool = False,
    bias_after_matmul: bool = False,
    activation_width: int = 0,
    **kwargs,
) -> torch.Tensor:
    """transformers' `fixed_cross_entropy` of the projected `hidden` ([..., hidden]) against `labels` ([...]): the
    mean over scored labels, or their sum over Trainer's `num_items_in_batch`; 0 (with zero gradients) when no
    label is scored. `chunk_size` tokens are projected at a time (None: `chunk_rows` sizes the chunks by the model's
    `activation_width`, layers x hidden). With
    `select_scored` (a masked-LM batch, which scores about 15% of its tokens) only the scored tokens are projected,
    at the price of one host synchronisation in eager mode (their count sizes the selection); under torch.compile
    every token is. `vocab_size` (default: every row of `weight`) is the number of real tokens of a padded table.
    `bias_after_matmul` adds `bias` after the matmul instead of inside it, as BART adds its final_logits_bias (two
    roundings in bf16, as the reference)."""
    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1).to(hidden.device)
    scored = labels != ignore_index
    if select_scored and not torch.compiler.is_compiling():
        rows = scored.nonzero().squeeze(-1)  # the one synchronisation; index_select's backward needs none
        hidden, labels, scored = (tensor.index_select(0, rows) for tensor in (hidden, labels, scored))
    vocab_size = weight.shape[0] if vocab_size is None else vocab_size
    chunk = chunk_rows(hidden.shape[0], weight.shape[0], chunk_size, activation_width, 2 * hidden.shape[-1])
    total = ChunkedLinearCrossEntropy.apply(
        hidden,
        weight,
        bias,
        labels,
        scored,
        scale,
        softcap,
        chunk,
        vocab_size,
        compute_dtype(hidden),
        bias_after_matmul,
    )
    if num_items_in_batch is None:
        return total / scored.sum().clamp(min=1)
    # clamped: an accumulated batch without targets has 0 items (transformers divides 0 by 0 there)
    return total / torch.as_tensor(num_items_in_batch, device=total.device).clamp(min=1)


def load_balancing_loss(
    router_logits: tuple[torch.Tensor, ...], num_experts: int, top_k: int, attention_mask: torch.Tensor | None = None
) -> torch.Tensor | float:
    """Switch Transformer's (Mixtral's) auxiliary loss over every MoE layer: `num_experts` times the sum over experts
    of (share of top-k assignments it got) x (mean router probability it got), counting real tokens only when a
    [batch, length] `attention_mask` is given. The same value as transformers' Mixtral `load_balancing_loss_func`
    (tests/test_compat.py), owned here so no other model's module is imported; index_add_, so no device sync."""
    if not isinstance(router_logits, tuple) or not router_logits:
        return 0
    device = router_logits[0].device
    probabilities = torch.softmax(torch.cat([logits.to(device) for logits in router_logits]), dim=-1)
    _, chosen = torch.topk(probabilities, top_k, dim=-1)
    rows = probabilities.shape[0]
    if attention_mask is None:
        weights = torch.ones(rows, dtype=torch.float32, device=device)
    else:
        weights = attention_mask.reshape(-1).to(device, torch.float32).repeat(len(router_logits))
    assignments = torch.zeros(num_experts, dtype=torch.float32, device=device)
    assignments.index_add_(0, chosen.reshape(-1), weights.repeat_interleave(top_k))
    probability_sums = (probabilities.float() * weights[:, None]).sum(dim=0)
    total = weights.sum()
    return torch.sum((assignments / total) * (probability_sums / total)) * num_experts
