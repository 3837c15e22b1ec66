"""Count-only lengths for BERT WordPiece tokenizers (issue #51): the tokenizer's own model
counts each word once, a per-copy cache counts it after that, and str methods and one
regex (C loops) do what the normalizer and the pre-tokenizer do, for the texts where
that is exact.

On a text of printable ASCII, tab, newline and carriage return, ``BertNormalizer`` only
maps those three to a space and, with ``lowercase``, lowers the letters (nothing to clean,
no CJK character to pad, no accent to strip), and ``BertPreTokenizer`` splits on
whitespace and isolates every ASCII punctuation character. The model then tokenizes each
piece alone, and the post-processor adds a fixed number of special tokens. So a text's
length is the sum of its words' model lengths plus the specials, with no ids, masks,
type ids, offsets or token strings built (``encode_batch_fast`` still builds all but the
offsets: about six times the work on English text). Any other text, one that holds an
added token's content (any case), and any other tokenizer take ``encode_batch_fast``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tokenizers import models, normalizers, pre_tokenizers, processors

# Anything but printable ASCII, tab, newline and carriage return.
_OTHER = re.compile(r"[^\t\n\r -~]")
# char::is_ascii_punctuation, which BertPreTokenizer isolates (with Unicode's, none ASCII).
_PUNCTUATION = r"!-/:-@\[-`{-~"
_WORDS = re.compile(rf"[^\s{_PUNCTUATION}]+|[{_PUNCTUATION}]")
# Words held per tokenizer copy, in each of two generations, and the longest one held:
# a copy's cache stays under about 4 MB whatever its texts.
HELD_WORDS = 16 * 1024
HELD_WORD_CHARS = 64
# More added tokens than this (each looked for in every text) and the path is not taken.
MOST_ADDED = 64
_PROCESSORS = (processors.TemplateProcessing, processors.BertProcessing)


class WordCounts:
    """Lengths (special tokens included) of the texts ``backend`` would count the same
    way word by word; None for any other text."""

    def __init__(self, model: Any, lowercase: bool, added: list[str], specials: int) -> None:
        self._tokenize = model.tokenize
        self._lowercase = lowercase
        self._added = added  # lowered contents, each falls back wherever it appears
        self._specials = specials
        self._young: dict[str, int] = {}
        self._old: dict[str, int] = {}

    @classmethod
    def of(cls, backend: Any) -> WordCounts | None:
        """The count-only path for a tokenizers ``Tokenizer``, or None when its pipeline is
        not BertNormalizer, BertPreTokenizer, WordPiece and a template post-processor, or an
        added token could match a text in a way this path does not see."""
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
        return cls(model, bool(normalizer.lowercase), contents, specials)

    def length(self, text: str) -> int | None:
        """``text``'s token count with special tokens, or None when this path cannot
        count it exactly."""
        if _OTHER.search(text) is not None:
            return None
        lowered = text.lower()
        if any(content in lowered for content in self._added):
            return None
        words = _WORDS.findall(lowered if self._lowercase else text)
        counts = list(map(self._young.get, words))
        if None in counts:
            counts = [self._miss(w) if n is None else n for w, n in zip(words, counts, strict=True)]
        return sum(counts) + self._specials  # type: ignore[arg-type]

    def lengths(self, texts: Sequence[str]) -> list[int | None]:
        return [self.length(text) for text in texts]

    def _miss(self, word: str) -> int:
        """A word the young generation does not hold: from the old one (moved back to the
        young one) or from the model."""
        count = self._old.pop(word, None)
        if count is None:
            count = len(self._tokenize(word))
        if len(word) <= HELD_WORD_CHARS:
            if len(self._young) >= HELD_WORDS:
                self._young, self._old = {}, self._young
            self._young[word] = count
        return count


def _unseen(token: Any) -> bool:
    """An added token whose match this path's check (its lowered content in the lowered
    text) may miss: one matched after normalization whose content normalizing may change
    in another way (whitespace, anything but printable ASCII)."""
    content = str(token.content)
    unusual = _OTHER.search(content) is not None or any(c.isspace() for c in content)
    return bool(token.normalized) and unusual
