"""The options of counting: the tokenizer threads, the model discovery refresh, the
recounts that check the engine's reported usage, and the count cache."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class CountingOptions(BaseModel):
    """How the proxy counts tokens and checks the engine's counts."""

    tokenizer_threads: int = Field(2, ge=1, description="Threads that run tokenization.")
    refresh_interval: float = Field(
        60.0, gt=0, description="Seconds between reads of upstream /version and /v1/models."
    )
    recount_fraction: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Share of requests recounted in full once a model is trusted; the rest "
        "are judged by a shortcut (bi-encoders: the derivation from the reported count and "
        "the query length). Until then every request is recounted.",
    )
    upstream_transformers: Literal["auto", "4", "5"] = Field(
        "auto",
        description="The transformers major version the upstream counts with: auto is 4 "
        "up to vLLM 0.19.0 (which pin it below 5) and 5 from 0.19.1 (0.24 requires 5.5.3); "
        "set 4 for a 0.19.1 - 0.23 server installed with transformers 4.x. Some tokenizers "
        "(XLM-R) count differently.",
    )
    trust_after_recounts: int = Field(
        3,
        ge=1,
        description="Full recounts of a model (per release) that must agree with the upstream "
        "(exact or corrected) before --recount-fraction's shortcuts are used for it; one "
        "disagreement turns them off for that model.",
    )
    count_cache_size: int = Field(
        50_000,
        ge=0,
        description="Cached per-text token counts (0 disables; the least recently used go "
        "first, by generations). Texts up to 2,048 characters are kept as their own keys "
        "(at most 32 MiB of them), longer ones as a 16-byte digest.",
    )
