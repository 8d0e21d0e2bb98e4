"""TRL post-trains hf_tfm decoders with its defaults: SFTTrainer (plain and with a LoRA `peft_config`), DPOTrainer and
GRPOTrainer run on a dense and an MoE hf_tfm decoder and log the losses of the transformers reference class holding
the same weights (LlamaForCausalLM, MixtralForCausalLM), step for step.

A dense hf_tfm model looks dense to TRL: its config's `router_aux_loss_coef` is 0.0 (TRL reads a non-zero coefficient
as a Mixture-of-Experts model and asks it for router logits), an MoE one keeps Mixtral's convention. Only what a tiny
CPU run needs is set (steps, batch, lengths, the CPU, no reporting); everything else is each trainer's default.
"""

import pytest
import torch
from conftest import perturb
from support.trainer import logged_losses

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
from peft import LoraConfig  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
)

from hf_tfm.convert import to_tfm  # noqa: E402
from hf_tfm.convert.record import TINY_DECODER  # noqa: E402
from hf_tfm.training.tokenizers import train_tokenizer  # noqa: E402

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "a stitch in time saves nine",
    "all that glitters is not gold",
    "where there is smoke there is fire",
] * 8
VOCAB = 320
# the trained tokenizer's ids: end of text 0, padding 1, no start token
SHAPE = dict(
    TINY_DECODER, vocab_size=VOCAB, max_position_embeddings=128, bos_token_id=None, eos_token_id=0, pad_token_id=1
)
REFERENCES = {
    "dense": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE)),
    "moe": lambda: MixtralForCausalLM(MixtralConfig(**SHAPE, num_local_experts=4, num_experts_per_tok=2)),
}
STEPS = 4
RTOL = 1e-3  # fp32 on both sides; AdamW turns rounding-sized gradient differences into small weight differences


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = train_tokenizer(TEXTS, "bpe", vocab_size=300)
    assert len(tokenizer) <= VOCAB
    return tokenizer


def pair(kind: str, folder=None):
    """The reference with perturbed random weights and hf_tfm's conversion; with `folder`, both saved and loaded back
    (DPO builds its frozen reference model from the policy's `name_or_path`, as it would for a published model)."""
    torch.manual_seed(0)
    reference = perturb(REFERENCES[kind](), scale=0.05)
    models = {"reference": reference, "ours": to_tfm(reference)}
    if folder is None:
        return models
    for side, model in models.items():
        model.save_pretrained(folder / side)
    return {side: AutoModelForCausalLM.from_pretrained(folder / side) for side in models}


def common(tmp_path, name: str) -> dict:
    return dict(
        output_dir=str(tmp_path / name),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        save_strategy="no",
    )


def trained_losses(trainer) -> list[float]:
    trainer.train()
    return logged_losses(trainer)


def run_both(kind: str, build, folder=None) -> dict:
    return {side: trained_losses(build(model)) for side, model in pair(kind, folder).items()}


def assert_same_losses(losses: dict) -> None:
    assert len(losses["ours"]) == len(losses["reference"]) == STEPS
    torch.testing.assert_close(losses["ours"], losses["reference"], rtol=RTOL, atol=1e-5)


def test_a_dense_model_looks_dense_and_an_moe_model_does_not():
    dense, moe = pair("dense")["ours"], pair("moe")["ours"]
    assert dense.config.router_aux_loss_coef == 0.0 and dense.config.num_experts == 0
    assert moe.config.router_aux_loss_coef == MixtralConfig().router_aux_loss_coef


@pytest.mark.parametrize("kind", REFERENCES)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sft_trains_as_the_reference(tmp_path, tokenizer, kind, lora):
    dataset = datasets.Dataset.from_dict({"text": TEXTS})
    peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"]) if lora else None

    def build(model):
        arguments = trl.SFTConfig(**common(tmp_path, f"sft-{kind}-{lora}"), max_length=32)
        return trl.SFTTrainer(
            model=model, args=arguments, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config
        )

    assert_same_losses(run_both(kind, build))


@pytest.mark.parametrize("kind", REFERENCES)
def test_dpo_trains_as_the_reference(tmp_path, tokenizer, kind):
    dataset = datasets.Dataset.from_dict(
        {
            "prompt": [text[:12] for text in TEXTS],
            "chosen": [text[12:] for text in TEXTS],
            "rejected": [text[::-1][:20] for text in TEXTS],
        }
    )

    def build(model):
        arguments = trl.DPOConfig(**common(tmp_path, f"dpo-{kind}"), max_length=48)
        return trl.DPOTrainer(model=model, args=arguments, train_dataset=dataset, processing_class=tokenizer)

    assert_same_losses(run_both(kind, build, tmp_path / "models"))


@pytest.mark.parametrize("kind", REFERENCES)
def test_grpo_trains_as_the_reference(tmp_path, tokenizer, kind):
    dataset = datasets.Dataset.from_dict({"prompt": [text[:10] for text in TEXTS]})

    def reward_length(completions, **kwargs):  # any deterministic reward of the completions
        return [float(len(completion)) / 10 for completion in completions]

    def build(model):
        arguments = trl.GRPOConfig(**common(tmp_path, f"grpo-{kind}"), num_generations=4, max_completion_length=8)
        return trl.GRPOTrainer(
            model=model, reward_funcs=reward_length, args=arguments, train_dataset=dataset, processing_class=tokenizer
        )

    assert_same_losses(run_both(kind, build))


def test_the_control_a_dense_model_claiming_a_router_loss_stops_sft(tmp_path, tokenizer):
    """What the old default did (router_aux_loss_coef=0.001 on every config): TRL takes the model for an MoE model
    and its first step fails on the router logits a dense model does not have."""
    model = pair("dense")["ours"]
    model.config.router_aux_loss_coef = 0.001
    arguments = trl.SFTConfig(**common(tmp_path, "control"), max_length=32)
    dataset = datasets.Dataset.from_dict({"text": TEXTS})
    trainer = trl.SFTTrainer(model=model, args=arguments, train_dataset=dataset, processing_class=tokenizer)
    with pytest.raises((IndexError, TypeError, ValueError)):
        trainer.train()
