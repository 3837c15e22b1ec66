"""Shared domain types: model families, verdicts, truncation options and the Tokenizer protocol."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

JSON = dict[str, Any]
TruncationSide = Literal["left", "right"]


class Family(enum.StrEnum):
    """How vLLM turns a scoring request into engine inputs (spec section 4)."""

    BI_ENCODER = "bi-encoder"
    LATE_INTERACTION = "late-interaction"
    CROSS_ENCODER = "cross-encoder"
    TEMPLATE_RERANKER = "template-reranker"
    JINA_V3 = "jina-v3"


class Verdict(enum.StrEnum):
    """What the proxy can say about the upstream's reported usage."""

    EXACT = "exact"
    CORRECTED = "corrected"
    MISMATCH = "mismatch"
    UNAUDITED = "unaudited"
    INVALID = "invalid"  # the upstream's usage is not a token count (or is ambiguous)


class Method(enum.StrEnum):
    """How the engine-level count was obtained."""

    RECOUNT = "recount"
    DERIVED = "derived"
    FORMULA = "formula"
    NONE = "none"


class Pairing(enum.StrEnum):
    ONE_TO_ONE = "1:1"
    ONE_TO_N = "1:N"
    N_TO_N = "N:N"


@dataclass(frozen=True, slots=True)
class Truncation:
    """The request fields that change how many tokens each engine input has."""

    truncate_prompt_tokens: int | None = None
    truncation_side: TruncationSide | None = None
    max_tokens_per_query: int = 0
    max_tokens_per_doc: int = 0
    pad_to_max_length: bool = False


class Tokenizer(Protocol):
    """The slice of a Hugging Face tokenizer that accounting needs (always add_special_tokens)."""

    @property
    def pad_token_id(self) -> int | None: ...

    @property
    def truncation_side(self) -> str: ...

    def lengths(self, texts: Sequence[str], *, max_length: int | None) -> list[int]:
        """Token counts with special tokens; HF truncation (keeping specials) when max_length."""
        ...

    def pair_length(
        self, text: str, pair: str, *, max_length: int | None, only_second: bool
    ) -> int:
        """Token count of ``tok(text=text, text_pair=pair)`` with optional HF truncation."""
        ...

    def content_offsets(self, text: str) -> list[tuple[int, int]]:
        """Character offsets of the text's tokens, without special tokens."""
        ...

    def num_special_tokens_pair(self) -> int: ...

    def render_chat(
        self, template: str, messages: Sequence[dict[str, str]], kwargs: dict[str, Any]
    ) -> str:
        """``apply_chat_template(messages, chat_template=template, tokenize=False)``."""
        ...


PROVEN_RANGE = ((0, 27), (0, 32))


@dataclass(frozen=True, slots=True)
class Release:
    """An upstream vLLM release, reduced to the behaviour switches accounting needs."""

    version: str | None

    @property
    def _parsed(self) -> tuple[int, int] | None:
        if not self.version:
            return None
        parts = self.version.lstrip("v").split(".")
        try:
            return int(parts[0]), int(parts[1])
        except (IndexError, ValueError):
            return None

    @property
    def proven(self) -> bool | None:
        """Within the releases ``make compat`` runs on a real engine (0.27.0 - 0.32.x);
        None when the version is unknown."""
        parsed = self._parsed
        return None if parsed is None else PROVEN_RANGE[0] <= parsed <= PROVEN_RANGE[1]

    @property
    def reports_engine_usage(self) -> bool | None:
        """True from 0.30.0 (the fix), False before, None when the version is unknown."""
        parsed = self._parsed
        return None if parsed is None else parsed >= (0, 30)

    @property
    def pads(self) -> bool:
        """``padding: "max_length"`` is honoured from 0.29 (earlier releases accept the
        field as an unknown extra and ignore it; measured by make compat on 0.28.0)."""
        parsed = self._parsed
        return parsed is None or parsed >= (0, 29)

    def applied(self, truncation: Truncation) -> Truncation:
        """The request's options as this release applies them."""
        if truncation.pad_to_max_length and not self.pads:
            return replace(truncation, pad_to_max_length=False)
        return truncation

    @property
    def runs_transformers_4(self) -> bool:
        """Releases before 0.16 run transformers 4.x (0.15 pins it below 5; 0.8 - 0.10 need
        it for their CPU extension); later ones install 5.x (0.29 requires 5.10)."""
        parsed = self._parsed
        return parsed is not None and parsed < (0, 16)

    @property
    def only_second_needs_room(self) -> bool:
        """From 0.33 a ``max_tokens_per_doc`` pair is truncated ``only_second`` only when
        the query and the special tokens leave room for the document; before, always."""
        parsed = self._parsed
        return parsed is not None and parsed >= (0, 33)

    @property
    def reserves_score_tokens(self) -> bool:
        """From 0.33 the tokens a model's score template appends after truncation
        (jina-reranker-m0's score token) are reserved out of every length limit."""
        parsed = self._parsed
        return parsed is not None and parsed >= (0, 33)

    @property
    def joins_cut_texts(self) -> bool:
        """An LLM reranker without a template joins its two texts and tokenizes them from
        0.31; up to 0.30 a ``max_tokens_per_doc`` request joined their ids instead."""
        parsed = self._parsed
        return parsed is None or parsed >= (0, 31)

    @property
    def iterative_text_cut(self) -> bool:
        """max_tokens_per_query/doc cut text iteratively from 0.31 (assumed when unknown)."""
        parsed = self._parsed
        return parsed is None or parsed >= (0, 31)


@dataclass(frozen=True, slots=True)
class ScorePrompt:
    """How vLLM builds a template reranker's prompt from a (query, document) pair, in the
    order its scoring code tries them: the server's ``--chat-template`` (rendered with the
    roles ``query`` and ``document``), else the model's own score template, else the pair
    tokenizer (``use_sep_token``), else the two texts joined."""

    chat_template: str | None = None
    builtin: Literal["jina-vl"] | None = None
    use_sep_token: bool = False


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """What the proxy knows about one served model: enough to count like its engine."""

    family: Family
    max_model_len: int
    has_pad_token: bool
    release: Release
    prompt: ScorePrompt | None = None  # template rerankers: how their prompt is built


class Uncountable(ValueError):
    """A text the proxy will not tokenize within its memory bound; the request is judged
    without a recount (the derivation path, else ``unaudited``: billed as reported)."""


class NotCached(LookupError):
    """A count the count cache does not hold (a cache-only tokenizer never tokenizes)."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One model the upstream serves, with what auditing needs or why it cannot audit."""

    name: str
    root: str
    max_model_len: int
    profile: EngineProfile | None
    tokenizer: Tokenizer | None
    problem: str | None = None
    task: str | None = None  # generate, embed, token_embed, classify; None: unknown
