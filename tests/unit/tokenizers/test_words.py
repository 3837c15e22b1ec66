"""The count-only path (proxy/tokenizers/words.py): where it counts, it counts what the
tokenizer's backend counts, on MiniLM and on BERT variants built from its file; it steps
aside for every other text and tokenizer, and what it knows of words before a text is
counted is the vocabulary's alone."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.tokenizers.hf import HFTokenizer, backend_lengths, load_tokenizer
from proxy.tokenizers.words import WordCounts

PLAIN = [
    "a",
    "Z",
    "word",
    "THE",
    "Eiffel",
    "tower's",
    "x" * 70,  # no vocabulary entry: counted by the model
    "y" * 101,  # past WordPiece's max_input_chars_per_word: one [UNK]
    "2026",
    "3.14",
    "##",
    " ",
    "  ",
    "\n",
    "\t",
    "\r\n",
    ".",
    ",",
    "-",
    "!?",
    "[",
    "]",
    "{}",
    "~`",
    "@",
    "\\",
    "[SEP]",
    "[cls]",
    "[Mask]",
    "hello",
    "HeLLo",
    "xyz",
    "XyZ",
]
OTHER = [
    "\x0b",
    "\x0c",
    "\x1f",
    "\x7f",
    "\x00",
    "é",
    "字",
    "\u00a0",
    "\u2028",
    "🙂",
]
# Half the texts plain (the path counts them unless a special token's text is in them),
# half with anything in them.
TEXT = st.one_of(
    st.lists(st.sampled_from(PLAIN), max_size=40).map("".join),
    st.lists(st.sampled_from(PLAIN + OTHER), max_size=40).map("".join),
)
TEXTS = st.lists(TEXT, min_size=1, max_size=5)

# Each variant of MiniLM's tokenizer.json the path must count exactly (or step aside for).
Edit = Callable[[dict[str, Any]], None]


def _cased(spec: dict[str, Any]) -> None:
    spec["normalizer"]["lowercase"] = False


def _unclean(spec: dict[str, Any]) -> None:
    spec["normalizer"]["clean_text"] = False
    spec["normalizer"]["strip_accents"] = True


def _added(spec: dict[str, Any]) -> None:
    """A normalized added word and a raw one, as ``add_tokens`` writes them."""
    start = max(token["id"] for token in spec["added_tokens"]) + 1000
    for offset, (content, normalized) in enumerate((("hello", True), ("XyZ", False))):
        spec["added_tokens"].append(
            {
                "id": start + offset,
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": normalized,
                "special": False,
            }
        )


VARIANTS: dict[str, Edit | None] = {
    "minilm": None,
    "cased": _cased,
    "unclean": _unclean,
    "added": _added,
}
_LOADED: dict[str, HFTokenizer] = {}


def _variant(minilm_path: Path, tmp: Path, name: str) -> HFTokenizer:
    if name not in _LOADED:
        edit = VARIANTS[name]
        if edit is None:
            _LOADED[name] = load_tokenizer(minilm_path)
        else:
            target = tmp / name
            shutil.copytree(minilm_path, target)
            spec = json.loads((target / "tokenizer.json").read_text())
            edit(spec)
            (target / "tokenizer.json").write_text(json.dumps(spec))
            _LOADED[name] = load_tokenizer(target)
    return _LOADED[name]


@pytest.fixture(scope="module")
def variants(minilm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("variants")
    return {name: _variant(minilm_path, tmp, name) for name in VARIANTS}


@pytest.mark.parametrize("name", list(VARIANTS))
@settings(max_examples=150, deadline=None)
@given(texts=TEXTS)
def test_where_the_path_counts_it_counts_what_the_backend_counts(
    variants: dict[str, HFTokenizer], name: str, texts: list[str]
) -> None:
    """Property: for every text the path counts (others are None), its count equals the
    backend's ``encode_batch_fast`` count, special tokens included; and the adapter's
    lengths, which take the path, equal the backend's for every text."""
    tok = variants[name]
    words = WordCounts.of(tok._tok.backend_tokenizer)
    assert words is not None
    want = backend_lengths(tok._tok, texts, add_special_tokens=True)
    for text, counted, exact in zip(texts, words.lengths(texts), want, strict=True):
        assert counted is None or counted == exact, text
    assert tok.encode_lengths(texts, max_length=None) == want


def test_plain_english_takes_the_path(minilm: HFTokenizer) -> None:
    """Printable ASCII with newlines and tabs is counted word by word (what makes a full
    recount cheap); a special token's text, a control character and any non-ASCII
    character step aside to the backend."""
    words = WordCounts.of(minilm._tok.backend_tokenizer)
    assert words is not None
    plain = "Where is the Eiffel Tower?\n\tIt stands by the Seine, in Paris (France)."
    assert words.length(plain) == backend_lengths(minilm._tok, [plain], add_special_tokens=True)[0]
    for other in ("a [SEP] b", "a [mask] b", "bell\x07", "café", "a\x0bb"):
        assert words.length(other) is None


def test_other_tokenizers_do_not_take_the_path() -> None:
    """A byte-level BPE tokenizer (the Qwen kind) has no count-only path."""
    from tests.support.bpe import train_qwen_like

    assert WordCounts.of(train_qwen_like().backend_tokenizer) is None


def test_an_added_token_that_normalizing_may_change_turns_the_path_off(
    minilm_path: Path, tmp_path: Path
) -> None:
    """A normalized added token with a space (or anything but printable ASCII) could match
    a text where its lowered content does not appear: no path for that tokenizer."""

    def spaced(spec: dict[str, Any]) -> None:
        _added(spec)
        spec["added_tokens"][-2]["content"] = "hello there"

    VARIANTS["spaced"] = spaced
    try:
        tok = _variant(minilm_path, tmp_path, "spaced")
    finally:
        del VARIANTS["spaced"]
        _LOADED.pop("spaced", None)
    assert WordCounts.of(tok._tok.backend_tokenizer) is None


def test_every_public_word_is_one_token(variants: dict[str, HFTokenizer]) -> None:
    """The words the path knows before any text (the vocabulary's entries a word can be)
    are each one token as the model counts them, on every variant: so taking them from
    the vocabulary keeps the count exact."""
    for name, tok in variants.items():
        words = WordCounts.of(tok._tok.backend_tokenizer)
        assert words is not None
        model = tok._tok.backend_tokenizer.model
        assert len(words.public) > 20_000, name
        assert all(len(model.tokenize(word)) == 1 for word in words.public), name


def test_what_a_text_holds_is_not_kept(minilm: HFTokenizer) -> None:
    """Regression (issue #59): the words of a counted text were kept in a cache every
    tenant's counts share, so a word anyone had sent was counted faster. Counting leaves
    what the path knows as it was (the vocabulary's words), and the same text counts the
    same, exactly, every time."""
    words = WordCounts.of(minilm._tok.backend_tokenizer)
    assert words is not None
    before = set(words.public)
    texts = ["the zqxwv of merger-memo 77421 by kjhgf", "zqxwv zqxwv wordpiece"]
    want = backend_lengths(minilm._tok, texts, add_special_tokens=True)
    assert words.lengths(texts) == want
    assert words.lengths(texts) == want
    assert words.public == before
    assert "zqxwv" not in words.public


def test_the_copies_share_one_vocabulary(minilm: HFTokenizer) -> None:
    """A counting thread's copy reads the same public words as its original (one dict
    per loaded tokenizer, not one per thread)."""
    twin = minilm.copy()
    assert twin._words is not None
    assert minilm._words is not None
    assert twin._words.public is minilm._words.public


def test_texts_of_many_unknown_words_count_exactly(minilm: HFTokenizer) -> None:
    """Texts of many words outside the vocabulary (names, ids, rare terms, repeated
    within a text and across texts) count what the backend counts."""
    words = WordCounts.of(minilm._tok.backend_tokenizer)
    assert words is not None
    unknown = [f"zq{i}x{'k' * (i % 5)}" for i in range(40)]
    texts = [" ".join(unknown[: n + 1] * 3 + ["the", "tower"]) for n in (0, 5, 9, 39)]
    want = backend_lengths(minilm._tok, texts, add_special_tokens=True)
    assert words.lengths(texts) == want
