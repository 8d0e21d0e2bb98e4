"""hf_tfm's own losses: cross-entropy over a vocabulary projection without the full logits, and the MoE
load-balancing loss.

The cross-entropy projects the scored tokens a chunk at a time, and each chunk's gradients are taken while its logits
exist, so neither the `[tokens, vocab]` float32 logits nor their gradient is ever held whole (Liger-Kernel's fused
linear cross-entropy, in plain PyTorch so that it runs on any device). Same loss and gradients as projecting
everything and calling transformers' loss, to rounding.
"""

import torch


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of `softcap(scale * hidden @ weight.T + bias)` against `labels`, over the labels that are
    not `ignore_index`, and over the first `vocab_size` logits: rows of `weight` past them are the padding of a
    padded table (`pad_vocab_size_to_multiple_of`), projected (the matmuls keep the padded width) but never scored,
    and their gradient is 0.
    The gradients are computed chunk by chunk in the forward pass (when autograd will want them) and scaled by the
    incoming gradient in backward: one pass over the vocabulary instead of a forward and a recomputation."""

    @staticmethod
    def forward(
        ctx, hidden, weight, bias, labels, scale, softcap, chunk_size: int, ignore_index: int, masked: bool, vocab_size
    ):
        wants = any(ctx.needs_input_grad[:3])  # autograd will ask for a gradient
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        # accumulated in place (addmm_): a `+=` would allocate a [vocab, hidden] temporary per chunk
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias) if bias is not None and ctx.needs_input_grad[2] else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            inputs = hidden[rows] * scale if scale != 1.0 else hidden[rows]
            logits = padded = torch.nn.functional.linear(inputs, weight, bias).float()
            if vocab_size < padded.shape[-1]:
                logits = padded[:, :vocab_size]
            if softcap is not None:
                capped = torch.tanh(logits / softcap)
                logits = capped * softcap
            scored = labels[rows] != ignore_index
            target = torch.where(scored, labels[rows], 0)
            log_normaliser = torch.logsumexp(logits, dim=-1)
            token_loss = log_normaliser - logits.gather(-1, target[:, None]).squeeze(-1)
            total = total + torch.where(scored, token_loss, 0.0).sum()
            if not wants:
                continue
            # d(loss)/d(logits) = softmax - one_hot(target), through the cap's 1 - tanh^2, written over the logits
            grad_logits = logits.sub_(log_normaliser[:, None]).exp_()
            if masked:  # one fused elementwise pass for inductor, where an indexed write is a pass of its own
                hit = torch.arange(grad_logits.shape[-1], device=grad_logits.device) == target[:, None]
                grad_logits = torch.where(scored[:, None], grad_logits - hit.to(grad_logits.dtype), 0.0)
            else:
                grad_logits[torch.arange(target.shape[0], device=target.device), target] -= 1.0
            if softcap is not None:
                grad_logits.mul_(1.0 - capped * capped)
            if vocab_size < padded.shape[-1]:  # back to the padded width, the padding's gradient 0
                if softcap is not None or masked:  # else grad_logits was written over `padded` already
                    padded[:, :vocab_size] = grad_logits
                padded[:, vocab_size:] = 0.0
                grad_logits = padded
            # in the weight's dtype: under autocast the hidden states may be bf16 while the weight stays fp32, and the
            # in-place addmm_ is not autocast
            grad_logits = grad_logits.to(weight.dtype)
            if grad_hidden is not None:
                chunk_grad = grad_logits @ weight
                grad_hidden[rows] = chunk_grad * scale if scale != 1.0 else chunk_grad
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t(), inputs.to(weight.dtype))
            if grad_bias is not None:
                grad_bias += grad_logits.sum(dim=0)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        grads = [None if grad is None else grad.mul_(grad_output.to(grad.dtype)) for grad in ctx.saved_tensors]
        return *grads, None, None, None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    chunk_size: int,
    num_items_in_batch=None,
    ignore_index: int = -100,
    vocab_size: int | None = None,
    scale: float = 1.0,
    softcap: float | None = None,
    **kwargs,
) -> torch.Tensor:
    """transformers' `fixed_cross_entropy` of the projected `hidden` ([..., hidden]) against `labels` ([...]): the
    mean over scored labels, or their sum over Trainer's `num_items_in_batch`; 0 (with zero gradients) when no
    label is scored. In eager mode only the scored tokens are projected (a masked-LM batch scores about 15% of
    them); under torch.compile every token is, masked, since a data-dependent selection would break the graph.
    `vocab_size` (default: every row of `weight`) is the number of real tokens of a padded table."""
    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1).to(hidden.device)
    scored = labels != ignore_index
    masked = torch.compiler.is_compiling()
    if not masked:
        hidden, labels = hidden[scored], labels[scored]
    vocab_size = weight.shape[0] if vocab_size is None else vocab_size
    total = ChunkedLinearCrossEntropy.apply(
        hidden, weight, bias, labels, scale, softcap, chunk_size, ignore_index, masked, vocab_size
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
