"""The main job on the embedded default: train a small decoder on stdlib docstrings, evaluate it, generate, save.

Everything runs offline on a CPU in minutes: corpus from the standard library, tokenizer trained on it,
`transformers.Trainer` for the loop, `generate()` for the sample, `save_pretrained` for the folder.
"""

import math
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

from ..hub.card import Measurement, write_model_card
from ..configuration_tfm import TfmDecoderConfig
from .corpus import stdlib_docstrings
from ..modeling_tfm import TfmDecoderForCausalLM
from .tokenizers import train_byte_level_bpe

PROMPT = "Return the"
CORPUS_NAME = "python-stdlib-docstrings"


def lm_blocks(tokenizer, texts: list[str], block_size: int) -> Dataset:
    """Concatenate the documents (each ended by EOS) and cut fixed-length training blocks."""
    ids = [token for row in tokenizer(texts)["input_ids"] for token in (*row, tokenizer.eos_token_id)]
    usable = len(ids) // block_size * block_size
    return Dataset.from_dict({"input_ids": [ids[i : i + block_size] for i in range(0, usable, block_size)]})


def demo_config(vocab_size: int, tokenizer) -> TfmDecoderConfig:
    """A Llama-style decoder (RoPE, RMSNorm, SwiGLU, GQA) sized for a 2-core CPU."""
    return TfmDecoderConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=352,
        hidden_act="silu",
        ffn_type="glu",
        norm_type="rmsnorm",
        position_embedding_type="rope",
        max_position_embeddings=512,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def run_demo(
    output_dir: str,
    max_steps: int = 600,
    block_size: int = 128,
    batch_size: int = 16,
    eval_blocks: int = 128,
    max_files: int | None = None,
    seed: int = 0,
) -> dict:
    started = time.time()
    output = Path(output_dir)
    torch.manual_seed(seed)
    print("building the stdlib docstring corpus ...", flush=True)
    corpus = stdlib_docstrings(max_files=max_files)
    tokenizer = train_byte_level_bpe(corpus["train"], vocab_size=4096)
    train = lm_blocks(tokenizer, corpus["train"], block_size)
    validation = lm_blocks(tokenizer, corpus["validation"], block_size)
    validation = validation.select(range(min(eval_blocks, len(validation))))
    print(f"corpus: {len(train)} train / {len(validation)} validation blocks of {block_size} tokens", flush=True)

    model = TfmDecoderForCausalLM(demo_config(len(tokenizer), tokenizer))
    print(f"model: {model.num_parameters() / 1e6:.2f}M parameters", flush=True)
    args = TrainingArguments(
        output_dir=str(output / "trainer"),
        max_steps=max_steps,
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, max_steps // 20),
        weight_decay=0.1,
        logging_steps=max(1, max_steps // 10),
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=seed,
        disable_tqdm=True,
    )
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=validation, data_collator=collator)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]

    model.eval()
    prompt = tokenizer(PROMPT, return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=24, do_sample=False)
    sample = tokenizer.decode(generated[0], skip_special_tokens=True)
    model.save_pretrained(output / "model")
    tokenizer.save_pretrained(output / "model")
    write_model_card(
        output / "model",
        model,
        results=[Measurement("validation", "loss", after), Measurement("validation", "perplexity", math.exp(after))],
        dataset=CORPUS_NAME,
        repo_id="hf-tfm-demo-decoder",
        training=(
            f"{max_steps} steps of `Trainer` (AdamW, lr {args.learning_rate}, cosine schedule, batch {batch_size} x "
            f"{block_size} tokens, seed {seed}) on {len(train)} blocks of Python standard-library docstrings, "
            f"tokenized with a byte-level BPE of {len(tokenizer)} tokens trained on the same text. "
            f"Validation loss went from {before:.3f} to {after:.3f}."
        ),
    )
    summary = {
        "validation_loss_before": before,
        "validation_loss_after": after,
        "validation_perplexity_after": math.exp(after),
        "uniform_perplexity": float(len(tokenizer)),
        "sample": sample,
        "model_dir": str(output / "model"),
        "seconds": time.time() - started,
    }
    print("\n== hf-tfm demo summary ==")
    print(f"validation loss      {before:.3f} -> {after:.3f} (perplexity {math.exp(after):.1f}; uniform {len(tokenizer)})")
    print(f"greedy sample        {sample!r}")
    print(f"model, tokenizer, card  {summary['model_dir']}")
    print(f"wall time            {summary['seconds']:.0f} s")
    return summary
