"""The `hf-tfm` command (and `python -m hf_tfm_cli`): parse torch-free, then run the command with hf_tfm. The only
module of this package that imports hf_tfm, and nothing imports it back."""

from . import build_parser, spec_from_args


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command in ("train", "compare", "scaling"):
        try:  # RunSpec's own checks (the parser's types already enforce each bound)
            args.spec = spec_from_args(args)
        except ValueError as error:
            raise SystemExit(f"error: {error}") from error
    from hf_tfm.commands import run_command  # torch, transformers and datasets load here, once a command runs

    run_command(args)
