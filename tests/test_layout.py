"""The tests mirror the source: one unit test module per module of ``proxy/``.

``proxy/<package>/<module>.py`` is tested by ``tests/unit/<package>/test_<module>.py``,
``proxy/<module>.py`` by ``tests/unit/test_<module>.py``. Packages' ``__init__`` and
``__main__`` are not mirrored. The few modules that only make sense with the whole app
running are listed below with the app or process tests that hold them.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "proxy"
UNIT = ROOT / "tests" / "unit"

TESTED_THROUGH_THE_APP = {
    "accounting/analysis": "glue of shapes, counts and verdicts: tests/app/test_hot_path.py",
    "accounting/chatfields": "rows of the field table: unit/accounting/test_fields.py",
    "accounting/fieldkinds": "the field table's kinds: unit/accounting/test_fields.py",
    "accounting/generationfields": "rows of the field table: unit/accounting/test_fields.py",
    "accounting/poolingfields": "rows of the field table: unit/accounting/test_fields.py",
    "ledger/recorder": "journal and subscribers of a running app: app/test_metering.py",
    "ledger/sqlite": "the journal's file: unit/ledger/test_journal.py, test_journal_files.py",
    "limitstore/tickets": "what limiter and store exchange, no behaviour: test_redislimiter.py",
    "serving/admin": "the proxy's own endpoints: app/test_app.py, app/test_metrics.py",
    "serving/app": "the wiring: every test under tests/app",
    "serving/attribution": "who pays, per request: app/test_attribution.py",
    "serving/audited": "the scoring handler: app/test_app.py, app/test_hot_path.py",
    "serving/bodies": "body admission: app/test_bodies.py, app/test_memory.py",
    "serving/downstream": "writing to clients: app/test_answers.py, app/test_stalled_clients.py",
    "serving/keys": "typed application state, no behaviour of its own",
    "serving/lifetimes": "resources' cleanup contexts: app/test_metering.py, process tests",
    "serving/realtime": "the realtime session handler: app/test_realtime.py",
    "serving/metered": "the metered handler: app/test_metering.py, app/test_generation.py",
    "serving/relayed": "the transparent handler: app/test_app.py, app/test_security.py",
    "serving/routing": "the route table applied to requests: app/test_security.py",
    "serving/upstream": "the session and its errors: app/test_faults.py, app/test_odd_answers.py",
    "settings/choices": "the values options take: unit/settings/test_model.py, test_reference",
    "settings/counting": "options declared, no behaviour: unit/settings/test_reference.py",
    "settings/recording": "options declared, no behaviour: unit/settings/test_reference.py",
    "settings/traffic": "options declared, no behaviour: unit/settings/test_reference.py",
}


def _module(path: Path, root: Path) -> str:
    return path.relative_to(root).with_suffix("").as_posix()


def source_modules() -> set[str]:
    """Every module of ``proxy/`` as ``package/module``, without ``__init__``/``__main__``."""
    return {
        _module(path, SOURCE)
        for path in SOURCE.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    }


def unit_test_modules() -> set[str]:
    """Every ``tests/unit/**/test_X.py`` as the ``package/X`` it claims to test."""
    found = set()
    for path in UNIT.rglob("test_*.py"):
        relative = path.relative_to(UNIT)
        found.add(
            (relative.parent / relative.name.removeprefix("test_")).with_suffix("").as_posix()
        )
    return found


def test_every_unit_test_module_names_a_source_module() -> None:
    """No unit test module outlives its module or sits in the wrong folder."""
    assert sorted(unit_test_modules() - source_modules()) == []


def test_every_source_module_has_its_unit_tests() -> None:
    """A new module comes with its unit test module, or a reason here why not."""
    missing = source_modules() - unit_test_modules() - TESTED_THROUGH_THE_APP.keys()
    assert sorted(missing) == []


def test_the_exemptions_are_current() -> None:
    """An exempt module still exists and has not gained a unit test module meanwhile."""
    exempt = set(TESTED_THROUGH_THE_APP)
    assert sorted(exempt - source_modules()) == []
    assert sorted(exempt & unit_test_modules()) == []


def test_every_test_package_is_a_package() -> None:
    """Each folder of tests has an ``__init__.py``: modules import as ``tests.…``."""
    folders = {path.parent for path in (ROOT / "tests").rglob("test_*.py")}
    assert sorted(str(f) for f in folders if not (f / "__init__.py").exists()) == []


def test_test_modules_never_import_each_other() -> None:
    """Shared helpers live in ``tests/support``; a test module imports no test module."""
    offenders = []
    for path in (ROOT / "tests").rglob("*.py"):
        for line in path.read_text().splitlines():
            words = line.split()
            if words[:1] in (["from"], ["import"]) and len(words) > 1:
                name = words[1].split(".")[-1]
                if words[1].startswith("tests.") and (
                    name.startswith("test_") or name == "conftest"
                ):
                    offenders.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    assert offenders == []


def test_no_module_waits_with_asyncio_wait_for() -> None:
    """Python 3.11's ``asyncio.wait_for`` can drop a cancellation that arrives as the awaited
    future completes (bpo-42130): a cancelled background task then runs on and a shutdown
    that awaits it never ends (tests/unit/ledger/test_reconciler.py). ``asyncio.timeout``
    has no such window; the proxy uses it everywhere."""
    users = [
        _module(path, SOURCE) for path in SOURCE.rglob("*.py") if "wait_for(" in path.read_text()
    ]
    assert users == []


def test_no_two_modules_share_a_name() -> None:
    """A module's name says which one it is: ``shares`` or ``memory`` in two packages had
    a reader open the wrong one."""
    names: dict[str, list[str]] = {}
    for path in SOURCE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            names.setdefault(path.stem, []).append(_module(path, SOURCE))
    assert sorted(m for m in names.values() if len(m) > 1) == []
