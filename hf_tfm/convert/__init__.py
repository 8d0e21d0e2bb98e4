"""Conversion between transformers' model families and hf_tfm, both ways and exactly (not remote code: it is
installed with hf_tfm and never copied next to a checkpoint).

- `engine.py`: the one conversion engine, which runs any family record both ways (`to_tfm`, `from_tfm`, ...);
- `record.py`: what a family record is (`Family`, `Weights`) and the preset sizes;
- `common.py`: the config round trip every conversion passes (`converted_config`), exact weight loading;
- `families.py`: the registry `FAMILIES`, filled from `decoder.py`, `encoder.py` and `encoder_decoder.py`, one record
  per family;
- `upcycle.py`: a dense GLU model turned into an MoE model that computes the same function;
- `qkv.py`: a self-attention's q, k and v as three layers or one (`fused_qkv_proj`), and `with_fused_qkv` between them.

    from hf_tfm.convert import to_tfm, from_tfm
"""

from .engine import (
    config_from_tfm,
    config_to_tfm,
    family,
    from_tfm,
    tfm_model_for,
    to_tfm,
    weights_from_tfm,
    weights_to_tfm,
)
from .qkv import with_fused_qkv

__all__ = [
    "config_from_tfm",
    "config_to_tfm",
    "family",
    "from_tfm",
    "tfm_model_for",
    "to_tfm",
    "weights_from_tfm",
    "weights_to_tfm",
    "with_fused_qkv",
]
