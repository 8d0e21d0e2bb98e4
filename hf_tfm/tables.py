"""The guides' tables that the code owns, printed from it so that a page cannot drift from the rules:

    python -m hf_tfm.tables      # what each attention backend and serving engine refuses (docs/models.md)

tests/test_readme.py checks the page holds the table as printed.
"""

from .model.capabilities import RULES

# the attention backends transformers offers hf_tfm's models, and vLLM (its Transformers backend)
BACKENDS = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "vllm")


def backends_table() -> str:
    """A row per rule of `hf_tfm.model.capabilities.RULES`: the config field, the backends that refuse it, and why."""
    rows = ["| config field | refused by | why, and what to use instead |", "|---|---|---|"]
    for rule in RULES:
        refused = ", ".join(f"`{backend}`" for backend in BACKENDS if rule.backends(backend))
        rows.append(f"| `{rule.field}` | {refused} | {rule.instead} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(backends_table(), end="")
