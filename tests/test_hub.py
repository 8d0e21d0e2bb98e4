# ruff: noqa: F811  (tests take the imported `hub_server` fixture as an argument)
"""Publishing: the real `huggingface_hub` client pushes to a local Hub (tests/support/hub_server.py), and a user with
only torch and transformers downloads the models from it and gets the same logits and the same greedy tokens."""

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import perturb, tiny_config
from huggingface_hub import HfApi, ModelCard, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
from support.hub_server import fast_client_retries, hub_server  # noqa: F401  (hub_server: the fixture)
from support.run_record import RECORD as RUN_RECORD
from transformers import AutoModelForCausalLM

import hf_tfm
from hf_tfm import (
    TfmDecoderConfig,
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
)
from hf_tfm.hub.card import active_parameters, write_card_from_run
from hf_tfm.hub.push import NotAModelFolderError, push_folder
from hf_tfm.model.modeling_tfm_loading import AUTO_CLASSES
from hf_tfm.saving import MANIFEST
from hf_tfm.training.tokenizers import train_byte_level_bpe

TEXTS = ["return the number of items in the list", "def add(a, b): return a + b", "open the file and read it"]
PROMPTS = ["return the number", "def add(a, b):"]
# what ships next to the weights: the model bundle, every file of it (hf_tfm/model/, its __init__ aside)
CODE_FILES = {path.name for path in (Path(hf_tfm.__file__).parent / "model").glob("*.py")} - {"__init__.py"}
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json"}
GREEDY = {"max_new_tokens": 5, "min_new_tokens": 5, "do_sample": False}


@pytest.fixture(scope="module")
def tokenizer():
    return train_byte_level_bpe(TEXTS * 20, vocab_size=300)


def build(kind: str, tokenizer, seed: int = 0, **overrides):
    """A tiny model of `kind` on the tokenizer's vocabulary, perturbed so that its logits are far from uniform."""
    special = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    config_class, model_class, extra = {
        "decoder": (TfmDecoderConfig, TfmDecoderForCausalLM, {}),
        "encoder": (TfmEncoderConfig, TfmEncoderForMaskedLM, {}),
        "seq2seq": (
            TfmEncoderDecoderConfig,
            TfmEncoderDecoderForConditionalGeneration,
            {"decoder_start_token_id": tokenizer.bos_token_id},
        ),
        "moe": (
            TfmDecoderConfig,
            TfmDecoderForCausalLM,
            {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
        ),
    }[kind]
    torch.manual_seed(seed)
    return perturb(model_class(tiny_config(config_class, **{**special, **extra, **overrides})))


def outputs(model, tokenizer) -> dict:
    """Logits on a padded batch, and (for generative heads) greedy tokens for a one-prompt batch."""
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    extra = {}
    if model.config.is_encoder_decoder:
        extra["decoder_input_ids"] = batch["input_ids"][:, :3]
    with torch.no_grad():
        result = {"input_ids": batch["input_ids"], "logits": model(**batch, **extra).logits}
    if model.can_generate():
        result["tokens"] = model.generate(**tokenizer(PROMPTS[:1], return_tensors="pt"), **GREEDY)
    return result


def folder_state(folder) -> dict:
    """Every file under `folder` with its content hash and modification time: equal before and after = untouched."""
    state = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as file:
                state[os.path.relpath(path, folder)] = (
                    hashlib.sha256(file.read()).hexdigest(),
                    os.stat(path).st_mtime_ns,
                )
    return state


def run_without_hf_tfm(script: str, tmp_path) -> subprocess.CompletedProcess:
    """Run `script` in a fresh interpreter where `import hf_tfm` fails, online against the local Hub (HF_ENDPOINT and
    HF_TOKEN come from the fixture's environment), with an empty Hub cache and an empty remote-code cache."""
    prelude = "import sys\nsys.modules['hf_tfm'] = None  # as if the package were not installed\n"
    home = tmp_path / "fresh_home"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "0",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_MODULES_CACHE": str(home / "modules"),
        "PYTHONPATH": "",
    }
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        check=False,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,  # transformers may ask "Do you wish to run the custom code? [y/N]": answer nothing
        capture_output=True,
        text=True,
        timeout=300,
    )


def published(repo_id: str, revision: str = "main") -> set[str]:
    return set(HfApi().list_repo_files(repo_id, revision=revision))


@pytest.fixture
def moe_folder(tmp_path, tokenizer):
    """A saved MoE decoder folder as the training code leaves it: model, tokenizer, run record and model card."""
    model = build("moe", tokenizer)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "hf_tfm_run.json").write_text(json.dumps(RUN_RECORD))
    write_card_from_run(folder, model, repo_id="test-user/tiny-moe-card")
    return folder, model


# ---------------------------------------------------------------------------------------------- push_to_hub -> load


@pytest.mark.slow
def test_push_to_hub_then_load_anywhere(hub_server, tokenizer, moe_folder, tmp_path):
    """`model.push_to_hub` + `tokenizer.push_to_hub` for the four kinds; then, in a process without hf_tfm and with an
    empty cache, trust_remote_code downloads them and reproduces logits and greedy tokens exactly; without
    trust_remote_code, transformers refuses before running any code; with hf_tfm installed no remote code is needed.
    The same process runs the load snippet of the card that `push_folder` published, as written."""
    kinds = {
        "decoder": "AutoModelForCausalLM",
        "encoder": "AutoModelForMaskedLM",
        "seq2seq": "AutoModelForSeq2SeqLM",
        "moe": "AutoModelForCausalLM",
    }
    expected = {}
    for kind, auto_class in kinds.items():
        model = build(kind, tokenizer)
        repo_id = f"test-user/tiny-{kind}"
        commit = model.push_to_hub(repo_id)
        tokenizer.push_to_hub(repo_id)
        assert commit.oid == hub_server.repo(repo_id).history()[1].oid  # the model commit, then the tokenizer's
        expected[repo_id] = {"auto_class": auto_class, **outputs(model, tokenizer)}

        # what a user downloads: config with auto_map for every Auto class, the flat code, weights, tokenizer, card
        files = (
            CODE_FILES
            | TOKENIZER_FILES
            | {".gitattributes", "README.md", "config.json", "model.safetensors", MANIFEST}
        )
        if model.can_generate():
            files.add("generation_config.json")
        assert published(repo_id) == files, kind
        config = json.loads(hub_server.files(repo_id)["config.json"])
        assert set(config["auto_map"]) == {"AutoConfig", *AUTO_CLASSES[model.config.model_type]}
        assert {f"{ref.split('.')[0]}.py" for ref in config["auto_map"].values()} <= files
        # push_to_hub publishes hf_tfm's card of the model, named after the repo, not transformers' stub
        card = ModelCard(hub_server.files(repo_id)["README.md"].decode())
        assert (
            "hf_tfm" in card.data.tags
            and card.data.model_name == repo_id
            and "This is the model card of a" not in card.text
        )
        assert (
            f"| parameters (total / active per token) | {model.num_parameters():,} / {active_parameters(model):,} |"
            in card.text
        )

    # the card's "only torch and transformers" snippet, then its generation snippet, on a push_folder'ed MoE folder
    folder, card_model = moe_folder
    push_folder(folder, "test-user/tiny-moe-card")
    snippets = re.findall(r"```python\n(.*?)```", (folder / "README.md").read_text(), re.DOTALL)
    assert "trust_remote_code=True" in snippets[1] and "import hf_tfm" not in snippets[1] + snippets[2]
    prompt = tokenizer("def add(a, b):", return_tensors="pt")
    card_tokens = card_model.generate(**prompt, max_new_tokens=32, do_sample=False)

    torch.save(
        {"models": expected, "snippet": snippets[1] + snippets[2], "card_tokens": card_tokens},
        tmp_path / "expected.pt",
    )
    result = run_without_hf_tfm(
        """
        import torch, transformers
        from transformers import AutoTokenizer

        data = torch.load("expected.pt")
        # 1. without trust_remote_code: a clear refusal, and no code from the repo was imported. `False` refuses at
        # once; the default (None) asks "Do you wish to run the custom code? [y/N]" on stdin (closed here) first.
        for trust in (False, None):
            try:
                transformers.AutoModelForCausalLM.from_pretrained("test-user/tiny-decoder", trust_remote_code=trust)
            except ValueError as error:
                print(f"refused ({trust}):", " ".join(str(error).split()))
        assert not [m for m in sys.modules if m.startswith("transformers_modules")], "remote code ran"
        # 2. with it: every model downloads and reproduces the outputs exactly
        for repo_id, want in data["models"].items():
            auto_class = getattr(transformers, want["auto_class"])
            model = auto_class.from_pretrained(repo_id, trust_remote_code=True).eval()
            assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
            # as most users write it (it asks about the config's code, then falls back); the card adds trust
            tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=repo_id.endswith("moe") or None)
            batch = tokenizer(["return the number", "def add(a, b):"], return_tensors="pt", padding=True)
            assert torch.equal(batch["input_ids"], want["input_ids"]), repo_id
            extra = {"decoder_input_ids": batch["input_ids"][:, :3]} if model.config.is_encoder_decoder else {}
            with torch.no_grad():
                logits = model(**batch, **extra).logits
            torch.testing.assert_close(logits, want["logits"], rtol=0, atol=0)
            if "tokens" in want:
                prompt = tokenizer(["return the number"], return_tensors="pt")
                tokens = model.generate(**prompt, max_new_tokens=5, min_new_tokens=5, do_sample=False)
                assert torch.equal(tokens, want["tokens"]), (repo_id, tokens, want["tokens"])
            print("loaded", repo_id, type(model).__name__)
        # 3. the model card's snippets, verbatim
        namespace = {}
        exec(data["snippet"], namespace)
        assert torch.equal(namespace["output"], data["card_tokens"])
        print("card snippet ran")
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-5000:]
    for trust in (False, None):
        assert f"refused ({trust}): The repository test-user/tiny-decoder contains custom code" in result.stdout
    assert "Please pass the argument `trust_remote_code=True`" in result.stdout
    assert result.stdout.count("loaded ") == len(kinds) and "card snippet ran" in result.stdout, result.stdout

    # with hf_tfm installed (this process): no trust_remote_code, our own classes, same numbers
    model = AutoModelForCausalLM.from_pretrained("test-user/tiny-moe", cache_dir=tmp_path / "cache").eval()
    assert type(model) is TfmDecoderForCausalLM
    assert torch.equal(outputs(model, tokenizer)["logits"], expected["test-user/tiny-moe"]["logits"])
    assert hub_server.unhandled == []


def test_sharded_push_loads(hub_server, tokenizer, tmp_path):
    """A small `max_shard_size` publishes a safetensors index and its shards; the model still loads exactly."""
    model = build("decoder", tokenizer)
    model.push_to_hub("test-user/sharded", max_shard_size="40KB")
    files = published("test-user/sharded")
    shards = sorted(f for f in files if f.startswith("model-") and f.endswith(".safetensors"))
    assert "model.safetensors.index.json" in files and "model.safetensors" not in files
    assert len(shards) >= 2
    index = json.loads(hub_server.files("test-user/sharded")["model.safetensors.index.json"])
    assert sorted(set(index["weight_map"].values())) == shards
    loaded = AutoModelForCausalLM.from_pretrained("test-user/sharded", cache_dir=tmp_path / "cache").eval()
    torch.testing.assert_close(
        outputs(loaded, tokenizer)["logits"], outputs(model, tokenizer)["logits"], rtol=0, atol=0
    )
    assert hub_server.unhandled == []


def test_save_pretrained_push_to_hub_and_a_card_to_keep(hub_server, tokenizer, tmp_path):
    """`save_pretrained(push_to_hub=True)` publishes the saved folder with hf_tfm's card; a card the user wrote on the
    Hub is not replaced by a later `push_to_hub`."""
    model = build("decoder", tokenizer)
    folder = tmp_path / "tiny-pushed"
    model.save_pretrained(folder, push_to_hub=True, repo_id="test-user/tiny-pushed")
    files = hub_server.files("test-user/tiny-pushed")
    assert {name: (folder / name).read_bytes() for name in os.listdir(folder)}.items() <= files.items()
    assert "hf_tfm" in ModelCard(files["README.md"].decode()).data.tags
    mine = b"---\nlicense: mit\n---\n# My model\n"
    HfApi().upload_file(path_or_fileobj=mine, path_in_repo="README.md", repo_id="test-user/tiny-pushed")
    model.push_to_hub("test-user/tiny-pushed")
    assert hub_server.files("test-user/tiny-pushed")["README.md"] == mine
    assert hub_server.unhandled == []


# ------------------------------------------------------------------------------------------------------ push_folder


def test_push_folder_private_revision_message(hub_server, moe_folder, tmp_path, tokenizer):
    """private, a new branch and the commit message reach the Hub; the files download at that revision (and only
    with a token, the repo being private)."""
    folder, model = moe_folder
    url = push_folder(
        folder, "test-user/private-moe", private=True, revision="experiment-1", commit_message="Tiny MoE, run 0"
    )
    repo = hub_server.repo("test-user/private-moe")
    head = repo.history("experiment-1")[0]
    assert repo.private and url == f"{hub_server.url}/test-user/private-moe/commit/{head.oid}" and url.oid == head.oid
    assert head.title == "Tiny MoE, run 0"
    assert set(repo.branches) == {"main", "experiment-1"} and published("test-user/private-moe") == {".gitattributes"}
    local = {name: (folder / name).read_bytes() for name in os.listdir(folder)}
    assert hub_server.files("test-user/private-moe", "experiment-1") == {
        **local,
        ".gitattributes": hub_server.files("test-user/private-moe")[".gitattributes"],
    }
    # regular uploads: the client sent every file base64-encoded inside the NDJSON commit, no LFS
    assert {op["path"] for op in head.operations} == set(local) and {op["encoding"] for op in head.operations} == {
        "base64"
    }
    assert hub_server.count("preupload") >= 1 and not any("lfs" in r.path for r in hub_server.requests)

    path = hf_hub_download("test-user/private-moe", "config.json", revision="experiment-1", cache_dir=tmp_path / "c")
    assert Path(path).read_bytes() == local["config.json"]
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(
            "test-user/private-moe", "config.json", revision="experiment-1", token=False, cache_dir=tmp_path / "c2"
        )
    loaded = AutoModelForCausalLM.from_pretrained(
        "test-user/private-moe", revision="experiment-1", cache_dir=tmp_path / "c3"
    )
    assert torch.equal(outputs(loaded.eval(), tokenizer)["logits"], outputs(model, tokenizer)["logits"])

    # pushing again changes nothing: the client skips unchanged files and makes no empty commit
    commits = len(repo.commits)
    push_folder(folder, "test-user/private-moe", private=True, revision="experiment-1")
    assert len(repo.commits) == commits
    # --private on an existing public repo is refused instead of publishing
    push_folder(folder, "test-user/public-moe")
    with pytest.raises(ValueError, match="already exists and is public"):
        push_folder(folder, "test-user/public-moe", private=True, revision="other")
    assert set(hub_server.repo("test-user/public-moe").branches) == {"main"}
    assert hub_server.unhandled == []


def test_push_folder_refuses_what_is_not_a_model_folder(hub_server, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "config-only").mkdir()
    (tmp_path / "config-only" / "config.json").write_text("{}")
    for name, message in [("missing", "is not a folder"), ("empty", "no config.json"), ("config-only", "no weights")]:
        with pytest.raises(NotAModelFolderError, match=message) as error:
            push_folder(tmp_path / name, "test-user/never")
        assert str(tmp_path / name) in str(error.value)
    assert hub_server.requests == []  # refused before talking to the Hub


def test_failure_in_the_middle_of_a_push(hub_server, moe_folder, monkeypatch):
    """The Hub answering 500 to the commit (after the repo, branch and preupload calls succeeded): push_folder raises
    the client's HfHubHTTPError with a message naming the folder and the repo, the local folder is untouched, nothing
    was committed, and running the push again completes it."""
    fast_client_retries(monkeypatch)
    folder, _ = moe_folder
    before = folder_state(folder)

    # upload_folder (hf_xet installed) retries a failed commit 5 times: one 500 is absorbed...
    hub_server.fail_next("commit", times=1)
    push_folder(folder, "test-user/absorbed")
    assert hub_server.count("commit", status=500) == 1 and "config.json" in published("test-user/absorbed")

    # ...a failing Hub is not: the client retries (a folder of more than 20 files in smaller commits), then raises
    hub_server.fail_next("commit", times=1000)
    with pytest.raises(HfHubHTTPError) as error:
        push_folder(folder, "test-user/flaky", commit_message="first try")
    message = str(error.value)
    assert error.value.response.status_code == 500 and "500" in message
    assert "injected fault on commit" in message  # the server's error body is in the message
    assert str(folder) in message and "test-user/flaky" in message and "Run the push again" in message
    assert hub_server.count("commit", status=500) > 1
    assert folder_state(folder) == before
    assert published("test-user/flaky") == {".gitattributes"}  # nothing committed
    hub_server.fail_next("commit", times=0)

    push_folder(folder, "test-user/flaky", commit_message="second try")
    assert published("test-user/flaky") == {".gitattributes", *before}
    assert hub_server.repo("test-user/flaky").history()[0].title == "second try"
    assert folder_state(folder) == before
    assert hub_server.unhandled == []


def test_push_to_hub_fails_fast_on_a_commit_error(hub_server, tokenizer):
    """transformers' push_to_hub uses create_commit, which does not retry the commit: one 500 raises."""
    hub_server.fail_next("commit", times=1)
    with pytest.raises(HfHubHTTPError, match="500"):
        build("decoder", tokenizer).push_to_hub("test-user/fails")
    assert published("test-user/fails") == {".gitattributes"}


# ------------------------------------------------------------------------------------------------------- the card


def test_published_card(hub_server, moe_folder, tmp_path):
    """The card push_folder publishes: YAML that ModelCard parses and the Hub validates, model-index = the run
    record's numbers, parameter counts = the model's, MoE tags; `model.push_to_hub` afterwards keeps it."""
    folder, model = moe_folder
    push_folder(folder, "test-user/tiny-moe-card")
    card = ModelCard.load("test-user/tiny-moe-card")
    card.validate()  # POST /api/validate-yaml on the local Hub: no errors
    assert card.content == (folder / "README.md").read_text()
    data = card.data
    assert (
        data.library_name == "transformers" and data.pipeline_tag == "text-generation" and data.license == "apache-2.0"
    )
    assert {"hf_tfm", "tfm_decoder", "decoder-only", "moe", "mixture-of-experts"} <= set(data.tags)
    assert data.datasets == ["python-stdlib-docstrings"] and data.model_name == "test-user/tiny-moe-card"
    measured = [(r.dataset_split, r.metric_type, r.metric_value) for r in data.eval_results]
    assert measured == [(r["split"], r["metric"], r["value"]) for r in RUN_RECORD["results"]]
    assert (
        f"| parameters (total / active per token) | {model.num_parameters():,} / {active_parameters(model):,} |"
        in card.text
    )
    assert active_parameters(model) < model.num_parameters()
    assert 'AutoModelForCausalLM.from_pretrained("test-user/tiny-moe-card", trust_remote_code=True)' in card.text
    info = HfApi().model_info("test-user/tiny-moe-card")
    assert info.pipeline_tag == "text-generation" and "moe" in info.tags

    # transformers' push_to_hub loads the card already on the Hub and pushes it back instead of its stub
    model.push_to_hub("test-user/tiny-moe-card")
    again = ModelCard.load("test-user/tiny-moe-card", ignore_metadata_errors=False)
    assert again.data.to_dict() == data.to_dict() and "This is the model card of a 🤗" not in again.text
    assert hub_server.unhandled == []


def test_validate_yaml_rejects_a_broken_card(hub_server):
    """The local Hub's validator is not a rubber stamp: a bad pipeline tag and a model-index without metrics fail."""
    card = ModelCard(
        ignore_metadata_errors=True,
        content=(
            "---\npipeline_tag: text-generator\nmodel-index:\n- name: x\n  results:\n"
            "  - task: {type: text-generation}\n    dataset: {type: d, name: d}\n---\n# x\n"
        ),
    )
    with pytest.raises(ValueError, match="pipeline_tag"):
        card.validate()


def test_cli_card_and_push(hub_server, moe_folder, monkeypatch, capsys):
    """`hf-tfm card` rewrites the folder's card; `hf-tfm push` publishes it with --private, --revision and
    --commit-message; a failing push exits with the client's error and the folder named, not a traceback."""
    from hf_tfm_cli.entry import main

    folder, _ = moe_folder
    (folder / "README.md").unlink(missing_ok=True)
    main(["card", str(folder)])
    assert ModelCard.load(folder / "README.md").data.library_name == "transformers"
    main(
        ["push", str(folder), "test-user/cli-moe", "--private", "--revision", "v1", "--commit-message", "from the CLI"]
    )
    repo = hub_server.repo("test-user/cli-moe")
    assert repo.private and repo.history("v1")[0].title == "from the CLI"
    assert "README.md" in hub_server.files("test-user/cli-moe", "v1")
    assert "pushed" in capsys.readouterr().out
    fast_client_retries(monkeypatch)
    hub_server.fail_next("commit", times=1000)  # more than the client retries
    with pytest.raises(SystemExit, match=f"error: .*{folder.name}"):
        main(["push", str(folder), "test-user/cli-flaky"])
