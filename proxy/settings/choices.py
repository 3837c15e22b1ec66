"""The values options take: the modes, the event loops, the journal's durability and
default path, the prefix-cache salting, a served model's overrides; the environment's
prefix and the options that are not flags."""

from __future__ import annotations

import enum
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from proxy.accounting.types import Family

ENV_PREFIX = "USAGE_PROXY_"


# Not flags: structured (models) or secret (headers, the salt key: argv is visible to every
# local user).
FILE_ONLY = frozenset({"models", "cloudevents_headers", "cache_salt_secret"})


def items(value: str) -> list[str]:
    """The items of a comma-separated option."""
    return [item.strip() for item in value.split(",") if item.strip()]


class Mode(enum.StrEnum):
    REWRITE = "rewrite"
    ANNOTATE = "annotate"
    SHADOW = "shadow"


class CacheSalting(enum.StrEnum):
    TENANT = "tenant"
    OFF = "off"


class Durability(enum.StrEnum):
    SYNC = "sync"
    ASYNC = "async"


class EventLoop(enum.StrEnum):
    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


def default_journal_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "vllm-usage-proxy" / "journal.sqlite"


class ModelOverride(BaseModel):
    """Per-model knowledge that discovery cannot get from the upstream."""

    model_config = ConfigDict(extra="forbid")

    tokenizer: str | None = Field(
        None, description="Tokenizer directory or HF id in the local cache (default: root)."
    )
    family: Family | None = Field(
        None,
        description="Scoring family (default: config.json, corrected by the routes the "
        "server serves).",
    )
    template: Path | None = Field(
        None,
        description="The score template file the server was given as --chat-template "
        "(LLM rerankers such as Qwen3-Reranker); the proxy renders it as vLLM does.",
    )
    use_sep_token: bool | None = Field(
        None,
        description="An LLM reranker without a template: tokenize query and document as a "
        "pair (true) or joined (false); default as vLLM decides from the config.",
    )
