"""``make compat``: prove the proxy on every vLLM release that runs here (issue #16).

    python scripts/compat.py [VERSION ...] [--keep] [--results DIR] [--output docs/compatibility.md]

For each release, one at a time: provision it (cached; removed afterwards unless --keep or
it is one of the releases ``make test`` uses, so disk stays bounded), serve the three test
models (MiniLM, the tiny cross-encoder, the tiny ColBERT), put a real ``usage-proxy serve``
in front of each, send the end-to-end case matrix through the proxy one request at a time,
and compare what the proxy billed with the growth of that engine's own
``vllm:prompt_tokens_total``. The six family models of ``scripts/families.py`` are measured
the same way, each from its ``FIRST_RELEASE`` on: the two XLM-R models from 0.15.1, Qwen3,
the Qwen3-Reranker served with hf_overrides, jina-reranker-v3 and ModernBERT ColBERT from
0.27.0 (``--no-families`` skips them; about 13 minutes per release from 0.27.0). Results
are kept in ``--results`` (the cache by default), so a run resumes. Writes the measured tables into
docs/compatibility.md between its ``compat:start``/``compat:end`` markers. Not part of
``make test``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.vllm_cpu import (
    CACHE,
    E2E_VERSIONS,
    ROOT,
    Process,
    metric,
    post,
    prepare_models,
    provision,
    reserved,
    start_proxy,
    start_vllm,
)

# Releases before 0.27 pin CPU torch builds the registry lacks; scripts/old_release.py
# installs them (issue #31). A sample, one per minor series that changed the scoring code
# (docs/compatibility.md says which and why); every release from 0.27.0 on.
OLD_SAMPLE = ("0.8.5", "0.10.2", "0.13.0", "0.15.1", "0.16.0", "0.19.1", "0.20.2", "0.26.0")
NEWEST = ("0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
RUNNABLE = (*OLD_SAMPLE, *NEWEST)
FAMILIES = {"bi-encoder": "minilm", "cross-encoder": "tiny-ce", "late-interaction": "tiny-colbert"}
START, END = "<!-- compat:start -->\n", "<!-- compat:end -->"


@dataclass
class Outcome:
    family: str
    case: str
    status: int
    reported: int | None = None
    engine: int | None = None
    billed: int | None = None
    verdict: str | None = None
    usage_fields: str | None = None  # the usage members the client got, e.g. total_tokens
    error_body: bool = False  # HTTP 200 carrying an error (releases up to 0.17)

    @property
    def accepted(self) -> bool:
        return self.status == 200 and not self.error_body

    @property
    def agrees(self) -> bool:
        if self.error_body:
            return not self.engine  # nothing processed, nothing billed
        return self.status != 200 or self.billed == self.engine


def say(text: str) -> None:
    print(f"[compat] {text}", flush=True)


def run_release(version: str, logs: Path) -> tuple[list[Outcome], dict[str, float]]:
    from tests.e2e.cases import CASES

    timings: dict[str, float] = {}
    started = time.monotonic()
    python = provision(version)
    timings["provision_s"] = time.monotonic() - started
    models = prepare_models(python)
    processes: list[Process] = []
    try:
        with reserved(len(FAMILIES)) as slots:  # all three at once, or wait
            servers = {
                f: start_vllm(python, models[f], name, logs, family=f, slots=[slots.pop()])
                for f, name in FAMILIES.items()
            }
        processes.extend(servers.values())
        with ThreadPoolExecutor(3) as pool:
            failures = list(pool.map(_ready, servers.values()))
        timings["start_s"] = time.monotonic() - started - timings["provision_s"]
        for family, failure in zip(list(servers), failures, strict=True):
            if failure is not None:
                # A release that cannot serve a model family (its architecture is not
                # registered yet) is measured on the others.
                say(f"vLLM {version} does not serve the {family} test model: {failure[-400:]}")
                timings[f"not_served:{family}"] = 1
                del servers[family]
        if "bi-encoder" not in servers:
            raise RuntimeError(f"vLLM {version} does not serve the bi-encoder test model")
        served, unclassified = classify_routes(servers["bi-encoder"].url)
        timings["routes_served"], timings["routes_unclassified"] = served, len(unclassified)
        for route in unclassified:
            say(f"vLLM {version} serves {route}, which the proxy's route table does not classify")
        proxies = {
            f: start_proxy(s.url, logs, "--reconcile-interval", "0", "--journal", "off")
            for f, s in servers.items()
        }
        processes.extend(proxies.values())
        for proxy in proxies.values():
            proxy.wait_ready("/readyz", 120)
        outcomes = []
        for family, server in servers.items():
            for case in CASES:
                body = case.body
                if isinstance(body, dict) and "model" not in body:
                    body = {"model": FAMILIES[family], **body}
                before = metric(server.url)
                status, headers, raw = post(proxies[family].url + case.path, body)
                engine = int(metric(server.url) - before)
                outcome = Outcome(family, case.name, status)
                if status == 200:
                    answer = json.loads(raw)
                    usage = answer.get("usage")
                    outcome.engine = engine
                    if not isinstance(usage, dict):
                        outcome.error_body = True
                    else:
                        reported = headers.get("x-usage-upstream-prompt-tokens", "-1")
                        outcome.reported = int(reported)
                        # Before prompt_tokens (rerank up to 0.10.x), total_tokens is billed.
                        outcome.billed = usage.get("prompt_tokens", usage.get("total_tokens"))
                        outcome.verdict = headers.get("x-usage-verdict")
                        outcome.usage_fields = ",".join(sorted(usage))
                outcomes.append(outcome)
        timings["total_s"] = time.monotonic() - started
        return outcomes, timings
    finally:
        for process in processes:
            process.stop()


def _ready(process: Process) -> str | None:
    """None when the server answers /health, else why not (its log tail)."""
    try:
        process.wait_ready("/health", 900)
    except (RuntimeError, TimeoutError) as exc:
        process.stop()
        return str(exc)
    return None


def classify_routes(url: str) -> tuple[int, list[str]]:
    """The routes a release's own router serves (its /openapi.json) and those of them the
    proxy's route table does not classify (the closed world: they would be refused)."""
    import re
    import urllib.request

    from proxy.accounting.routes import route_of

    with urllib.request.urlopen(url + "/openapi.json", timeout=60) as answer:
        spec = json.loads(answer.read())
    served, unclassified = 0, []
    for path, operations in spec["paths"].items():
        route = route_of(re.sub(r"\{[a-z_]+\}", "some-id", path))
        for method in operations:
            served += 1
            if route is None or method.upper() not in route.methods:
                unclassified.append(f"{method.upper()} {path}")
    return served, unclassified


def render(results: dict[str, tuple[list[Outcome], dict[str, float]]]) -> str:
    from packaging.version import Version

    results = {v: results[v] for v in sorted(results, key=Version)}
    lines = [
        "| release | families served | accepted cases | refused (status) | billed = engine "
        "| verdicts | rerank usage members | routes served (unclassified) | install, start, run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for version, (outcomes, timings) in results.items():
        accepted = [o for o in outcomes if o.accepted]
        refused = [o for o in outcomes if not o.accepted]
        agree = sum(o.agrees for o in accepted)
        verdicts: dict[str, int] = {}
        for o in accepted:
            verdicts[o.verdict or "-"] = verdicts.get(o.verdict or "-", 0) + 1
        shown = ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items()))
        statuses = sorted({_status(o) for o in refused})
        families = [f for f in FAMILIES if f"not_served:{f}" not in timings]
        rerank = next(
            (o for o in accepted if o.family == "bi-encoder" and o.case == "rerank-1toN"), None
        )
        members = f"`{rerank.usage_fields}`" if rerank and rerank.usage_fields else "not read"
        lines.append(
            f"| {version} | {len(families)} | {len(accepted)} "
            f"| {len(refused)} ({', '.join(statuses)}) "
            f"| {agree} of {len(accepted)} | {shown} | {members} | {_routes(timings)} "
            f"| {_durations(timings)} |"
        )
    not_served = [
        f"{v} {k.split(':', 1)[1]}"
        for v, (_, t) in results.items()
        for k in t
        if k.startswith("not_served:")
    ]
    if not_served:
        lines += ["", "Test models a release does not serve (its server does not start):", ""]
        lines += [f"- {entry}" for entry in not_served]
    lines += ["", "Disagreements and cases a release refuses that 0.32.0 accepts:", ""]
    accepted_new = {(o.family, o.case) for o in results.get("0.32.0", ([], {}))[0] if o.accepted}
    found = False
    for version, (outcomes, _) in results.items():
        for o in outcomes:
            if not o.agrees:
                found = True
                lines.append(
                    f"- {version} {o.family} `{o.case}`: reported {o.reported}, engine "
                    f"{o.engine}, billed {o.billed} ({o.verdict})"
                )
            elif not o.accepted and (o.family, o.case) in accepted_new:
                found = True
                lines.append(f"- {version} {o.family} `{o.case}`: refused with {_status(o)}")
    if not found:
        lines.append("- none")
    lines += ["", "Per case (reported / engine / billed, verdict), bi-encoder:", ""]
    versions = list(results)
    lines.append("| case | " + " | ".join(versions) + " |")
    lines.append("|---|" + "---|" * len(versions))
    cases = [o.case for o in results[versions[0]][0] if o.family == "bi-encoder"]
    for case in cases:
        cells = []
        for version in versions:
            o = next(x for x in results[version][0] if x.family == "bi-encoder" and x.case == case)
            cells.append(
                f"{o.reported}/{o.engine}/{o.billed} {o.verdict}" if o.accepted else _status(o)
            )
        lines.append(f"| `{case}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _status(outcome: Outcome) -> str:
    return "200 error" if outcome.error_body else str(outcome.status)


def _durations(timings: dict[str, float]) -> str:
    if "start_s" not in timings:
        return f"{timings.get('total_s', 0):.0f} s"
    run = timings["total_s"] - timings["provision_s"] - timings["start_s"]
    return f"{timings['provision_s']:.0f} s, {timings['start_s']:.0f} s, {run:.0f} s"


def _routes(timings: dict[str, float]) -> str:
    if "routes_served" not in timings:
        return "not read"
    return f"{timings['routes_served']:.0f} ({timings['routes_unclassified']:.0f})"


# In the results directory: the base matrix's outcomes and the family rows, per release.
RESULTS = "compat-results.json"
FAMILY_RESULTS = "compat-families.json"


def save_results(results: dict[str, tuple[list[Outcome], dict[str, float]]], into: Path) -> None:
    """Each finished release's outcomes survive a later one failing (resumable runs)."""
    data = {v: ([o.__dict__ for o in outs], t) for v, (outs, t) in results.items()}
    (into / RESULTS).write_text(json.dumps(data))


def load_results(into: Path) -> dict[str, tuple[list[Outcome], dict[str, float]]]:
    path = into / RESULTS
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {v: ([Outcome(**o) for o in outs], t) for v, (outs, t) in data.items()}


def write_doc(path: Path, table: str) -> None:
    text = path.read_text()
    head, rest = text.split(START)
    _, tail = rest.split(END)
    path.write_text(head + START + table + END + tail)


def run_families(version: str, families: list[str], logs: Path) -> list[dict[str, object]]:
    """The ``families`` on ``version`` (``scripts/families.measure_all``), as rows."""
    from dataclasses import asdict

    from scripts.families import measure_all

    say(f"vLLM {version}: {', '.join(families)}, three servers at a time ...")
    measured = measure_all([version], families, logs, pythons={version: provision(version)})
    rows = [asdict(r) for r in measured.rows]
    wrong = [r for r in rows if not _right(r)]
    say(f"vLLM {version} families: {len(rows)} requests, {len(wrong)} billed differently")
    return rows


def _right(row: dict[str, object]) -> bool:
    """``Row.right`` of a row as saved in the results file."""
    from scripts.families import Row

    return Row(**row).right  # type: ignore[arg-type]


def render_families(families: dict[str, list[dict[str, object]]]) -> str:
    """Per family and proxy, per release: accepted requests billed at the engine count,
    and their verdicts."""
    if not families:
        return ""
    from packaging.version import Version

    versions = sorted(families, key=Version)
    keys = sorted({(str(r["family"]), str(r["proxy"])) for v in versions for r in families[v]})
    lines = [
        "",
        "Family models (`scripts/families.py`): accepted requests billed = engine, verdicts:",
        "",
        "| family (proxy) | " + " | ".join(versions) + " |",
        "|---|" + "---|" * len(versions),
    ]
    for family, proxy in keys:
        cells = []
        for version in versions:
            rows = [r for r in families[version] if (r["family"], r["proxy"]) == (family, proxy)]
            accepted = [r for r in rows if r["status"] == 200]
            verdicts: dict[str, int] = {}
            for r in accepted:
                verdicts[str(r["verdict"])] = verdicts.get(str(r["verdict"]), 0) + 1
            shown = ", ".join(f"{k} {n}" for k, n in sorted(verdicts.items()))
            right = sum(_right(r) for r in accepted)
            cells.append(f"{right} of {len(accepted)} ({shown})" if rows else "-")
        lines.append(f"| {family} ({proxy}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", default=list(RUNNABLE))
    parser.add_argument("--keep", action="store_true", help="keep every provisioned release")
    parser.add_argument(
        "--fresh", action="store_true", help="forget earlier runs' results (kept in the cache)"
    )
    parser.add_argument(
        "--no-families",
        dest="families",
        action="store_false",
        help="skip the family models (about 13 minutes per release from 0.27.0)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=CACHE,
        help="the directory of the results files, read to resume and written per release",
    )
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "compatibility.md")
    args = parser.parse_args()
    from scripts.families import families_on

    args.results.mkdir(parents=True, exist_ok=True)
    results = load_results(args.results) if not args.fresh else {}
    families: dict[str, list[dict[str, object]]] = {}
    if (args.results / FAMILY_RESULTS).is_file() and not args.fresh:
        families = json.loads((args.results / FAMILY_RESULTS).read_text())
    started = time.monotonic()
    unrun: list[str] = []
    with tempfile.TemporaryDirectory(prefix="usage-proxy-compat-") as tmp:
        for version in args.versions:
            say(f"vLLM {version}: provisioning, starting 3 servers, running the matrix ...")
            try:
                outcomes, timings = run_release(version, Path(tmp))
                results[version] = (outcomes, timings)
                save_results(results, args.results)
                measured = families_on(version) if args.families else []
                if measured:
                    families[version] = run_families(version, measured, Path(tmp))
                    (args.results / FAMILY_RESULTS).write_text(json.dumps(families))
            except (RuntimeError, TimeoutError, OSError, subprocess.CalledProcessError) as exc:
                say(f"vLLM {version} could not be run: {str(exc)[:500]}")
                unrun.append(version)
                continue
            finally:
                # Old environments are 6-8 GB: one at a time on disk, even when one fails.
                if not args.keep and version not in E2E_VERSIONS:
                    shutil.rmtree(CACHE / f"vllm-cpu-{version}", ignore_errors=True)
            wrong = [o for o in outcomes if not o.agrees]
            say(
                f"vLLM {version}: {sum(o.accepted for o in outcomes)} accepted, "
                f"{len(wrong)} billed differently from the engine, "
                + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
            )
    if results:
        write_doc(args.output, render(results) + render_families(families))
        say(f"all releases in {time.monotonic() - started:.0f} s; wrote {args.output}")
    failed = [
        v
        for v, (outcomes, timings) in results.items()
        if not all(o.agrees for o in outcomes) or timings.get("routes_unclassified")
    ] + [v for v, rows in families.items() if not all(_right(r) for r in rows)]
    if unrun:  # a release the promise names but no run proved is a failure, not a skip
        say(f"not run, so not proven: {', '.join(unrun)}")
    return 1 if failed or unrun else 0


if __name__ == "__main__":
    sys.exit(main())
