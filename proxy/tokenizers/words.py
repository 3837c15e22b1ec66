"""Count-only lengths for BERT WordPiece tokenizers (issue #51): the tokenizer's own model
counts each word its vocabulary does not hold (one it holds is one token), and str methods
and one regex (C loops) do what the normalizer and the pre-tokenizer do, for the texts
where that is exact.

On a text of printable ASCII, tab, newline and carriage return, ``BertNormalizer`` only
maps those three to a space and, with ``lowercase``, lowers the letters (nothing to clean,
no CJK character to pad, no accent to strip), and ``BertPreTokenizer`` splits on
whitespace and isolates every ASCII punctuation character. The model then tokenizes each
piece alone, and the post-processor adds a fixed number of special tokens. So a text's
length is the sum of its words' model lengths plus the specials, with no ids, masks,
type ids, offsets or token strings built (``encode_batch_fast`` still builds all but the
offsets: about six times the work on English text). Any other text, one that holds an
added token's content (any case), and any other tokenizer take ``encode_batch_fast``.

What is known of a word before a text is counted comes from the vocabulary alone (issue
#59): a word that is one vocabulary entry is one token, and every other word is counted
by the model anew in each call. A cache filled by what tenants send made a tenant's
count faster on words anyone had sent recently, so its timing told which those were.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from itertools import filterfalse
from typing import Any

from tokenizers import models, normalizers, pre_tokenizers, processors

# Anything but printable ASCII, tab, newline and carriage return.
_OTHER = re.compile(r"[^\t\n\r -~]")
# char::is_ascii_punctuation, which BertPreTokenizer isolates (with Unicode's, none ASCII).
_PUNCTUATION = r"!-/:-@\[-`{-~"
_WORDS = re.compile(rf"[^\s{_PUNCTUATION}]+|[{_PUNCTUATION}]")
_WORD = re.compile(rf"[^\s{_PUNCTUATION}]+")
# More added tokens than this (each looked for in every text) and the path is not taken.
MOST_ADDED = 64
_PROCESSORS = (processors.TemplateProcessing, processors.BertProcessing)


class WordCounts:
    """Lengths (special tokens included) of the texts ``backend`` would count the same
    way word by word; None for any other text."""

    def __init__(
        self,
        model: Any,
        lowercase: bool,
        added: list[str],
        specials: int,
        public: frozenset[str],
    ) -> None:
        self._tokenize = model.tokenize
        self._lowercase = lowercase
        self._added = added  # lowered contents, each falls back wherever it appears
        self._specials = specials
        # The vocabulary's words: read-only, so the copies of one tokenizer share it.
        self.public = public

    @classmethod
    def of(cls, backend: Any, public: frozenset[str] | None = None) -> WordCounts | None:
        """The count-only path for a tokenizers ``Tokenizer``, or None when its pipeline is
        not BertNormalizer, BertPreTokenizer, WordPiece and a template post-processor, or an
        added token could match a text in a way this path does not see. ``public``: the
        vocabulary's words, as another copy of the same tokenizer holds them."""
        normalizer, model = backend.normalizer, backend.model
        post = backend.post_processor
        if not (
            isinstance(normalizer, normalizers.BertNormalizer)
            and isinstance(backend.pre_tokenizer, pre_tokenizers.BertPreTokenizer)
            and isinstance(model, models.WordPiece)
            and (post is None or isinstance(post, _PROCESSORS))
        ):
            return None
        added = list(backend.get_added_tokens_decoder().values())
        if len(added) > MOST_ADDED or any(_unseen(token) for token in added):
            return None
        specials = 0 if post is None else int(post.num_special_tokens_to_add(False))
        contents = sorted({token.content.lower() for token in added})
        if public is None:
            public = public_words(backend.get_vocab(with_added_tokens=False))
        return cls(model, bool(normalizer.lowercase), contents, specials, public)

    def length(self, text: str, seen: dict[str, int] | None = None) -> int | None:
        """``text``'s token count with special tokens, or None when this path cannot
        count it exactly. ``seen``: the counts of the words not in the vocabulary that
        the caller's earlier texts held (one request's texts, never another's)."""
        if _OTHER.search(text) is not None:
            return None
        lowered = text.lower()
        if any(content in lowered for content in self._added):
            return None
        words = _WORDS.findall(lowered if self._lowercase else text)
        unknown = list(filterfalse(self.public.__contains__, words))  # a C loop
        count = len(words) - len(unknown)  # the vocabulary's words: one token each
        if unknown:
            seen = {} if seen is None else seen
            count += sum([self._count(word, seen) for word in unknown])
        return count + self._specials

    def lengths(self, texts: Sequence[str]) -> list[int | None]:
        """Each text's length (None where the path cannot count it); a word the
        vocabulary does not hold is counted by the model once for all of ``texts``."""
        seen: dict[str, int] = {}
        return [self.length(text, seen) for text in texts]

    def _count(self, word: str, seen: dict[str, int]) -> int:
        count = seen.get(word)
        if count is None:
            count = seen[word] = len(self._tokenize(word))
        return count


def public_words(vocabulary: Iterable[str]) -> frozenset[str]:
    """Every vocabulary entry a word can be (printable ASCII, no whitespace, no
    punctuation), each one token: WordPiece matches the longest vocabulary prefix first,
    so a word that is an entry is that entry alone (and one past
    ``max_input_chars_per_word`` is one unknown token all the same). Public: the same
    for every tenant whatever anyone sends."""
    return frozenset(
        entry
        for entry in vocabulary
        if _OTHER.search(entry) is None and _WORD.fullmatch(entry) is not None
    )


def _unseen(token: Any) -> bool:
    """An added token whose match this path's check (its lowered content in the lowered
    text) may miss: one matched after normalization whose content normalizing may change
    in another way (whitespace, anything but printable ASCII)."""
    content = str(token.content)
    unusual = _OTHER.search(content) is not None or any(c.isspace() for c in content)
    return bool(token.normalized) and unusual
