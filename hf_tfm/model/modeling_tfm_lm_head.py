"""The language-model head: the vocabulary projection, its logits and its loss, in one module.

`TfmLMHead` is the projection (an `nn.Linear` over the padded vocabulary, so state dicts, ties, PEFT and the parallel
plans see a plain `lm_head`) and owns what a head does with it: the logits of the real tokens (`logits`: T5's input
scale, BART's bias after the matmul, the padded rows sliced off, Gemma 2's soft cap) and the loss (`loss`). Training
with labels, the loss projects a chunk of tokens at a time and takes each chunk's gradients while its logits exist
(`linear_cross_entropy`: Liger-Kernel's fused linear cross-entropy in plain PyTorch), so the `[tokens, vocab]` float32
logits and their gradient are never held whole; otherwise it is transformers' loss over the logits. Same loss and
gradients either way, to rounding. Not torch's own `linear_cross_entropy`: its chunked operator ignores autocast (a
float32 vocabulary matmul under bf16 autocast) and knows none of the options above (hf_tfm's compat table, row
"torch.nn.functional.linear_cross_entropy").
"""

import math

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.loss.loss_utils import ForCausalLMLoss

from .compat import slice_logits_to_keep
from .configuration_tfm import TfmConfig
from .modeling_tfm_layers import compute_dtype, make_norm, reads_its_weight


class TfmLMHead(nn.Linear):
    """The vocabulary projection, `padded_vocab_size()` rows, and what the heads do with it (`logits`, `loss`)."""

    def __init__(self, config: TfmConfig, bias: bool | None = None, bias_after_matmul: bool | None = None):
        bias = config.lm_head_bias if bias is None else bias
        super().__init__(config.token_width(), config.padded_vocab_size(), bias=bias)
        self.config = config  # the model's own: resize_token_embeddings changes its vocab_size
        # BART's final_logits_bias is added after the matmul and never trained, as BART's buffer
        self.bias_after_matmul = config.lm_head_bias if bias_after_matmul is None else bias_after_matmul
        self.freeze_bias()
        self.input_scale = config.hidden_size**-0.5 if config.scale_lm_head_input else 1.0  # T5, tied

    @classmethod
    def holding(cls, layer: nn.Module, config: TfmConfig, bias_after_matmul: bool | None = None) -> nn.Module:
        """An LM head over `layer`'s own weight and bias, when something hands the model a plain `nn.Linear` as its
        output embeddings (transformers' `resize_token_embeddings` builds one): the head keeps its logits and loss."""
        if type(layer) is not nn.Linear:
            return layer
        with torch.device("meta"):
            head = cls(config, bias=layer.bias is not None, bias_after_matmul=bias_after_matmul)
        head.in_features, head.out_features = layer.in_features, layer.out_features
        head.weight, head.bias = layer.weight, layer.bias
        head.freeze_bias()
        # initialised already (transformers marks the layer it resized): a later post_init() must not draw it again
        if getattr(layer, "_is_hf_initialized", False):
            head._is_hf_initialized = True
        return head

    def freeze_bias(self) -> None:
        """BART's `final_logits_bias` is a buffer its reference never trains: frozen when built and after loading
        (transformers makes every loaded floating parameter trainable). A masked LM's own bias (BERT's) trains."""
        if self.bias_after_matmul and self.bias is not None:
            self.bias.requires_grad_(False)

    def logits(
        self, hidden_states: torch.Tensor, logits_to_keep: int | torch.Tensor, layer: nn.Module
    ) -> torch.Tensor:
        """The logits of the real tokens at the positions kept. `layer`: the module the model holds in this head's
        place (the head itself, or a PEFT wrapper around it), called for the projection."""
        hidden_states = slice_logits_to_keep(hidden_states, logits_to_keep)
        if self.input_scale != 1.0:
            hidden_states = hidden_states * self.input_scale
        if self.bias_after_matmul and self.bias is not None and reads_its_weight(layer, TfmLMHead):
            # rounded twice in bf16, as BART's (a sharded head's own call adds it inside, as the hooks gather)
            logits = nn.functional.linear(hidden_states, self.weight) + self.bias
        else:
            logits = layer(hidden_states)  # through the module's hooks: tensor parallelism gathers here
        if logits.shape[-1] != self.config.vocab_size:  # a padded head: a view of the real tokens' logits
            logits = logits[..., : self.config.vocab_size]
        cap = self.config.final_logit_softcapping
        if cap is None:
            return logits
        # one step per line, so each intermediate [batch, length, vocab] tensor is freed as the next is made
        logits = logits / cap
        logits = torch.tanh(logits)
        return logits * cap

    def predict(
        self, hidden_states, labels, loss_function, layer: nn.Module, logits_to_keep=0, select_scored=False, **kwargs
    ) -> dict:
        """{"logits", "loss"}. Training with labels and gradients: the loss alone (Trainer's training step reads only
        the loss), projected chunk by chunk (`loss_chunk_size`; only the scored tokens with `select_scored`: a masked
        LM). Otherwise (evaluation, generation, `loss_chunk_size=0`, a weight that cannot be read as it is: a
        tensor-parallel shard or a ZeRO-3 partition, which the module's hooks gather; a quantised weight): the logits
        and, with labels, transformers' `loss_function` over them, 0 for a batch without a target (where it gives NaN).
        Labels line up token for token with the states they score. `layer`: as for `logits`."""
        if labels is not None and labels.shape != hidden_states.shape[:-1]:
            raise ValueError(f"labels have shape {tuple(labels.shape)}, expected {tuple(hidden_states.shape[:-1])}")
        chunked = self.training and torch.is_grad_enabled() and self.config.loss_chunk_size != 0
        if labels is None or not (chunked and reads_its_weight(layer, TfmLMHead)):
            logits = self.logits(hidden_states, logits_to_keep, layer)
            if labels is None:
                return {"logits": logits, "loss": None}
            loss = loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
            scored = labels[..., 1:] if loss_function is ForCausalLMLoss else labels  # a token scores its successor
            return {"logits": logits, "loss": torch.where((scored != -100).any(), loss, torch.zeros_like(loss))}
        if loss_function is ForCausalLMLoss:  # each token scores its successor: the labels move, not the states
            labels = nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
        config = self.config
        loss = linear_cross_entropy(
            hidden_states,
            self.weight,
            self.bias,
            labels,
            config.loss_chunk_size,
            vocab_size=config.vocab_size,
            scale=self.input_scale,
            softcap=config.final_logit_softcapping,
            select_scored=select_scored,
            activation_width=config.num_hidden_layers * config.hidden_size,
            bias_after_matmul=self.bias_after_matmul,
            **kwargs,
        )
        return {"logits": None, "loss": loss}


def lm_head_in(layer: nn.Module) -> TfmLMHead:
    """The `TfmLMHead` that `layer` is, or wraps: PEFT replaces a targeted head by a layer of its own that holds it."""
    return next(module for module in layer.modules() if isinstance(module, TfmLMHead))


class TfmMaskedLMHead(nn.Module):
    """BERT's MLM head: dense, activation and norm (`transform`, to the token table's width), then the vocabulary
    projection (`decoder`, tied to the token table) with its own trained bias."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_width())
        self.act_fn = ACT2FN[config.hidden_act]
        self.norm = make_norm(config, config.embedding_width())
        self.decoder = TfmLMHead(config, bias=True, bias_after_matmul=False)

    def transform(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act_fn(self.dense(hidden_states)))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return lm_head_in(self.decoder).logits(self.transform(hidden_states), 0, self.decoder)


# ------------------------------------------------------------------------------------ the chunked cross-entropy


def aligned_rows(table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The head's weight or bias (a row per token) in the matmul's `dtype`, and in a 16-bit dtype with zero rows up to
    a multiple of 8: a [tokens, table] product then has 16-byte-aligned rows, which the GPU's tensor-core matmul
    kernels need (GPT-2's 50257 tokens are not; benchmarks/NOTES.md measures what unaligned kernels cost).
    The zero rows' logits are never scored (the loss biases them to -inf, or slices capped logits short of them) and
    their gradients are dropped."""
    padding = -table.shape[0] % 8 if dtype.itemsize == 2 else 0
    if not padding:
        return table.to(dtype)
    aligned = table.new_empty((table.shape[0] + padding, *table.shape[1:]), dtype=dtype)
    aligned[: table.shape[0]] = table
    aligned[table.shape[0] :] = 0
    return aligned


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of `softcap(scale * hidden @ weight.T + bias)` against `labels`, over the labels that
    `scored` marks and the first `vocab_size` logits (rows of `weight` past them pad the table: projected, never
    scored, gradient 0).

    The gradients are computed chunk by chunk in the forward pass (its callers run it only when autograd wants them)
    and scaled by the incoming gradient in backward: one pass over the vocabulary instead of a forward and a
    recomputation. Matmuls run in `dtype` (autocast's, as transformers' head would), log_softmax and its gradient in
    float32, the weight gradient summed over chunks in float32. Unscored rows take part with their input zeroed and get
    a zero gradient (no boolean selection: no host synchronisation, one graph under torch.compile)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, scored, scale, softcap, chunk: int, vocab_size, dtype, bias_after):
        target = torch.where(scored, labels, 0)[:, None]  # 0 where not scored: a valid index, its row is dropped
        # cast once, not once per chunk; an unscored token's input row is zeroed, so its softmax row adds nothing to
        # the weight gradient (its loss is dropped and its input gradient zeroed at the end): no per-chunk masking
        keep = scored[:, None].to(hidden.dtype)
        row_scale = keep * scale if scale != 1.0 else keep
        inputs_all = (hidden * row_scale).to(dtype)
        grad_hidden = torch.empty_like(inputs_all)
        grad_weight = None  # the first chunk's product, then a sum in place: no [vocab, hidden] temporary per chunk
        summed = torch.promote_types(weight.dtype, torch.float32)  # chunks add up in float32 even for bf16 weights
        grad_bias = torch.zeros_like(bias) if bias is not None and ctx.needs_input_grad[2] else None
        weight_c, bias_c = aligned_rows(weight, dtype), None if bias is None else aligned_rows(bias, dtype)
        # the logits past the vocabulary (a padded table's rows, the rows aligned_rows added) are biased to -inf, so
        # log_softmax runs over whole rows and gives them probability 0; a soft cap would bound the -inf, so capped
        # logits are sliced instead
        sliced = softcap is not None and vocab_size < weight_c.shape[0]
        if vocab_size < weight_c.shape[0] and not sliced:
            beyond = torch.zeros(weight_c.shape[0], dtype=dtype, device=hidden.device)
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
            log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # as transformers' cross_entropy
            target_log_prob = log_probs.gather(-1, target[rows])
            target_log_probs.append(target_log_prob)
            # d(loss)/d(logits) = softmax - one_hot(target); an unscored row's softmax is zeroed (`keep`), so that the
            # bias gradient leaves it out
            if torch.compiler.is_compiling():
                # written over the logits, then the target's column (p - 1, rounded once as transformers' loss rounds
                # it): one kernel with log_softmax, in the matmul's dtype, the rows zeroed in it. A float32 buffer
                # between them, or a zeroing pass after the scatter, costs a write and a read (benchmarks.compiled)
                row_keep = keep[rows]
                grad_logits = logits.copy_(torch.exp(log_probs) * row_keep)
                target_gradient = torch.expm1(target_log_prob) * row_keep
                grad_logits.scatter_(-1, target[rows], target_gradient.to(grad_logits.dtype))
            else:
                # eager: in float32 over the log-probabilities, cast into the projection's buffer below (a CPU runs
                # float32 math written as bf16 4x slower, and a scatter into bf16 orders of magnitude slower)
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
    `activation_width`, layers x hidden). With `select_scored` (a masked-LM batch, which scores about 15% of its
    tokens) only the scored tokens are projected, at the price of one host synchronisation in eager mode (their count
    sizes the selection); under torch.compile every token is. `vocab_size` (default: every row of `weight`) is the
    number of real tokens of a padded table. `bias_after_matmul` adds `bias` after the matmul (BART)."""
    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1).to(hidden.device)
    scored = labels != ignore_index
    if select_scored and not torch.compiler.is_compiling():
        rows = scored.nonzero().squeeze(-1)  # the one synchronisation; index_select's backward needs none
        hidden, labels, scored = (tensor.index_select(0, rows) for tensor in (hidden, labels, scored))
    vocab_size = weight.shape[0] if vocab_size is None else vocab_size
    # None: chunks sized by the memory the model already holds for its backward, a chunk's logits no more values than
    # the batch's hidden states of every layer (`activation_width` = layers x hidden per token), so the loss never
    # dominates the step's memory; at least twice the hidden size in tokens (each chunk reads and writes the float32
    # [vocab, hidden] weight gradient once), evened out over the chunks
    most = max(2 * hidden.shape[-1], hidden.shape[0] * activation_width // weight.shape[0])
    chunk = chunk_size or max(1, math.ceil(hidden.shape[0] / max(1, math.ceil(hidden.shape[0] / most))))
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
    # clamped: an accumulated batch without targets has 0 items (transformers divides 0 by 0 there)
    count = scored.sum() if num_items_in_batch is None else torch.as_tensor(num_items_in_batch, device=total.device)
    return total / count.clamp(min=1)
