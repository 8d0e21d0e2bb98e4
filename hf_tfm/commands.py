"""What each `hf-tfm` command does, once `hf_tfm_cli` (torch-free: the parser, `--help`, argument errors) has parsed
its command line and handed the parsed arguments to `run_command`. This module does not import `hf_tfm_cli`: the
command line is `hf-tfm ...` or `python -m hf_tfm_cli ...` (e.g. `accelerate launch -m hf_tfm_cli train ...`)."""

import json
from pathlib import Path

__all__ = ["run_command"]


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


def _direction(model_type: str | None, to: str | None) -> tuple[str, bool]:
    """The family and the direction (True: to hf_tfm) a source folder's model_type and `--to` ask for."""
    from .convert.families import FAMILIES

    problem = f"error: no converter for model_type={model_type!r} with --to {to}"
    if model_type in FAMILIES:
        if to is not None:
            raise SystemExit(f"{problem}: a {model_type} folder converts to hf_tfm (leave --to out)")
        return model_type, True
    back = [name for name, record in FAMILIES.items() if model_type in record.model_types()]
    if not back:
        raise SystemExit(f"{problem}: SOURCE must hold an hf_tfm model or one of {', '.join(FAMILIES)}")
    if to not in back:  # None too: an hf_tfm folder needs a target
        raise SystemExit(f"{problem}: a {model_type} model converts back with --to {' | '.join(back)}")
    return to, False


def _convert(args) -> None:
    import transformers

    from .convert.engine import from_tfm, to_tfm
    from .convert.families import FAMILIES
    from .training.checkpoints import load_saved

    source, destination = args.source, args.destination
    saved = _saved_config(source)
    model_type = saved.get("model_type")
    name, forward = _direction(model_type, args.to)
    record = FAMILIES[name]
    takes = record.classes if forward else dict.fromkeys(record.classes.values())
    # a reference folder loads as the class it names where the family converts it (T5EncoderModel has no Auto class
    # of its own for every family); anything else as its Auto class says
    architecture = (saved.get("architectures") or [""])[0]
    model = load_saved(source, getattr(transformers, architecture) if forward and architecture in takes else None)
    found = type(model).__name__
    if found not in takes:  # a head the family has no counterpart for
        raise SystemExit(f"error: {source} holds a {found}; the {name} converter takes {' or '.join(takes)}")
    converted = to_tfm(model) if forward else from_tfm(model, name)
    converted.save_pretrained(destination)
    _copy_tokenizer(source, destination)
    print(f"converted {model_type} ({found}) -> {type(converted).__name__}: {destination}")


def _upcycle(args) -> None:
    from .convert.upcycle import upcycle
    from .training.checkpoints import load_saved

    model = load_saved(args.source)
    upcycle(model, num_experts=args.num_experts, num_experts_per_tok=args.top_k).save_pretrained(args.destination)
    _copy_tokenizer(args.source, args.destination)
    print(f"upcycled {args.source} to {args.num_experts} experts (top-{args.top_k}): {args.destination}")


def _demo(args) -> None:
    from .training.main_job import run_main_job

    run_main_job(args.output_dir, scale=args.scale, max_files=args.max_files, seed=args.seed, overwrite=args.overwrite)


def _train(args) -> None:
    from .training.report import print_summary
    from .training.run import train

    print_summary([train(args.spec)])  # args.spec: the RunSpec hf_tfm_cli built and checked


def _compare(args) -> None:
    from .training.compare import compare

    record = compare(args.spec, args.models, args.seeds, args.output_dir)
    print((Path(args.output_dir) / "compare.md").read_text())
    print(
        f"{len(record['models'])} models x {len(record['seeds'])} seeds -> {args.output_dir}/compare.json, compare.png"
    )


def _scaling(args) -> None:
    from .training.scaling import scaling

    def progress(done: int, total: int, seconds: float) -> None:
        left = seconds / done * (total - done)
        print(f"scaling: run {done} of {total} done, {seconds / 60:.1f} min so far, about {left / 60:.1f} min left")

    rates = args.learning_rates or [args.spec.learning_rate]
    scaling(
        args.spec, args.models, args.sizes, rates, args.seeds, args.tokens_per_parameter, args.output_dir, progress
    )
    print((Path(args.output_dir) / "scaling.md").read_text())
    print(f"-> {args.output_dir}/scaling.json, scaling.png")


def _evaluate(args) -> None:
    from .training.run import evaluate_saved

    # options left out (None) fall back to the data settings recorded by the run that made the folder
    given = ("data", "validation_file", "dataset_config", "max_files", "max_eval_samples", "batch_size", "max_length")
    columns = dict(args.column) if args.column else None
    result = evaluate_saved(args.model_dir, columns=columns, **{name: getattr(args, name) for name in given})
    print(json.dumps(result, indent=2))


def _generate(args) -> None:
    from .training.generate import generate_text

    for line in generate_text(
        args.model_dir,
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        num_beams=args.num_beams,
        do_sample=args.do_sample,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    ):
        print(line)


def _attention(args) -> None:
    from .training.attention_maps import draw_attention

    for path in draw_attention(
        args.model_dir, args.text, args.output_dir, args.layers, args.heads, max_new_tokens=args.max_new_tokens
    ):
        print(f"wrote {path}")


def _verify(args) -> None:
    from .saving import verify_folder

    print(verify_folder(args.folder, repair=args.repair))


def _card(args) -> None:
    from .hub.card import refresh_card

    refresh_card(args.folder)
    print(f"wrote {Path(args.folder) / 'README.md'}")


def _push(args) -> None:
    from .hub.push import push_folder

    url = push_folder(
        args.folder, args.repo_id, private=args.private, revision=args.revision, commit_message=args.commit_message
    )
    print(f"pushed {args.folder} to {url}")


# what each command runs, by its name on the command line
COMMANDS = {
    "demo": _demo,
    "train": _train,
    "compare": _compare,
    "scaling": _scaling,
    "evaluate": _evaluate,
    "generate": _generate,
    "attention": _attention,
    "convert": _convert,
    "upcycle": _upcycle,
    "verify": _verify,
    "card": _card,
    "push": _push,
}

# top-level modules of the `[train]` extra (pyproject.toml), which a core-only install lacks
TRAIN_EXTRA_MODULES = {
    "accelerate",
    "datasets",
    "evaluate",
    "tokenizers",
    "sklearn",
    "sacrebleu",
    "rouge_score",
    "matplotlib",
    "tensorboard",
}


def run_command(args) -> None:
    """Run a parsed `hf-tfm` command; a problem with the input ends in one line naming it."""
    from huggingface_hub.errors import HfHubHTTPError

    import hf_tfm  # noqa: F401  (registers the Auto classes)

    try:
        COMMANDS[args.command](args)
    except (ValueError, FileNotFoundError, FileExistsError, PermissionError, HfHubHTTPError) as error:
        raise SystemExit(f"error: {error}") from error
    except ModuleNotFoundError as error:  # a core-only install: training, data and metrics come with the extra
        if error.name and error.name.split(".")[0] in TRAIN_EXTRA_MODULES:
            raise SystemExit(
                f"error: hf-tfm {args.command} needs {error.name}, which the training extra installs: "
                "pip install 'hf-tfm[train]'"
            ) from error
        raise
