"""Moved to `hf_tfm.commands`: this name works for one more release (hf_tfm/moved.py)."""

if __name__ == "__main__":
    # `python -m hf_tfm.cli ...` was the command line README gave before hf_tfm_cli; running nothing and exiting 0
    # would look like success to a script
    raise SystemExit(
        "error: `python -m hf_tfm.cli` is no longer a command line: use `hf-tfm ...` or `python -m hf_tfm_cli ...` "
        "(the same commands and arguments)"
    )

from .moved import alias  # noqa: E402

alias(__name__)
