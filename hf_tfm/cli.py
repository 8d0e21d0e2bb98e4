"""`hf-tfm` command line: the main job (`demo`), training and evaluation, generation, conversion, upcycling,
model cards and pushes to the Hub. Every subcommand's `--help` ends with examples."""

import argparse
import dataclasses
import json
from pathlib import Path

EXAMPLES = {
    "demo": """examples:
  hf-tfm demo                                        # all three paradigms on the embedded data, summary + loss curves
  hf-tfm demo --output-dir runs/demo --scale 0.5     # half the steps""",
    "train": """examples:
  hf-tfm train --task causal-lm --model llama-mini --max-steps 600          # embedded stdlib docstrings
  hf-tfm train --task masked-lm --model bert-mini --output-dir runs/mlm
  hf-tfm train --task sequence-classification --model runs/mlm/model      # fine-tune a checkpoint
  hf-tfm train --task seq2seq --model t5-mini --data pairs.jsonl --column source=question --column target=answer
  hf-tfm train --task causal-lm --model configs/llama-mini/config.json --set num_experts=8 --bf16
  hf-tfm train --task causal-lm --output-dir runs/train --resume          # continue a killed run
  accelerate launch --config_file configs/accelerate/multi_gpu.yaml -m hf_tfm.cli train --task causal-lm""",
    "evaluate": """examples:
  hf-tfm evaluate runs/train/model                   # its task's embedded validation split
  hf-tfm evaluate runs/cls/model --data test.csv --column text=sentence""",
    "generate": """examples:
  hf-tfm generate runs/train/model "Return the"
  hf-tfm generate runs/s2s/model "Return the number of items." --num-beams 4
  hf-tfm generate runs/mlm/model "Return the [MASK] of items."      # masked LMs fill masks""",
    "convert": """examples:
  hf-tfm convert path/to/gpt2 runs/tfm-from-gpt2      # GPT-2, Llama, Mixtral, BERT, T5 or BART folder -> hf_tfm
  hf-tfm convert runs/tfm-from-gpt2 runs/back --to gpt2""",
    "upcycle": """examples:
  hf-tfm upcycle runs/demo/causal-lm/model runs/demo-moe --num-experts 8 --top-k 2""",
    "card": """examples:
  hf-tfm card runs/train/model                       # (re)write README.md from the model and its run record""",
    "push": """examples:
  hf-tfm push runs/train/model me/tfm-small
  hf-tfm push runs/train/model me/tfm-small --private --revision v1 --commit-message "600 steps"
""",
}


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
def _saved_config(source: str) -> dict:
    config_file = Path(source) / "config.json"
    if not config_file.is_file():
        raise SystemExit(f"error: {config_file} not found: SOURCE must be a saved model folder")
    return json.loads(config_file.read_text())


def _copy_tokenizer(source: str, destination: str) -> None:
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(source).save_pretrained(destination)
    except (OSError, ValueError):
        pass  # a folder without tokenizer files carries weights only


def _convert(source: str, destination: str, to: str | None) -> None:
    import importlib

    from .training.checkpoints import load_saved

    model_type = _saved_config(source).get("model_type")
    if (model_type, to) not in CONVERTERS:
        known = ", ".join(m + (f" --to {t}" if t else "") for m, t in CONVERTERS)
        raise SystemExit(f"error: no converter for model_type={model_type!r} with --to {to}; known: {known}")
    module, function = CONVERTERS[model_type, to].split(".")
    converter = getattr(importlib.import_module(f"hf_tfm.{module}"), function)
    model = load_saved(source)
    converted = converter(model)
    converted.save_pretrained(destination)
    _copy_tokenizer(source, destination)
    print(f"converted {model_type} ({type(model).__name__}) -> {type(converted).__name__}: {destination}")


def _upcycle(source: str, destination: str, num_experts: int, top_k: int) -> None:
    from .training.checkpoints import load_saved
    from .upcycle import upcycle

    model = load_saved(source)
    upcycle(model, num_experts=num_experts, num_experts_per_tok=top_k).save_pretrained(destination)
    _copy_tokenizer(source, destination)
    print(f"upcycled {source} to {num_experts} experts (top-{top_k}): {destination}")


def _key_value(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key, value


def _config_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a bare string such as rmsnorm


def _add_train_arguments(parser: argparse.ArgumentParser) -> None:
    from .training.data import TASKS

    parser.add_argument("--task", required=True, choices=TASKS)
    parser.add_argument("--model", default="llama-mini", help="a preset (configs/<name>), a config.json file, or a model folder to fine-tune")
    parser.add_argument("--output-dir", default="runs/train")
    data = parser.add_argument_group("data")
    data.add_argument("--data", help="a local .txt/.json/.jsonl/.csv/.parquet file or a datasets name (default: embedded stdlib docstrings)")
    data.add_argument("--validation-file")
    data.add_argument("--dataset-config")
    data.add_argument("--column", action="append", type=_key_value, default=[], metavar="TASK_COLUMN=YOURS", help="map a column the task reads to one in the data")
    data.add_argument("--tokenizer", help="a tokenizer folder (default: the checkpoint's, else one trained on the data)")
    data.add_argument("--vocab-size", type=int, default=4096, help="of a tokenizer trained on the data")
    data.add_argument("--max-length", type=int, default=128)
    data.add_argument("--max-files", type=int, help="embedded data: read only this many stdlib files")
    data.add_argument("--max-eval-samples", type=int)
    loop = parser.add_argument_group("training")
    loop.add_argument("--max-steps", type=int, default=200)
    loop.add_argument("--batch-size", type=int, default=16, help="per device")
    loop.add_argument("--gradient-accumulation-steps", type=int, default=1)
    loop.add_argument("--learning-rate", type=float, default=1e-3)
    loop.add_argument("--lr-scheduler-type", default="cosine")
    loop.add_argument("--warmup-ratio", type=float, default=0.05)
    loop.add_argument("--weight-decay", type=float, default=0.01)
    loop.add_argument("--eval-steps", type=int)
    loop.add_argument("--save-steps", type=int)
    loop.add_argument("--keep-checkpoints", type=int, default=2)
    loop.add_argument("--logging-steps", type=int)
    loop.add_argument("--seed", type=int, default=0)
    loop.add_argument("--dropout", type=float, help="set every dropout of a fresh model")
    loop.add_argument("--set", action="append", type=_key_value, default=[], metavar="FIELD=VALUE", help="override a fresh model's config field (JSON values)")
    loop.add_argument("--bf16", action="store_true")
    loop.add_argument("--gradient-checkpointing", action="store_true")
    loop.add_argument("--torch-compile", action="store_true")
    loop.add_argument("--report-to", action="append", default=[], help="tensorboard, wandb, ... (CSV is always written)")
    loop.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint in --output-dir")
    loop.add_argument("--overwrite", action="store_true", help="discard the checkpoints of an earlier run in --output-dir")
    loop.add_argument("--use-cpu", action="store_true")


def _train(args) -> None:
    from .training.report import print_summary
    from .training.run import RunSpec, train

    # every option whose dest is a RunSpec field passes through as is; the repeated NAME=VALUE options become dicts
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunSpec) if hasattr(args, f.name)}
    spec = RunSpec(**given, columns=dict(args.column), config_overrides={key: _config_value(value) for key, value in args.set})
    result = train(spec)
    print_summary([result])


def _evaluate(args) -> None:
    from .training.run import evaluate_saved

    result = evaluate_saved(args.model_dir, data=args.data, validation_file=args.validation_file, columns=dict(args.column),
                            max_files=args.max_files, batch_size=args.batch_size, max_length=args.max_length)
    print(json.dumps(result, indent=2))


def _generate(args) -> None:
    from .training.generate import generate_text

    for line in generate_text(args.model_dir, args.prompt, max_new_tokens=args.max_new_tokens, num_beams=args.num_beams,
                              do_sample=args.do_sample, temperature=args.temperature, top_p=args.top_p, seed=args.seed):
        print(line)


def _card(args) -> None:
    from .hub.card import refresh_card

    refresh_card(args.folder)
    print(f"wrote {Path(args.folder) / 'README.md'}")


def _push(args) -> None:
    from .hub.push import push_folder

    url = push_folder(args.folder, args.repo_id, private=args.private, revision=args.revision, commit_message=args.commit_message)
    print(f"pushed {args.folder} to {url}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="hf-tfm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, description=help, epilog=EXAMPLES[name], formatter_class=argparse.RawDescriptionHelpFormatter)

    demo = command("demo", "the main job: train, evaluate and save a decoder, an encoder and an encoder-decoder on the embedded data")
    demo.add_argument("--output-dir", default="runs/demo")
    demo.add_argument("--scale", type=float, default=1.0, help="multiply every run's steps (0.05 for a smoke run)")
    demo.add_argument("--max-files", type=int, help="read only this many stdlib files (smoke runs)")
    demo.add_argument("--seed", type=int, default=0)
    _add_train_arguments(command("train", "train a model for a task (causal-lm, masked-lm, seq2seq, sequence- or token-classification)"))
    evaluate = command("evaluate", "score a saved model on its task's validation data")
    evaluate.add_argument("model_dir")
    evaluate.add_argument("--data")
    evaluate.add_argument("--validation-file")
    evaluate.add_argument("--column", action="append", type=_key_value, default=[], metavar="TASK_COLUMN=YOURS")
    evaluate.add_argument("--max-files", type=int)
    evaluate.add_argument("--batch-size", type=int, default=16)
    evaluate.add_argument("--max-length", type=int, default=128)
    generate = command("generate", "continue prompts with a saved decoder or encoder-decoder (or fill [MASK] with a masked LM)")
    generate.add_argument("model_dir")
    generate.add_argument("prompt", nargs="+")
    generate.add_argument("--max-new-tokens", type=int, default=32)
    generate.add_argument("--num-beams", type=int, default=1)
    generate.add_argument("--do-sample", action="store_true")
    generate.add_argument("--temperature", type=float, default=1.0)
    generate.add_argument("--top-p", type=float, default=1.0)
    generate.add_argument("--seed", type=int, default=0)
    convert = command("convert", "convert GPT-2/Llama/Mixtral/BERT/T5/BART checkpoints to hf_tfm and back, exactly")
    convert.add_argument("source", help="a saved model folder: gpt2, llama, mixtral, bert, t5, bart, or an hf_tfm model")
    convert.add_argument("destination", help="folder to write the converted model to")
    convert.add_argument("--to", choices=sorted({t for _, t in CONVERTERS if t}), help="target when converting an hf_tfm model back")
    upcycle = command("upcycle", "turn a dense GLU checkpoint into an MoE one (experts = copies of the FFN)")
    upcycle.add_argument("source", help="a saved dense hf_tfm model folder (ffn_type=glu, no mlp bias)")
    upcycle.add_argument("destination")
    upcycle.add_argument("--num-experts", type=int, default=8)
    upcycle.add_argument("--top-k", type=int, default=2)
    card = command("card", "write or refresh the model card (README.md) of a saved model folder")
    card.add_argument("folder")
    push = command("push", "push a saved model folder to the Hub (HF_ENDPOINT and HF_TOKEN are honoured)")
    push.add_argument("folder")
    push.add_argument("repo_id")
    push.add_argument("--private", action="store_true")
    push.add_argument("--revision", help="a branch; created if missing")
    push.add_argument("--commit-message")
    args = parser.parse_args(argv)

    from huggingface_hub.errors import HfHubHTTPError

    import hf_tfm  # noqa: F401  (registers the Auto classes)

    try:
        if args.command == "demo":
            from .training.main_job import run_main_job

            run_main_job(args.output_dir, scale=args.scale, max_files=args.max_files, seed=args.seed)
        elif args.command == "upcycle":
            _upcycle(args.source, args.destination, args.num_experts, args.top_k)
        elif args.command == "convert":
            _convert(args.source, args.destination, args.to)
        else:
            {"train": _train, "evaluate": _evaluate, "generate": _generate, "card": _card, "push": _push}[args.command](args)
    except (ValueError, FileNotFoundError, FileExistsError, PermissionError, HfHubHTTPError) as error:
        raise SystemExit(f"error: {error}") from error


if __name__ == "__main__":
    main()
