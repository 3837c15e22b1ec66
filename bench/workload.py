"""What the benchmarks send: the named request scenarios and their deterministic texts."""

from __future__ import annotations

import json
from typing import Any

WORDS = [
    "the",
    "capital",
    "of",
    "france",
    "is",
    "paris",
    "and",
    "the",
    "eiffel",
    "tower",
    "stands",
    "by",
    "the",
    "seine",
    "river",
    "while",
    "berlin",
    "lies",
    "in",
    "germany",
    "near",
    "the",
    "spree",
    "with",
    "many",
    "museums",
    "and",
    "parks",
]

QUERY = "Where is the Eiffel Tower?"


def doc(i: int, tokens: int = 100) -> str:
    """A deterministic English document of about ``tokens`` MiniLM tokens."""
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(tokens - 2))


# Every request carries documents nobody sent before: no count-cache hits in the proxy.
UNIQUE = "rerank 1x64 unique docs"
SCENARIOS: dict[str, tuple[str, dict[str, Any]]] = {
    "rerank 1x64": ("/rerank", {"query": QUERY, "documents": [doc(i) for i in range(64)]}),
    "rerank 1x256": ("/rerank", {"query": QUERY, "documents": [doc(i) for i in range(256)]}),
    "score N:N 32": (
        "/score",
        {"text_1": [doc(i, 20) for i in range(32)], "text_2": [doc(i + 1) for i in range(32)]},
    ),
    UNIQUE: ("/rerank", {"query": QUERY, "documents": [doc(i) for i in range(64)]}),
    "pass-through": ("/echo/bench", {"any": "body the proxy does not meter"}),
    "embeddings": ("/v1/embeddings", {"model": "minilm", "input": "hello world"}),
}


def request(scenario: str) -> tuple[str, bytes]:
    """The path and the JSON body of ``scenario``."""
    path, payload = SCENARIOS[scenario]
    return path, json.dumps(payload).encode()


def unique_bodies(seed: int, n: int) -> list[bytes]:
    """``n`` rerank 1x64 bodies whose documents differ from every other seed's and call's."""
    return [
        json.dumps(
            {
                "query": QUERY,
                "documents": [f"{seed}-{i}-{k} " + doc(i * 64 + k, 95) for k in range(64)],
            }
        ).encode()
        for i in range(n)
    ]
