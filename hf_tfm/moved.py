"""Module names that moved, kept working for one release with a DeprecationWarning (the plain-core layout: converters
in `hf_tfm.convert`, exporters in `hf_tfm.export`, the command runner in `hf_tfm.commands`)."""

import importlib
import sys
import warnings

# old module -> where it lives now
MOVED = {
    "hf_tfm.cli": "hf_tfm.commands",
    "hf_tfm.convert_common": "hf_tfm.convert.common",
    "hf_tfm.family_record": "hf_tfm.convert.record",
    "hf_tfm.families": "hf_tfm.convert.families",
    "hf_tfm.families_decoder": "hf_tfm.convert.decoder",
    "hf_tfm.families_encoder": "hf_tfm.convert.encoder",
    "hf_tfm.families_encoder_decoder": "hf_tfm.convert.encoder_decoder",
    "hf_tfm.upcycle": "hf_tfm.convert.upcycle",
    "hf_tfm.onnx_export": "hf_tfm.export.onnx",
    "hf_tfm.gguf_export": "hf_tfm.export.gguf",
}


def alias(old: str) -> None:
    """Make the module being imported as `old` the module it moved to: `import old` and `from old import name` keep
    working (private names too), with a DeprecationWarning that names the new place."""
    new = MOVED[old]
    warnings.warn(f"{old} moved to {new}; the old name goes in the next release", DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
