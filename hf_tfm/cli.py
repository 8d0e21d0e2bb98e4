"""`hf-tfm` command line: the main job (`demo`) and checkpoint conversion (`convert`)."""

import argparse
import json
from pathlib import Path

EXAMPLES = """examples:
  hf-tfm demo --output-dir runs/demo                 # train, evaluate, generate, save (embedded data)
  hf-tfm convert path/to/gpt2 runs/tfm-from-gpt2      # GPT-2, Llama, Mixtral, BERT, T5 or BART folder -> hf_tfm
  hf-tfm convert runs/tfm-from-gpt2 runs/back --to gpt2
  hf-tfm upcycle runs/demo/model runs/demo-moe --num-experts 8 --top-k 2
"""


# (source model_type, --to) -> "module.function" of the converter
CONVERTERS = {
    ("gpt2", None): "convert_gpt2.gpt2_to_tfm",
    ("llama", None): "convert_llama.llama_to_tfm",
    ("mixtral", None): "convert_mixtral.mixtral_to_tfm",
    ("bert", None): "convert_bert.bert_to_tfm",
    ("t5", None): "convert_t5.t5_to_tfm",
    ("bart", None): "convert_bart.bart_to_tfm",
    ("tfm_decoder", "gpt2"): "convert_gpt2.tfm_to_gpt2",
    ("tfm_decoder", "llama"): "convert_llama.tfm_to_llama",
    ("tfm_decoder", "mixtral"): "convert_mixtral.tfm_to_mixtral",
    ("tfm_encoder", "bert"): "convert_bert.tfm_to_bert",
    ("tfm_encoder_decoder", "t5"): "convert_t5.tfm_to_t5",
    ("tfm_encoder_decoder", "bart"): "convert_bart.tfm_to_bart",
}
# the head a saved folder holds, read off its `architectures` entry
AUTO_CLASS_BY_SUFFIX = {
    "ForCausalLM": "AutoModelForCausalLM",
    "LMHeadModel": "AutoModelForCausalLM",
    "ForMaskedLM": "AutoModelForMaskedLM",
    "ForConditionalGeneration": "AutoModelForSeq2SeqLM",
}


def _saved_config(source: str) -> dict:
    config_file = Path(source) / "config.json"
    if not config_file.is_file():
        raise SystemExit(f"error: {config_file} not found: SOURCE must be a saved model folder")
    return json.loads(config_file.read_text())


def _load_saved(source: str):
    """The model in a saved folder, loaded as the head its `architectures` entry names."""
    import transformers

    architecture = (_saved_config(source).get("architectures") or [""])[0]
    auto_name = next((auto for suffix, auto in AUTO_CLASS_BY_SUFFIX.items() if architecture.endswith(suffix)), "AutoModel")
    return getattr(transformers, auto_name).from_pretrained(source)


def _copy_tokenizer(source: str, destination: str) -> None:
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(source).save_pretrained(destination)
    except (OSError, ValueError):
        pass  # a folder without tokenizer files carries weights only


def _convert(source: str, destination: str, to: str | None) -> None:
    import importlib

    model_type = _saved_config(source).get("model_type")
    if (model_type, to) not in CONVERTERS:
        known = ", ".join(m + (f" --to {t}" if t else "") for m, t in CONVERTERS)
        raise SystemExit(f"error: no converter for model_type={model_type!r} with --to {to}; known: {known}")
    module, function = CONVERTERS[model_type, to].split(".")
    converter = getattr(importlib.import_module(f"hf_tfm.{module}"), function)
    model = _load_saved(source)
    converted = converter(model)
    converted.save_pretrained(destination)
    _copy_tokenizer(source, destination)
    print(f"converted {model_type} ({type(model).__name__}) -> {type(converted).__name__}: {destination}")


def _upcycle(source: str, destination: str, num_experts: int, top_k: int) -> None:
    from .upcycle import upcycle

    model = _load_saved(source)
    upcycle(model, num_experts=num_experts, num_experts_per_tok=top_k).save_pretrained(destination)
    _copy_tokenizer(source, destination)
    print(f"upcycled {source} to {num_experts} experts (top-{top_k}): {destination}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="hf-tfm", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train a small decoder on stdlib docstrings, evaluate, generate, save")
    demo.add_argument("--output-dir", default="runs/demo")
    demo.add_argument("--max-steps", type=int, default=600)
    demo.add_argument("--seed", type=int, default=0)
    convert = commands.add_parser("convert", help="convert GPT-2/Llama/Mixtral/BERT/T5/BART checkpoints to hf_tfm and back, exactly")
    convert.add_argument("source", help="a saved model folder: gpt2, llama, mixtral, bert, t5, bart, or an hf_tfm model")
    convert.add_argument("destination", help="folder to write the converted model to")
    convert.add_argument("--to", choices=sorted({t for _, t in CONVERTERS if t}), help="target when converting an hf_tfm model back")
    upcycle = commands.add_parser("upcycle", help="turn a dense GLU checkpoint into an MoE one (experts = copies of the FFN)")
    upcycle.add_argument("source", help="a saved dense hf_tfm model folder (ffn_type=glu, no mlp bias)")
    upcycle.add_argument("destination")
    upcycle.add_argument("--num-experts", type=int, default=8)
    upcycle.add_argument("--top-k", type=int, default=2)
    args = parser.parse_args(argv)

    import hf_tfm  # noqa: F401  (registers the Auto classes)

    if args.command == "demo":
        from .training.main_job import run_demo

        run_demo(args.output_dir, max_steps=args.max_steps, seed=args.seed)
    elif args.command == "upcycle":
        _upcycle(args.source, args.destination, args.num_experts, args.top_k)
    else:
        _convert(args.source, args.destination, args.to)


if __name__ == "__main__":
    main()
