"""Shared domain types: model families, verdicts, truncation options and the Tokenizer protocol."""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from packaging.version import InvalidVersion, Version

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


# The minor series ``make compat`` measures on a real engine (docs/compatibility.md): a
# sample of the old releases (one per series that changed the scoring code), then every
# release from 0.27.0 on.
PROVEN_SERIES = frozenset(
    {(0, minor) for minor in (8, 10, 13, 15, 16, 19, 20, 26, 27, 28, 29, 30, 31, 32)}
)
PROVEN_TEXT = (
    "0.8.x, 0.10.x, 0.13.x, 0.15.x, 0.16.x, 0.19.x, 0.20.x, 0.26.x, 0.27.0 - 0.32.x "
    "(docs/compatibility.md)"
)


_ODD_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


@functools.lru_cache(maxsize=64)
def _release_numbers(version: str | None) -> tuple[int, ...] | None:
    """The release numbers of a vLLM version (``0.30.1.dev12+gabc`` -> 0, 30, 1): PEP 440
    first (local builds, rc, dev and post releases), else the leading ``X.Y[.Z]`` of a
    string a build made oddly; None when there is none."""
    if not version:
        return None
    try:
        return Version(version).release
    except InvalidVersion:
        odd = _ODD_VERSION.match(version.strip())
        return None if odd is None else tuple(int(n) for n in odd.groups() if n is not None)


@dataclass(frozen=True, slots=True)
class Release:
    """An upstream vLLM release, reduced to the behaviour switches accounting needs.

    Every switch assumes the newest behaviour when the version is unknown."""

    version: str | None

    @property
    def _parsed(self) -> tuple[int, int] | None:
        numbers = _release_numbers(self.version)
        return None if numbers is None or len(numbers) < 2 else (numbers[0], numbers[1])

    @property
    def invocations_model_from_header(self) -> bool:
        """From 0.11.1 ``/invocations`` takes the model from the SageMaker adapter header
        (``inject_adapter_id`` sets the body's ``model`` to it, None without it: the
        default model); before, from the body."""
        parsed = self._parsed
        if parsed is None:
            return True
        if parsed != (0, 11):
            return parsed > (0, 11)
        return (self._patch or 0) >= 1

    def _from(self, series: tuple[int, int]) -> bool:
        parsed = self._parsed
        return parsed is None or parsed >= series

    def since(self, series: tuple[int, int]) -> bool:
        """The release is of ``series`` (major, minor) or later (or unknown: the newest)."""
        return self._from(series)

    @property
    def proven(self) -> bool | None:
        """In a minor series ``make compat`` runs on a real engine (``PROVEN_SERIES``);
        None when the version is unknown."""
        parsed = self._parsed
        return None if parsed is None else parsed in PROVEN_SERIES

    @property
    def reports_engine_usage(self) -> bool | None:
        """True from 0.30.0 (the fix), False before, None when the version is unknown."""
        parsed = self._parsed
        return None if parsed is None else parsed >= (0, 30)

    @property
    def pads(self) -> bool:
        """``padding: "max_length"`` is honoured from 0.29 (earlier releases accept the
        field as an unknown extra and ignore it; measured by make compat on 0.28.0)."""
        return self._from((0, 29))

    @property
    def cuts_text(self) -> bool:
        """``max_tokens_per_query/doc`` exist from 0.20; earlier releases ignore them as
        unknown extras and encode the whole text (measured on 0.15.1)."""
        return self._from((0, 20))

    @property
    def truncates_left(self) -> bool:
        """False on 0.19.x only: its scoring asks the tokenizer for no truncation when
        ``truncation_side`` is ``"left"`` (a later slice was to cut) and never slices, so
        ``truncate_prompt_tokens`` is not applied at all (make compat on 0.19.1: 197
        tokens processed where 0.16.0 and 0.20.2 process 32). Before 0.19 the side is an
        ignored extra; from 0.20 the scoring IO processors slice."""
        parsed = self._parsed
        return parsed is None or parsed[:2] != (0, 19)

    def applied(self, truncation: Truncation) -> Truncation:
        """The request's options as this release applies them (the ones it does not
        know are extras it ignores)."""
        changes: dict[str, Any] = {}
        if truncation.pad_to_max_length and not self.pads:
            changes["pad_to_max_length"] = False
        if truncation.truncation_side == "left" and not self.truncates_left:
            changes |= {"truncate_prompt_tokens": None, "truncation_side": None}
        if (truncation.max_tokens_per_query or truncation.max_tokens_per_doc) and (
            not self.cuts_text
        ):
            changes |= {"max_tokens_per_query": 0, "max_tokens_per_doc": 0}
        return replace(truncation, **changes) if changes else truncation

    @property
    def runs_transformers_4(self) -> bool:
        """Releases up to 0.19.0 run transformers 4.x: their wheels pin it below 5 (read in
        0.13.0 - 0.19.0; 0.8 - 0.10 need it for their CPU extension), and make compat
        measured 4.57.6 under 0.15.1 and 0.16.0. 0.19.1 - 0.22 accept 4.56 or 5.5.1+ (a
        fresh install gets 5.x); 0.24 on require 5.5.3+ (0.29: 5.10)."""
        parsed = self._parsed
        if parsed is None or parsed > (0, 19):
            return False
        return parsed < (0, 19) or self._patch == 0

    @property
    def _patch(self) -> int | None:
        """The patch number (``0.19.0+cpu`` -> 0), None when there is none."""
        numbers = _release_numbers(self.version)
        return numbers[2] if numbers is not None and len(numbers) > 2 else None

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
    def sanitizes_repeatedly(self) -> bool:
        """From 0.34 jina-reranker-v3's texts lose its embed tokens until none is left (one
        pass before), so a token hidden inside another is removed too (assumed when unknown,
        as the newest release does)."""
        return self._from((0, 34))

    @property
    def joins_cut_texts(self) -> bool:
        """An LLM reranker without a template joins its two texts and tokenizes them from
        0.31; up to 0.30 a ``max_tokens_per_doc`` request joined their ids instead."""
        parsed = self._parsed
        return parsed is None or parsed >= (0, 31)

    @property
    def iterative_text_cut(self) -> bool:
        """max_tokens_per_query/doc cut text iteratively from 0.31 (assumed when unknown)."""
        return self._from((0, 31))


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
