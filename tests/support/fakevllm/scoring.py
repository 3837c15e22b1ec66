"""/score, /rerank: vLLM's scoring request models, tokenization and usage of each
version (0.29.0 reports inflated bi-encoder usage, 0.30 and later engine-level), written
independently of ``proxy.accounting.counts``, with each version's error bodies."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from typing import Annotated, Any, Literal, Required

from aiohttp import web
from multidict import CIMultiDict
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from tests.support.fakevllm.base import FakeState, dumps, error

SCORE_PATHS = ("/score", "/v1/score")
# The body as it came on the wire, when a dispatcher (``/invocations``) rewrote it.
RECEIVED = web.RequestKey("received", bytes)
RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")
# vLLM's score request union, in the order it tries the field pairs.
SCORE_FIELD_PAIRS = (
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
    ("text_1", "text_2"),
)


class _Common(BaseModel):
    """vLLM's ScoringRequestMixin fields (protocol.py), validated like vLLM does."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    padding: Literal["max_length", "do_not_pad"] | None = None
    truncation_side: Literal["left", "right"] | None = None
    max_tokens_per_query: int = 0
    max_tokens_per_doc: int = 0


class MultiModal(TypedDict, total=False):
    """vLLM's ScoreMultiModalParam: a dict without ``content`` is no input."""

    content: Required[list[dict[str, Any]]]


Input = str | MultiModal
INPUTS: TypeAdapter[Any] = TypeAdapter(Input | list[Input])


class _Rerank(_Common):
    query: Input
    documents: Input | list[Input]
    top_n: int = Field(default=0, ge=0)


def _validate(body: Any, rerank: bool) -> None:
    """Raise FakeError (400) where vLLM's pydantic request models would."""
    try:
        if rerank:
            _Rerank.model_validate(body)
            return
        if not isinstance(body, dict):
            raise FakeError("Input should be a valid dictionary")
        _Common.model_validate(body)
        if _score_pair(body) is None:
            raise FakeError("Field required")
    except ValidationError as exc:
        raise FakeError(str(exc).splitlines()[0]) from exc


def _score_pair(body: dict[str, Any]) -> tuple[str, str] | None:
    """The field pair vLLM's ScoreRequest union reads: the first member whose two inputs
    validate (checked with ``TypeAdapter(ScoreRequest)`` in the 0.29.0 environment: a pair
    with a dict input lacking ``content`` is skipped for the next one)."""
    for a, b in SCORE_FIELD_PAIRS:
        if a in body and b in body:
            try:
                INPUTS.validate_python(body[a])
                INPUTS.validate_python(body[b])
            except ValidationError:
                continue
            return a, b
    return None


class FakeError(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ScoringAPI(FakeState):
    """The scoring endpoints, the way vLLM's scoring IO processors handle a request."""

    async def handle_scoring(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.raw_bodies.append(request.get(RECEIVED, raw))
        self.seen_headers.append(CIMultiDict(request.headers))
        try:
            body = json.loads(raw)
        except ValueError:
            return error(400, "JSON decode error", "BadRequestError")
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.ok_error:  # releases up to 0.17: "does not support Score API" with HTTP 200
            message = {
                "object": "error",
                "message": "The model does not support Score API",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
            return web.Response(body=dumps(message), content_type="application/json")
        if not self.known_model(body):
            return error(
                404, f"The model `{body['model']}` does not exist.", "NotFoundError", "model"
            )
        rerank = request.path in RERANK_PATHS or (
            request.path == "/invocations" and isinstance(body, dict) and "query" in body
        )
        try:
            _validate(body, rerank)
            queries, docs = self._inputs(body, rerank)
            per_input, reported = self._usage(body, queries, docs)
        except FakeError as exc:
            return error(400, str(exc), "BadRequestError", exc.param)
        self.prompt_tokens_total += per_input
        pairs = zip(self._expand(queries, docs), docs, strict=True)
        scores = [self._score(q, d) for q, d in pairs]
        if rerank:
            answer = self._rerank_body(body, docs, scores, reported)
        else:
            answer = self._score_body(scores, reported)
        self.last_body = dumps(answer)
        return self.answer(self.last_body)

    # --- request handling, the way vLLM's scoring IO processors do it ---------------

    def _inputs(self, body: dict[str, Any], rerank: bool) -> tuple[list[str], list[str]]:
        if rerank:
            first, second = body.get("query"), body.get("documents")
        else:
            pair = _score_pair(body)
            if pair is None:
                raise FakeError("Field required")
            first, second = body[pair[0]], body[pair[1]]
        queries = first if isinstance(first, list) else [first]
        docs = second if isinstance(second, list) else [second]
        if not all(isinstance(x, str) for x in (*queries, *docs)):
            raise FakeError("MultiModalParam is not supported for BertModel")
        if not queries or not docs:
            raise FakeError("At least one text element must be given")
        if len(queries) > 1 and len(queries) != len(docs):
            raise FakeError("Input lengths must be either 1:1, 1:N or N:N")
        return queries, docs

    @staticmethod
    def _expand(queries: list[str], docs: list[str]) -> list[str]:
        return queries * len(docs) if len(queries) == 1 else queries

    def _tokens(self, body: dict[str, Any], text: str, pair: str | None = None) -> list[int]:
        """Tokenize like TokenizeParams.get_encode_kwargs + apply_post_tokenization."""
        keep = body.get("truncate_prompt_tokens")
        # truncation_side is a field from 0.19; earlier releases ignore it (an extra).
        side = body.get("truncation_side") if self._series >= (0, 19) else None
        if side == "left" and self._series == (0, 19):
            keep = side = None  # 0.19.x: no HF truncation for "left", and no slice after
        mml = self.max_model_len
        if keep is not None and keep > mml:
            raise FakeError(
                "truncate_prompt_tokens cannot be greater than max_model_len",
                "truncate_prompt_tokens",
            )
        if keep is not None and keep < 0:
            keep = mml
        if keep is not None and side is not None:
            kwargs: dict[str, Any] = {"truncation": False}
        else:
            max_length = keep if keep is not None else mml + 1
            kwargs = {"truncation": max_length is not None, "max_length": max_length}
        if keep == 0:
            ids: list[int] = []
        elif pair is None:
            ids = self.tokenizer(text, add_special_tokens=True, **kwargs)["input_ids"]
        else:
            ids = self.tokenizer(text=text, text_pair=pair, add_special_tokens=True, **kwargs)[
                "input_ids"
            ]
        if keep is not None and keep < len(ids):
            ids = ids[-keep:] if (side or self.tokenizer.truncation_side) == "left" else ids[:keep]
        if body.get("padding") == "max_length" and len(ids) < mml:
            ids = ids + [self.tokenizer.pad_token_id] * (mml - len(ids))
        if len(ids) > mml:
            raise FakeError(
                f"This model's maximum context length is {mml} tokens. However, your "
                f"request has {len(ids)} input tokens.",
                "input_tokens",
            )
        return list(ids)

    def _usage(self, body: dict[str, Any], queries: list[str], docs: list[str]) -> tuple[int, int]:
        """(engine-level tokens, reported prompt_tokens) for this version and family."""
        if self.family == "cross-encoder":
            pairs = [
                len(self._tokens(body, q, d))
                for q, d in zip(self._expand(queries, docs), docs, strict=True)
            ]
            return sum(pairs), sum(pairs)
        q_ids = [self._tokens(body, q) for q in queries]
        d_ids = [self._tokens(body, d) for d in docs]
        engine = sum(map(len, q_ids)) + sum(map(len, d_ids))
        if self.fixed:
            return engine, engine
        pad = [self.tokenizer.pad_token_id] if self.tokenizer.pad_token_id is not None else []
        q_pairs = q_ids * len(docs) if len(q_ids) == 1 else q_ids
        inflated = sum(len(q + pad + d) for q, d in zip(q_pairs, d_ids, strict=True))
        return engine, inflated

    @staticmethod
    def _score(query: str, doc: str) -> float:
        digest = hashlib.sha256(f"{query}\x00{doc}".encode()).digest()
        return int.from_bytes(digest[:7], "big") / float(1 << 56)

    def _score_body(self, scores: list[float], reported: int) -> dict[str, Any]:
        return {
            "id": f"score-{uuid.uuid4().hex[:16]}",
            "object": "list",
            "created": int(time.time()),
            "model": self.name,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": {
                "prompt_tokens": reported,
                "total_tokens": reported,
                "completion_tokens": 0,
                **self.prompt_details(),
                "completion_tokens_details": None,
            },
        }

    @property
    def _series(self) -> tuple[int, int]:
        major, minor = (int(x) for x in self.version.split(".")[:2])
        return major, minor

    def _rerank_usage(self, reported: int) -> dict[str, int]:
        """Rerank usage is ``total_tokens`` only before 0.13 (RerankUsage, 0.12.0 -> 0.13.0)."""
        if self._series < (0, 13):
            return {"total_tokens": reported}
        return {"prompt_tokens": reported, "total_tokens": reported}

    def _rerank_body(
        self, body: dict[str, Any], docs: list[str], scores: list[float], reported: int
    ) -> dict[str, Any]:
        order = sorted(range(len(docs)), key=lambda i: scores[i], reverse=True)
        top_n = body.get("top_n") or len(docs)
        results = [
            {
                "index": i,
                "document": {"text": docs[i], "multi_modal": None},
                "relevance_score": scores[i],
            }
            for i in order[:top_n]
        ]
        return {
            "id": f"score-{uuid.uuid4().hex[:16]}",
            "model": body.get("model") or self.name,
            "usage": self._rerank_usage(reported),
            "results": results,
        }
