"""Hugging Face tokenizers behind the accounting ``Tokenizer`` protocol, and a thread pool.

vLLM tokenizes through the transformers call API. Pairs and offsets go through that API
here too. Single-text lengths, the bulk of every recount, come from the same Rust
backend that call uses, set up as the call sets it up (no truncation or padding from the
tokenizer file): the call only converts ids, masks and offsets to Python lists around
it, and counting needs lengths (``encode_batch_fast``: no offsets either). A fast
tokenizer must not be used by two threads at once, so every worker thread gets its own
copy (made on first use) and no shared instance is ever mutated.
"""

from __future__ import annotations

import copy
import functools
import inspect
import itertools
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from proxy.accounting.types import NotCached, Tokenizer, Uncountable
from proxy.tokenizers.cache import CountCache
from proxy.tokenizers.words import WordCounts

_keys = itertools.count()
# The tokenizer library behaviour counts follow: the upstream's (see load_tokenizer).
TRANSFORMERS_5 = "transformers 5 (the tokenizer class rebuilds its pipeline)"
TRANSFORMERS_4 = "transformers 4 (tokenizer.json as it is)"
# Texts longer than this are counted chunk by chunk, stopping once the count passes the
# bound: the tokenizer's memory then follows the chunk, not the text (one 2 MiB text used
# to take ~600 MB). A chunk ends right before a single space between a letter or digit and
# a non-space character: there every pre-tokenizer vLLM's models use splits, whatever
# follows (BERT's, Metaspace, GPT-2's and Qwen's byte-level patterns, the last of which
# keep newline runs, and punctuation with the newlines after it, as one pre-token; a cut
# anywhere else in whitespace could split a token the vocabulary merges, such as "\n\n").
LONG_TEXT_CHARS = 32 * 1024
CHUNK_CHARS = 16 * 1024
# A run without such a cut is tokenized whole (about 70 MB of tokenizer memory per MiB
# with MiniLM); longer runs are not counted at all.
MAX_RUN_CHARS = 64 * 1024


def _is_cut(text: str, i: int) -> bool:
    """A chunk may start at ``i``: a single space after a letter or digit, before a
    non-space character."""
    return (
        0 < i < len(text) - 1
        and text[i] == " "
        and text[i - 1].isalnum()
        and not text[i + 1].isspace()
    )


def _last_cut(text: str, low: int, high: int) -> int:
    """The last cut in ``[low, high)``, or -1."""
    i = text.rfind(" ", low, high)
    while i >= low:
        if _is_cut(text, i):
            return i
        i = text.rfind(" ", low, i)
    return -1


def _next_cut(text: str, low: int) -> int:
    """The first cut at or after ``low``, or -1."""
    i = text.find(" ", low)
    while i != -1:
        if _is_cut(text, i):
            return i
        i = text.find(" ", i + 1)
    return -1


def whitespace_chunks(text: str, size: int) -> list[tuple[int, int]]:
    """(start, end) pieces of ``text`` of about ``size`` characters, each cut where no
    pre-tokenizer can join the two sides (``_is_cut``); a piece without such a cut longer
    than ``size`` stays whole, and one longer than MAX_RUN_CHARS raises Uncountable."""
    pieces: list[tuple[int, int]] = []
    start = 0
    while len(text) - start > size:
        cut = _last_cut(text, start + 1, start + size + 1)
        if cut < 0:
            cut = _next_cut(text, start + size)
        end = len(text) if cut < 0 else cut
        if end - start > MAX_RUN_CHARS:
            raise Uncountable(f"a run of more than {MAX_RUN_CHARS} characters without a cut")
        if cut < 0:
            break
        pieces.append((start, cut))
        start = cut
    pieces.append((start, len(text)))
    return pieces


def backend_lengths(tokenizer: Any, texts: list[str], *, add_special_tokens: bool) -> list[int]:
    """Token counts from ``tokenizer``'s Rust backend, set up as the transformers call
    sets it up for an untruncated, unpadded batch: no truncation and no padding (a
    tokenizer file may carry its own), special tokens split as the call splits them.
    ``encode_batch_fast`` (tokenizers >= 0.21) computes no offsets. The backend belongs
    to the calling thread's own tokenizer copy (see TokenizerPool)."""
    backend = tokenizer.backend_tokenizer
    if backend.truncation is not None:
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()
    split = bool(getattr(tokenizer, "split_special_tokens", False))
    if backend.encode_special_tokens != split:
        backend.encode_special_tokens = split
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return [len(e) for e in encode(texts, add_special_tokens=add_special_tokens)]


class HFTokenizer:
    """Adapter from a transformers tokenizer to the accounting protocol."""

    def __init__(self, tokenizer: Any, words: frozenset[str] | None = None) -> None:
        self._tok = tokenizer
        self.key = next(_keys)
        # The count cache keeps each tenant's entries apart (``for_tenant``): a tenant
        # cannot learn from a fast answer that another one sent a text.
        self.cache_key = (self.key, "")
        self.cache: CountCache | None = None
        # Token counts above this never matter (``serve``); None: exact.
        self.bound: int | None = None
        self._specials = int(tokenizer.num_special_tokens_to_add(pair=False))
        self.semantics = TRANSFORMERS_5  # which library behaviour the counts follow
        self._pair_specials = int(tokenizer.num_special_tokens_to_add(pair=True))
        # Count-only lengths where they are exact (BERT WordPiece, plain ASCII texts); this
        # copy's own, as its backend is, over the vocabulary's words (``words``: another
        # copy's, shared).
        self._words = WordCounts.of(tokenizer.backend_tokenizer, words)

    @property
    def pad_token_id(self) -> int | None:
        value = self._tok.pad_token_id
        return None if value is None else int(value)

    @property
    def truncation_side(self) -> str:
        return str(self._tok.truncation_side)

    def lengths(self, texts: Sequence[str], *, max_length: int | None) -> list[int]:
        if self.cache is not None:
            return self.cache.lengths(self, texts, max_length)
        return self.encode_lengths(texts, max_length=max_length)

    def encode_lengths(self, texts: Sequence[str], *, max_length: int | None) -> list[int]:
        if not texts:
            return []
        long = {i for i, t in enumerate(texts) if self._is_long(t)}
        short = [t for i, t in enumerate(texts) if i not in long]
        counted = iter(self._batch_lengths(short, max_length) if short else [])
        out = []
        for i, text in enumerate(texts):
            if i in long:
                n = self._content_length(text) + self._specials
                out.append(n if max_length is None else min(n, max_length))
            else:
                out.append(next(counted))
        return out

    def _batch_lengths(self, texts: Sequence[str], max_length: int | None) -> list[int]:
        """Lengths with special tokens. Truncating one text to ``max_length`` (at least its
        special tokens, see accounting._MIN_CAP) keeps ``min(length, max_length)``."""
        lengths = self._full_lengths(texts)
        if max_length is None:
            return lengths
        return [min(n, max_length) for n in lengths]

    def _full_lengths(self, texts: Sequence[str]) -> list[int]:
        """Untruncated lengths with special tokens: word by word where that is exact
        (``WordCounts``), the rest in one backend batch."""
        if self._words is None:
            return backend_lengths(self._tok, list(texts), add_special_tokens=True)
        counted = self._words.lengths(texts)
        rest = [text for text, n in zip(texts, counted, strict=True) if n is None]
        if not rest:
            return counted  # type: ignore[return-value]
        more = iter(backend_lengths(self._tok, rest, add_special_tokens=True))
        return [next(more) if n is None else n for n in counted]

    def _is_long(self, text: str) -> bool:
        return self.bound is not None and len(text) > LONG_TEXT_CHARS

    def _content_length(self, text: str) -> int:
        """Content tokens of a long text, chunk by chunk, stopping past the bound."""
        assert self.bound is not None
        total = 0
        for start, end in whitespace_chunks(text, CHUNK_CHARS):
            total += backend_lengths(self._tok, [text[start:end]], add_special_tokens=False)[0]
            if total > self.bound:
                break
        return total

    def pair_length(
        self, text: str, pair: str, *, max_length: int | None, only_second: bool
    ) -> int:
        if self._is_long(text) or self._is_long(pair):
            # [CLS] q [SEP] d [SEP]: truncation keeps max_length when it can (vLLM answers
            # 400 when only_second cannot reach it; the count is then never billed).
            total = (
                self._content_length(text)
                + self._content_length(pair)
                + self.num_special_tokens_pair()
            )
            return total if max_length is None else min(total, max_length)
        truncation: bool | str = max_length is not None
        if only_second:
            truncation = "only_second"
        out = self._tok(
            text=text,
            text_pair=pair,
            add_special_tokens=True,
            truncation=truncation,
            max_length=max_length,
        )
        return len(out["input_ids"])

    def content_offsets(self, text: str) -> list[tuple[int, int]]:
        if not self._is_long(text):
            out = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
            return [(int(a), int(b)) for a, b in out["offset_mapping"]]
        assert self.bound is not None
        offsets: list[tuple[int, int]] = []
        for start, end in whitespace_chunks(text, CHUNK_CHARS):
            out = self._tok(text[start:end], add_special_tokens=False, return_offsets_mapping=True)
            offsets.extend((start + int(a), start + int(b)) for a, b in out["offset_mapping"])
            if len(offsets) > self.bound:
                break
        return offsets

    def num_special_tokens_pair(self) -> int:
        return self._pair_specials

    def render_chat(
        self, template: str, messages: Sequence[dict[str, str]], kwargs: dict[str, Any]
    ) -> str:
        """The prompt vLLM's ``safe_apply_chat_template`` renders (``tokenize=False``): the
        request's ``chat_template_kwargs`` reach the template only where vLLM lets them
        (``apply_chat_template``'s own parameters and the template's variables)."""
        accepted = _accepted_kwargs(self._tok, template)
        passed = {k: v for k, v in kwargs.items() if k in accepted}
        rendered = self._tok.apply_chat_template(
            list(messages), chat_template=template, tokenize=False, **passed
        )
        return str(rendered)

    def for_tenant(self, tenant: str) -> HFTokenizer:
        """This tokenizer (the same instance underneath: same thread) counting into
        ``tenant``'s own part of the count cache."""
        view = copy.copy(self)
        view.cache_key = (self.key, tenant)
        return view

    def serve(self, cache: CountCache | None, max_model_len: int) -> None:
        """Serve a discovered model: count through the shared ``cache``, and never past
        ``max_model_len + 2`` tokens (any engine input longer than ``max_model_len`` is
        refused or cut by vLLM, so a larger count never matters)."""
        self.cache = cache
        self.bound = max_model_len + 2

    def copy(self) -> HFTokenizer:
        public = None if self._words is None else self._words.public
        twin = HFTokenizer(copy.deepcopy(self._tok), public)
        twin.key, twin.cache_key = self.key, self.cache_key
        twin.cache = self.cache
        twin.bound = self.bound
        twin.semantics = self.semantics
        return twin


# Keys vLLM refuses in chat_template_kwargs (it answers 400) or fixes itself.
_RESERVED_KWARGS = frozenset({"chat_template", "tools", "tokenize"})


@functools.lru_cache(maxsize=64)
def _template_variables(template: str) -> frozenset[str]:
    """The variables a template reads. Parsed with the loop controls transformers enables;
    a tag only transformers knows (``{% generation %}``) leaves the set empty, so only
    ``apply_chat_template``'s own parameters pass (rendering reports any real error)."""
    import jinja2
    import jinja2.meta

    environment = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    try:
        parsed = environment.parse(template)
    except jinja2.TemplateSyntaxError:
        return frozenset()
    return frozenset(jinja2.meta.find_undeclared_variables(parsed))


def _accepted_kwargs(tokenizer: Any, template: str) -> frozenset[str]:
    """vLLM's ``resolve_chat_template_kwargs``: the named parameters of
    ``apply_chat_template`` and the template's own variables, reserved keys excepted."""
    named = {
        name
        for name, p in inspect.signature(tokenizer.apply_chat_template).parameters.items()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }
    return frozenset((named | _template_variables(template)) - _RESERVED_KWARGS)


class CachedCounts:
    """The accounting protocol over the shared count cache alone: it never calls the
    tokenizer, so it may run on the event loop; any count not cached raises NotCached
    and the request is counted in the tokenizer pool instead."""

    def __init__(self, base: Tokenizer, tenant: str = "") -> None:
        if not isinstance(base, HFTokenizer):
            raise NotCached
        self._base = base.for_tenant(tenant)

    @property
    def pad_token_id(self) -> int | None:
        return self._base.pad_token_id

    @property
    def truncation_side(self) -> str:
        return self._base.truncation_side

    def lengths(self, texts: Sequence[str], *, max_length: int | None) -> list[int]:
        cache = self._base.cache
        found = None if cache is None else cache.cached(self._base, texts, max_length)
        if found is None:
            raise NotCached
        return found

    def pair_length(
        self, text: str, pair: str, *, max_length: int | None, only_second: bool
    ) -> int:
        raise NotCached

    def content_offsets(self, text: str) -> list[tuple[int, int]]:
        raise NotCached

    def num_special_tokens_pair(self) -> int:
        return self._base.num_special_tokens_pair()

    def render_chat(
        self, template: str, messages: Sequence[dict[str, str]], kwargs: dict[str, Any]
    ) -> str:
        raise NotCached


# What transformers 4.x reads from tokenizer_config.json when it loads tokenizer.json.
_SPECIAL_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def load_tokenizer(source: str | Path, *, transformers_4: bool = False) -> HFTokenizer:
    """Load a tokenizer from a local directory or the local HF cache, never the network.

    ``transformers_4``: count as an upstream running transformers 4.x does (vLLM before
    0.16): it takes ``tokenizer.json`` as it is, where transformers 5 lets some tokenizer
    classes (XLM-R among them) rebuild the normalizer and pre-tokenizer, which changes
    counts ("line one\nline two": 7 tokens under 4.57, 6 under 5.x)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # One tokenizer call per request on one thread: the pool threads give parallelism
    # across requests. Rayon's threads inside a call cost about 1.6x the CPU (they spin
    # while waiting) for half the wall time of one batch; a sidecar pays CPU, not wall.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    # Its records join the process's JSON lines (proxy.logs), not its own bare handler.
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    tok = _as_in_transformers_4(source) if transformers_4 else None
    semantics = TRANSFORMERS_4 if tok is not None else TRANSFORMERS_5
    if tok is None:
        tok = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"{source}: a fast tokenizer is required (offset mappings)")
    adapter = HFTokenizer(tok)
    adapter.semantics = semantics
    return adapter


def model_file(source: str | Path, name: str) -> Path | None:
    """A file of a local model directory, or of an HF id in the local cache (offline)."""
    path = Path(source) / name
    if path.is_file():
        return path
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(str(source), name)
    except ValueError:  # not a valid HF id either (e.g. a missing absolute path)
        return None
    return Path(cached) if isinstance(cached, str) else None


def _as_in_transformers_4(source: str | Path) -> Any | None:
    """``tokenizer.json`` loaded as it is, with the special tokens its config names (what
    ``PreTrainedTokenizerFast`` did in 4.x); None without a ``tokenizer.json``."""
    from transformers import PreTrainedTokenizerFast

    file = model_file(source, "tokenizer.json")
    if file is None:
        return None
    config_file = model_file(source, "tokenizer_config.json")
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file else {}
    specials: dict[str, str] = {}
    for key in _SPECIAL_KEYS:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            specials[key] = value
    tok = PreTrainedTokenizerFast(tokenizer_file=str(file), **specials)  # type: ignore[no-untyped-call]
    tok.truncation_side = str(config.get("truncation_side", "right"))
    return tok


def for_tenant(tokenizer: Tokenizer, tenant: str) -> Tokenizer:
    """``tokenizer`` counting into ``tenant``'s part of the count cache (one that is not a
    Hugging Face tokenizer has no cache)."""
    return tokenizer.for_tenant(tenant) if isinstance(tokenizer, HFTokenizer) else tokenizer


def cached_for(tenant: str) -> Callable[[Tokenizer], Tokenizer]:
    """The count cache alone, ``tenant``'s part of it (``CachedCounts``)."""
    return lambda tokenizer: CachedCounts(tokenizer, tenant)
