"""Every config.json an earlier hf_tfm saved still loads to the same model: the same state dict (names and shapes) and
the same logits under the same weights. tests/data/saved-configs/ holds the config of every preset and of option
variants no preset has, as hf_tfm saved them before the core was rebuilt (`numerics` was six boolean fields then), with
what their models computed (tests/support/saved_configs.py)."""

import json
from pathlib import Path

import pytest
import torch
from support.saved_configs import FOLDER, HEADS, deterministic_weights, logits_sample
from transformers import AutoConfig

import hf_tfm

SAVED = sorted(path.name for path in FOLDER.iterdir() if (path / "config.json").is_file())


def test_every_preset_has_a_saved_config():
    assert set(hf_tfm.preset_names()) <= set(SAVED) and len(SAVED) > len(hf_tfm.preset_names())


@pytest.mark.parametrize("name", SAVED)
def test_a_saved_config_loads_to_the_same_model(name):
    folder = FOLDER / name
    expected = json.loads((folder / "expected.json").read_text())
    config = AutoConfig.from_pretrained(folder)
    saved = json.loads((folder / "config.json").read_text())
    for legacy in ("rope_tables_in_float32", "rmsnorm_scale_in_float32", "router_weights_in_model_dtype"):
        assert not saved.get(legacy) or legacy in config.numerics, legacy  # the old fields read as `numerics`
    torch.manual_seed(0)
    model = getattr(hf_tfm, HEADS[config.model_type])(config)
    shapes = {key: "x".join(map(str, value.shape)) for key, value in model.state_dict().items()}
    assert shapes == expected["state_dict"]
    deterministic_weights(model)
    sample = logits_sample(model)
    torch.testing.assert_close(
        torch.tensor(sample["first_logits"]), torch.tensor(expected["logits"]["first_logits"]), rtol=1e-5, atol=1e-5
    )
    for summary in ("sum", "abs_mean"):
        assert sample[summary] == pytest.approx(expected["logits"][summary], rel=1e-5, abs=1e-4), summary


# the version before the core was rebuilt; a preset added since is saved by the first version that has it
BEFORE_THE_REBUILD = "a284bf4"


def written_by(name: str) -> str:
    return json.loads((FOLDER / name / "expected.json").read_text())["hf_tfm_commit"]


def test_the_records_were_written_before_the_rebuild():
    """The control: the data is the earlier version's (no `numerics` field in any config it saved), but for the
    presets and the variants of options added since (cross-layer sharing, disentangled attention, the projected
    token table)."""
    earlier = [name for name in SAVED if written_by(name) == BEFORE_THE_REBUILD]
    added_since = set(hf_tfm.preset_names()) | {
        "encoder-disentangled-shared-layers-factorised",
        "decoder-projected-token-table-post-norm",
    }
    assert len(earlier) == 29 and set(SAVED) - set(earlier) <= added_since
    configs = [json.loads((FOLDER / name / "config.json").read_text()) for name in earlier]
    assert not any("numerics" in config for config in configs)
    assert any(config.get("rope_tables_in_float32") for config in configs)
    assert Path(FOLDER).is_dir()
