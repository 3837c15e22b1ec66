"""Engine profiles for the accounting tests."""

from __future__ import annotations

from proxy.accounting.types import EngineProfile, Family, Release, ScorePrompt


def profile(
    family: Family = Family.BI_ENCODER,
    version: str | None = "0.29.0",
    max_model_len: int = 256,
    pad: bool = True,
    prompt: ScorePrompt | None = None,
) -> EngineProfile:
    """An engine profile for tests (MiniLM has a pad token, id 0)."""
    return EngineProfile(family, max_model_len, pad, Release(version), prompt)
