"""The install: a core that loads models without the training packages, version bounds that `make test-min` proves,
and presets named by their real parameter counts, loadable by name from any folder."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

import hf_tfm
from hf_tfm.convert import family_presets
from hf_tfm.hub.card import active_parameters
from hf_tfm.presets import RENAMED
from hf_tfm.training.run import resolve_model

REPO = Path(__file__).resolve().parents[1]
HEADS = {
    "tfm_decoder": AutoModelForCausalLM,
    "tfm_encoder": AutoModelForMaskedLM,
    "tfm_encoder_decoder": AutoModelForSeq2SeqLM,
}


@pytest.mark.slow
def test_core_install_loads_models_without_the_extras(tmp_path):
    """The model path (import, build from a preset, save with its card, load, generate) imports none of the packages
    the extras add; `make test-lean` runs the same script in a fresh venv that really lacks them."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / "lean_install.py"), "--block"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "t5-1.9m: built, saved, loaded, generated" in result.stdout


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _lower_bounds() -> dict[str, str]:
    project = _project()
    bounds = {}
    for requirement in project["dependencies"]:
        name, _, version = re.match(r"([A-Za-z0-9_.-]+)\s*(>=\s*([0-9.]+))?", requirement).groups()
        bounds[name.lower().replace("-", "_")] = version
    return bounds


def test_make_test_min_installs_the_declared_lower_bounds():
    """`make test-min` is the proof of pyproject.toml's lower bounds, so it must install exactly those versions."""
    makefile = (REPO / "Makefile").read_text()
    pins = dict(re.findall(r"([A-Za-z0-9_.-]+)==([0-9.]+)", re.search(r"^MIN_VERSIONS := (.*)$", makefile, re.M)[1]))
    pins["torch"] = re.search(r"^TORCH := torch==([0-9.]+)$", makefile, re.M)[1]
    bounds = _lower_bounds()
    for name, version in pins.items():
        bound = bounds[name.lower().replace("-", "_")]
        assert version.split(".")[: len(bound.split("."))] == bound.split("."), (name, version, bound)
    assert {"torch", "transformers"} <= set(pins)


def test_make_test_min_installs_the_test_extras_runner():
    makefile = (REPO / "Makefile").read_text()
    runner = re.search(r"^TEST_RUNNER := (.*)$", makefile, re.M)[1].replace('"', "").split()
    assert set(runner) <= set(_project()["optional-dependencies"]["test"])
    assert "$(TEST_RUNNER)" in makefile.split("\ntest-min:")[1].split("\n\n")[0]


def test_loadgroup_runs_a_group_on_one_worker(tmp_path):
    """The suite's `--dist loadgroup` keeps each xdist_group on one worker, so a module's launch fixture runs once:
    the installed pytest and pytest-xdist do (pytest 9.2 with xdist 3.8 spread every group)."""
    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\n"
        "pytestmark = pytest.mark.xdist_group('launch')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_grouped(i):\n"
        "    print('worker', os.environ['PYTEST_XDIST_WORKER'])\n"
    )
    (tmp_path / "test_free.py").write_text(
        "import pytest\n@pytest.mark.parametrize('i', range(6))\ndef test_free(i): pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-rA", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(re.findall(r"^PASSED test_grouped.py::test_grouped\[\d\]@launch$", result.stdout, re.M)) == 6
    assert len(set(re.findall(r"^worker (gw\d)$", result.stdout, re.M))) == 1, result.stdout


def test_core_dependencies_are_only_what_the_models_need():
    assert set(_lower_bounds()) == {"torch", "transformers", "safetensors", "huggingface_hub", "jinja2", "pyyaml"}
    extras = _project()["optional-dependencies"]
    assert {"train", "peft", "test", "dev"} <= set(extras)


# ---------------------------------------------------------------------------------------------------------- presets


def preset_counts(name: str) -> tuple[int, int]:
    """(parameters, active parameters) of the preset's LM head model, tied weights counted once."""
    config = hf_tfm.preset_config(name)
    with torch.device("meta"):
        model = HEADS[config.model_type].from_config(config)
    return model.num_parameters(), active_parameters(model)


@pytest.mark.parametrize("name", hf_tfm.preset_names())
def test_preset_names_state_their_parameter_count(name):
    """`llama-1.3m` has 1.3 million parameters, rounded to the digits the name gives."""
    count, _ = preset_counts(name)
    number = re.fullmatch(r"[a-z0-9-]+?-(\d+(?:\.(\d+))?)m", name)
    assert number, f"preset {name} is not named <family>-<millions>m"
    decimals = len(number[2] or "")
    assert round(count / 1e6, decimals) == float(number[1]), f"{name} has {count:,} parameters"


def test_the_preset_table_gives_the_real_counts():
    row = r"^\| `([^`]+)` \|.*\| ([\d,]+)(?: \(([\d,]+) active\))? \|$"  # | `name` | ... | 1,234 (567 active) |
    rows = re.findall(row, (REPO / "docs" / "models.md").read_text(), re.M)
    table = {
        name: (int(total.replace(",", "")), int(active.replace(",", "") or total.replace(",", "")))
        for name, total, active in rows
        if name in hf_tfm.preset_names()
    }
    assert sorted(table) == hf_tfm.preset_names()
    for name, (total, active) in table.items():
        assert preset_counts(name) == (total, active), name


def test_presets_load_by_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = hf_tfm.preset_config("llama-1.3m", num_hidden_layers=2)
    assert config.model_type == "tfm_decoder" and config.num_hidden_layers == 2 and config.hidden_size == 128
    assert (hf_tfm.preset_path("t5-1.9m") / "config.json").is_file()
    assert resolve_model("bert-1.4m") == (hf_tfm.preset_path("bert-1.4m"), False)


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_renamed_presets_name_their_new_name(old, new):
    with pytest.raises(ValueError, match=rf"preset '{old}' is now named '{re.escape(new)}'"):
        hf_tfm.preset_config(old)
    with pytest.raises(ValueError, match=rf"unknown model '{old}'.*is now named '{re.escape(new)}'"):
        resolve_model(old)
    assert new in hf_tfm.preset_names()


def test_unknown_preset_lists_the_presets():
    with pytest.raises(
        ValueError,
        match=r"no preset named 'gpt5-huge'; presets: albert-0.5m, bert-1.4m, bloom-1.3m, deberta-v2-1.4m, ",
    ):
        hf_tfm.preset_path("gpt5-huge")
    with pytest.raises(ValueError, match="no preset named 'accelerate'"):  # the accelerate configs are no preset
        hf_tfm.preset_path("accelerate")


@pytest.mark.parametrize("family", sorted(family_presets.preset_families()))
def test_family_presets_are_their_converters_output(family):
    """Each family preset is what the family's converter makes of transformers' config for it, unchanged since."""
    config = family_presets.family_config(family)
    path = hf_tfm.preset_path(family_presets.preset_name(family, config)) / "config.json"
    assert path.read_text() == family_presets.preset_json(config)
