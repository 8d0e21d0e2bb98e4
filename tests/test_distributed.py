"""Distributed training on CPU through `accelerate launch`, and the accelerate configs in configs/accelerate/.

`accelerate launch --num_processes 2` (the DDP config, gloo on CPU) trains a tiny decoder with
examples/train_causal_lm.py for a fixed number of steps at 2 processes x batch B; a plain one-process run trains
the same model at batch 2B. The two runs must see the same samples at every step, which follows from the sampler
code rather than from luck:

- Trainer's RandomSampler is replaced by accelerate's SeedableRandomSampler in *both* runs (use_seedable_sampler is
  on by default): the permutation comes from a generator seeded with `seed + epoch`, the same in every process.
- One process batches that permutation into [p0..p2B-1], [p2B..p4B-1], ...; with two processes, BatchSamplerShard
  (split_batches=False) hands the B-sized batches out alternately, so at step k process 0 gets p[2kB : 2kB+B] and
  process 1 gets p[2kB+B : 2kB+2B]: together the one-process batch of step k. The dataset is far longer than
  steps x 2B, so no epoch wraps.
- The blocks are all --max-length tokens (no padding), the model has no dropout and both runs start from the same
  --seed. Trainer counts the tokens of the global batch (average_tokens_across_devices) and scales each process's
  loss by the number of processes; DDP averages the gradients: the same mean over the same 2B x T tokens.

So the runs differ only by float32 summation order (two half-batch sums plus a gloo all-reduce against one sum).
Tolerance: relative 1e-5 on every logged loss, absolute 1e-5 on every final parameter and on the logits of the
saved checkpoints. Measured here: losses within 8e-8 relative (5e-7 absolute), parameters within 4e-7, logits
within 2e-7. A run that is not really distributed (each process training alone on batch B, as a CPU launch without
`use_cpu` silently does) is off by 8e-4 relative at the first step and 1e-2 by the third.

FSDP on CPU: torch's FSDP2 (`fully_shard`) runs on CPU with gloo, but accelerate 1.15 keeps the FSDP plugin only for
GPU-like distributed types (MULTI_GPU, MULTI_XPU, ...): a CPU launch with configs/accelerate/fsdp.yaml is
MULTI_CPU and trains as DDP. tests/test_fsdp.py proves FSDP2 on CPU without accelerate (transformers'
`distributed_config` under Trainer, and plain torch with a sharded checkpoint), and checks that this fallback still
holds.
"""

import json
import os
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType
from conftest import seq2seq, tiny_model
from support.processes import run_process_group
from transformers import AutoModelForCausalLM

import hf_tfm  # noqa: F401  (registers the tfm model types)
from hf_tfm.model.modeling_tfm_stack import TfmBlock

# one xdist worker runs this module, so its module-scoped fixture runs once
pytestmark = [pytest.mark.xdist_group("distributed")]

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs" / "accelerate"
SCRIPT = REPO / "examples" / "train_causal_lm.py"
STEPS, BATCH = 6, 2  # per process; the one-process run takes 2 * BATCH
TINY = [
    *("--max-files", "60", "--max-steps", str(STEPS), "--logging-steps", "1", "--seed", "3"),
    *("--hidden-size", "32", "--num-layers", "2", "--max-length", "32"),
    *("--vocab-size", "400", "--max-eval-samples", "8"),
]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--mixed_precision", "no"]
LOSS_RTOL, PARAMETER_ATOL, LOGITS_ATOL = 1e-5, 1e-5, 1e-5


def train(output: Path, launcher: list[str], batch: int) -> str:
    command = [*launcher, str(SCRIPT), *TINY, "--batch-size", str(batch), "--output-dir", str(output)]
    result = run_process_group(command, cwd=REPO, env=ENV, timeout=600)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result.stdout


def logged_losses(output: Path) -> list[float]:
    history = json.loads((output / "trainer_state.json").read_text())["log_history"]
    return [entry["loss"] for entry in history if "loss" in entry]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("one-process") / "out"
    train(output, [sys.executable], batch=2 * BATCH)
    return output


def assert_same_training(reference: Path, output: Path) -> None:
    expected, actual = logged_losses(reference), logged_losses(output)
    assert len(expected) == len(actual) == STEPS
    assert actual == pytest.approx(expected, rel=LOSS_RTOL, abs=0)
    one, two = AutoModelForCausalLM.from_pretrained(reference), AutoModelForCausalLM.from_pretrained(output)
    assert type(two).__name__ == "TfmDecoderForCausalLM"
    expected_state, state = one.state_dict(), two.state_dict()
    assert sorted(state) == sorted(expected_state)
    for name, tensor in expected_state.items():
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=PARAMETER_ATOL, msg=name)
    inputs = torch.randint(0, one.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(two(inputs).logits, one(inputs).logits, rtol=0, atol=LOGITS_ATOL)


@pytest.mark.slow
def test_ddp_two_processes_match_one_process_with_the_same_global_batch(one_process, tmp_path):
    output = tmp_path / "out"
    launcher = [*LAUNCH, "--config_file", str(CONFIGS / "multi_gpu_ddp.yaml"), "--main_process_port", "0"]
    printed = train(output, launcher, batch=BATCH)
    # a real process group, not two processes each training alone
    assert "process 1/2: DistributedType.MULTI_CPU" in printed and "process 2/2: DistributedType.MULTI_CPU" in printed
    assert_same_training(one_process, output)


SHARDED = {  # config -> the distributed type its processes must report
    "fsdp.yaml": DistributedType.FSDP,
    "deepspeed_zero2.yaml": DistributedType.DEEPSPEED,
    "deepspeed_zero3.yaml": DistributedType.DEEPSPEED,
}


@pytest.mark.parametrize("name", sorted(SHARDED))
@pytest.mark.slow
def test_sharded_configs_two_gpus_match_one_process(name, request, tmp_path):
    """The GPU proof of the FSDP and DeepSpeed configs (configs/accelerate/README.md): on the CPU, accelerate
    1.15 runs fsdp.yaml as DDP and DeepSpeed not data-parallel at all. Unlike the DDP run, the one-process run is on
    GPU 0."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs: accelerate 1.15 shards with FSDP or DeepSpeed only on GPU-like devices")
    if name.startswith("deepspeed"):
        pytest.importorskip("deepspeed", reason="pip install deepspeed")
    output = tmp_path / "out"
    launcher = [*LAUNCH, "--config_file", str(CONFIGS / name), "--main_process_port", "0"]
    printed = train(output, launcher, batch=BATCH)
    assert f"process 1/2: {SHARDED[name]}" in printed and f"process 2/2: {SHARDED[name]}" in printed
    # the final save is a full state dict (examples/common.py), sharded checkpoints notwithstanding
    assert_same_training(request.getfixturevalue("one_process"), output)


# --- the accelerate configs: what `accelerate launch --config_file X` makes of each -----------------------------

EXPECTED = {
    "single_gpu.yaml": {"distributed_type": DistributedType.NO, "num_processes": 1},
    "multi_gpu_ddp.yaml": {"distributed_type": DistributedType.MULTI_GPU, "num_processes": 2},
    "fsdp.yaml": {"distributed_type": DistributedType.FSDP, "num_processes": 2},
    "deepspeed_zero2.yaml": {"distributed_type": DistributedType.DEEPSPEED, "num_processes": 2},
    "deepspeed_zero3.yaml": {"distributed_type": DistributedType.DEEPSPEED, "num_processes": 2},
}
FSDP_CONFIG = {
    "fsdp_version": 2,
    "fsdp_reshard_after_forward": True,  # FSDP2's FULL_SHARD
    "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    "fsdp_offload_params": False,
}


def launch_args(name: str):
    args = launch_command_parser().parse_args(["--config_file", str(CONFIGS / name), str(SCRIPT)])
    return _validate_launch_command(args)[0]


def test_every_config_is_documented_and_tested():
    assert sorted(path.name for path in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)
    readme = (CONFIGS / "README.md").read_text()
    for name in EXPECTED:
        assert f"accelerate launch --config_file configs/accelerate/{name}" in readme, name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_loads_with_accelerate_and_launches_as_intended(name):
    config = load_config_from_file(str(CONFIGS / name))
    assert isinstance(config, ClusterConfig)
    for field, value in EXPECTED[name].items():
        assert getattr(config, field) == value, field
    assert (config.mixed_precision, config.use_cpu, config.num_machines) == ("bf16", False, 1)
    args = launch_args(name)  # the launcher's reading of the file: which launcher, how many processes
    assert args.num_processes == EXPECTED[name]["num_processes"]
    assert args.multi_gpu == (name == "multi_gpu_ddp.yaml")
    assert args.use_fsdp == (name == "fsdp.yaml")
    assert args.use_deepspeed == name.startswith("deepspeed")
    assert args.mixed_precision == "bf16"


def test_fsdp_config_fully_shards_our_blocks_with_sharded_checkpoints(monkeypatch):
    config = load_config_from_file(str(CONFIGS / "fsdp.yaml"))
    assert {key: config.fsdp_config[key] for key in FSDP_CONFIG} == FSDP_CONFIG
    assert "fsdp_transformer_layer_cls_to_wrap" not in config.fsdp_config  # the model names its block class
    # the plugin that the launched processes build from the launcher's environment, applied to one of our models
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    for key, value in prepare_multi_gpu_env(launch_args("fsdp.yaml")).items():
        if key.startswith(("FSDP_", "ACCELERATE_USE_FSDP")):
            monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert "SHARDED_STATE_DICT" in str(plugin.state_dict_type)
    plugin.set_auto_wrap_policy(tiny_model())  # raises if no module of the model is of a class it names
    assert plugin.auto_wrap_policy.keywords["transformer_layer_cls"] == {TfmBlock}


@pytest.mark.parametrize(
    "build",
    [
        partial(tiny_model, norm_position="pre"),
        partial(tiny_model, norm_position="sandwich"),
        partial(tiny_model, norm_position="post"),
        partial(tiny_model, parallel_residual=True),
        partial(seq2seq, norm_position="post"),
    ],
    ids=["pre", "sandwich", "post", "parallel", "encoder-decoder"],
)
def test_fsdp_wraps_the_block_class_a_model_is_built_of(build, monkeypatch):
    """accelerate's transformer-based wrap policy (fsdp.yaml's, and Trainer's `fsdp="full_shard auto_wrap"` without
    class names) and PEFT's look up every class name in the model's `_no_split_modules` and refuse one the model
    lacks: each model names the one block class it holds, for every placement and paradigm."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    for key, value in {"ACCELERATE_USE_FSDP": "true", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP"}.items():
        monkeypatch.setenv(key, value)
    model = build()
    blocks = {type(module) for module in model.modules() if isinstance(module, TfmBlock)}
    assert len(blocks) == 1 and set(model._no_split_modules) == {block.__name__ for block in blocks}
    plugin = FullyShardedDataParallelPlugin()
    plugin.set_auto_wrap_policy(model)
    assert plugin.auto_wrap_policy.keywords["transformer_layer_cls"] == blocks
    # PEFT's policy for a LoRA model under FSDP reads the same list
    from peft import LoraConfig, get_peft_model
    from peft.utils.other import fsdp_auto_wrap_policy

    peft_policy = fsdp_auto_wrap_policy(get_peft_model(model, LoraConfig(target_modules=["q_proj", "v_proj"])))
    assert blocks <= peft_policy.keywords["policies"][1].keywords["transformer_layer_cls"]


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_configs(stage):
    """DeepSpeed is not a dependency, and under accelerate it does not run data-parallel on CPU (README of the
    configs): only what the file says is checked."""
    config = load_config_from_file(str(CONFIGS / f"deepspeed_zero{stage}.yaml"))
    ds = config.deepspeed_config
    assert ds["zero_stage"] == stage
    assert (ds["offload_optimizer_device"], ds["offload_param_device"]) == ("none", "none")
    assert "gradient_accumulation_steps" not in ds  # "auto": Trainer's --gradient_accumulation_steps decides
    if stage == 3:
        assert ds["zero3_save_16bit_model"] is True and ds["zero3_init_flag"] is True
