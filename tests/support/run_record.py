"""A run record (`hf_tfm_run.json`) as `hf-tfm train` writes one: what the model-card tests read."""

RECORD = {
    "task": "causal-lm",
    "dataset": "python-stdlib-docstrings",
    "training": {"max_steps": 600, "learning_rate": 0.003, "per_device_train_batch_size": 16, "seed": 0},
    "results": [
        {"split": "validation", "metric": "loss", "value": 4.88},
        {"split": "validation", "metric": "perplexity", "value": 131.63},
    ],
    "baselines": [{"name": "uniform over the vocabulary", "metric": "perplexity", "value": 292.0}],
    "description": "600 optimizer steps of `Trainer`.",
}
