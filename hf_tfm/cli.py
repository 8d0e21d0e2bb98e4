"""`hf-tfm` command line: the main job (`demo`) and checkpoint conversion (`convert`)."""

import argparse
import json
from pathlib import Path

EXAMPLES = """examples:
  hf-tfm demo --output-dir runs/demo                 # train, evaluate, generate, save (embedded data)
  hf-tfm convert path/to/gpt2 runs/tfm-from-gpt2      # GPT-2 or Llama folder -> hf_tfm
  hf-tfm convert runs/tfm-from-gpt2 runs/back --to gpt2
"""


def _convert(source: str, destination: str, to: str | None) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import convert_gpt2, convert_llama

    config_file = Path(source) / "config.json"
    if not config_file.is_file():
        raise SystemExit(f"error: {config_file} not found: SOURCE must be a saved model folder")
    model_type = json.loads(config_file.read_text()).get("model_type")
    converters = {
        ("gpt2", None): convert_gpt2.gpt2_to_tfm,
        ("llama", None): convert_llama.llama_to_tfm,
        ("tfm_decoder", "gpt2"): convert_gpt2.tfm_to_gpt2,
        ("tfm_decoder", "llama"): convert_llama.tfm_to_llama,
    }
    if (model_type, to) not in converters:
        known = ", ".join(f"{m}" + (f" --to {t}" if t else "") for m, t in converters)
        raise SystemExit(f"error: no converter for model_type={model_type!r} with --to {to}; known: {known}")
    converted = converters[model_type, to](AutoModelForCausalLM.from_pretrained(source))
    converted.save_pretrained(destination)
    try:
        AutoTokenizer.from_pretrained(source).save_pretrained(destination)
    except (OSError, ValueError):
        pass  # a folder without tokenizer files converts weights only
    print(f"converted {model_type} -> {type(converted).__name__}: {destination}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="hf-tfm", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train a small decoder on stdlib docstrings, evaluate, generate, save")
    demo.add_argument("--output-dir", default="runs/demo")
    demo.add_argument("--max-steps", type=int, default=600)
    demo.add_argument("--seed", type=int, default=0)
    convert = commands.add_parser("convert", help="convert GPT-2/Llama checkpoints to hf_tfm and back, exactly")
    convert.add_argument("source", help="a saved model folder (gpt2, llama or tfm_decoder)")
    convert.add_argument("destination", help="folder to write the converted model to")
    convert.add_argument("--to", choices=["gpt2", "llama"], help="target when converting an hf_tfm model back")
    args = parser.parse_args(argv)

    import hf_tfm  # noqa: F401  (registers the Auto classes)

    if args.command == "demo":
        from .demo import run_demo

        run_demo(args.output_dir, max_steps=args.max_steps, seed=args.seed)
    else:
        _convert(args.source, args.destination, args.to)


if __name__ == "__main__":
    main()
