"""`hf-tfm attention`: what each head of a saved model attends to on a text, and where an MoE model routes each token.

The weights come from eager attention (the only backend that forms them), whatever backend the folder was saved
with.
An encoder or a decoder draws its self-attention; an encoder-decoder draws the encoder's self-attention, and the
decoder's self-attention and cross-attention over the continuation it generates greedily. Each figure is a grid, a
row per layer and a column per head, with the tokens on the axes (query down, key across).
"""

from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoints import load_saved
from .generate import escaped
from .run import load_tokenizer

MAX_TOKENS = 96  # past this the tokens on the axes no longer read
DEFAULT_LAYERS = 6  # evenly spaced layers drawn when none are chosen
DEFAULT_HEADS = 8  # the first heads drawn when none are chosen


@dataclass
class AttentionMaps:
    """One text through a model: each kind of attention's weights per layer ([heads, queries, keys]), the tokens on
    each side, and for MoE layers the experts each token was sent to ([tokens, top_k] per MoE layer)."""

    maps: dict[str, list[torch.Tensor]]  # "self", or "encoder", "decoder" and "cross"
    query_tokens: dict[str, list[str]]
    key_tokens: dict[str, list[str]]
    routing: dict[str, dict[int, torch.Tensor]]  # "self", or "encoder"/"decoder" -> MoE layer -> chosen experts
    routed_tokens: dict[str, list[str]]
    num_experts: int


def attention_maps(model, tokenizer, text: str, max_new_tokens: int = 12) -> AttentionMaps:
    """The attention weights (eager) and MoE routing of `model` on `text`. An encoder-decoder first generates a greedy
    continuation of at most `max_new_tokens`, whose tokens are the decoder's side. The model is read in eval mode with
    eager attention, then given back with its own backend and mode (a model being trained goes on as it was)."""
    attention, training = model.config._attn_implementation, model.training
    model.set_attn_implementation("eager")
    model.eval()
    try:
        return _eager_maps(model, tokenizer, text, max_new_tokens)
    finally:
        model.set_attn_implementation(attention)
        model.train(training)


def _eager_maps(model, tokenizer, text: str, max_new_tokens: int) -> AttentionMaps:
    inputs = tokenizer(text, return_tensors="pt")
    inputs.pop("token_type_ids", None)
    length = inputs["input_ids"].shape[1]
    if length > MAX_TOKENS:
        raise ValueError(f"the text is {length} tokens long; attention maps read up to {MAX_TOKENS}: shorten --text")
    tokens = _tokens(tokenizer, inputs["input_ids"][0])
    config = model.config
    is_moe = config.has_moe_layers()
    with torch.no_grad():
        if not config.is_encoder_decoder:
            outputs = model(**inputs, output_attentions=True, output_router_logits=is_moe)
            maps = {"self": _per_layer(outputs.attentions)}
            routing = {"self": _routing(config, outputs.router_logits, decoder=False)} if is_moe else {}
            return AttentionMaps(
                maps, {"self": tokens}, {"self": tokens}, routing, {"self": tokens}, config.num_experts
            )
        generated = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1)
        decoder_ids = generated[:, :-1] if generated.shape[1] > 1 else generated  # the inputs that produced the text
        outputs = model(**inputs, decoder_input_ids=decoder_ids, output_attentions=True, output_router_logits=is_moe)
    decoded = _tokens(tokenizer, decoder_ids[0])
    maps = {
        "encoder": _per_layer(outputs.encoder_attentions),
        "decoder": _per_layer(outputs.decoder_attentions),
        "cross": _per_layer(outputs.cross_attentions),
    }
    queries = {"encoder": tokens, "decoder": decoded, "cross": decoded}
    keys = {"encoder": tokens, "decoder": decoded, "cross": tokens}
    routing = {}
    if is_moe:
        routing = {
            "encoder": _routing(config, outputs.encoder_router_logits, decoder=False),
            "decoder": _routing(config, outputs.decoder_router_logits, decoder=True),
        }
    return AttentionMaps(maps, queries, keys, routing, {"encoder": tokens, "decoder": decoded}, config.num_experts)


def _tokens(tokenizer, ids: torch.Tensor) -> list[str]:
    """Each token as the text it decodes to (not the vocabulary's byte symbols), escaped; a blank one as its spaces
    made visible."""
    texts = [escaped(tokenizer.decode([token_id])) for token_id in ids.tolist()]
    return [text if text.strip() else text.replace(" ", "\u2423") or "''" for text in texts]


def _per_layer(attentions) -> list[torch.Tensor]:
    return [layer[0].float() for layer in attentions]  # the one text's [heads, queries, keys]


def _routing(config, router_logits, decoder: bool) -> dict[int, torch.Tensor]:
    """The experts each token was sent to ([tokens, top_k], best first), by the index of its MoE layer."""
    depth = dict((is_decoder, depth) for _, depth, is_decoder in config.stacks())[decoder]
    layers = [index for index in range(depth) if config.is_moe_layer(index, decoder)]
    chosen_experts = [logits.float().topk(config.num_experts_per_tok, dim=-1).indices for logits in router_logits]
    return dict(zip(layers, chosen_experts, strict=True))


def chosen(count: int, wanted: list[int] | None, default: int, what: str, spread: bool) -> list[int]:
    """The layers or heads to draw: those asked for (each checked against `count`), else up to `default` of them,
    evenly spaced (layers) or the first ones (heads)."""
    if wanted:
        for index in wanted:
            if not 0 <= index < count:
                raise ValueError(f"{what} {index} does not exist: the model has {count} (0 to {count - 1})")
        return list(wanted)
    if count <= default:
        return list(range(count))
    if spread:
        return sorted({round(step * (count - 1) / (default - 1)) for step in range(default)})
    return list(range(default))


def plot_attention_maps(
    found: AttentionMaps, output_dir: str | Path, layers: list[int] | None = None, heads: list[int] | None = None
) -> list[Path]:
    """One figure per kind of attention (`attention-<kind>.png`), and `routing.png` for an MoE model; returns their
    paths."""
    from matplotlib.figure import Figure

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, per_layer in found.maps.items():
        rows = chosen(len(per_layer), layers, DEFAULT_LAYERS, "layer", spread=True)
        columns = chosen(per_layer[0].shape[0], heads, DEFAULT_HEADS, "head", spread=False)
        queries, keys = found.query_tokens[kind], found.key_tokens[kind]
        side = max(1.6, 0.16 * max(len(queries), len(keys)) + 0.8)  # a panel wide enough for its tokens
        figure = Figure(figsize=(side * len(columns), side * len(rows)), layout="constrained")
        grid = figure.subplots(len(rows), len(columns), squeeze=False)
        for row, layer in zip(grid, rows):
            for axis, head in zip(row, columns):
                weights = per_layer[layer][head]
                axis.imshow(weights.numpy(), cmap="viridis", vmin=0, vmax=float(weights.max()), aspect="auto")
                axis.set_title(f"layer {layer}, head {head}", fontsize=8)
                axis.set_xticks(range(len(keys)), keys, rotation=90, fontsize=6)
                axis.set_yticks(range(len(queries)), queries, fontsize=6)
        figure.suptitle(f"{kind} attention: query down, key across; colour from 0 to each panel's largest weight")
        path = output_dir / f"attention-{kind}.png"
        figure.savefig(path, dpi=100)
        written.append(path)
    if found.routing:
        written.append(_plot_routing(found, output_dir / "routing.png"))
    return written


def _plot_routing(found: AttentionMaps, path: Path) -> Path:
    """A panel per stack: a row per MoE layer, a column per token, each cell the expert it was sent to first (the
    top-k's others are in the label)."""
    from matplotlib.figure import Figure

    stacks = [(name, layers) for name, layers in found.routing.items() if layers]
    longest = max(len(found.routed_tokens[name]) for name, _ in stacks)
    height = 1.2 + sum(0.5 * len(layers) + 1 for _, layers in stacks)
    figure = Figure(figsize=(max(6, 0.32 * longest + 2), height))
    axes = figure.subplots(len(stacks), 1, squeeze=False)[:, 0]
    for axis, (name, layers) in zip(axes, stacks):
        first = torch.stack([experts[:, 0] for experts in layers.values()]).numpy()
        axis.imshow(first, cmap="tab20", vmin=0, vmax=max(found.num_experts - 1, 1), aspect="auto")
        for row, experts in enumerate(layers.values()):
            for token, ranked in enumerate(experts.tolist()):
                axis.text(token, row, "/".join(map(str, ranked)), ha="center", va="center", fontsize=6)
        tokens = found.routed_tokens[name]
        axis.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=7)
        axis.set_yticks(range(len(layers)), [f"layer {index}" for index in layers], fontsize=7)
        axis.set_title(f"{name}: the experts each token went to, best first (colour: the first)", fontsize=9)
    figure.set_layout_engine("constrained")
    figure.savefig(path, dpi=100)
    return path


def draw_attention(
    folder: str | Path,
    text: str,
    output_dir: str | Path,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    max_new_tokens: int = 12,
) -> list[Path]:
    """`hf-tfm attention`: the attention figures (and MoE routing) of the model saved in `folder` on `text`."""
    model = load_saved(folder)
    tokenizer = load_tokenizer(folder)
    return plot_attention_maps(attention_maps(model, tokenizer, text, max_new_tokens), output_dir, layers, heads)
