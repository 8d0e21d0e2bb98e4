"""The `hf-tfm` command, the main job, the presets and the embedded corpus."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from conftest import VOCAB, assert_same_state_dict, perturb
from support.families import skip_where_the_reference_is_not_its_family
from support.minilm import minilm_dir
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    GPT2Config,
    GPT2Model,
)

from hf_tfm import TfmDecoderForCausalLM, preset_config, preset_names
from hf_tfm.convert import config_from_tfm
from hf_tfm.convert.families import FAMILIES, PARADIGMS, families_table
from hf_tfm.model.modeling_tfm_loading import AUTO_CLASSES
from hf_tfm.training.checkpoints import load_saved
from hf_tfm.training.corpus import stdlib_docstrings
from hf_tfm_cli import EXAMPLES, TASKS, RunSpec, build_parser, spec_from_args
from hf_tfm_cli.entry import main

REPO = Path(__file__).resolve().parents[1]


# a reference family's default config with every size below shrunk to a tiny one (where the family has the field)
TINY_SIZES = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model"), 32),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers"), 2),
    "num_decoder_layers": 2,
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads"), 4),
    **dict.fromkeys(("encoder_attention_heads", "decoder_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_experts_per_tok"), 2),
    **dict.fromkeys(("head_dim", "d_kv"), 8),
    **dict.fromkeys(("intermediate_size", "d_ff", "encoder_ffn_dim", "decoder_ffn_dim"), 64),
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24,
    # DeepSeek-V3's latent attention and routing
    **dict(kv_lora_rank=16, q_lora_rank=12, qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5),
    **dict(n_routed_experts=8, n_group=2, topk_group=1, first_k_dense_replace=1),
    **dict.fromkeys(("num_experts", "num_local_experts"), 4),
    **dict.fromkeys(("max_position_embeddings", "n_positions"), 64),
    "vocab_size": VOCAB,
}


def tiny_reference(record, reference: str):
    """`reference` (a transformers class of `record`'s family) built from the family's default config, shrunk:
    what a published checkpoint of the family looks like, at a size that runs in milliseconds."""
    import transformers

    skip_where_the_reference_is_not_its_family(record.name)
    defaults = AutoConfig.for_model(record.name).to_dict()
    fields = {key: value for key, value in TINY_SIZES.items() if defaults.get(key) is not None}
    ids = {key: value for key, value in defaults.items() if key.endswith("token_id") and isinstance(value, int)}
    large = sorted({value for value in ids.values() if value >= VOCAB})
    small = {value: VOCAB - 1 - i for i, value in enumerate(large)}  # equal ids stay equal (ModernBERT's cls, bos)
    fields |= {key: small[value] for key, value in ids.items() if value in small}
    if reference.endswith("ForSequenceClassification") and fields.get("pad_token_id", ids.get("pad_token_id")) is None:
        fields["pad_token_id"] = 0  # a batch's rows end at their last non-padding token: a classifier needs the id
    if defaults.get("num_experts_per_tok", 0) is None:  # DeepSeek-V2's default leaves top-k unset
        fields["num_experts_per_tok"] = 2
    if "kv_lora_rank" in fields:  # latent attention: every head's keys expanded, head_dim the rotary width
        fields |= dict(num_key_value_heads=fields["num_attention_heads"], head_dim=fields["qk_rope_head_dim"])
    torch.manual_seed(0)
    config = AutoConfig.for_model(record.name, **fields)
    return perturb(getattr(transformers, reference)(config))


def _outputs(model, ids):
    decoder = {"decoder_input_ids": ids[:, :5]} if model.config.is_encoder_decoder else {}
    with torch.no_grad():
        output = model(ids, **decoder)
    if hasattr(output, "start_logits"):  # question answering
        return torch.stack([output.start_logits, output.end_logits])
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


FAMILY_CLASSES = [
    pytest.param(record, reference, id=reference) for record in FAMILIES.values() for reference in record.classes
]


@pytest.mark.parametrize("record, reference", FAMILY_CLASSES)
def test_convert_command_round_trip_every_family(tmp_path, record, reference):
    """`hf-tfm convert` turns a saved checkpoint of every family in its table into hf_tfm and back: the saved hf_tfm
    model computes the reference outputs, and the folder converted back holds the same class and state dict."""
    original = tiny_reference(record, reference)
    original.save_pretrained(tmp_path / record.name)
    main(["convert", str(tmp_path / record.name), str(tmp_path / "tfm")])
    main(["convert", str(tmp_path / "tfm"), str(tmp_path / "back"), "--to", record.name])
    ours, back = load_saved(tmp_path / "tfm"), load_saved(tmp_path / "back", type(original))  # its class, named
    converted_classes = {name for model_type in record.model_types() for name in PARADIGMS[model_type].classes}
    assert type(ours).__name__ in converted_classes and type(back) is type(original)
    assert_same_state_dict(back.state_dict(), original.state_dict())
    ids = torch.randint(3, VOCAB, (2, 8))
    expected = _outputs(original, ids)
    assert expected.abs().max() > 100 * 1e-4  # not vacuous
    torch.testing.assert_close(_outputs(ours, ids), expected, rtol=0, atol=1e-4)


PRESET_FAMILIES = [
    (preset, FAMILIES[family])
    for preset in preset_names()
    if (family := preset.rsplit("-", 1)[0].replace("-", "_")) in FAMILIES
]


@pytest.mark.parametrize("preset, record", PRESET_FAMILIES, ids=[preset for preset, _ in PRESET_FAMILIES])
def test_presets_named_after_a_family_convert_to_it(preset, record):
    """`llama-1.3m`, `qwen3-moe-2.9m`...: a preset named after a family is that family's architecture (fields its
    own model never reads, such as a dense width beside experts, do not block it)."""
    preset_fields = preset_config(preset)
    family = config_from_tfm(preset_fields, record.name)
    assert type(family) in {getattr(transformers, name).config_class for name in record.classes}
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        assert family.get_text_config().to_dict().get(field, getattr(family, field, None)) == getattr(
            preset_fields, field
        ), field


def test_convert_command_keeps_the_tokenizer(tmp_path):
    """The real pretrained MiniLM folder (a BertModel) converts with its tokenizer, and back to the same weights."""
    source = minilm_dir()
    main(["convert", str(source), str(tmp_path / "tfm")])
    main(["convert", str(tmp_path / "tfm"), str(tmp_path / "back"), "--to", "bert"])
    original, back = AutoModel.from_pretrained(source), AutoModel.from_pretrained(tmp_path / "back")
    assert type(back) is type(original)
    assert_same_state_dict(back.state_dict(), original.state_dict())
    assert (tmp_path / "tfm" / "tokenizer.json").is_file()  # the tokenizer travels with the weights


def test_convert_command_names_the_problem(tmp_path):
    with pytest.raises(SystemExit, match="config.json not found"):
        main(["convert", str(tmp_path / "missing"), str(tmp_path / "out")])
    TfmDecoderForCausalLM(
        AutoConfig.for_model(
            "tfm_decoder", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4
        )
    ).save_pretrained(tmp_path / "tfm")
    decoders = " | ".join(name for name, record in FAMILIES.items() if record.paradigm == "tfm_decoder")
    with pytest.raises(SystemExit, match=f"with --to None: a tfm_decoder model converts back with --to {decoders}$"):
        main(["convert", str(tmp_path / "tfm"), str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="model_type='tfm_decoder' with --to bert: .* --to gpt2 | llama"):
        main(["convert", str(tmp_path / "tfm"), str(tmp_path / "out"), "--to", "bert"])
    # a name the registry does not hold is refused by the command, with the registry's names (the parser keeps none)
    with pytest.raises(SystemExit, match=f"with --to llamma: a tfm_decoder model converts back with --to {decoders}$"):
        main(["convert", str(tmp_path / "tfm"), str(tmp_path / "out"), "--to", "llamma"])
    GPT2Model(GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=VOCAB)).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(SystemExit, match="model_type='gpt2' with --to llama: a gpt2 folder converts to hf_tfm"):
        main(["convert", str(tmp_path / "gpt2"), str(tmp_path / "out"), "--to", "llama"])
    with pytest.raises(
        SystemExit,
        match="holds a GPT2Model; the gpt2 converter takes GPT2LMHeadModel or GPT2ForSequenceClassification$",
    ):
        main(["convert", str(tmp_path / "gpt2"), str(tmp_path / "out")])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"model_type": "xlnet"}')
    with pytest.raises(SystemExit, match="model_type='xlnet' with --to None: SOURCE must hold an hf_tfm model or one"):
        main(["convert", str(tmp_path / "other"), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_every_command_the_parser_offers_runs_something():
    from hf_tfm.commands import COMMANDS

    assert set(COMMANDS) == set(build_parser()._subparsers._group_actions[0].choices)


def test_convert_table_is_the_registry():
    """One table: the registry. The torch-free parser keeps no copy of the family names (the command checks --to
    against the registry), and the conversion guide's table is the one the registry writes
    (`python -m hf_tfm.convert.families`)."""
    convert = build_parser()._subparsers._group_actions[0].choices["convert"]
    assert next(a for a in convert._actions if a.dest == "to").choices is None
    guide = (REPO / "docs" / "convert.md").read_text()
    assert families_table() in guide, (
        "docs/convert.md's converter table is not the registry's: python -m hf_tfm.convert.families"
    )
    assert f"--to {'|'.join(FAMILIES)}]" in guide


@pytest.mark.parametrize(
    "preset", sorted(p.name for p in (REPO / "configs").iterdir() if (p / "config.json").is_file())
)
def test_presets_load_and_build(preset):
    """Every preset builds its paradigm's generative or masked-LM head, and is shipped inside the package."""
    config = AutoConfig.from_pretrained(REPO / "configs" / preset)
    head = {
        "tfm_decoder": AutoModelForCausalLM,
        "tfm_encoder": AutoModelForMaskedLM,
        "tfm_encoder_decoder": AutoModelForSeq2SeqLM,
    }
    with torch.device("meta"):
        model = head[config.model_type].from_config(config)
    assert type(model).__name__ == AUTO_CLASSES[config.model_type][head[config.model_type].__name__]
    assert preset in preset_names()
    if preset == "gpt2-124m":  # GPT-2 small's shape, tied head: 124,439,808 parameters
        assert model.num_parameters() == 124_439_808


def test_corpus_is_deterministic_and_split_by_file():
    first, second = stdlib_docstrings(max_files=80), stdlib_docstrings(max_files=80)
    assert first == second
    assert first["train"] and first["validation"]
    assert not set(first["train"]) & set(first["validation"])


# ------------------------------------------------------------------------- the parser: torch-free, derived, checked

HEAVY = ("torch", "transformers", "datasets", "evaluate", "hf_tfm")
ENTRY_POINT_PROBE = """
import importlib, sys
module, function = sys.argv[1].split(":")
try:
    getattr(importlib.import_module(module), function)(sys.argv[2:])
except SystemExit as exit_:
    print("exit", exit_.code)
print("imported:", sorted(name for name in {heavy} if name in sys.modules))
"""


def _declared_entry_point() -> str:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["hf-tfm"]


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["train", "--task", "lm", "--max-steps", "-1"]])
def test_entry_point_answers_without_importing_torch(argv):
    """`hf-tfm --help` and argument errors never import torch, transformers, datasets or hf_tfm (seconds each)."""
    probe = ENTRY_POINT_PROBE.format(heavy=HEAVY)
    command = [sys.executable, "-c", probe, _declared_entry_point(), *argv]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120, check=True)
    assert "imported: []" in done.stdout, done.stdout[-500:]
    assert ("exit 0" if "--help" in argv else "exit 2") in done.stdout


def test_python_m_runs_the_cli():  # `accelerate launch -m hf_tfm_cli ...`
    done = subprocess.run(
        [sys.executable, "-m", "hf_tfm_cli", "train", "--help"], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert done.returncode == 0 and "examples:\n  hf-tfm train" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--task", "seq2seq", "--max-steps", "-1"], "argument --max-steps: must be an integer >= 1, got -1"),
        (["train", "--task", "seq2seq", "--max-steps", "0"], "argument --max-steps: must be an integer >= 1, got 0"),
        (["train", "--task", "seq2seq", "--max-length", "0"], "argument --max-length: must be an integer >= 2, got 0"),
        (
            ["train", "--task", "seq2seq", "--gradient-accumulation-steps", "0"],
            "argument --gradient-accumulation-steps: must be an integer >= 1, got 0",
        ),
        (["train", "--task", "seq2seq", "--warmup-ratio", "2"], r"--warmup-ratio: must be a number in \[0, 1\]"),
        (["train", "--task", "seq2seq", "--learning-rate", "nan"], "argument --learning-rate: must be a number >= 0"),
        (["train", "--task", "seq2seq", "--batch-size", "x"], "--batch-size: must be an integer >= 1, got 'x'"),
        (["evaluate", "m", "--max-files", "0"], "argument --max-files: must be an integer >= 1, got 0"),
        (["generate", "m", "p", "--num-beams", "0"], "argument --num-beams: must be an integer >= 1, got 0"),
        (["generate", "m", "p", "--top-p", "0"], r"argument --top-p: must be a number in \(0, 1\], got 0"),
        (["upcycle", "a", "b", "--num-experts", "0"], "argument --num-experts: must be an integer >= 2, got 0"),
        (["demo", "--scale", "0"], "argument --scale: must be a number > 0, got 0"),
    ],
)
def test_numbers_out_of_range_are_one_line_errors(capsys, argv, message):
    """Each bound is checked by the argument's own type, before anything is imported or run."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert re.search(message, capsys.readouterr().err.strip().splitlines()[-1])


def test_run_spec_checks_the_same_bounds():
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1, got 0"):
        RunSpec(task="causal-lm", max_steps=0)
    with pytest.raises(ValueError, match="unknown task 'lm'"):
        RunSpec(task="lm")


def test_train_parser_is_derived_from_run_spec():
    """Every RunSpec field on the command line has an option whose default is the field's default."""
    args = build_parser().parse_args(["train", "--task", "seq2seq"])
    assert spec_from_args(args) == RunSpec(task="seq2seq")
    args = build_parser().parse_args(
        [
            "train",
            "--task",
            "seq2seq",
            "--column",
            "source=q",
            "--set",
            "num_experts=4",
            "--set",
            "norm_type=rmsnorm",
            "--report-to",
            "tensorboard",
            "--bf16",
        ]
    )
    spec = spec_from_args(args)
    assert spec.columns == {"source": "q"} and spec.report_to == ["tensorboard"] and spec.bf16
    assert spec.config_overrides == {"num_experts": 4, "norm_type": "rmsnorm"}


def test_cli_tasks_are_the_training_tasks():
    from hf_tfm.training import tasks

    assert tuple(tasks.TASKS) == TASKS


def _example_lines(epilog: str) -> list[list[str]]:
    """Each example command of an epilog as argv for the hf-tfm parser (`accelerate launch ... -m hf_tfm_cli` too)."""
    commands = []
    for line in epilog.splitlines()[1:]:
        words = shlex.split(line, comments=True)
        if words[:1] == ["hf-tfm"]:
            commands.append(words[1:])
        elif "hf_tfm_cli" in words:
            commands.append(words[words.index("hf_tfm_cli") + 1 :])
    return commands


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_help_examples_parse_and_name_existing_paths(command):
    """Every example in a `--help` parses, and every repository path or preset it names exists."""
    epilog = EXAMPLES[command]
    examples = _example_lines(epilog)
    assert examples, f"{command} --help shows no example"
    for argv in examples:
        build_parser().parse_args(argv)  # an example that does not parse exits here
        if "--model" in argv and "/" not in argv[argv.index("--model") + 1]:
            assert argv[argv.index("--model") + 1] in preset_names(), argv
    shipped = {"examples", "benchmarks", "docs", "hf_tfm", "hf_tfm_cli", "tests", "configs", "model_cards"}
    for word in shlex.split(epilog, comments=True):  # runs/... are outputs, path/to/... placeholders
        if "/" in word and word.split("/")[0] in shipped:
            assert (REPO / word).exists(), f"{command} --help names {word}, which does not exist"


@pytest.mark.slow
def test_the_old_module_command_line_fails():
    """`python -m hf_tfm.cli train ...`, README's command line before hf_tfm_cli, must not exit 0 doing nothing: the
    module is gone (no shims: the package has no users of the old names), and Python says so."""
    result = subprocess.run(
        [sys.executable, "-m", "hf_tfm.cli", "train", "--help"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode != 0 and "No module named hf_tfm.cli" in result.stderr


def test_generate_shows_a_continuation_a_person_can_see():
    """`hf-tfm generate` prints each continuation on one line, its line breaks and tabs escaped, and the token ids
    beside one that decodes to blanks alone (which would otherwise print as nothing)."""
    from hf_tfm.training.generate import visible

    assert visible("def f():\n\treturn 1", [7]) == "def f():\\n\\treturn 1"
    assert visible("\n\n ", [5, 5, 6]) == "'\\n\\n ' (only blanks: token ids [5, 5, 6])"
