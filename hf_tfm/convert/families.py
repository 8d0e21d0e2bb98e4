"""The registry: every family hf_tfm converts exactly, one record each (`hf_tfm.convert.record.Family`), in the order
the CLI, docs and reports list them. `hf_tfm.convert` runs any record both ways; the CLI, presets, model cards,
benchmarks, the converter table of docs/convert.md and the parity tests read the records. Adding a family is one
record (in the module of its paradigm, listed in that module's tuple) plus its tests (CONTRIBUTING.md).

    python -m hf_tfm.convert.families      # prints docs/convert.md's converter table
"""

from .decoder import DECODERS
from .encoder import ENCODERS
from .encoder_decoder import ENCODER_DECODERS
from .record import PARADIGMS, Family

FAMILIES: dict[str, Family] = {record.name: record for record in (*DECODERS, *ENCODERS, *ENCODER_DECODERS)}

__all__ = ["FAMILIES", "PARADIGMS", "Family", "families_table"]


def families_table() -> str:
    """The converter table of docs/convert.md: each family's reference classes, hf_tfm's, and its name for `from_tfm`
    and `hf-tfm convert --to`."""
    rows = ["| reference classes | hf_tfm classes | family |", "|---|---|---|"]
    for record in FAMILIES.values():
        theirs = ", ".join(f"`{name}`" for name in record.classes)
        ours = ", ".join(f"`{name}`" for name in dict.fromkeys(record.classes.values()))
        summary = f" ({record.summary})" if record.summary else ""
        rows.append(f"| {theirs} | {ours}{summary} | `{record.name}` |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(families_table(), end="")
