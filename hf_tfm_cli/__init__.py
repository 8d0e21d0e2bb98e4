"""`hf-tfm` command line: the main job (`demo`), training and evaluation, generation, conversion, upcycling,
model cards and pushes to the Hub. Every subcommand's `--help` ends with examples.

This package never imports torch, transformers or datasets, nor hf_tfm: `--help` and argument errors answer at once.
`hf_tfm_cli.entry.main` (the `hf-tfm` command) parses, then hands a command that runs to `hf_tfm.commands`; the parser
and `RunSpec` here are what hf_tfm's training code shares with the command line, without importing it back.
"""

import argparse
import json
from dataclasses import MISSING, fields

from .spec import TASKS, RunSpec, describe, number, parameter_count, positive_float, positive_int, value_kind

__all__ = ["TASKS", "RunSpec", "build_parser", "spec_from_args"]


EXAMPLES = {
    "demo": """examples:
  hf-tfm demo                                        # all three paradigms on the embedded data, summary + loss curves
  hf-tfm demo --output-dir runs/demo --scale 0.5     # half the steps
  hf-tfm demo --overwrite                            # replace an earlier demo run in runs/demo""",
    "train": """examples:
  hf-tfm train --task causal-lm --model llama-1.3m --max-steps 600          # embedded stdlib docstrings
  hf-tfm train --task masked-lm --model bert-1.4m --output-dir runs/mlm
  hf-tfm train --task sequence-classification --model runs/mlm/model      # fine-tune a checkpoint
  hf-tfm train --task seq2seq --model t5-1.9m --data pairs.jsonl --column source=question --column target=answer
  hf-tfm train --task causal-lm --model configs/llama-1.3m/config.json --set num_experts=8 --bf16
  hf-tfm train --task causal-lm --output-dir runs/train --resume          # continue a killed run
  accelerate launch --config_file configs/accelerate/multi_gpu_ddp.yaml -m hf_tfm_cli train --task causal-lm""",
    "compare": """examples:
  hf-tfm compare --task causal-lm --models llama-1.3m gpt2                 # embedded data, 200 steps, seed 0
  hf-tfm compare --task causal-lm --models llama-1.3m llama-1.3m:num_key_value_heads=2 gpt2 --seeds 0 1 2
  hf-tfm compare --task masked-lm --models bert-1.4m bert --data texts.jsonl --max-steps 1000
  hf-tfm compare --task causal-lm --models my-config.json gpt2 --output-dir runs/compare   # again: resumes
  hf-tfm compare --task seq2seq --models t5-1.9m t5 bart --max-steps 400
models: a preset, a config.json, NAME:field=value[,field=value] (a variant), or a reference class of transformers,
gpt2 (causal-lm), bert (masked-lm), t5 or bart (seq2seq), sized to the parameters of the first hf_tfm model""",
    "scaling": """examples:
  hf-tfm scaling --task causal-lm --models llama-1.3m gpt2 --sizes 50K 100K 200K 400K
  hf-tfm scaling --task causal-lm --models llama-1.3m llama-1.3m:num_experts=4 gpt2 --sizes 150K 300K 600K --seeds 0 1
  hf-tfm scaling --task causal-lm --models llama-1.3m gpt2 --sizes 50K 100K 200K --learning-rates 1e-3 3e-3 1e-2
  hf-tfm scaling --task masked-lm --models bert-1.4m bert --sizes 100K 200K 400K --tokens-per-parameter 10
sizes: non-embedding parameters of the first model; each hf_tfm model is scaled along its width and depth, the
references matched to the first model at each size (as compare does); run again to resume""",
    "evaluate": """examples:
  hf-tfm evaluate runs/train/model                   # the validation split its training run used
  hf-tfm evaluate runs/cls/model --data test.csv --column text=sentence""",
    "generate": """examples:
  hf-tfm generate runs/train/model "Return the"
  hf-tfm generate runs/s2s/model "Return the number of items." --num-beams 4
  hf-tfm generate runs/mlm/model "Return the [MASK] of items."      # masked LMs fill masks""",
    "attention": """examples:
  hf-tfm attention runs/demo/causal-lm/model --text "Return the number of items."
  hf-tfm attention runs/demo/seq2seq/model --text "Return the number of items." --output-dir runs/attention-s2s
  hf-tfm attention runs/big/model --text "..." --layers 0 11 --heads 0 1 2 3     # a chosen few of a big model
figures: attention-<kind>.png per kind of attention (self; or encoder, decoder, cross), routing.png for MoE models""",
    "convert": """examples:
  hf-tfm convert path/to/gpt2 runs/tfm-from-gpt2      # a saved folder of any family hf_tfm converts -> hf_tfm
  hf-tfm convert runs/tfm-from-gpt2 runs/back --to gpt2
families (config.json model_type, and --to): python -m hf_tfm.convert.families lists them""",
    "upcycle": """examples:
  hf-tfm upcycle runs/demo/causal-lm/model runs/demo-moe --num-experts 8 --top-k 2""",
    "verify": """examples:
  hf-tfm verify runs/train/model                     # every file hashed against the save's manifest
  hf-tfm verify runs/train/model --repair            # first undo what an interrupted save left (this host's)""",
    "card": """examples:
  hf-tfm card runs/train/model                       # (re)write README.md from the model and its run record""",
    "push": """examples:
  hf-tfm push runs/train/model me/tfm-small
  hf-tfm push runs/train/model me/tfm-small --private --revision v1 --commit-message "600 steps"
""",
}


def key_value(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key, value


def config_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a bare string such as rmsnorm


def add_spec_arguments(parser: argparse.ArgumentParser, leave_out: tuple[str, ...] = ()) -> None:
    """One option per `RunSpec` field, from its type, default and metadata: a new field is a new option. Fields in
    `leave_out` are the command's own business (compare names its models and seeds itself)."""
    groups = {"run": parser}
    for spec_field in fields(RunSpec):
        meta = spec_field.metadata
        if not meta["cli"] or spec_field.name in leave_out:
            continue
        group = groups.get(meta["group"]) or groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        kind = value_kind(spec_field)
        arguments = {"dest": spec_field.name, "help": meta["help"] or None}
        if kind is bool:
            arguments["action"] = "store_true"
        elif kind in (dict, list):  # repeated options: NAME=VALUE pairs (a dict) or plain values (a list)
            arguments.update(action="append", default=[], metavar=meta["metavar"])
            if kind is dict:
                arguments["type"] = key_value
        else:
            bounded = meta["low"] is not None or meta["high"] is not None
            arguments.update(choices=meta["choices"], metavar=meta["metavar"], required=spec_field.default is MISSING)
            arguments["type"] = number(kind, meta["low"], meta["high"], meta["low_open"]) if bounded else kind
            if spec_field.default is not MISSING:
                arguments["default"] = spec_field.default
            if bounded:  # the accepted range, in the words the error message uses
                arguments["help"] = f"{meta['help']} ({describe(kind, meta['low'], meta['high'], meta['low_open'])})"
        group.add_argument(meta["flag"] or "--" + spec_field.name.replace("_", "-"), *meta["aliases"], **arguments)


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    """The RunSpec a parsed `hf-tfm train` (or `compare`) command line describes (NAME=VALUE options become dicts;
    options a command leaves out keep their defaults)."""
    given = {f.name: getattr(args, f.name) for f in fields(RunSpec) if f.metadata["cli"] and hasattr(args, f.name)}
    if "columns" in given:
        given["columns"] = dict(given["columns"])
    if "config_overrides" in given:
        given["config_overrides"] = {key: config_value(value) for key, value in given["config_overrides"]}
    return RunSpec(**given)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-tfm", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=help,
            description=help,
            epilog=EXAMPLES[name],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    demo = command(
        "demo",
        "the main job: train, evaluate and save a decoder, an encoder and an encoder-decoder on the embedded data",
    )
    demo.add_argument("--output-dir", default="runs/demo")
    demo.add_argument(
        "--scale", type=positive_float, default=1.0, help="multiply every run's steps (0.05 for a smoke run)"
    )
    demo.add_argument("--max-files", type=positive_int, help="read only this many stdlib files (smoke runs)")
    demo.add_argument("--seed", type=number(int, 0), default=0)
    demo.add_argument("--overwrite", action="store_true", help="replace an earlier demo run in --output-dir")
    train = command(
        "train", "train a model for a task (causal-lm, masked-lm, seq2seq, sequence- or token-classification)"
    )
    train.usage = "%(prog)s --task TASK [options]   (all options: hf-tfm train --help)"
    add_spec_arguments(train)
    compare = command(
        "compare",
        "train models and transformers' own GPT-2, BERT, T5 or BART on the same data, tokenizer, batches and budget",
    )
    compare.usage = "%(prog)s --task TASK --models MODEL [MODEL ...] [options]   (all options: --help)"
    compare.add_argument("--models", nargs="+", required=True, metavar="MODEL", help="see the examples below")
    compare.add_argument(
        "--seeds", nargs="+", type=number(int, 0), default=[0], help="every model trains once per seed"
    )
    compare.add_argument(
        "--output-dir", default="runs/compare", help="runs, table, record and figure; run again to resume"
    )
    add_spec_arguments(
        compare, leave_out=("model", "output_dir", "seed", "config_overrides", "tokenizer", "resume", "overwrite")
    )
    scaling = command(
        "scaling",
        "scaling curves: models trained at a ladder of sizes beside GPT-2 or BERT; loss against counted compute, a "
        "fitted power law per model and the compute multiplier",
    )
    scaling.usage = "%(prog)s --task TASK --models MODEL [MODEL ...] --sizes N N N [N ...] [options]   (all: --help)"
    scaling.add_argument("--models", nargs="+", required=True, metavar="MODEL", help="as compare takes them")
    scaling.add_argument(
        "--sizes", nargs="+", required=True, type=parameter_count, metavar="N", help="non-embedding parameters (>= 3)"
    )
    scaling.add_argument(
        "--learning-rates", nargs="+", type=positive_float, metavar="LR", help="a sweep per model and size (the best "
        "by validation loss is kept); default: --learning-rate's default"
    )  # fmt: skip
    scaling.add_argument("--seeds", nargs="+", type=number(int, 0), default=[0])
    scaling.add_argument("--tokens-per-parameter", type=positive_float, default=20.0, help="training tokens per size")
    scaling.add_argument(
        "--output-dir", default="runs/scaling", help="runs, tables, record and figure; again: resumes"
    )
    add_spec_arguments(
        scaling,
        leave_out=("model", "output_dir", "seed", "config_overrides", "tokenizer", "resume", "overwrite", "max_steps",
                   "learning_rate"),
    )  # fmt: skip
    evaluate = command(
        "evaluate",
        "score a saved model on the validation split its training run used (its run "
        "record's data settings), or on other data",
    )
    evaluate.add_argument("model_dir")
    evaluate.add_argument("--data", help="other data to score on (default: the training run's)")
    evaluate.add_argument("--validation-file")
    evaluate.add_argument("--dataset-config")
    evaluate.add_argument("--column", action="append", type=key_value, metavar="TASK_COLUMN=YOURS")
    evaluate.add_argument("--max-files", type=positive_int)
    evaluate.add_argument("--max-eval-samples", type=positive_int)
    evaluate.add_argument("--batch-size", type=positive_int)
    evaluate.add_argument("--max-length", type=number(int, 2))
    generate = command(
        "generate", "continue prompts with a saved decoder or encoder-decoder (or fill [MASK] with a masked LM)"
    )
    generate.add_argument("model_dir")
    generate.add_argument("prompt", nargs="+")
    generate.add_argument("--max-new-tokens", type=positive_int, default=32)
    generate.add_argument("--num-beams", type=positive_int, default=1)
    generate.add_argument("--do-sample", action="store_true")
    generate.add_argument("--temperature", type=positive_float, default=1.0)
    generate.add_argument("--top-p", type=number(float, 0, 1, low_open=True), default=1.0)
    generate.add_argument("--seed", type=number(int, 0), default=0)
    attention = command(
        "attention", "draw what each attention head of a saved model attends to on a text (and an MoE's routing)"
    )
    attention.add_argument("model_dir")
    attention.add_argument("--text", required=True, help="the text to run through the model")
    attention.add_argument("--output-dir", default="attention-maps", help="folder the figures are written to")
    attention.add_argument(
        "--layers", type=number(int, 0), nargs="+", help="layers to draw (default: up to 6, evenly spaced)"
    )
    attention.add_argument("--heads", type=number(int, 0), nargs="+", help="heads to draw (default: the first 8)")
    attention.add_argument(
        "--max-new-tokens", type=positive_int, default=12, help="an encoder-decoder's greedy continuation, drawn"
    )
    convert = command("convert", "convert transformers checkpoints of every family hf_tfm knows to hf_tfm and back")
    convert.add_argument("source", help="a saved model folder: a family's (see --to) or an hf_tfm model")
    convert.add_argument("destination", help="folder to write the converted model to")
    # the family names are the registry's (hf_tfm.convert.families), which the command checks once it runs: the
    # parser answers without importing torch, and keeps no copy of them
    convert.add_argument("--to", metavar="FAMILY", help="the family (model_type) to convert an hf_tfm model back to")
    upcycle = command("upcycle", "turn a dense GLU checkpoint into an MoE one (experts = copies of the FFN)")
    upcycle.add_argument("source", help="a saved dense hf_tfm model folder (ffn_type=glu, no mlp bias)")
    upcycle.add_argument("destination")
    upcycle.add_argument("--num-experts", type=number(int, 2), default=8, help="(an integer >= 2)")
    upcycle.add_argument("--top-k", type=positive_int, default=2)
    verify = command(
        "verify", "check every file of a saved model folder against its manifest; name the first damaged one"
    )
    verify.add_argument("folder")
    verify.add_argument(
        "--repair",
        action="store_true",
        help="first restore the folder from what an interrupted save of this host left beside it (as the next save "
        "would), and remove those leftovers; another host's are never touched",
    )
    card = command("card", "write or refresh the model card (README.md) of a saved model folder")
    card.add_argument("folder")
    push = command("push", "push a saved model folder to the Hub (HF_ENDPOINT and HF_TOKEN are honoured)")
    push.add_argument("folder")
    push.add_argument("repo_id")
    push.add_argument("--private", action="store_true")
    push.add_argument("--revision", help="a branch; created if missing")
    push.add_argument("--commit-message")
    return parser
