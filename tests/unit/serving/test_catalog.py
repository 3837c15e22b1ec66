"""Model discovery: a release outside the proven range is announced once; what a model
needs to be ready."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.accounting.types import Release
from proxy.serving.catalog import with_contexts


def test_unproven_release_is_announced() -> None:
    """The proxy says once what it assumes for a release outside the proven range."""
    from structlog.testing import capture_logs

    from proxy.serving.catalog import warn_if_unproven

    with capture_logs() as logs:
        warn_if_unproven(Release("0.33.0"))
        warn_if_unproven(Release("0.32.0"))
    assert [e["event"] for e in logs] == ["release_outside_proven_range"]
    assert logs[0]["upstream_version"] == "0.33.0"


def test_a_model_the_server_scores_nothing_with_needs_no_config(tmp_path: Path) -> None:
    """Issue #49: Voxtral realtime is served from Mistral-format files (params.json,
    tekken.json; no config.json). The server's router offers no pooling route for it, so
    there is nothing to recount: the model is ready, its usage metered as vLLM reports it.
    Where the router does not say, or scores with it, the missing config is a problem."""
    from proxy.accounting.family import ServedTasks
    from proxy.serving.catalog import build_model

    (tmp_path / "params.json").write_text("{}")
    entry = {"id": "voxtral", "root": str(tmp_path), "max_model_len": 4096}

    def load(source: str, legacy: bool) -> Any:
        raise AssertionError("no tokenizer is loaded for it")

    generates = ServedTasks(embed=False, classify=False, generate=True)
    model = build_model(entry, Release("0.32.0"), None, load, generates)
    assert (model.problem, model.task, model.tokenizer) == (None, "generate", None)
    for served in (None, ServedTasks(embed=True, classify=False, generate=False)):
        model = build_model(entry, Release("0.32.0"), None, load, served)
        assert model.problem == f"no readable config.json at {tmp_path}; set models.voxtral.family"


def test_a_lora_adapter_runs_within_its_parents_context() -> None:
    """vLLM lists a LoRA adapter with no ``max_model_len``: it takes its parent's (the
    engine's), so its requests have a bound to be priced by; an entry naming no known
    parent, or with a context of its own, is left as it is."""
    entries = [
        {"id": "base", "max_model_len": 4096},
        {"id": "lora", "parent": "base", "max_model_len": None},
        {"id": "orphan", "parent": "gone"},
        {"id": "own", "parent": "base", "max_model_len": 512},
    ]
    contexts = {e["id"]: e.get("max_model_len") for e in with_contexts(entries)}
    assert contexts == {"base": 4096, "lora": 4096, "orphan": None, "own": 512}
    assert with_contexts("not a list") == []
