"""`hf-tfm train` at tiny sizes: a fresh tiny model's config file per paradigm and a run spec per task."""

import json
from pathlib import Path

from hf_tfm.training.run import RunSpec

TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 64,
}

PARADIGM_FOR_TASK = {
    "causal-lm": "tfm_decoder",
    "masked-lm": "tfm_encoder",
    "seq2seq": "tfm_encoder_decoder",
    "sequence-classification": "tfm_encoder",
    "token-classification": "tfm_encoder",
}


def tiny_config_file(folder: Path, model_type: str, **overrides) -> str:
    """A config.json for a fresh tiny model (vocabulary and special tokens come from the run's tokenizer)."""
    folder.mkdir(parents=True, exist_ok=True)
    fields = {"model_type": model_type, **TINY, "max_position_embeddings": 128, **overrides}
    if model_type == "tfm_encoder_decoder":
        fields["decoder_layers"] = 1
    path = folder / f"{model_type}.json"
    path.write_text(json.dumps(fields))
    return str(path)


def tiny_spec(tmp_path: Path, task: str, **overrides) -> RunSpec:
    fields = {
        "task": task,
        "model": tiny_config_file(tmp_path / "configs", PARADIGM_FOR_TASK[task]),
        "output_dir": str(tmp_path / task),
        "max_files": 40,
        "vocab_size": 300,
        "max_length": 32,
        "max_steps": 6,
        "batch_size": 4,
        "save_steps": 2,
        "eval_steps": 3,
        "logging_steps": 1,
        "max_eval_samples": 8,
        "learning_rate": 3e-3,
        "use_cpu": True,
    }
    fields.update(overrides)
    return RunSpec(**fields)
