"""What a stack refuses to run on, as a table: bad input becomes an error naming the argument and its shape or value,
never an index error deep in an embedding, a CUDA device-side assert, or a silent wrong answer. `InputRules.check` is
the one call a stack's forward makes: the shape rules (`SHAPE_RULES`) cost no device work and run on every forward;
the values (ids and positions inside their tables: `check_values`) are read, in one host-device synchronisation, only
by a forward that starts a sequence or feeds several tokens and is no training step after the first (a decode step's
token came from the model's own vocabulary; a step must not wait for the device). Under torch.compile only the choice
of input is checked: data-dependent checks would break the graph."""

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Inputs:
    """One forward's inputs as a stack received them; `past_length` is a device tensor for a static cache."""

    config: object
    input_ids: torch.Tensor | None
    inputs_embeds: torch.Tensor | None
    attention_mask: torch.Tensor | dict | None
    position_ids: torch.Tensor | None
    token_type_ids: torch.Tensor | None
    past_length: int | torch.Tensor
    prefix: str  # how the caller spells this stack's arguments ("decoder_" for an encoder-decoder's decoder)
    batch: int
    length: int

    def embeds_width(self) -> str:
        """The width `inputs_embeds` must have (the token table's), as the config names it."""
        for name in ("word_embed_proj_dim", "embedding_size"):
            if getattr(self.config, name):
                return f"{name}={getattr(self.config, name)}"
        return f"hidden_size={self.config.hidden_size}"

    def mask_shape(self) -> str:
        if isinstance(self.past_length, int):
            keys = self.past_length + self.length
            return f"({self.batch}, {keys}) (batch, cached tokens {self.past_length} + new tokens {self.length})"
        return f"(batch {self.batch}, cached tokens + new tokens {self.length})"


@dataclass(frozen=True)
class ShapeRule:
    argument: str  # checked when given
    refuses: Callable[[Inputs], bool]
    says: str  # after "<argument> has shape <shape>", formatted with the inputs


def _mask_refused(inputs: Inputs) -> bool:
    mask = inputs.attention_mask
    if isinstance(mask, dict) or mask.dim() == 4:  # prepared masks (per layer type, or 4D), passed on as they are
        return False
    if mask.dim() != 2 or mask.shape[0] != inputs.batch:
        return True
    if isinstance(inputs.past_length, int):
        return mask.shape[1] != inputs.past_length + inputs.length
    return mask.shape[1] < inputs.length  # a static cache's length is a device tensor: comparing it would sync


EMPTY = ": an empty sequence, give at least one token"
SHAPE_RULES = (
    ShapeRule(
        "input_ids",
        lambda inputs: inputs.input_ids.dim() != 2,
        ", expected (batch, sequence length); for a single sequence add the batch dimension (input_ids[None])",
    ),
    ShapeRule(
        "inputs_embeds",
        lambda inputs: (
            inputs.inputs_embeds.dim() != 3 or inputs.inputs_embeds.shape[-1] != inputs.config.token_width()
        ),
        ", expected (batch, sequence length, {width})",
    ),
    ShapeRule("input_ids", lambda inputs: inputs.length == 0, EMPTY),
    ShapeRule("inputs_embeds", lambda inputs: inputs.length == 0, EMPTY),
    ShapeRule(
        "token_type_ids",
        lambda inputs: inputs.config.type_vocab_size == 0,
        ", but the config has type_vocab_size=0 (no token-type embeddings)",
    ),
    ShapeRule(
        "token_type_ids",
        lambda inputs: tuple(inputs.token_type_ids.shape) != (inputs.batch, inputs.length),
        ", expected ({inputs.batch}, {inputs.length})",
    ),
    ShapeRule("attention_mask", _mask_refused, ", expected {mask_shape}, or a prepared 4D mask"),
    ShapeRule(
        "position_ids",
        lambda inputs: (
            inputs.position_ids.dim() != 2
            or inputs.position_ids.shape[0] not in (1, inputs.batch)
            or inputs.position_ids.shape[1] != inputs.length
        ),
        ", expected ({inputs.batch}, {inputs.length}) or (1, {inputs.length})",
    ),
)
# what each id indexes: (argument, the config field its table's size is, what the table holds)
ID_TABLES = (("input_ids", "vocab_size", "the vocabulary"), ("token_type_ids", "type_vocab_size", "the token types"))
# the schemes whose positions index a table
ABSOLUTE_POSITIONS = ("learned", "sinusoidal")


class InputRules:
    """A stack's input validator: the one call its forward makes (`check`). Tracks whether the stack has trained a
    step, since a training step after the first reads no values: it must not wait for the device, and later batches
    come from the same tokenizer and collator."""

    def __init__(self, config, prefix: str):
        self.config = config
        self.prefix = prefix  # how the caller spells this stack's arguments ("decoder_" for an encoder-decoder's)
        self.trained_a_step = False

    def check(
        self, input_ids, inputs_embeds, attention_mask, position_ids, token_type_ids, past_length, training: bool
    ) -> None:
        """Raise a `ValueError` naming the first argument a rule refuses (`training`: the stack's training mode)."""
        prefix = self.prefix
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"You must specify exactly one of {prefix}input_ids or {prefix}inputs_embeds")
        if torch.compiler.is_compiling():  # a compiled graph checks nothing and counts nothing
            return
        tokens = input_ids if input_ids is not None else inputs_embeds
        batch, length = (*tokens.shape, 0, 0)[:2]  # a 1D tensor is named by the first rule
        inputs = Inputs(
            self.config, input_ids, inputs_embeds, attention_mask, position_ids, token_type_ids, past_length, prefix,
            batch, length,
        )  # fmt: skip
        for rule in SHAPE_RULES:
            tensor = getattr(inputs, rule.argument)
            if tensor is not None and rule.refuses(inputs):
                says = rule.says.format(inputs=inputs, mask_shape=inputs.mask_shape(), width=inputs.embeds_width())
                raise ValueError(f"{prefix}{rule.argument} has shape {tuple(tensor.shape)}{says}")
        training_step = training and torch.is_grad_enabled()
        later_training_step = training_step and self.trained_a_step
        self.trained_a_step = self.trained_a_step or training_step
        # a forward that starts a sequence or feeds several tokens (one on a static cache counts as a decode step)
        starts = length > 1 or (isinstance(past_length, int) and past_length == 0)
        read_values = starts and not later_training_step
        absolute = self.config.position_embedding_type in ABSOLUTE_POSITIONS
        if self.config.check_input_values and (read_values or absolute):
            check_values(inputs, read_values)


def check_values(inputs: Inputs, read_values: bool) -> None:
    """Ids inside their tables, and positions inside a learned or sinusoidal table, read together in one sync.
    Positions the stack makes count the tokens so far: past the table exactly when the host-known length is (an
    error without reading anything). Given ones are read with the ids, and on a decode step only once that length is
    past the table, so that the step gets its error without a sync on the others."""
    config, name = inputs.config, f"{inputs.prefix}position_ids"
    end = inputs.past_length + inputs.length if isinstance(inputs.past_length, int) else 0
    beyond = config.position_embedding_type in ABSOLUTE_POSITIONS and end > config.max_position_embeddings
    if inputs.position_ids is None and beyond:
        raise beyond_the_position_table(config, name, end - 1)
    # (argument, its tensor, the first value past its table, what the table holds)
    checked = [
        (argument, getattr(inputs, argument), getattr(config, field), what)
        for argument, field, what in ID_TABLES
        if read_values and getattr(inputs, argument) is not None and inputs.batch > 0
    ]
    absolute = config.position_embedding_type in ABSOLUTE_POSITIONS
    if absolute and inputs.position_ids is not None and (read_values or beyond) and inputs.batch > 0:
        checked.append(("position_ids", inputs.position_ids, config.max_position_embeddings, None))
    if not checked:
        return
    # -1: the padding position of RoBERTa (its padding row) and OPT (its offset's first row)
    lowest_position = -int(config.position_ids_from_padding or config.position_ids_from_attention_mask)
    for (argument, _, limit, what), (low, high) in zip(checked, read_bounds([entry[1] for entry in checked])):
        if what is None and low < lowest_position:
            raise ValueError(f"{name} contains position {low}: positions must be >= {lowest_position}")
        if what is None and high >= limit:
            raise beyond_the_position_table(config, name, high)
        if low < 0 or high >= limit:
            bad = low if low < 0 else high
            raise ValueError(f"{inputs.prefix}{argument} contains id {bad}, outside {what} [0, {limit})")


def read_bounds(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Each tensor's [min, max], brought to the host together: one device synchronisation however many tensors."""
    device = tensors[0].device
    return torch.stack([torch.stack(torch.aminmax(tensor)).to(device, torch.long) for tensor in tensors]).tolist()


def beyond_the_position_table(config, name: str, position: int) -> ValueError:
    """The error for positions past a learned or sinusoidal table, given or made by the stack alike."""
    return ValueError(
        f"{name} reach position {position}, beyond the {config.position_embedding_type} position table "
        f"(max_position_embeddings={config.max_position_embeddings}); shorten the input"
    )
