"""`import hf_tfm` loads what building, loading, saving and generating need, and nothing of training, PEFT,
quantisation, DeepSpeed or the Hub card machinery: those load when used. Measured against transformers' own
`LlamaForCausalLM` in a fresh process, since transformers itself may import some of them (its quantizer utilities
import torchao, its integrations accelerate, when they are installed): hf_tfm adds none, and prints nothing more."""

import json
import subprocess
import sys

import pytest

# what only training, fine-tuning, quantising or publishing needs
NOT_AT_IMPORT = {
    "accelerate", "bitsandbytes", "datasets", "deepspeed", "evaluate", "lm_eval", "matplotlib", "peft",
    "sentence_transformers", "sklearn", "tensorboard", "torchao", "trl",
}  # fmt: skip

REPORT = "import sys, json; print(json.dumps(sorted(sys.modules)))"


def imported(code: str) -> tuple[set[str], list[str]]:
    """The modules a fresh process holds after `code`, and the lines it printed on stderr."""
    result = subprocess.run(
        [sys.executable, "-c", f"{code}\n{REPORT}"], capture_output=True, text=True, timeout=300, check=True
    )
    return set(json.loads(result.stdout.splitlines()[-1])), result.stderr.splitlines()


def packages(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


@pytest.mark.slow
def test_import_hf_tfm_adds_no_training_package_and_no_output():
    reference, reference_err = imported("from transformers import LlamaForCausalLM")
    ours, our_err = imported("from transformers import LlamaForCausalLM\nimport hf_tfm")
    assert (packages(ours) - packages(reference)) & NOT_AT_IMPORT == set()
    assert len(our_err) == len(reference_err), our_err
    own = [name for name in ours if name.startswith(("hf_tfm.training", "hf_tfm.hub", "hf_tfm.convert"))]
    assert own == [], "the training, Hub card and conversion code load when used"


@pytest.mark.slow
def test_import_hf_tfm_first_prints_nothing():
    """A newcomer's `python -c "import hf_tfm"`: transformers' own import, made by hf_tfm, logs nothing of the optional
    packages it loads (torchao's kernels for other machines, torch's deprecations), and hf_tfm adds no training
    package (beyond what transformers' model code itself imports when installed)."""
    modules, stderr = imported("import hf_tfm")
    assert stderr == []
    baseline, _ = imported("import transformers.modeling_utils")
    assert (packages(modules) - packages(baseline)) & NOT_AT_IMPORT == set()
