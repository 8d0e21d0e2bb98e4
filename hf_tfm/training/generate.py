"""`hf-tfm generate`: continue prompts with a saved decoder or encoder-decoder, or fill masks with a masked LM."""

import torch

from .checkpoints import load_saved
from .run import load_tokenizer


def generate_text(
    folder: str,
    prompts: list[str],
    max_new_tokens: int = 32,
    num_beams: int = 1,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> list[str]:
    model = load_saved(folder).eval()
    tokenizer = load_tokenizer(folder)
    if not model.can_generate():
        if tokenizer.mask_token is None or model.get_output_embeddings() is None:
            raise ValueError(f"{folder} holds a {type(model).__name__}, which neither generates nor fills masks")
        return [_fill_masks(model, tokenizer, prompt) for prompt in prompts]
    torch.manual_seed(seed)
    tokenizer.padding_side = "left"  # decoder prompts end where generation starts
    inputs = tokenizer(prompts, return_tensors="pt", padding=True)
    inputs.pop("token_type_ids", None)
    sampling = {"temperature": temperature, "top_p": top_p} if do_sample else {}
    with torch.no_grad():
        output = model.generate(
            **inputs, max_new_tokens=max_new_tokens, num_beams=num_beams, do_sample=do_sample, **sampling
        )
    if not model.config.is_encoder_decoder:
        output = output[:, inputs["input_ids"].shape[1] :]
    texts = tokenizer.batch_decode(output, skip_special_tokens=True)
    return [f"{prompt} -> {visible(text, ids.tolist())}" for prompt, text, ids in zip(prompts, texts, output)]


ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escaped(text: str) -> str:
    """`text` on one line a person can read: line breaks, tabs and backslashes escaped, other characters no font
    draws (control characters) as their code point."""
    return "".join(ESCAPES.get(char) or (char if char.isprintable() else f"\\x{ord(char):02x}") for char in text)


def visible(text: str, token_ids: list[int]) -> str:
    """A continuation on one line that a person can see: escaped, and the token ids beside it when it decodes to
    blanks alone (a small model's first output often does)."""
    return escaped(text) if text.strip() else f"'{escaped(text)}' (only blanks: token ids {token_ids})"


def _fill_masks(model, tokenizer, prompt: str) -> str:
    if tokenizer.mask_token not in prompt:
        raise ValueError(f"masked LMs fill {tokenizer.mask_token} tokens; the prompt {prompt!r} has none")
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[0]
    ids = inputs["input_ids"][0].clone()
    masked = ids == tokenizer.mask_token_id
    ids[masked] = logits[masked].argmax(-1)
    return f"{prompt} -> {tokenizer.decode(ids, skip_special_tokens=True)}"
