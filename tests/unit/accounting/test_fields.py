"""The field table against vLLM's own request models: every field of every body class a
metered route of any release validates (tests/data/vllm_request_fields.json, read from each
release's code by scripts/vllm_fields.py) is classified for the route's operation; the
provisioned releases' live models are held against the same file in tests/e2e."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.accounting.fieldkinds import Effect
from proxy.accounting.fields import FIELDS, field_of
from proxy.accounting.routes import BY_PATH, INVOCATIONS_PATH, ROUTES, Handling

DATA = json.loads((Path(__file__).parents[2] / "data" / "vllm_request_fields.json").read_text())
RELEASES: dict[str, dict[str, dict[str, list[str]]]] = DATA["releases"]
METERED = (Handling.AUDITED, Handling.METERED)


def operations_of(release: str, path: str, model: str) -> set[str]:
    """The operations a class's body is run as: its route's, or for /invocations those of
    the routes of the same release that validate with the same class."""
    if path != INVOCATIONS_PATH:
        return {BY_PATH[path].operation}
    routes = RELEASES[release]["routes"]
    return {BY_PATH[p].operation for p, ms in routes.items() if p != path and model in ms}


def unclassified(release: str, path: str) -> list[str]:
    entry = RELEASES[release]
    return [
        f"{release} {path} {model}.{name} (as {op})"
        for model in entry["routes"][path]
        for op in sorted(operations_of(release, path, model))
        for name in entry["models"][model]
        if field_of(op, name) is None
    ]


@pytest.mark.parametrize(
    ("release", "path"), [(r, p) for r, e in RELEASES.items() for p in e["routes"]]
)
def test_every_field_of_every_release_is_classified(release: str, path: str) -> None:
    """Each field of each class the route validates its body with, in this release, has
    an effect in the table for the route's operation; a new field fails here, named."""
    assert unclassified(release, path) == []


def test_every_invocations_type_is_run_as_some_operation() -> None:
    """Each type /invocations tries is also the body of a metered route of the release, so
    its fields are classified under that route's operation."""
    orphans = [
        f"{release} {model}"
        for release, entry in RELEASES.items()
        for model in entry["routes"].get(INVOCATIONS_PATH, [])
        if not operations_of(release, INVOCATIONS_PATH, model)
    ]
    assert orphans == []


def test_a_missing_field_is_named() -> None:
    """The check can fail: a field the table lacks is reported with release, route, class
    and field (the table is held here against a copy with one field removed)."""
    entry = RELEASES["0.32.0"]
    model = entry["routes"]["/v1/completions"][0]
    saved = entry["models"][model]
    entry["models"][model] = [*saved, "no_such_field"]
    try:
        found = unclassified("0.32.0", "/v1/completions")
    finally:
        entry["models"][model] = saved
    assert found == [f"0.32.0 /v1/completions {model}.no_such_field (as completions)"]


def test_the_table_names_only_fields_some_release_has() -> None:
    """No entry outlives vLLM: each classified field is a field of some class of some
    release on a route of that operation (so the table cannot rot)."""
    seen: dict[str, set[str]] = {op: set() for op in FIELDS}
    for entry in RELEASES.values():
        for path, models in entry["routes"].items():
            if path != INVOCATIONS_PATH:
                for model in models:
                    seen[BY_PATH[path].operation].update(entry["models"][model])
    stale = {op: sorted(set(table) - seen[op]) for op, table in FIELDS.items()}
    assert {op: names for op, names in stale.items() if names} == {}


def test_the_table_covers_exactly_the_metered_operations() -> None:
    """One table per operation routes.py meters or audits, keyed by its record name."""
    assert set(FIELDS) == {r.operation for r in ROUTES if r.handling in METERED}


@pytest.mark.parametrize(
    ("operation", "name"),
    [(op, n) for op, t in FIELDS.items() for n, f in t.items() if Effect.MULTIPLIES in f.effects],
)
def test_work_the_usage_does_not_show_has_a_feature_name(operation: str, name: str) -> None:
    """A field that multiplies engine work names the --allow-unmetered feature that relays
    it, as <operation>.<feature>."""
    feature = FIELDS[operation][name].feature
    assert feature is not None
    assert feature.startswith(f"{operation}.")
    assert feature.removeprefix(f"{operation}.").isidentifier()


def test_only_work_the_usage_does_not_show_has_a_feature_name() -> None:
    """A feature name is an --allow-unmetered switch: nothing else carries one."""
    named = [
        f"{op}.{n}"
        for op, t in FIELDS.items()
        for n, f in t.items()
        if f.feature and Effect.MULTIPLIES not in f.effects
    ]
    assert named == []


@pytest.mark.parametrize(
    ("operation", "name", "effect"),
    [
        ("completions", "use_beam_search", Effect.MULTIPLIES),
        ("chat", "use_beam_search", Effect.MULTIPLIES),
        ("completions", "best_of", Effect.MULTIPLIES),
        ("chat", "request_id", Effect.ECHOED),
        ("generate", "request_id", Effect.ECHOED),
        ("responses", "metadata", Effect.ECHOED),
        ("responses", "previous_response_id", Effect.STATE),
        ("responses", "request_id", Effect.STATE),
        ("responses", "store", Effect.STATE),
        ("rerank", "cache_salt", Effect.STATE),
        ("chat", "cache_salt", Effect.STATE),
        ("rerank", "documents", Effect.ECHOED),
    ],
)
def test_the_doors_of_issue_44_are_classified(operation: str, name: str, effect: Effect) -> None:
    """The fields issue #44 found doors in carry the effect the enforcement keys on."""
    found = field_of(operation, name)
    assert found is not None
    assert effect in found.effects


def test_every_field_has_an_effect_and_a_reason() -> None:
    """No entry is empty: at least one effect and a one-line why."""
    empty = [
        f"{op}.{n}"
        for op, t in FIELDS.items()
        for n, f in t.items()
        if not f.effects or not f.why or "\n" in f.why or f.name != n
    ]
    assert empty == []


def test_unknown_operations_and_fields_have_no_classification() -> None:
    """field_of answers None for what the table does not know (the enforcement's cue)."""
    assert field_of("chat", "no_such_field") is None
    assert field_of("no_such_operation", "model") is None


def test_the_documented_field_table_is_generated() -> None:
    """docs/metering.md shows the fields whose effect is more than billed work as
    scripts/fields_doc.py makes them from the table (``make docs``)."""
    from scripts import fields_doc

    text = (Path(__file__).parents[3] / "docs" / "metering.md").read_text()
    start = text.index(fields_doc.START) + len(fields_doc.START)
    assert text[start : text.index(fields_doc.END)] == fields_doc.fields_reference()
