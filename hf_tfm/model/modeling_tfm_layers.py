"""The small building blocks: absent parts, norms, token embeddings and token types, feed-forward layers and the
pooler, each chosen by the config when the model is built (`make_norm`, `make_token_embedding`, `make_dropout`)."""

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from transformers.activations import ACT2FN

from .configuration_tfm import TfmConfig


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype autocast would run a matmul of `tensor` in: its own outside autocast."""
    device = tensor.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else tensor.dtype


class Absent(nn.Module):
    """A part the config leaves out (a norm a placement does not have, dropout of probability 0, absolute positions
    under RoPE): it returns its input. Called without nn.Module's call machinery, since hooks on a part that does
    nothing have nothing to watch: one Python call where a module call takes four, in every layer."""

    def __call__(self, hidden_states: torch.Tensor, *args) -> torch.Tensor:
        return hidden_states

    forward = __call__


def make_dropout(probability: float) -> nn.Module:
    return nn.Dropout(probability) if probability > 0 else Absent()


# ---------------------------------------------------------------------------------------------------------- norms


class TfmRMSNorm(nn.Module):
    """RMSNorm computed in float32 as Llama's (and T5's), so converted checkpoints match bit for bit: normalised in
    float32, cast to the input's dtype, then scaled."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def normalized(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The input over its root mean square, in float32."""
        in_float32 = hidden_states.to(torch.float32)
        variance = in_float32.pow(2).mean(-1, keepdim=True)
        # a 16-bit input without gradients is scaled itself, as T5's norm does: the same values (it widens exactly in
        # the product) with 2 bytes an element read instead of 4. With gradients the float32 copy is scaled, as
        # Llama's: the input's gradient then sums both paths in float32, rounded once
        scaled = hidden_states if hidden_states.dtype.itemsize == 2 and not torch.is_grad_enabled() else in_float32
        return scaled * torch.rsqrt(variance + self.variance_epsilon)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.weight * self.normalized(hidden_states).to(hidden_states.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class TfmRMSNormScaledInFloat32(TfmRMSNorm):
    """RMSNorm that scales the float32 states by its weight, then casts (OLMo 2, GPT-OSS: `numerics`)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return (self.weight * self.normalized(hidden_states)).to(hidden_states.dtype)


class TfmRMSNormInWeightDtype(TfmRMSNorm):
    """T5's RMSNorm: the normalised states cast to the weight's dtype, not the input's (`numerics`
    "ffn_output_in_float32": after a feed-forward kept in float32, the residual stream is float32 in a float16 model,
    and the sublayer after the norm runs in float16)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.weight * self.normalized(hidden_states).to(self.weight.dtype)


class TfmUnitOffsetRMSNorm(TfmRMSNorm):
    """Gemma's RMSNorm: scaled by `1 + weight` in float32, then cast; the weight starts at 0."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__(hidden_size, eps)
        nn.init.zeros_(self.weight)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return (self.normalized(hidden_states) * (1.0 + self.weight.float())).to(hidden_states.dtype)


def make_norm(config: TfmConfig, width: int | None = None) -> nn.Module:
    """The config's norm over `width` features (`hidden_size` by default)."""
    width = width or config.hidden_size
    if config.norm_type == "layernorm":
        return nn.LayerNorm(width, eps=config.layer_norm_eps, bias=config.norm_bias)
    if config.rmsnorm_unit_offset:
        return TfmUnitOffsetRMSNorm(width, eps=config.layer_norm_eps)
    if "rmsnorm_scale_in_float32" in config.numerics:
        return TfmRMSNormScaledInFloat32(width, eps=config.layer_norm_eps)
    if "ffn_output_in_float32" in config.numerics:
        return TfmRMSNormInWeightDtype(width, eps=config.layer_norm_eps)
    return TfmRMSNorm(width, eps=config.layer_norm_eps)


# ------------------------------------------------------------------------------------------------- token embeddings


class TfmScaledEmbedding(nn.Embedding):
    """A token table whose lookups are multiplied by `sqrt(hidden_size)` (the original Transformer, BART, Gemma), as
    transformers' scaled word embeddings do it: inside the lookup, so `inputs_embeds` a caller passes are taken as
    they are. Gemma multiplies by the scale rounded to the table's dtype (`numerics`): the value for each dtype is
    computed once, on the CPU (no buffer for a meta-device load or vLLM to rebuild)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, rounded: bool = False):
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        scale = embedding_dim**0.5
        self.scales = {
            dtype: torch.tensor(scale, dtype=dtype, device="cpu").item() if rounded else scale
            for dtype in (torch.float32, torch.bfloat16, torch.float16)
        }
        self.scale = scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.scales.get(self.weight.dtype, self.scale)


def make_token_embedding(config: TfmConfig) -> nn.Embedding:
    """The token table: `padded_vocab_size()` rows of `token_width()`, scaled by `sqrt(hidden_size)` with
    `scale_embeddings`, its pad row frozen with `freeze_pad_embedding`."""
    rows, width = config.padded_vocab_size(), config.token_width()
    padding_idx = config.pad_token_id if config.freeze_pad_embedding else None
    if config.scale_embeddings:
        return TfmScaledEmbedding(rows, width, padding_idx, rounded="round_embedding_scale" in config.numerics)
    return nn.Embedding(rows, width, padding_idx)


class TfmTokenTypes(nn.Embedding):
    """Token-type (segment) embeddings added to the token embeddings (BERT), type 0 where none are given."""

    def __init__(self, config: TfmConfig):
        super().__init__(config.type_vocab_size, config.embedding_width())

    def forward(self, hidden_states: torch.Tensor, token_type_ids, position_ids: torch.Tensor) -> torch.Tensor:
        if token_type_ids is None:  # as position_ids: one row shared by the batch
            token_type_ids = torch.zeros_like(position_ids)
        return hidden_states + super().forward(token_type_ids)


# -------------------------------------------------------------------------------------------- joined projections

# a weight that is a plain tensor: a Parameter, or a fake one while torch traces the model without values (FakeTensor,
# the form benchmarks/trace.py counts a step in); not a tensor subclass that quantises or shards it, nor the proxy a
# torch.fx symbolic trace gives for a parameter
PLAIN_WEIGHTS = (nn.Parameter, FakeTensor)


def reads_its_weight(layer: nn.Module, linear: type = nn.Linear) -> bool:
    """A layer of class `linear` whose weight can be read directly: not a LoRA wrapper, a quantised or sharded weight
    (a tensor subclass: a tensor-parallel DTensor), nor a layer whose hooks gather or move its weight when it is called
    (DeepSpeed ZeRO-3, accelerate's offloading, tensor parallelism) or watch its calls."""
    return (
        type(layer) is linear
        and type(layer.weight) in PLAIN_WEIGHTS
        and not layer._forward_pre_hooks
        and not layer._forward_hooks
        and "_hf_hook" not in layer.__dict__
    )


def joint_projections(hidden_states: torch.Tensor, layers: list[nn.Linear]) -> list[torch.Tensor]:
    """Each layer's output on the same input (attention's q/k/v, a GLU's gate/up). In a training step under autocast
    to another dtype than the weights' (fp32 weights, bf16 matmuls), one matmul over the layers' concatenated weights,
    as GPT-2's `c_attn` is: one cast and one read of the input, one input-gradient matmul. Otherwise each layer on its
    own: without gradients (a decode step would copy the weights at every token), with weights already in the matmul's
    dtype (the joined weight, saved for backward, would be a copy the separate layers do not hold), or for a layer that
    must be called (`reads_its_weight`). The parameters stay the layers' own: state dicts, PEFT and plans see them."""
    # the weights are asked about before autocast is: under a symbolic trace (vLLM's) they are proxies, and so is
    # the input, which has no device to ask autocast about
    joined = (
        torch.is_grad_enabled()
        and all(map(reads_its_weight, layers))
        and compute_dtype(hidden_states) != layers[0].weight.dtype
    )
    if not joined:
        return [layer(hidden_states) for layer in layers]
    weight = torch.cat([layer.weight for layer in layers])
    bias = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])
    return nn.functional.linear(hidden_states, weight, bias).split([layer.out_features for layer in layers], dim=-1)


# ---------------------------------------------------------------------------------------------------- feed-forward


class TfmLinearInWeightDtype(nn.Linear):
    """A linear layer that casts its input to its weight's dtype: T5's feed-forward output (`wo`), which a float16
    load keeps in float32 (`numerics` "ffn_output_in_float32"), where float16 would overflow."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not torch.is_autocast_enabled(hidden_states.device.type):  # under autocast, autocast picks the dtype
            hidden_states = hidden_states.to(self.weight.dtype)
        return super().forward(hidden_states)


def make_ffn_output(config: TfmConfig, inner: int) -> nn.Linear:
    """A feed-forward's output projection (`down_proj`), from its inner width back to `hidden_size`."""
    linear = TfmLinearInWeightDtype if "ffn_output_in_float32" in config.numerics else nn.Linear
    return linear(inner, config.hidden_size, bias=config.mlp_bias)


class TfmMLP(nn.Module):
    """`down(act(up(x)))`: GPT-2's and BERT's feed-forward (with `activation_dropout`, on the activation's output:
    BART's, OPT's, T5's)."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = make_ffn_output(config, config.intermediate_size)
        self.act_fn = ACT2FN[config.hidden_act]
        self.activation_dropout = make_dropout(config.activation_dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation_dropout(self.act_fn(self.up_proj(hidden_states))))


class TfmGLU(nn.Module):
    """`down(act(gate(x)) * up(x))`: SwiGLU with silu (Llama), GeGLU with gelu (with `activation_dropout` on the
    product, as T5's gated feed-forward drops out)."""

    def __init__(self, config: TfmConfig, intermediate_size: int | None = None):
        super().__init__()
        inner = intermediate_size or config.intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, inner, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, inner, bias=config.mlp_bias)
        self.down_proj = make_ffn_output(config, inner)
        self.act_fn = ACT2FN[config.hidden_act]
        self.activation_dropout = make_dropout(config.activation_dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        gate, up = joint_projections(hidden_states, [self.gate_proj, self.up_proj])
        return self.down_proj(self.activation_dropout(self.act_fn(gate) * up))


class TfmPooler(nn.Module):
    """BERT's pooler: dense + tanh on the first token, the sentence vector for sequence-level heads."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))
