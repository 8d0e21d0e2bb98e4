"""The family presets: a small member of each converted family, made by its converter from transformers' own config
class (so each is what that family is, in hf_tfm's terms). All share llama-1.3m's size where the family allows it:
4 layers, hidden 128, 4 heads (2 key/value), vocab 4096, 512 positions, tied embeddings unless the family never ties.

    python -m configs.family_presets      # rewrites configs/<family>-<size>/config.json

tests/test_packaging.py checks that the committed files are what this produces.
"""

import importlib
import json
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
SIZE = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, vocab_size=4096, max_position_embeddings=512)
# special tokens inside the small vocabulary (the families' defaults point past it); decoders leave them unset, as
# llama-1.3m does, and take them from the tokenizer
NO_TOKENS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
ENCODER_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
DECODER = dict(SIZE, **NO_TOKENS, num_key_value_heads=2, intermediate_size=352, tie_word_embeddings=True)

# family (its converter module's suffix) -> (transformers config class, its fields)
FAMILIES = {
    "mistral": ("MistralConfig", dict(DECODER, sliding_window=128)),
    "qwen2": ("Qwen2Config", DECODER),
    "qwen3": ("Qwen3Config", dict(DECODER, head_dim=32)),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(DECODER, head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=176),
    ),
    "olmo2": ("Olmo2Config", DECODER),
    "phi3": ("Phi3Config", DECODER),
    # Pythia's recipe: a quarter of each head rotated, parallel residual, untied head
    "gpt_neox": (
        "GPTNeoXConfig",
        dict(SIZE, **NO_TOKENS, intermediate_size=512, rotary_pct=0.25, tie_word_embeddings=False),
    ),
    "gemma2": (
        "Gemma2Config",
        dict(
            DECODER, head_dim=32, query_pre_attn_scalar=32, sliding_window=128, hidden_activation="gelu_pytorch_tanh"
        ),
    ),
    "smollm3": ("SmolLM3Config", DECODER),  # NoPE every 4th layer, as SmolLM3-3B
    "roberta": ("RobertaConfig", dict(SIZE, intermediate_size=512, max_position_embeddings=514)),  # pad 1 (its own)
    "modernbert": (
        "ModernBertConfig",
        dict(SIZE, **ENCODER_TOKENS, cls_token_id=1, sep_token_id=2, intermediate_size=352, local_attention=128),
    ),
}
FAMILY_NAMES = {"qwen3_moe": "qwen3-moe", "gpt_neox": "gpt-neox"}  # how a preset spells the family


def family_config(family: str):
    """The family's small member as an hf_tfm config, through the family's converter."""
    import transformers

    from hf_tfm import TfmDecoderForCausalLM  # noqa: F401  (registers the tfm config classes)

    class_name, fields = FAMILIES[family]
    converter = importlib.import_module(f"hf_tfm.convert_{family}")
    return getattr(converter, f"{family}_config_to_tfm")(getattr(transformers, class_name)(**fields))


def preset_json(config) -> str:
    values = {key: value for key, value in config.to_dict().items() if key not in ("transformers_version", "dtype")}
    return json.dumps(values, indent=2, sort_keys=True) + "\n"


def preset_name(family: str, config) -> str:
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    auto = AutoModelForMaskedLM if config.model_type == "tfm_encoder" else AutoModelForCausalLM
    model = auto.from_config(config)
    count = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return f"{FAMILY_NAMES.get(family, family)}-{count / 1e6:.1f}m"


def main() -> None:
    for family in FAMILIES:
        config = family_config(family)
        folder = FOLDER / preset_name(family, config)
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(preset_json(config))
        print(folder.name)


if __name__ == "__main__":
    main()
