"""The query and documents the scoring tests send, and the rerank request they make."""

from __future__ import annotations

from typing import Any

QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital of France.", "The Eiffel Tower is in Paris.", "Berlin is in Germany."]
RERANK: dict[str, Any] = {"query": QUERY, "documents": DOCS}
