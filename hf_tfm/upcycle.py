"""Moved to `hf_tfm.convert.upcycle`: this name works for one more release (hf_tfm/moved.py)."""

from .moved import alias

alias(__name__)
