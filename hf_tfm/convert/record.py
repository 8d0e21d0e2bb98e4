"""What a converted family is, as one record: `Family` (its reference classes, config field table, fixed values,
weight layout and the few hooks for what is truly special), `Weights` (the state-dict layout as data) and
`Paradigm` (what each hf_tfm model type is). Records are plain data; `hf_tfm.convert` runs any of them both ways.

Torch-free and transformers-free: classes are named, not imported, so that reading a record costs nothing.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Paradigm:
    """One hf_tfm model type: how a card names it, its main Auto class, the hf_tfm classes converters take and give
    (the main head first) and what a benchmark feeds it."""

    description: str
    auto_class: str
    classes: tuple[str, ...]
    task: str  # "causal", "masked" or "seq2seq"


PARADIGMS = {
    "tfm_decoder": Paradigm(
        "decoder-only",
        "AutoModelForCausalLM",
        ("TfmDecoderForCausalLM", "TfmDecoderForSequenceClassification", "TfmDecoderForTokenClassification"),
        "causal",
    ),
    "tfm_encoder": Paradigm(
        "encoder-only",
        "AutoModelForMaskedLM",
        (
            "TfmEncoderForMaskedLM",
            "TfmEncoderModel",
            "TfmEncoderForPreTraining",
            "TfmEncoderForSequenceClassification",
            "TfmEncoderForTokenClassification",
            "TfmEncoderForQuestionAnswering",
        ),
        "masked",
    ),
    "tfm_encoder_decoder": Paradigm(
        "encoder-decoder", "AutoModelForSeq2SeqLM", ("TfmEncoderDecoderForConditionalGeneration",), "seq2seq"
    ),
}


# The presets' shared size (hf_tfm/convert/family_presets.py): a family's small member is llama-1.3m's size where the
# family allows it: 4 layers, hidden 128, 4 heads (2 key/value), vocab 4096, 512 positions, tied embeddings unless the
# family never ties. Special tokens sit inside the small vocabulary (the families' defaults point past it); decoders
# leave them unset, as llama-1.3m does, and take them from the tokenizer.
PRESET_SIZE = dict(
    hidden_size=128, num_hidden_layers=4, num_attention_heads=4, vocab_size=4096, max_position_embeddings=512
)
PRESET_UNSET_TOKENS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
PRESET_ENCODER_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
PRESET_DECODER = dict(
    PRESET_SIZE, **PRESET_UNSET_TOKENS, num_key_value_heads=2, intermediate_size=352, tie_word_embeddings=True
)


# The tests' size (tests/support/families.py builds each family's tiny reference model from its record's `tiny`): a
# forward pass costs milliseconds on one CPU core. 97 tokens, ids 0-2 kept for pad, bos and eos; a sliding window of
# 4, shorter than the tests' 9-token prompts.
TINY_VOCAB = 97
TINY_WINDOW = 4
TINY_DECODER = dict(
    vocab_size=TINY_VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_id=2,
)
TINY_ENCODER = dict(
    vocab_size=TINY_VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)


@dataclass(frozen=True)
class Weights:
    """A family's state-dict layout against hf_tfm's, written once in the reference's direction; the engine inverts
    it by mapping the reference model's own keys (so the way back needs no second table).

    - `renames`: `(pattern, replacement)` regular expressions applied in order to each reference key, giving
      hf_tfm's key (`re.sub`, so `^bert\\.` touches only a prefix).
    - `transposed`: a pattern on reference keys whose tensors are stored `[in, out]` (GPT-2's `Conv1D`, GPT-OSS's
      experts: the last two axes swap).
    - `alternating`: `(pattern, axis)` pairs: reference tensors whose gate and up rows alternate along `axis` (after
      any transpose; GPT-OSS's experts), where hf_tfm stacks all gate rows, then all up rows.
    - `fused`: an hf_tfm-named fused module (what `renames` turns the reference's into, e.g. `self_attn.qkv`) ->
      the hf_tfm modules whose rows it stacks, in order. Row counts come from the hf_tfm model's own parameters.
    - `interleaved`: the fused rows alternate per head (`[heads, parts, head_dim]`, GPT-NeoX) instead of stacking.
    - `stacked`: a pattern on hf_tfm keys (what `renames` gives) with three groups, (module, index, name): the
      reference keeps one tensor per index (Switch Transformer's `experts.expert_3.wi`, renamed `experts.3.up_proj`),
      hf_tfm one tensor `module.name` stacking them along a new first axis, in index order.
    - `copies`: a reference key -> (the key it must equal, the reason): a tensor the reference keeps twice
      (T5's per-stack token tables), refused when the copies differ and filled from the original on the way back.
    """

    renames: tuple[tuple[str, str], ...] = ()
    transposed: str | None = None
    alternating: tuple[tuple[str, int], ...] = ()
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict)
    interleaved: bool = False
    stacked: str | None = None
    copies: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    """One reference family, converted exactly both ways by `hf_tfm.convert`.

    Data: `name` is its transformers model_type (config.json says it; `hf-tfm convert --to` takes it); `classes` maps
    each reference model class it converts (the usual checkpoint's first) to hf_tfm's; `fields` is the field table
    (reference name -> hf_tfm name); `fixed` what the family always is in hf_tfm terms; `unread` the reference
    fields its models never read (with the reason), which the round-trip check does not compare (`our_unread`: the
    hf_tfm fields, on the way back); `weights` the state-dict layout; `summary` the hf_tfm options the family needs,
    for the converter table (docs/convert.md); `preset` the small member's reference config fields
    (`hf_tfm/convert/family_presets.py`);
    `tiny` the reference config fields of the family's tiny test model (`tests/support/families.py`), every option
    its usual checkpoint uses switched on;
    `pair` the benchmark pairing (`benchmarks/pairs.py`: config `defaults`, and the `attention` and
    `experts_implementation` both sides run where not the defaults, which name the pair in reports), None where not
    benchmarked.

    Hooks, each optional, for what data cannot say:
    - `to_tfm(config, **options) -> dict`, `from_tfm(config) -> dict`: computed fields each way.
    - `their_form(config)`, `our_form(config)`: a config in the one form the way back writes it (a default written
      out, an order), so that the round-trip check compares like with like.
    - `unread_of(config) -> dict`: unread fields that depend on the config.
    - `options(model) -> dict`: what the reference keeps out of its config (BERT's pooler, T5's tie), given to
      `to_tfm` on the way in; `our_options(config)` the same from an hf_tfm config on the way back.
    - `check(model)`: a refusal that needs the whole model (naming the field).
    - `state_to_tfm(model, state)`: a tensor no rename expresses (ModernBERT's absent head bias, given as zeros).
    - `layer_renames(config) -> renames`: renames that depend on the reference config, applied before `weights`'
      own (ALBERT's layer groups, numbered as hf_tfm's distinct blocks).
    - `reference_config(model, config)`: the reference config to build with, from the hf_tfm model (ModernBERT's
      head bias); `reference_kwargs(model) -> dict`: arguments of the reference class beside its config (BERT's
      `add_pooling_layer`); `prepare_reference(model, target)`: set up the built reference before loading (T5's
      untied head, Gemma 2's eager attention).
    """

    name: str
    paradigm: str
    classes: dict[str, str]
    config_class: str
    fields: dict[str, str]
    summary: str = ""  # what the converter table says the hf_tfm side uses (sliding window, MoE...)
    fixed: dict = field(default_factory=dict)
    unread: dict[str, str] = field(default_factory=dict)
    our_unread: dict[str, str] = field(default_factory=dict)
    weights: Weights = Weights()
    preset: dict | None = None
    tiny: dict = field(default_factory=dict)
    pair: dict | None = None
    to_tfm: Callable | None = None
    from_tfm: Callable | None = None
    their_form: Callable | None = None
    our_form: Callable | None = None
    unread_of: Callable | None = None
    options: Callable | None = None
    our_options: Callable | None = None
    check: Callable | None = None
    state_to_tfm: Callable | None = None
    reference_config: Callable | None = None
    reference_kwargs: Callable | None = None
    prepare_reference: Callable | None = None
    layer_renames: Callable | None = None

    def encoder_only(self, class_name: str) -> bool:
        """Whether reference class `class_name` holds an encoder-decoder family's encoder alone (T5EncoderModel),
        hf_tfm's `TfmEncoderModel`."""
        return self.paradigm == "tfm_encoder_decoder" and self.classes.get(class_name) == "TfmEncoderModel"

    def model_types(self) -> set[str]:
        """The hf_tfm model types this family converts back from: its paradigm's, and an encoder's where one of its
        classes holds the encoder alone."""
        return {self.paradigm} | {"tfm_encoder" for name in self.classes if self.encoder_only(name)}

    def weights_for(self, config, class_name: str) -> Weights:
        """The state-dict layout of reference class `class_name` with config `config`."""
        renames = (*(self.layer_renames(config) if self.layer_renames else ()), *self.weights.renames)
        if self.encoder_only(class_name):  # the encoder-decoder's names, less the body's encoder prefix
            renames = (*renames, (r"^model\.shared\.", "embed_tokens."), (r"^model\.encoder\.", ""))
        return dataclasses.replace(self.weights, renames=renames)

    @property
    def reference(self) -> str:
        """The usual checkpoint's class."""
        return next(iter(self.classes))
