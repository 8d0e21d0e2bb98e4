"""`python -m hf_tfm_cli ...`, the same as `hf-tfm ...`."""

from .entry import main

main()
