"""Tokenizers trained from data: BPE (causal LM), WordPiece (BERT-style), Unigram (T5-style)."""

import json
import random

import pytest
from transformers import (
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    PreTrainedTokenizerFast,
)

from hf_tfm.training.tasks import TASKS
from hf_tfm.training.tokenizers import (
    TOKENIZER_KINDS,
    train_byte_level_bpe,
    train_tokenizer,
    train_unigram,
    train_wordpiece,
)

KINDS = ("bpe", "wordpiece", "unigram")
VOCAB_SIZE = 400

# Strings no tokenizer may crash on: empty, whitespace only, unseen scripts, emoji sequences, combining marks,
# zero-width and control characters, compatibility forms, overlong words, the highest code point.
ODD_STRINGS = [
    "",
    " ",
    "   \t ",
    "hello world",
    "Straße café naïve",
    "東京タワー 😀🤗 👩‍👩‍👧",
    "مرحبا بالعالم",
    "e\u0301 combining",
    "zero\u200bwidth\u200d",
    "tab\tnew\nline\r\n",
    "\x00\x01 control \x7f",
    "ﬁ ligature Ⅻ ½",
    "a" * 300,
    "🤖" * 50,
    "\ufeffbom",
    "\U0010ffff",
    "[MASK] </s> <|endoftext|> ##",
]


def make_corpus(n: int = 1500, seed: int = 0) -> list[str]:
    """Sentences of made-up words built from shared syllables (so subword units are worth learning), some
    capitalised, some with punctuation, with a few non-ASCII words."""
    rng = random.Random(seed)
    syllables = [
        "ka",
        "lo",
        "mi",
        "ter",
        "ion",
        "pre",
        "con",
        "ing",
        "ed",
        "un",
        "sta",
        "ble",
        "ous",
        "ly",
        "ment",
        "re",
        "de",
        "tra",
        "vi",
        "ex",
    ]
    words = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(600)})
    words += ["café", "naïve", "Straße", "東京", "données", "Ελλάδα", "über"]
    texts = []
    for _ in range(n):
        sentence = [rng.choice(words) for _ in range(rng.randint(4, 12))]
        if rng.random() < 0.5:
            sentence[0] = sentence[0].capitalize()
        texts.append(" ".join(sentence) + rng.choice([".", "!", "?", ",", ""]))
    return texts


CORPUS = make_corpus()


def pipeline(tokenizer) -> dict:
    """The serialized backend less its padding and truncation, which calls with `padding=True` switch on in place."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    return {key: value for key, value in state.items() if key not in ("padding", "truncation")}


@pytest.fixture(scope="module")
def trained():
    return {kind: train_tokenizer(CORPUS, kind, VOCAB_SIZE) for kind in KINDS}


@pytest.fixture(scope="module")
def reloaded(trained, tmp_path_factory):
    out = {}
    for kind, tokenizer in trained.items():
        folder = tmp_path_factory.mktemp(kind)
        tokenizer.save_pretrained(folder)
        out[kind] = AutoTokenizer.from_pretrained(folder)
    return out


def test_kinds_and_defaults():
    assert TOKENIZER_KINDS == KINDS
    assert {name: task.tokenizer for name, task in TASKS.items()} == {
        "causal-lm": "bpe",
        "masked-lm": "wordpiece",
        "sequence-classification": "wordpiece",
        "token-classification": "wordpiece",
        "seq2seq": "unigram",
    }


@pytest.mark.parametrize("kind", ["BPE", "sentencepiece", "", "wordlevel"])
def test_unknown_kind(kind):
    with pytest.raises(ValueError, match="bpe, wordpiece, unigram"):
        train_tokenizer(CORPUS[:10], kind, 100)


def test_dispatch(trained):
    assert trained["bpe"].eos_token == "<|endoftext|>"
    assert trained["wordpiece"].mask_token == "[MASK]"
    assert trained["unigram"].eos_token == "</s>"
    for tokenizer in trained.values():
        assert isinstance(tokenizer, PreTrainedTokenizerFast)
        assert len(tokenizer) == VOCAB_SIZE  # the corpus is rich enough to fill the vocabulary


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_through_auto_tokenizer(kind, trained, reloaded):
    original, loaded = trained[kind], reloaded[kind]
    assert loaded.get_vocab() == original.get_vocab()
    assert loaded.special_tokens_map == original.special_tokens_map
    assert loaded.all_special_ids == original.all_special_ids
    assert loaded.model_input_names == original.model_input_names
    assert pipeline(loaded) == pipeline(original)
    for text in CORPUS[:50] + ODD_STRINGS:
        assert loaded(text).data == original(text).data, text
        assert loaded(text, CORPUS[0]).data == original(text, CORPUS[0]).data, text
        ids = original(text)["input_ids"]
        assert loaded.decode(ids) == original.decode(ids)
    batch = [CORPUS[1], CORPUS[2][:10]]
    assert loaded(batch, padding=True).data == original(batch, padding=True).data


@pytest.mark.parametrize("kind", KINDS)
def test_any_unicode_string_encodes(kind, trained):
    tokenizer = trained[kind]
    for text in ODD_STRINGS:
        encoding = tokenizer(text, text)
        assert all(0 <= i < len(tokenizer) for i in encoding["input_ids"])
        tokenizer.decode(encoding["input_ids"], skip_special_tokens=True)
        encoding.word_ids()


def test_bpe_is_lossless_and_unchanged(trained):
    tokenizer = trained["bpe"]
    for text in ODD_STRINGS[:-1]:
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    # The original contract of train_byte_level_bpe, which callers rely on.
    direct = train_byte_level_bpe(CORPUS, vocab_size=VOCAB_SIZE)
    assert direct.get_vocab() == tokenizer.get_vocab()
    assert (direct.bos_token, direct.eos_token, direct.pad_token) == ("<|endoftext|>", "<|endoftext|>", "<|pad|>")
    assert (direct.eos_token_id, direct.pad_token_id) == (0, 1)
    assert direct(CORPUS[0])["input_ids"][0] != direct.bos_token_id  # adds no special tokens


def test_wordpiece_special_tokens_and_templates(trained):
    tokenizer = trained["wordpiece"]
    assert [tokenizer.convert_ids_to_tokens(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (
        tokenizer.pad_token_id,
        tokenizer.unk_token_id,
        tokenizer.cls_token_id,
        tokenizer.sep_token_id,
        tokenizer.mask_token_id,
    ) == (0, 1, 2, 3, 4)
    assert "token_type_ids" in tokenizer.model_input_names

    single = tokenizer("kalo mition")
    tokens = tokenizer.convert_ids_to_tokens(single["input_ids"])
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 1
    assert set(single["token_type_ids"]) == {0}

    first, second = tokenizer("kalo mition", add_special_tokens=False), tokenizer("preing", add_special_tokens=False)
    pair = tokenizer("kalo mition", "preing")
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert pair["input_ids"] == [cls, *first["input_ids"], sep, *second["input_ids"], sep]
    n_first = len(first["input_ids"]) + 2
    assert pair["token_type_ids"] == [0] * n_first + [1] * (len(second["input_ids"]) + 1)
    assert pair.sequence_ids() == [None, *[0] * (n_first - 2), None, *[1] * len(second["input_ids"]), None]

    # Cased, with "##" continuations; unseen characters make their word [UNK]; the mask token is recognised in text.
    assert tokenizer.tokenize("Kalo") != tokenizer.tokenize("kalo")
    assert any(token.startswith("##") for token in tokenizer.get_vocab())
    assert tokenizer.tokenize("kalo ж kalo") == [*tokenizer.tokenize("kalo"), "[UNK]", *tokenizer.tokenize("kalo")]
    assert tokenizer("kalo [MASK]")["input_ids"][-2] == tokenizer.mask_token_id
    assert tokenizer.decode(tokenizer("kalo mition, preing.")["input_ids"], skip_special_tokens=True) == (
        "kalo mition, preing."
    )


def test_unigram_special_tokens_and_templates(trained):
    tokenizer = trained["unigram"]
    assert [tokenizer.convert_ids_to_tokens(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    assert tokenizer.bos_token is None  # seq2seq models start decoding from <pad>, id 0
    assert tokenizer.model_input_names == ["input_ids", "attention_mask"]

    first, second = tokenizer("kalo mition", add_special_tokens=False), tokenizer("preing", add_special_tokens=False)
    assert tokenizer("kalo mition")["input_ids"] == [*first["input_ids"], 1]
    assert tokenizer("kalo mition", "preing")["input_ids"] == [*first["input_ids"], 1, *second["input_ids"], 1]
    assert tokenizer("kalo mition", text_target="preing")["labels"] == [*second["input_ids"], 1]

    # SentencePiece-style: "▁" marks word starts, the decoder restores the text, unseen characters are <unk>.
    assert tokenizer.tokenize("kalo")[0].startswith("\u2581")
    for text in CORPUS[:20]:
        assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text
    assert tokenizer.unk_token_id in tokenizer("kalo ж")["input_ids"]
    # NFKC and collapsed spaces
    assert tokenizer("kalo   mi")["input_ids"] == tokenizer("kalo mi")["input_ids"]
    assert tokenizer("\ufb01")["input_ids"] == tokenizer("fi")["input_ids"]


@pytest.mark.parametrize("kind", KINDS)
def test_word_ids(kind, trained):
    tokenizer = trained[kind]
    text = "kalominter preingly unstament exvi"
    encoding = tokenizer(text)
    word_ids = encoding.word_ids()
    specials = [i for i, token in enumerate(encoding["input_ids"]) if token in tokenizer.all_special_ids]
    assert all(word_ids[i] is None for i in specials)
    words = [w for w in word_ids if w is not None]
    assert words == sorted(words) and set(words) == {0, 1, 2, 3}
    for word, (start, end) in enumerate(encoding.word_to_chars(w) for w in range(4)):
        assert text[start:end].strip() == text.split()[word]


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
def test_word_ids_of_pretokenized_words(kind, trained):
    """Token classification feeds words and aligns one label per word through word_ids()."""
    tokenizer = trained[kind]
    words = ["Kalominter", "preingly", ",", "東京", "ж"]
    encoding = tokenizer(words, is_split_into_words=True)
    word_ids = encoding.word_ids()
    assert sorted({w for w in word_ids if w is not None}) == list(range(len(words)))
    assert [w for w in word_ids if w is not None] == sorted(w for w in word_ids if w is not None)


@pytest.mark.parametrize("kind", KINDS)
def test_training_is_deterministic(kind, trained):
    """`tokenizers`' WordPiece and Unigram trainers alone give a different vocabulary on every run (their Rust
    HashMaps are seeded at random, even within one process); ours must not, nor depend on the order of the texts."""
    first, again = train_tokenizer(CORPUS, kind, VOCAB_SIZE), train_tokenizer(CORPUS, kind, VOCAB_SIZE)
    shuffled = CORPUS[:]
    random.Random(1).shuffle(shuffled)
    permuted = train_tokenizer(iter(shuffled), kind, VOCAB_SIZE)
    reference = first.backend_tokenizer.to_str()
    assert again.backend_tokenizer.to_str() == reference
    assert permuted.backend_tokenizer.to_str() == reference
    assert pipeline(trained[kind]) == pipeline(first)


@pytest.mark.parametrize("train", [train_wordpiece, train_unigram])
def test_vocab_ids_are_contiguous(train):
    tokenizer = train(CORPUS[:300], 200)
    assert sorted(tokenizer.get_vocab().values()) == list(range(len(tokenizer)))
    assert len(tokenizer) <= 200


def test_masked_lm_collator(trained):
    tokenizer = trained["wordpiece"]
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.5, seed=0)
    batch = collator([tokenizer(text) for text in CORPUS[:8]])
    input_ids, labels = batch["input_ids"], batch["labels"]
    assert input_ids.shape == labels.shape == batch["token_type_ids"].shape
    scored = labels != -100
    assert scored.any() and (input_ids == tokenizer.mask_token_id).any()
    special = (
        (labels == tokenizer.cls_token_id) | (labels == tokenizer.sep_token_id) | (labels == tokenizer.pad_token_id)
    )
    assert not (scored & special).any()  # special tokens and padding are never masked
    assert (input_ids[batch["attention_mask"] == 0] == tokenizer.pad_token_id).all()


@pytest.mark.parametrize("kind", KINDS)
def test_empty_corpus_gives_a_working_tokenizer(kind):
    tokenizer = train_tokenizer([], kind, 100)
    assert tokenizer("anything at all")["input_ids"]
    assert tokenizer.pad_token_id is not None
