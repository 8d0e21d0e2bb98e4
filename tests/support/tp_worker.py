"""The multi-process half of tests/test_tensor_parallel.py, which runs it once as

    torchrun --standalone --nproc_per_node 2 tests/support/tp_worker.py RUNS_DIR

RUNS_DIR holds one saved model per case and `runs.json`: run name -> the case's folder, its Auto class and
paradigm, the `from_pretrained` arguments that distribute it, and the checks that apply. Every rank loads the model
twice: plainly (the one-process reference, computed on every rank) and distributed by transformers from the plans
hf_tfm declares, over gloo on the CPU. It measures in float32 the largest difference of the logits, whether greedy
generate() gives the same tokens, for one training step the loss, every gradient and every parameter after an SGD
step (sharded ones gathered), and what save_pretrained writes. SGD, not Adam: Adam's first step is about
lr * sign(gradient), blind to a gradient off by a constant factor. Each rank writes RUNS_DIR/rank<N>.json; a run
that raises is recorded with its traceback, and the next one still runs.
"""

import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch.distributed.tensor import DTensor

import hf_tfm  # noqa: F401  (registers the tfm model types)

SEQUENCE, NEW_TOKENS, LEARNING_RATE = 8, 6, 0.5


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor, gathered from every rank when it is sharded."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def largest_difference(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (full(actual).detach().double() - expected.detach().double()).abs().max().item()


def sharded_parameters(model) -> dict[str, str]:
    """The parameters held in slices across ranks (layer numbers written `*`), with their placements."""
    sharded = {}
    for name, parameter in model.named_parameters():
        if isinstance(parameter, DTensor) and not all(p.is_replicate() for p in parameter.placements):
            sharded[".".join("*" if part.isdigit() else part for part in name.split("."))] = str(parameter.placements)
    return dict(sorted(sharded.items()))


def make_inputs(model, paradigm: str) -> tuple[dict, torch.Tensor]:
    """A batch of two rows, one padded, and its labels (padding unscored). An encoder-decoder's inputs include the
    decoder's (the labels shifted right), which generate() does without."""
    config = model.config
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, config.vocab_size, (2, SEQUENCE), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    if paradigm == "decoder":  # left padding, as generate() wants it
        attention_mask[1, :2] = 0
    else:
        attention_mask[1, -2:] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, config.pad_token_id)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    if paradigm == "encoder":  # masked LM: about half the real tokens scored
        labels = labels.masked_fill(torch.rand(labels.shape, generator=generator) < 0.5, -100)
    if paradigm == "encoder_decoder":
        labels = torch.randint(3, config.vocab_size, (2, SEQUENCE - 2), generator=generator)
        inputs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels)
    return inputs, labels


def distributed_arguments(spec: dict) -> dict:
    """`tp_plan="auto"` as it is (transformers' older spelling), anything else as a `DistributedConfig`."""
    if "tp_plan" in spec and spec["tp_plan"] == "auto":
        return spec
    from transformers.distributed import DistributedConfig

    return {"distributed_config": DistributedConfig(**spec)}


def run(folder: Path, spec: dict) -> dict:
    auto_class = getattr(transformers, spec["auto_class"])
    reference = auto_class.from_pretrained(folder)
    model = auto_class.from_pretrained(folder, **distributed_arguments(spec["distributed"]))
    result = {
        "sharded": sharded_parameters(model),
        "tp_size": model.tp_size,
        # pipeline parallelism: the modules of other stages are replaced by placeholders
        "placeholders": sum(type(module).__name__ == "PipelineIdentityLayer" for module in model.modules()),
    }
    inputs, labels = make_inputs(reference, spec["paradigm"])

    with torch.no_grad():
        result["logits"] = largest_difference(model(**inputs).logits, reference(**inputs).logits)

    if "generate" in spec["checks"]:
        prompt = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
        options = {"max_new_tokens": NEW_TOKENS, "do_sample": False}
        expected = reference.generate(**prompt, **options)
        tokens = model.generate(**prompt, **options)
        result["same_tokens"] = torch.equal(tokens, expected)
        result["tokens"] = tokens.tolist()

    if "train" in spec["checks"]:
        result.update(training_step(reference, model, inputs, labels))
    if "save" in spec["checks"]:
        result["saved"] = saved_and_reloaded(model, folder.parent / f"{folder.name}-saved-from-shards")
    return result


def saved_and_reloaded(model, directory: Path) -> float:
    """save_pretrained from every rank (transformers gathers the shards, rank 0 writes), then a plain load: the
    largest difference of its tensors from the distributed model's, gathered."""
    model.save_pretrained(directory)
    dist.barrier()  # rank 0 may still be moving the staged folder into place
    reloaded = type(model).from_pretrained(directory).state_dict()
    return max(largest_difference(tensor, reloaded[name]) for name, tensor in model.state_dict().items())


def training_step(reference, model, inputs: dict, labels: torch.Tensor) -> dict[str, float]:
    """The largest differences of the loss, of the gradients and of the parameters after one SGD step."""
    losses = []
    for each in (reference, model):
        each.train()
        loss = each(**inputs, labels=labels).loss
        loss.backward()
        losses.append(loss)
    expected = dict(reference.named_parameters())
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]  # BART's frozen final bias
    gradients = max(largest_difference(parameter.grad, expected[name].grad) for name, parameter in named)
    for each in (reference, model):
        torch.optim.SGD(each.parameters(), lr=LEARNING_RATE).step()
    parameters = max(largest_difference(parameter, expected[name]) for name, parameter in named)
    return {"loss": largest_difference(losses[1], losses[0]), "gradients": gradients, "parameters": parameters}


def main(runs_dir: Path) -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)  # tp_plan= in from_pretrained: kept, but deprecated
    runs = json.loads((runs_dir / "runs.json").read_text())
    results = {}
    for name, spec in runs.items():
        start = time.perf_counter()
        try:
            results[name] = run(runs_dir / spec["folder"], spec)
        except Exception:  # recorded for the test to show; the other runs still go (a rank that waits on the one
            # that failed shows where in the launcher's output)
            results[name] = {"error": traceback.format_exc()}
            print(f"rank {os.environ['RANK']}, run {name}:\n{results[name]['error']}", file=sys.stderr, flush=True)
        results[name]["seconds"] = round(time.perf_counter() - start, 2)
    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    output = runs_dir / f"rank{os.environ['RANK']}.json"
    output.write_text(json.dumps({"versions": versions, "runs": results}, indent=1))
    if dist.is_initialized():  # transformers started the process group with the first distributed load
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
