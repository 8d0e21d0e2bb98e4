"""Train a tokenizer from text with `tokenizers` and wrap it as a `PreTrainedTokenizerFast` that saves with a model.

Three kinds, one per family of models (each task's record, `tasks.TASKS[task].tokenizer`, names its kind):

- `"bpe"`, `train_byte_level_bpe`: GPT-2 style byte-level BPE for causal LMs; every string encodes, no unknown token.
- `"wordpiece"`, `train_wordpiece`: BERT style, `[CLS] A [SEP] B [SEP]` with token types, `[MASK]` for masked LM.
- `"unigram"`, `train_unigram`: T5 style SentencePiece-like Unigram, `</s>` appended, `<pad>` (id 0) doubling as
  the decoder start token of seq2seq models.

Each saves with `save_pretrained` (one `tokenizer.json` holds normalizer, pre-tokenizer, model, post-processor and
decoder) and reloads identically with `transformers.AutoTokenizer.from_pretrained(folder)`. Training is
deterministic: the same texts (in any order) give the same vocabulary and ids, in any process, which `tokenizers`'
WordPiece and Unigram trainers alone do not guarantee (see `train_wordpiece` and `train_unigram`).
"""

import json
from collections.abc import Iterable

from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import PreTrainedTokenizerFast

EOS, PAD = "<|endoftext|>", "<|pad|>"

# WordPiece (BERT) special tokens, with ids 0..4 in this order.
WORDPIECE_PAD, WORDPIECE_UNK, WORDPIECE_CLS, WORDPIECE_SEP, WORDPIECE_MASK = (
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
)
WORDPIECE_SPECIAL_TOKENS = (WORDPIECE_PAD, WORDPIECE_UNK, WORDPIECE_CLS, WORDPIECE_SEP, WORDPIECE_MASK)
WORDPIECE_PREFIX = "##"

# Unigram (T5) special tokens: <pad> = 0, </s> = 1, <unk> = 2, as in T5.
UNIGRAM_PAD, UNIGRAM_EOS, UNIGRAM_UNK = "<pad>", "</s>", "<unk>"
UNIGRAM_SPECIAL_TOKENS = (UNIGRAM_PAD, UNIGRAM_EOS, UNIGRAM_UNK)
METASPACE = "\u2581"  # "▁", SentencePiece's word-boundary mark

TOKENIZER_KINDS = ("bpe", "wordpiece", "unigram")


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


def _bert_normalizer() -> normalizers.Normalizer:
    return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False)


def train_wordpiece(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """BERT-style WordPiece: special tokens [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4; `[CLS] A [SEP]` and
    `[CLS] A [SEP] B [SEP]` with token type ids 0 for the first segment (and its [CLS], [SEP]) and 1 for the second.

    Cased: `BertNormalizer(lowercase=False)` keeps case and accents (like bert-base-cased), cleans control characters
    and puts spaces around CJK ideographs; `BertPreTokenizer` splits on whitespace and punctuation. Characters never
    seen in training make their word `[UNK]`.
    """
    texts = list(texts)
    normalizer, pre_tokenizer = _bert_normalizer(), pre_tokenizers.BertPreTokenizer()
    # `WordPieceTrainer` numbers the "##c" continuation characters in the order it meets them in a Rust HashMap,
    # which is seeded at random in every process, and breaks ties between equally frequent merges by token id: the
    # vocabulary would change from run to run. Listing them up front (sorted) gives them fixed ids; they are
    # registered as special tokens for training only, and the tokenizer is rebuilt below from the trained vocabulary.
    continuations = sorted(
        {
            WORDPIECE_PREFIX + char
            for text in texts
            for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
            for char in word[1:]
        }
    )
    draft = Tokenizer(models.WordPiece(unk_token=WORDPIECE_UNK, continuing_subword_prefix=WORDPIECE_PREFIX))
    draft.normalizer, draft.pre_tokenizer = normalizer, pre_tokenizer
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=[*WORDPIECE_SPECIAL_TOKENS, *continuations],
        continuing_subword_prefix=WORDPIECE_PREFIX,
        show_progress=False,
    )
    draft.train_from_iterator(texts, trainer=trainer)

    tokenizer = Tokenizer(
        models.WordPiece(
            vocab=draft.get_vocab(with_added_tokens=False),
            unk_token=WORDPIECE_UNK,
            continuing_subword_prefix=WORDPIECE_PREFIX,
        )
    )
    tokenizer.normalizer = _bert_normalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix=WORDPIECE_PREFIX)
    tokenizer.add_special_tokens(list(WORDPIECE_SPECIAL_TOKENS))
    cls_id, sep_id = tokenizer.token_to_id(WORDPIECE_CLS), tokenizer.token_to_id(WORDPIECE_SEP)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{WORDPIECE_CLS}:0 $A:0 {WORDPIECE_SEP}:0",
        pair=f"{WORDPIECE_CLS}:0 $A:0 {WORDPIECE_SEP}:0 $B:1 {WORDPIECE_SEP}:1",
        special_tokens=[(WORDPIECE_CLS, cls_id), (WORDPIECE_SEP, sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=WORDPIECE_PAD,
        unk_token=WORDPIECE_UNK,
        cls_token=WORDPIECE_CLS,
        sep_token=WORDPIECE_SEP,
        mask_token=WORDPIECE_MASK,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def _unigram_normalizer() -> normalizers.Normalizer:
    return normalizers.Sequence([normalizers.Nmt(), normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])


def _canonical_pieces(trained: list) -> list[tuple[str, float]]:
    """The trained (piece, log-probability) pairs, less the special tokens, made reproducible (see `train_unigram`)."""
    pieces = {piece: score for piece, score in trained if piece not in UNIGRAM_SPECIAL_TOKENS}
    if not pieces:  # no text to learn from
        return []
    # The trainer gives each character that EM dropped the score min_score + k * 1e-4, k = 0, 1, ... in HashSet order:
    # give them all the lowest score. The band holds at most one step per character, whatever the order.
    lowest = min(pieces.values())
    chars = [piece for piece in pieces if len(piece) == 1]
    band = lowest + 1e-4 * len(chars)
    for char in chars:
        if pieces[char] <= band:
            pieces[char] = lowest
    return sorted((piece, round(score, 5)) for piece, score in pieces.items())


def train_unigram(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """T5-style SentencePiece-like Unigram: special tokens <pad>=0, </s>=1, <unk>=2; `</s>` appended to each segment
    (`A </s>`, `A </s> B </s>`). Seq2seq models use <pad> (id 0) as the decoder start token.

    Normalization as SentencePiece's: `Nmt` (control characters dropped, exotic whitespace to spaces), `NFKC`, runs of
    spaces collapsed to one; `Metaspace` turns spaces into "▁" and marks every word's start ("▁" prepended), and its
    decoder turns them back. Characters never seen in training encode as <unk> (no byte fallback, as in T5).

    Reproducibility: `UnigramTrainer` visits the words in a randomly seeded HashMap order, so equal scores come out
    in any order and a few 1e-11 apart, and the characters that EM dropped get the lowest score plus 0, 1e-4, 2e-4...
    in random order. Hence the pieces after the special tokens are numbered in code point order (not by score, as
    SentencePiece does), their log-probabilities are rounded to 1e-5, and those characters all get the lowest score
    (their scores move by at most 1e-4 per distinct character, among the least likely pieces).
    Unigram training needs a varied corpus: with few distinct words it keeps little more than the characters.
    """
    texts = list(texts)
    draft = Tokenizer(models.Unigram())
    draft.normalizer = _unigram_normalizer()
    draft.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always", split=True)
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=list(UNIGRAM_SPECIAL_TOKENS),
        unk_token=UNIGRAM_UNK,
        show_progress=False,
    )
    draft.train_from_iterator(texts, trainer=trainer)

    trained = json.loads(draft.to_str())["model"]["vocab"]
    vocab = [(token, 0.0) for token in UNIGRAM_SPECIAL_TOKENS] + _canonical_pieces(trained)
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=UNIGRAM_SPECIAL_TOKENS.index(UNIGRAM_UNK), byte_fallback=False))
    tokenizer.normalizer = _unigram_normalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always", split=True)
    tokenizer.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always", split=True)
    tokenizer.add_special_tokens(list(UNIGRAM_SPECIAL_TOKENS))
    eos_id = tokenizer.token_to_id(UNIGRAM_EOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {UNIGRAM_EOS}:0",
        pair=f"$A:0 {UNIGRAM_EOS}:0 $B:1 {UNIGRAM_EOS}:1",
        special_tokens=[(UNIGRAM_EOS, eos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=UNIGRAM_PAD,
        eos_token=UNIGRAM_EOS,
        unk_token=UNIGRAM_UNK,
        model_input_names=["input_ids", "attention_mask"],
    )


_TRAINERS = {"bpe": train_byte_level_bpe, "wordpiece": train_wordpiece, "unigram": train_unigram}


def train_tokenizer(texts: Iterable[str], kind: str, vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a tokenizer of `kind` ("bpe", "wordpiece" or "unigram"; `tasks.TASKS[task].tokenizer` is each task's)."""
    if kind not in _TRAINERS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(TOKENIZER_KINDS)}")
    return _TRAINERS[kind](texts, vocab_size=vocab_size)
