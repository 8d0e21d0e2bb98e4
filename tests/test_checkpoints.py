"""Saving and loading integrity: staged saves that a kill at any point cannot damage, recovery of what killed saves
leave behind by the next save (or `hf-tfm verify --repair`), never by a load and never of another host's save,
manifests that `hf-tfm verify` and resume check (a load compares sizes only), weights that must fit the config,
resumable checkpoints only, and the model card every save leaves."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import tiny_config, tiny_model
from huggingface_hub import ModelCard
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from hf_tfm import (
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderForMaskedLM,
    TfmEncoderForSequenceClassification,
    saving,
)
from hf_tfm.saving import (
    MANIFEST,
    CorruptCheckpoint,
    leftovers,
    recover_folder,
    this_host,
    verify_folder,
    write_manifest,
)
from hf_tfm.training.checkpoints import last_good_checkpoint, load_saved, replace_folder, verify

INPUT = torch.tensor([[5, 6, 7, 8, 9, 10]])


def logits(model):
    with torch.no_grad():
        return model(INPUT).logits


def version_writer(version: int):
    def write(folder: Path) -> None:
        (folder / "weights").write_text(f"version {version}")
        (folder / "config.json").write_text(json.dumps({"version": version}))

    return write


def version_of(folder: Path) -> int:
    return json.loads((folder / "config.json").read_text())["version"]


def dead_pid() -> int:
    """The pid of a process that has exited (and was reaped): no process runs under it now."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def leftover(kind: str, pid: int, host: str | None = None) -> str:
    """The name a save of process `pid` on `host` (this one by default) gives its staging or retired folder."""
    return f".model.{kind}-{host or this_host()}-{pid}"


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir())


# ------------------------------------------------------------------------------- replace_folder: killed for real

# The child loads hf_tfm/saving.py by path (it imports only the standard library and transformers' logging), saves
# version 2 over version 1, and SIGKILLs itself at the chosen point.
KILLED_SAVE = textwrap.dedent(
    """
    import importlib.util, json, os, signal, sys
    spec = importlib.util.spec_from_file_location("saving", {module!r})
    saving = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(saving)
    point, destination = {point!r}, {destination!r}
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    replace, rmtree = os.replace, saving.shutil.rmtree

    def write(folder):
        (folder / "weights").write_text("version 2")
        if point == "writing":
            die()
        (folder / "config.json").write_text(json.dumps({{"version": 2}}))

    def killing_replace(source, target):
        if point == "between the renames" and str(target) == destination:
            die()  # the old folder is already renamed away, the new one not yet in place
        replace(source, target)

    def killing_rmtree(path, *args, **kwargs):
        if point == "before the cleanup" and ".old-" in str(path):
            die()
        rmtree(path, *args, **kwargs)

    os.replace, saving.shutil.rmtree = killing_replace, killing_rmtree
    saving.replace_folder(write, destination)
    """
)


@pytest.mark.parametrize(
    ("point", "left_as"),
    [("writing", 1), ("between the renames", None), ("before the cleanup", 2)],
)
def test_a_save_killed_at_any_point_is_recovered_by_the_next_save(tmp_path, point, left_as):
    """SIGKILL inside the write, between the two renames (`model/` missing, the old one under a hidden name), and
    before the retired folder is removed. The next save finds `model/` complete (the killed save's, when it had
    completed), removes the leftovers, and saves."""
    destination = tmp_path / "model"
    replace_folder(version_writer(1), destination)
    script = KILLED_SAVE.format(module=saving.__file__, point=point, destination=str(destination))
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert leftovers(destination)  # what the kill left behind
    if left_as is None:
        assert not destination.exists()
    else:
        assert version_of(destination) == left_as

    recover_folder(destination)  # what the next save (or `hf-tfm verify --repair`) does first
    assert version_of(destination) == (left_as or 2)  # the complete new save, renamed back
    verify(destination)
    assert siblings(destination) == ["model"]
    replace_folder(version_writer(3), destination)
    assert version_of(destination) == 3 and siblings(destination) == ["model"]


def test_recovery_takes_the_newest_complete_leftover_of_dead_processes_only(tmp_path):
    """Leftovers of several killed saves: the newest one whose manifest verifies comes back; an incomplete newer one
    is not taken; a running process's staging folder is left alone."""
    destination = tmp_path / "model"
    dead = [dead_pid() for _ in range(3)]
    saves = [(dead[0], "old", 1, 1000), (dead[1], "partial", 2, 2000), (dead[2], "partial", 3, 3000)]
    for pid, kind, version, mtime in saves:
        folder = tmp_path / leftover(kind, pid)
        folder.mkdir()
        version_writer(version)(folder)
        write_manifest(folder)
        os.utime(folder / MANIFEST, (mtime, mtime))
    (tmp_path / leftover("partial", dead[2]) / "weights").write_text("half")  # the newest never completed
    running = tmp_path / leftover("partial", 1)  # pid 1 always runs: a save in progress elsewhere
    running.mkdir()

    recover_folder(destination)
    assert version_of(destination) == 2
    assert siblings(destination) == [running.name, "model"]


def test_another_hosts_leftovers_are_never_touched(tmp_path, caplog):
    """On a shared file system this host cannot tell whether another host's save still runs: its staging folder (and
    an earlier hf_tfm's, whose names say no host) is left in place and named in a warning, by the next save and by
    `hf-tfm verify --repair` alike; this host's dead ones go."""
    destination = tmp_path / "model"
    replace_folder(version_writer(1), destination)
    other = tmp_path / leftover("partial", dead_pid(), host="other_node")
    earlier = tmp_path / f".model.partial-{dead_pid()}"
    ours = tmp_path / leftover("old", dead_pid())
    for folder in (other, earlier, ours):
        folder.mkdir()
    replace_folder(version_writer(2), destination)
    assert siblings(destination) == sorted([other.name, earlier.name, "model"])
    assert other.name in caplog.text and earlier.name in caplog.text
    report = verify_folder(destination, repair=True)
    assert other.name in report and siblings(destination) == sorted([other.name, earlier.name, "model"])


def test_leftovers_of_saves_inside_a_staging_folder_are_removed_whatever_their_name(tmp_path):
    """A run's final save stages `.model.partial-PID` and saves the model into it; a kill there once left doubled
    names (`..model.partial-PID.partial-PID`) beside model/ that no later save removed. Every leftover of a dead
    process goes at the next save, nested or not; a running process's are kept."""
    destination = tmp_path / "model"
    replace_folder(version_writer(1), destination)
    dead = [dead_pid() for _ in range(3)]
    host = this_host()
    names = [
        f".model.partial-{host}-{dead[0]}",
        f"..model.partial-{host}-{dead[0]}.partial-{host}-{dead[0]}",
        f"..model.partial-{host}-{dead[1]}.old-{host}-{dead[1]}",
        f"...model.partial-{host}-{dead[2]}.partial-{host}-{dead[2]}.partial-{host}-{dead[2]}",
        f"..model.partial-{host}-1.partial-{host}-1",  # pid 1 always runs
    ]
    for name in names:
        (tmp_path / name).mkdir()
    (tmp_path / f".other.partial-{host}-1").mkdir()  # another folder's: never touched
    assert len(leftovers(destination)) == 5
    replace_folder(version_writer(2), destination)
    assert version_of(destination) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [names[-1], f".other.partial-{host}-1", "model"]


def test_a_save_into_a_staging_folder_is_written_in_place(tmp_path):
    """The model saved inside another save's staging folder (a run's final save) writes there directly: the outer
    save swaps the whole folder in, so a staging folder of its own is one more thing a kill could leave behind."""
    model = tiny_model()
    staging = tmp_path / leftover("partial", os.getpid())
    staging.mkdir()
    model.save_pretrained(staging)
    assert sorted(p.name for p in tmp_path.iterdir()) == [staging.name]
    assert (staging / "config.json").is_file()


def test_a_folder_missing_with_nothing_complete_left_is_a_clear_error(tmp_path):
    """A load names the interrupted save and its repair and writes nothing; the repair finds nothing complete to put
    back and says the folder does not exist."""
    folder = tmp_path / leftover("partial", dead_pid())
    folder.mkdir()
    (folder / "config.json").write_text("{")  # killed while writing: no manifest
    for load in (load_saved, TfmDecoderForCausalLM.from_pretrained):
        with pytest.raises(FileNotFoundError, match="interrupted before it completed .*hf-tfm verify .* --repair"):
            load(tmp_path / "model")
        assert siblings(tmp_path / "model") == [folder.name]  # a load writes nothing
    with pytest.raises(FileNotFoundError, match="does not exist"):
        verify_folder(tmp_path / "model", repair=True)
    assert siblings(tmp_path / "model") == []  # the incomplete leftover of a dead process is removed


# ----------------------------------------------------------------------------- save_pretrained: staged and swapped


class Killed(BaseException):
    """Stands in for SIGKILL inside this process: raised where no handler of the save runs."""


def test_a_model_killed_between_the_renames_is_named_by_a_load_and_restored_by_the_repair(tmp_path, monkeypatch):
    """The run's final save (`replace_folder`) and `save_pretrained` share the swap: killed between its renames, a load
    (`load_saved`, `from_pretrained`) names the repair and writes nothing; `hf-tfm verify --repair`, as the next save
    would, puts the complete model back under its name."""
    first, second = tiny_model(seed=1), tiny_model(seed=2)
    load_tfm = TfmDecoderForCausalLM.from_pretrained
    pairs = {
        "replace_folder + load_saved": (lambda m, d: replace_folder(m.save_pretrained, d), load_saved),
        "save_pretrained + from_pretrained": (lambda m, d: m.save_pretrained(d), load_tfm),
    }
    for name, (save, load) in pairs.items():
        destination = tmp_path / name / "model"
        save(first, destination)
        replace = os.replace

        def killing_replace(source, target, *, destination=destination, replace=replace):
            if Path(target) == destination:
                raise Killed
            replace(source, target)

        monkeypatch.setattr(saving.os, "replace", killing_replace)
        with pytest.raises(Killed):
            save(second, destination)
        monkeypatch.setattr(saving.os, "replace", replace)
        assert not destination.exists(), name
        left = siblings(destination)
        with pytest.raises(FileNotFoundError, match="--repair"):
            load(destination)
        assert siblings(destination) == left, name  # a load writes nothing
        assert "weight files match the manifest" in verify_folder(destination, repair=True)
        torch.testing.assert_close(logits(load(destination)), logits(second), rtol=0, atol=0)
        assert siblings(destination) == ["model"], name


def test_save_pretrained_killed_while_writing_keeps_the_previous_model(tmp_path, monkeypatch):
    """Killed while transformers writes the weights (sharded: after the first shard), the previous save is intact and
    loads; the load leaves the staging folder the kill left, which the next save removes."""
    from transformers import modeling_utils

    folder = tmp_path / "model"
    good = tiny_model(seed=1)
    good.save_pretrained(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def killed_after_first_shard(tensors, filename, metadata=None):
        write(tensors, filename, metadata=metadata)
        raise Killed

    write = modeling_utils.safe_save_file
    monkeypatch.setattr(modeling_utils, "safe_save_file", killed_after_first_shard)
    monkeypatch.setattr(saving.shutil, "rmtree", lambda *a, **k: None)  # a kill runs no cleanup
    with pytest.raises(Killed):
        tiny_model(seed=2).save_pretrained(folder, max_shard_size="20KB")
    monkeypatch.undo()
    assert [name for name in siblings(folder) if ".partial-" in name]  # the half-written staging folder
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(folder)), logits(good), rtol=0, atol=0)
    assert len(siblings(folder)) == 2  # a load writes nothing
    good.save_pretrained(folder)
    assert siblings(folder) == ["model"]


def test_save_pretrained_over_a_folder_keeps_its_other_files(tmp_path):
    """Saving over a folder that also holds a tokenizer, a run record, the user's own card and a sub-folder keeps
    them; the previous weights go (a sharded save leaves no stale `model.safetensors` to shadow its shards), and
    files the new save writes are the new ones."""
    folder = tmp_path / "model"
    tiny_model(seed=1).save_pretrained(folder)
    (folder / "tokenizer.json").write_text("{}")
    (folder / "hf_tfm_run.json").write_text(json.dumps({"task": "causal-lm"}))
    (folder / "README.md").write_text("# My own card\n")
    (folder / "runs").mkdir()
    (folder / "runs" / "events").write_text("log")
    new = tiny_model(seed=2)
    new.save_pretrained(folder, max_shard_size="20KB")
    names = set(os.listdir(folder))
    assert {"tokenizer.json", "hf_tfm_run.json", "README.md", "runs", "model.safetensors.index.json"} <= names
    assert "model.safetensors" not in names and len([n for n in names if n.startswith("model-000")]) >= 2
    assert (folder / "README.md").read_text() == "# My own card\n"
    assert (folder / "runs" / "events").read_text() == "log"
    assert (folder / "tokenizer.json").stat().st_nlink == 1  # the retired folder is gone: nothing shares it
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(folder)), logits(new), rtol=0, atol=0)
    new.save_pretrained(folder)  # back to one file: the shards and their index go
    assert not [n for n in os.listdir(folder) if n.startswith("model-000") or n.endswith(".index.json")]
    assert siblings(folder) == ["model"]


def test_save_pretrained_into_a_new_nested_folder_and_on_other_processes(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b" / "model.safetensors").is_file() and (tmp_path / "a" / "b" / MANIFEST).is_file()
    model.save_pretrained(tmp_path / "other", is_main_process=False)  # as transformers: the folder, no files
    assert os.listdir(tmp_path / "other") == []


# ---------------------------------------------------------------------------------------- from_pretrained checks


def test_a_weight_file_rewritten_whole_after_the_save_loads_with_a_warning_naming_it(tmp_path, caplog):
    """Another tool rewrote the weights (transformers' own tests re-save a file with fewer tensors): the file is whole
    safetensors of another size, so it loads as transformers would load it, and the warning names the file and the
    check that compares every byte. A file cut short stays an error (the test above)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "model"
    model = tiny_model()
    model.save_pretrained(folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.norm.weight"] = torch.full_like(model.model.norm.weight, 2.0)
    tensors["extra.note"] = torch.zeros(3)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level("WARNING"):
        loaded = AutoModelForCausalLM.from_pretrained(folder, strict=False)
    assert "model.safetensors has" in caplog.text and "rewritten after the save" in caplog.text
    assert f"hf-tfm verify {folder}" in caplog.text
    assert torch.equal(loaded.model.norm.weight, torch.full_like(model.model.norm.weight, 2.0))


def test_a_load_compares_sizes_and_verify_names_any_altered_byte(tmp_path):
    """A load compares the weight files' sizes with the manifest (a stat each: a truncated file is named, with the
    command that checks every byte); `hf-tfm verify` hashes every file, so a flipped byte is named there. Files the
    manifest does not list or that are not the model (a tokenizer saved later, a card edited by hand) do not matter
    to a load; no manifest, no check."""
    folder = tmp_path / "model"
    tiny_model().save_pretrained(folder)
    (folder / "tokenizer.json").write_text("{}")
    (folder / "README.md").write_text("# edited by hand\n")
    AutoModelForCausalLM.from_pretrained(folder)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-7] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match="model.safetensors does not match its manifest"):
        verify_folder(folder)
    weights.write_bytes(bytes(data))
    data[-7] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert verify_folder(folder).endswith("1 weight files match the manifest; edited since the save: README.md")
    weights.write_bytes(bytes(data[:-10]))
    for load in (AutoModelForCausalLM.from_pretrained, load_saved):
        with pytest.raises(CorruptCheckpoint, match=r"model.safetensors has \d+ bytes, \d+ saved .*hf-tfm verify"):
            load(folder)
    (folder / MANIFEST).unlink()  # saved before hf_tfm wrote manifests, or by other code: not checked
    with pytest.raises(CorruptCheckpoint, match="has no hf_tfm_manifest.json"):
        verify_folder(folder)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_hidden_layers": 3}, r"missing from the checkpoint \(they would be random\): model\.layers\.2\.attn"),
        ({"num_hidden_layers": 1}, r"in the checkpoint but not in the model: model\.layers\.1\.attn_norm"),
        ({"ffn_type": "glu"}, r"missing from the checkpoint .*model\.layers\.\{0, 1\}\.mlp\.gate_proj"),
    ],
)
def test_weights_that_do_not_fit_the_config_are_an_error(tmp_path, change, message):
    folder = tmp_path / "model"
    model = tiny_model()
    model.save_pretrained(folder)
    with pytest.raises(ValueError, match=message):
        AutoModelForCausalLM.from_pretrained(folder, **change)
    with pytest.raises(ValueError, match=message.replace("model\\.layers", "(model\\.)?layers")):
        AutoModel.from_pretrained(folder, **change)  # the base model, from the causal LM's weights
    # config.json edited by hand in a folder without a manifest: the same error, naming the folder
    (folder / MANIFEST).unlink()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=f"weights in {folder} do not match TfmDecoderForCausalLM"):
        AutoModelForCausalLM.from_pretrained(folder)
    # asked for: strict=False loads as transformers does, and is not kept in the config
    loaded, info = AutoModelForCausalLM.from_pretrained(folder, strict=False, output_loading_info=True)
    assert info["missing_keys"] or info["unexpected_keys"]
    assert not hasattr(loaded.config, "strict")
    AutoModelForCausalLM.from_pretrained(folder, ignore_mismatched_sizes=True)


def test_another_head_may_miss_its_own_weights_not_the_body(tmp_path):
    """A masked LM loads into sequence classification (new classifier and pooler missing, the LM head left over):
    legitimate. With one layer more than saved it is not."""
    folder = tmp_path / "mlm"
    torch.manual_seed(0)
    TfmEncoderForMaskedLM(tiny_config(TfmEncoderConfig)).save_pretrained(folder)
    classifier = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=3)
    assert type(classifier) is TfmEncoderForSequenceClassification
    AutoModel.from_pretrained(folder)
    with pytest.raises(ValueError, match=r"missing from the checkpoint .*model\.layers\.2"):
        AutoModelForSequenceClassification.from_pretrained(folder, num_labels=3, num_hidden_layers=3)


# ---------------------------------------------------------------------------------------- checkpoints to resume


def checkpoint(root: Path, step: int, optimizer=None) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    torch.save(optimizer if optimizer is not None else {"state": {}, "param_groups": []}, folder / "optimizer.pt")
    write_manifest(folder)
    return folder


class NotAllowed:
    """A pickled object that torch.load(weights_only=True) refuses."""


def unsafe_optimizer_state(folder: Path) -> None:
    torch.save({"x": NotAllowed()}, folder / "optimizer.pt")
    write_manifest(folder)  # the save completed: only loading it fails


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda c: (c / MANIFEST).write_text('{"files": {"mo'), r"hf_tfm_manifest.json is damaged \(JSONDecodeError"),
        (lambda c: (c / MANIFEST).write_text("{}"), r"hf_tfm_manifest.json is damaged \(KeyError"),
        (lambda c: (c / MANIFEST).write_text('{"files": [1]}'), r"hf_tfm_manifest.json is damaged"),
        (unsafe_optimizer_state, r"optimizer.pt cannot be loaded safely \(UnpicklingError"),
    ],
    ids=["truncated manifest", "empty manifest", "manifest of the wrong shape", "unsafe optimizer state"],
)
def test_resume_passes_over_a_damaged_manifest_or_optimizer_state(tmp_path, damage, reason):
    older = checkpoint(tmp_path, 2)
    newer = checkpoint(tmp_path, 4)
    damage(newer)
    chosen, passed_over = last_good_checkpoint(tmp_path)
    assert chosen == older
    [(folder, why)] = passed_over
    assert folder == newer and str(newer) in why
    assert re.search(reason, why), why


# ------------------------------------------------------------------------------------------------------ the card


def test_save_pretrained_leaves_a_card_of_the_model(tmp_path):
    """Every save writes README.md from hf_tfm's card code: architecture table, parameter count, load snippet."""
    model = tiny_model(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    model.save_pretrained(tmp_path / "tiny")
    card = ModelCard.load(tmp_path / "tiny" / "README.md")
    assert {"hf_tfm", "tfm_decoder", "moe"} <= set(card.data.tags) and card.data.model_name == "tiny"
    assert "| layers | 2 |" in card.text and "| experts / top-k | 4 / top-2 |" in card.text
    assert f"{model.num_parameters():,}" in card.text
    assert 'AutoModelForCausalLM.from_pretrained("tiny", trust_remote_code=True)' in card.text


def test_save_pretrained_keeps_a_richer_card_and_survives_a_failing_one(tmp_path, monkeypatch, caplog):
    from support.run_record import RECORD

    from hf_tfm.hub import card as card_code

    folder = tmp_path / "model"
    model = tiny_model()
    model.save_pretrained(folder)
    (folder / "hf_tfm_run.json").write_text(json.dumps(RECORD))
    card_code.refresh_card(folder, repo_id="user/run")  # a training run's card, with its results
    run_card = (folder / "README.md").read_text()
    model.save_pretrained(folder)
    assert (folder / "README.md").read_text() == run_card

    def broken(*args, **kwargs):
        raise RuntimeError("template missing")

    monkeypatch.setattr(card_code, "write_card_on_save", broken)
    model.save_pretrained(tmp_path / "no-card")
    assert not (tmp_path / "no-card" / "README.md").exists()
    assert "was not written (RuntimeError: template missing); the model is saved" in caplog.text
    AutoModelForCausalLM.from_pretrained(tmp_path / "no-card")


# ------------------------------------------------------------------------------------- config.json edited by hand


def edit_config(folder: Path, **fields) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}, indent=2))


def test_a_hand_edited_config_loads(tmp_path):
    """The manifest guards the weights: a config.json edited by hand (a longer context, another RoPE scaling, no
    cache) loads, and the edit takes effect."""
    model = tiny_model(position_embedding_type="rope")
    model.save_pretrained(tmp_path / "model")
    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    edit_config(tmp_path / "model", max_position_embeddings=128, rope_parameters=rope, use_cache=False)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert loaded.config.max_position_embeddings == 128 and loaded.config.rope_parameters["rope_type"] == "linear"
    assert not loaded.config.use_cache
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_a_config_edit_that_no_longer_fits_the_weights_names_the_field(tmp_path):
    model = tiny_model(position_embedding_type="rope")
    model.save_pretrained(tmp_path / "model")
    edit_config(tmp_path / "model", hidden_size=64)
    with pytest.raises(ValueError, match=r"hidden_size=64 in config.json, 32-wide weights \(model.embed_tokens"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", strict=False, ignore_mismatched_sizes=True)
    assert loaded.config.hidden_size == 64


def test_altered_weights_are_still_named_when_the_config_is_edited(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "model")
    edit_config(tmp_path / "model", use_cache=False)
    with open(tmp_path / "model" / "model.safetensors", "r+b") as weights:
        weights.seek(-8, os.SEEK_END)
        weights.write(b"\x00" * 8)
    with pytest.raises(CorruptCheckpoint, match="model.safetensors does not match its manifest"):
        verify_folder(tmp_path / "model")
