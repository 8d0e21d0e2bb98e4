"""transformers.Trainer on a tiny model, as the tests run it: a list dataset, the arguments (CPU, no reports, no saves,
a loss logged each step), the logged losses, and one accumulated step."""

from conftest import tiny_model
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments


class ListDataset(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def training_args(tmp_path, **overrides) -> TrainingArguments:
    fields = dict(
        output_dir=str(tmp_path),
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        seed=0,
        dataloader_num_workers=0,
    )
    fields.update(overrides)
    return TrainingArguments(**fields)


def logged_losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def accumulation_run(tmp_path, data, batch_size, accumulation, make_model=lambda: tiny_model(seed=1)):
    args = training_args(
        tmp_path / f"bs{batch_size}",
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        optim="sgd",
        learning_rate=0.5,
        max_grad_norm=0.0,  # no clipping: compare raw gradients
        train_sampling_strategy="sequential",
    )
    trainer = Trainer(model=make_model().train(), args=args, train_dataset=data)
    trainer.train()
    return trainer.model, logged_losses(trainer)
