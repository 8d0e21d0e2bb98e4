"""Train a tokenizer from text with `tokenizers` and wrap it as a `PreTrainedTokenizerFast` that saves with a model."""

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS, PAD = "<|endoftext|>", "<|pad|>"


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style): every string encodes, nothing maps to an unknown token."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=EOS, eos_token=EOS, pad_token=PAD)
