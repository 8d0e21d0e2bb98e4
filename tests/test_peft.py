"""LoRA with peft on every hf_tfm paradigm: what to target, a tiny fine-tune under Trainer, and the adapter's life
after training (save, reload with PeftModel and AutoPeftModel*, merge_and_unload, generation).

The module names every statement in docs/lora.md relies on are asserted here. peft's default `target_modules`
table is keyed by model_type and knows none of ours, so every LoraConfig names its targets explicitly.
"""

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import assert_same_state_dict, realigned, tiny_config
from peft import (
    AutoPeftModel,
    AutoPeftModelForCausalLM,
    AutoPeftModelForSeq2SeqLM,
    AutoPeftModelForSequenceClassification,
    LoraConfig,
    PeftModel,
    get_peft_model,
)
from peft.tuners.lora import LoraLayer
from safetensors import safe_open
from support.trainer import ListDataset, logged_losses, training_args
from transformers import Trainer

from hf_tfm import (
    TfmDecoderConfig,
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
    TfmEncoderForSequenceClassification,
)

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
FEED_FORWARD = ["up_proj", "down_proj"]  # plus "gate_proj" when ffn_type="glu"
EXPERTS = ["experts.gate_up_proj", "experts.down_proj"]  # fused 3-D parameters: target_parameters, not modules
MASK_ID = 3
# Weights at a pretrained model's scale: at the default 0.02 the frozen, tied embeddings keep every logit near zero
# and no adapter can move the loss far; at 0.2 a dozen LoRA steps cut it by more than half.
BASE = {"initializer_range": 0.2}


def causal_rows():
    pattern = torch.tensor([4, 5, 6, 7, 8, 9, 10, 11] * 2)
    return [{"input_ids": pattern, "labels": pattern.clone()} for _ in range(8)]


def masked_rows():
    rows = []
    for _ in range(8):
        ids = torch.arange(10, 26)
        labels = torch.full_like(ids, -100)
        masked = torch.tensor([2, 7, 11])
        labels[masked] = ids[masked]
        ids = ids.clone()
        ids[masked] = MASK_ID
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def classification_rows():
    torch.manual_seed(0)
    rows = []
    for i in range(8):
        label = i % 2
        ids = torch.randint(10, 50, (12,)) + 40 * label  # class 0 reads ids 10..49, class 1 ids 50..89
        rows.append({"input_ids": ids, "labels": torch.tensor(label)})
    return rows


def seq2seq_rows():
    source = torch.tensor([10, 11, 12, 13, 14, 15, 16, 17])
    return [{"input_ids": source, "labels": source.flip(0)} for _ in range(8)]


@dataclass
class Paradigm:
    name: str
    model_class: type
    config: object
    rows: object
    task_type: str | None
    auto_class: type
    target_modules: list[str]
    target_parameters: list[str] | None = None
    trainable_heads: list[str] = field(default_factory=list)  # submodules trained in full (modules_to_save)
    generation: tuple[list[int], list[int]] | None = None  # (prompt, what the fine-tuned adapter generates from it)

    def build(self, seed=0):
        torch.manual_seed(seed)
        # a config of its own: set_experts_implementation writes to the model's config, and a test that picks a
        # backend must not pick it for every model the paradigm builds after it
        return self.model_class(copy.deepcopy(self.config)).eval()

    def lora_config(self, **overrides):
        fields = {
            "r": 4,
            "lora_alpha": 8,
            "lora_dropout": 0.0,
            "task_type": self.task_type,
            "target_modules": self.target_modules,
            "target_parameters": self.target_parameters,
        }
        fields.update(overrides)
        return LoraConfig(**fields)


PARADIGMS = [
    Paradigm(
        "decoder",
        TfmDecoderForCausalLM,
        tiny_config(TfmDecoderConfig, **BASE),
        causal_rows,
        "CAUSAL_LM",
        AutoPeftModelForCausalLM,
        ATTENTION + FEED_FORWARD,
        generation=([4, 5, 6, 7, 8, 9], [4, 5, 6, 7, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9]),  # continues the pattern
    ),
    Paradigm(
        "masked_lm",
        TfmEncoderForMaskedLM,
        tiny_config(TfmEncoderConfig, **BASE),
        masked_rows,
        None,  # peft has no masked-LM task type: a plain PeftModel
        AutoPeftModel,
        ATTENTION + FEED_FORWARD,
    ),
    Paradigm(
        "sequence_classification",
        TfmEncoderForSequenceClassification,
        tiny_config(TfmEncoderConfig, num_labels=2, **BASE),
        classification_rows,
        "SEQ_CLS",  # peft adds "classifier" (and "score") to modules_to_save: the new head trains in full
        AutoPeftModelForSequenceClassification,
        ATTENTION,
        trainable_heads=["classifier"],
    ),
    Paradigm(
        "encoder_decoder",
        TfmEncoderDecoderForConditionalGeneration,
        tiny_config(TfmEncoderDecoderConfig, decoder_start_token_id=0, **BASE),
        seq2seq_rows,
        "SEQ_2_SEQ_LM",
        AutoPeftModelForSeq2SeqLM,
        ATTENTION + FEED_FORWARD,  # suffix match: self_attn (encoder and decoder) and cross_attn alike
        generation=(list(range(10, 18)), [0, *range(17, 9, -1)]),  # decoder start, then the source reversed
    ),
    Paradigm(
        "moe_decoder",
        TfmDecoderForCausalLM,
        tiny_config(TfmDecoderConfig, num_experts=4, **BASE),
        causal_rows,
        "CAUSAL_LM",
        AutoPeftModelForCausalLM,
        ATTENTION,
        target_parameters=EXPERTS,
        generation=([4, 5, 6, 7, 8, 9], [4, 5, 6, 7, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9]),
    ),
]
BY_NAME = {p.name: p for p in PARADIGMS}


def logits(model, paradigm: Paradigm) -> torch.Tensor:
    rows = paradigm.rows()
    batch = {"input_ids": torch.stack([r["input_ids"] for r in rows[:2]])}
    if paradigm.name == "encoder_decoder":
        batch["decoder_input_ids"] = torch.stack([r["labels"] for r in rows[:2]])
    with torch.no_grad():
        return model.eval()(**batch).logits


def base_weights(peft_model) -> dict[str, torch.Tensor]:
    """The frozen base model's tensors under their plain hf_tfm names (without LoRA factors and head copies)."""
    weights = {}
    for name, tensor in peft_model.get_base_model().state_dict().items():
        if "lora_" in name or "modules_to_save" in name:
            continue
        weights[name.replace(".base_layer", "").replace(".original_module", "")] = tensor
    return weights


@dataclass
class Trained:
    paradigm: Paradigm
    model: object  # the PeftModel after training
    losses: list[float]
    base_dir: Path
    adapter_dir: Path


@pytest.fixture(scope="module", params=[p.name for p in PARADIGMS])
def trained(request, tmp_path_factory) -> Trained:
    """Per paradigm: save a base model, wrap the reloaded base with LoRA, fine-tune it for a few Trainer steps, and
    save the adapter. Tests below inspect the result."""
    paradigm = BY_NAME[request.param]
    root = tmp_path_factory.mktemp(paradigm.name)
    paradigm.build().save_pretrained(root / "base")
    base = paradigm.model_class.from_pretrained(root / "base")  # name_or_path -> adapter's base_model_name_or_path
    model = get_peft_model(base, paradigm.lora_config())
    args = training_args(
        root / "trainer", per_device_train_batch_size=4, max_steps=12, learning_rate=2e-2, lr_scheduler_type="constant"
    )
    trainer = Trainer(model=model, args=args, train_dataset=ListDataset(paradigm.rows()))
    trainer.train()
    model.save_pretrained(root / "adapter")
    trainer.save_model(root / "trainer_save")  # Trainer recognises the PeftModel and saves the adapter alone
    return Trained(paradigm, model.eval(), logged_losses(trainer), root / "base", root / "adapter")


def test_no_default_target_modules():
    """peft's default target_modules table is keyed by model_type and has no hf_tfm entry: name the targets."""
    for paradigm in PARADIGMS:
        with pytest.raises(ValueError, match="Please specify `target_modules` or `target_parameters`"):
            get_peft_model(paradigm.build(), LoraConfig(task_type=paradigm.task_type))


def test_fused_experts_are_parameters_not_modules():
    """The experts are one module holding two 3-D parameters: target_modules cannot reach them."""
    paradigm = BY_NAME["moe_decoder"]
    with pytest.raises(ValueError, match="Target modules .*gate_up_proj.* not found in the base model"):
        get_peft_model(paradigm.build(), LoraConfig(target_modules=["gate_up_proj"]))


def test_lora_targets_every_named_module():
    """The names in docs/lora.md select exactly the projections they claim, per paradigm."""
    wrapped = {}
    for paradigm in PARADIGMS:
        model = get_peft_model(paradigm.build(), paradigm.lora_config())
        wrapped[paradigm.name] = sorted(
            name.removeprefix("base_model.model.") for name, m in model.named_modules() if isinstance(m, LoraLayer)
        )
    block = [f"self_attn.{n}" for n in ATTENTION]
    ffn = ["mlp.up_proj", "mlp.down_proj"]
    assert wrapped["decoder"] == sorted(f"model.layers.{i}.{n}" for i in range(2) for n in block + ffn)
    assert wrapped["masked_lm"] == wrapped["decoder"]
    assert wrapped["sequence_classification"] == sorted(f"model.layers.{i}.{n}" for i in range(2) for n in block)
    cross = [f"cross_attn.{n}" for n in ATTENTION]
    assert wrapped["encoder_decoder"] == sorted(
        [f"model.encoder.layers.{i}.{n}" for i in range(2) for n in block + ffn]
        + [f"model.decoder.layers.{i}.{n}" for i in range(2) for n in block + cross + ffn]
    )
    # MoE: attention by module name, the fused experts (nested wrappers, one per parameter) by parameter name
    assert [n for n in wrapped["moe_decoder"] if "experts" in n] == [
        "model.layers.0.mlp.experts",
        "model.layers.0.mlp.experts.base_layer",
        "model.layers.1.mlp.experts",
        "model.layers.1.mlp.experts.base_layer",
    ]

    # ffn_type="glu" adds gate_proj; a shared expert is a GLU feed-forward under mlp.shared_expert
    config = tiny_config(ffn_type="glu", num_experts=4, moe_layers=[1], shared_expert_intermediate_size=16)
    model = get_peft_model(TfmDecoderForCausalLM(config), LoraConfig(target_modules=["gate_proj", *FEED_FORWARD]))
    names = sorted(n.removeprefix("base_model.model.") for n, m in model.named_modules() if isinstance(m, LoraLayer))
    assert names == [f"model.layers.0.mlp.{n}" for n in ("down_proj", "gate_proj", "up_proj")] + [
        f"model.layers.1.mlp.shared_expert.{n}" for n in ("down_proj", "gate_proj", "up_proj")
    ]

    # "cross_attn.q_proj" (a longer suffix) picks the cross-attention only
    cross_only = LoraConfig(target_modules=["cross_attn.q_proj", "cross_attn.v_proj"])
    model = get_peft_model(BY_NAME["encoder_decoder"].build(), cross_only)
    names = sorted(n for n, m in model.named_modules() if isinstance(m, LoraLayer))
    assert len(names) == 4 and all(".cross_attn." in n for n in names)


@pytest.mark.parametrize("implementation", ["eager", "batched_mm", "grouped_mm"])
def test_expert_lora_under_every_experts_implementation(implementation):
    """peft's `target_parameters` wraps the fused expert tensors with a parametrization, so the adapter reaches
    every experts backend; the forward with the adapter equals the forward of the merged weights."""
    paradigm = BY_NAME["moe_decoder"]
    model = paradigm.build()
    model.set_experts_implementation(implementation)
    before = logits(model, paradigm)
    # init_lora_weights=False: random B factors, so the adapter changes the output before any training
    peft_model = get_peft_model(model, LoraConfig(target_parameters=EXPERTS, init_lora_weights=False))
    assert sorted(n for n, p in peft_model.named_parameters() if p.requires_grad) == sorted(
        f"base_model.model.model.layers.{i}.mlp.experts.{inner}lora_{ab}.default.weight"
        for i in range(2)
        for inner in ("", "base_layer.")
        for ab in "AB"
    )
    experts = peft_model.get_base_model().model.layers[0].mlp.experts  # wraps down_proj, around gate_up_proj's
    assert experts.lora_A["default"].weight.shape == (4 * 8, 64)  # rank 8 per expert, from I=64 for down_proj
    assert experts.base_layer.lora_B["default"].weight.shape == (2 * 64, 4 * 8)  # to 2I=128 for gate_up_proj
    with_adapter = logits(peft_model, paradigm)
    assert not torch.allclose(with_adapter, before, atol=1e-3)
    merged = peft_model.merge_and_unload()
    assert merged.model.layers[0].mlp.experts.gate_up_proj.shape == (4, 2 * 64, 32)
    torch.testing.assert_close(logits(merged, paradigm), with_adapter, rtol=0, atol=1e-5)


def test_sequence_classification_pooler_via_modules_to_save():
    """SEQ_CLS trains the classifier in full; the pooler (dense + tanh) stays frozen unless listed too."""
    paradigm = BY_NAME["sequence_classification"]
    model = get_peft_model(paradigm.build(), paradigm.lora_config(modules_to_save=["pooler"]))
    trainable = {
        name.split(".modules_to_save.")[0].removeprefix("base_model.model.")
        for name, p in model.named_parameters()
        if p.requires_grad and "lora_" not in name
    }
    assert trainable == {"classifier", "model.pooler"}


def test_expert_lora_refuses_dropout():
    """LoRA on a parameter cannot apply dropout to the layer input: peft refuses lora_dropout there."""
    with pytest.raises(ValueError, match="does not work with lora_dropout != 0"):
        get_peft_model(BY_NAME["moe_decoder"].build(), LoraConfig(target_parameters=EXPERTS, lora_dropout=0.1))


def test_only_lora_and_head_are_trainable(trained):
    model, paradigm = trained.model, trained.paradigm
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable
    heads = paradigm.trainable_heads
    for name in trainable:
        assert "lora_A" in name or "lora_B" in name or any(f"{h}.modules_to_save" in name for h in heads), name
    for head in paradigm.trainable_heads:  # the head is trained (a copy in modules_to_save), not frozen
        assert any(f"{head}.modules_to_save.default" in name for name in trainable), head
    if paradigm.target_parameters:
        assert any("experts" in name for name in trainable)


def test_fine_tune_lowers_loss_and_keeps_base(trained):
    losses = trained.losses
    assert len(losses) == 12 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.6 * losses[0], losses
    # the frozen base is bit-for-bit the saved base model
    saved = trained.paradigm.model_class.from_pretrained(trained.base_dir).state_dict()
    current = base_weights(trained.model)
    assert sorted(current) == sorted(saved)
    for name, tensor in saved.items():
        assert torch.equal(current[name], tensor), name
    # every LoRA B factor (zero at init) has learned, the expert factors of the MoE included; so has the head copy
    for name, param in trained.model.named_parameters():
        if "lora_B" in name:
            assert param.abs().sum() > 0, name
    for head in trained.paradigm.trainable_heads:
        wrapper = trained.model.get_base_model().get_submodule(head)
        assert not torch.equal(wrapper.modules_to_save["default"].weight, wrapper.original_module.weight)
    # ...and the adapter is not a no-op
    base = trained.paradigm.model_class.from_pretrained(trained.base_dir)
    assert not torch.allclose(logits(trained.model, trained.paradigm), logits(base, trained.paradigm), atol=1e-2)


def test_adapter_files_hold_only_the_adapter(trained):
    files = sorted(p.name for p in trained.adapter_dir.iterdir())
    assert "adapter_config.json" in files and "adapter_model.safetensors" in files
    assert "model.safetensors" not in files
    config = json.loads((trained.adapter_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(trained.base_dir)
    with safe_open(trained.adapter_dir / "adapter_model.safetensors", "pt") as f:
        keys = list(f.keys())
    heads = trained.paradigm.trainable_heads
    assert keys and all("lora_A" in k or "lora_B" in k or any(f".{h}." in k for h in heads) for k in keys), keys
    with safe_open(trained.adapter_dir.parent / "trainer_save" / "adapter_model.safetensors", "pt") as f:
        assert sorted(f.keys()) == sorted(keys)
    adapter_bytes = (trained.adapter_dir / "adapter_model.safetensors").stat().st_size
    assert adapter_bytes < (trained.base_dir / "model.safetensors").stat().st_size / 2


def test_reload_adapter_on_fresh_base(trained):
    """PeftModel.from_pretrained on a freshly built base (same seed) and AutoPeftModel* from the adapter folder
    alone (its base_model_name_or_path names the saved base) both give the trained model's logits."""
    paradigm = trained.paradigm
    expected = logits(trained.model, paradigm)
    reloaded = PeftModel.from_pretrained(paradigm.build(seed=0), trained.adapter_dir)
    torch.testing.assert_close(logits(reloaded, paradigm), expected, rtol=0, atol=0)

    kwargs = {"import_allowlist": ["hf_tfm"]} if paradigm.auto_class is AutoPeftModel else {}
    auto = paradigm.auto_class.from_pretrained(trained.adapter_dir, **kwargs)
    assert type(auto.get_base_model()) is paradigm.model_class
    torch.testing.assert_close(logits(auto, paradigm), expected, rtol=0, atol=0)


@pytest.mark.parametrize("trained", ["masked_lm"], indirect=True)
def test_auto_peft_model_needs_import_allowlist_for_masked_lm(trained):
    """Without a task type peft records the base class by module; hf_tfm is not on its default import allowlist."""
    with pytest.raises(
        ValueError, match="wants to import 'hf_tfm.model.modeling_tfm' which is not in the import allowlist"
    ):
        AutoPeftModel.from_pretrained(trained.adapter_dir)


def test_merge_and_unload(trained, tmp_path):
    paradigm = trained.paradigm
    expected = logits(trained.model, paradigm)
    merged = PeftModel.from_pretrained(paradigm.build(seed=0), trained.adapter_dir).merge_and_unload()
    assert type(merged) is paradigm.model_class
    assert not any(isinstance(m, LoraLayer) for m in merged.modules())
    torch.testing.assert_close(logits(merged, paradigm), expected, rtol=0, atol=1e-5)
    merged.save_pretrained(tmp_path)
    reloaded = paradigm.model_class.from_pretrained(tmp_path)
    assert_same_state_dict(reloaded.state_dict(), merged.state_dict())
    torch.testing.assert_close(logits(realigned(reloaded), paradigm), logits(merged, paradigm), rtol=0, atol=0)


@pytest.mark.parametrize("trained", [p.name for p in PARADIGMS if p.generation], indirect=True)
def test_generate_with_adapter(trained):
    """Greedy generation through the PeftModel produces what the fine-tune taught (the base model does not), and
    the merged model generates the same tokens."""
    paradigm = trained.paradigm
    prompt, expected = paradigm.generation
    prompt = torch.tensor([prompt])
    # a decoder returns the prompt and the new tokens; an encoder-decoder the start token and the new tokens
    new_tokens = len(expected) - (1 if paradigm.name == "encoder_decoder" else prompt.shape[1])
    greedy = {"attention_mask": torch.ones_like(prompt), "max_new_tokens": new_tokens, "do_sample": False}
    generated = trained.model.generate(input_ids=prompt, **greedy)
    assert generated.tolist() == [expected]
    merged = PeftModel.from_pretrained(paradigm.build(seed=0), trained.adapter_dir).merge_and_unload()
    assert torch.equal(merged.generate(input_ids=prompt, **greedy), generated)
    assert paradigm.build(seed=0).generate(input_ids=prompt, **greedy).tolist() != [expected]


LM_HEADS = {  # model class, config, the vocabulary projection's name
    "causal": (TfmDecoderForCausalLM, TfmDecoderConfig, "lm_head"),
    "masked": (TfmEncoderForMaskedLM, TfmEncoderConfig, "lm_head.decoder"),
    "seq2seq": (TfmEncoderDecoderForConditionalGeneration, TfmEncoderDecoderConfig, "lm_head"),
}


@pytest.mark.parametrize("head", LM_HEADS)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_lora_on_the_lm_head_trains_and_merges(head, mode):
    """LoRA may target the vocabulary projection (untied): PEFT wraps it in a layer of its own, which the head calls in
    its place; the loss is the merged model's (chunked in training, over full logits in eval) and the adapter gets
    gradients."""
    model_class, config_class, name = LM_HEADS[head]
    torch.manual_seed(0)
    model = model_class(tiny_config(config_class, tie_word_embeddings=False, **BASE)).train(mode == "train")
    ids = torch.randint(4, 90, (2, 8))
    inputs = {"input_ids": ids, "labels": ids} | ({"decoder_input_ids": ids} if head == "seq2seq" else {})
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=[name], init_lora_weights=False))
    loss = lora(**inputs).loss
    loss.backward()
    adapter = lora.get_submodule(f"base_model.model.{name}").lora_B["default"].weight
    assert adapter.grad is not None and adapter.grad.abs().sum() > 0
    merged = lora.merge_and_unload()
    with torch.no_grad():
        torch.testing.assert_close(merged(**inputs).loss, loss.detach(), atol=1e-5, rtol=1e-5)
