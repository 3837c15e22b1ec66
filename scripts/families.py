"""Measure the proxy on the model families users deploy (issue #30), against real vLLM.

    python scripts/families.py [--versions 0.29.0 0.32.0] [--families F ...] [--json OUT]
                               [--upstream-transformers 4|5]

For each family x release: serve the family's tiny model (``scripts/prepare_models.py``) as
users serve it (``scripts.vllm_cpu.serve_args``: hf_overrides, score template, context
length), put a real ``usage-proxy serve`` in front of it (rewrite mode, full recount; the
Qwen3-Reranker also behind a second proxy with ``--recount-fraction 0.1``), and send the
request matrix one request at a time: ``tests/e2e/cases.py`` CASES plus the family cases
below (long texts with blank lines, tabs and full-width text, instructions). Per request it
records what the upstream reported (``x-usage-upstream-prompt-tokens``), the growth of that
engine's own ``vllm:prompt_tokens_total``, what the proxy billed (``usage.prompt_tokens``)
and its verdict (``x-usage-verdict``), then prints a table. At most ``--concurrency`` (3) vLLM
servers run at a time: they are started, measured and stopped in batches.

The same code backs ``tests/e2e/test_families.py`` (``measure_all``) and can feed
``make compat`` (``measure_all`` for any provisioned release; ``--json``), which measures a
family from its ``FIRST_RELEASE`` on. ``--upstream-transformers`` pins every proxy's tokenizer
semantics: the control of the old releases' proof (5 in front of a release on transformers
4.x must miscount the whitespace cases of an XLM-R model).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.vllm_cpu import (
    E2E_VERSIONS,
    FAMILY_MODELS,
    FAMILY_SERVER_SLOTS,
    Process,
    metric,
    post,
    prepare_models,
    provision,
    reserved,
    serve_args,
    start_proxy,
    start_vllm,
)
from tests.e2e.cases import CASES, DOCS, HANGUL_DOCS, HANGUL_Q, Case, Q

FAMILIES = tuple(FAMILY_MODELS)
# The first release (major, minor) each family is measured on. The XLM-R architectures are
# registered already in 0.8.5, 0.10.2 and 0.13.0; they are measured from 0.15.1, on
# transformers 4.x, whose tokenizer semantics differ from 5.x on them. The others need
# 0.27's registry (Qwen3 and ModernBERT pooling, JinaForRanking, the Qwen3-Reranker's
# hf_overrides).
FIRST_RELEASE: dict[str, tuple[int, int]] = {
    "xlmr-cross-encoder": (0, 15),
    "xlmr-bi-encoder": (0, 15),
    "qwen3-embedding": (0, 27),
    "qwen3-reranker": (0, 27),
    "jina-v3": (0, 27),
    "modernbert-colbert": (0, 27),
}
SERVED_NAMES = {
    "xlmr-cross-encoder": "xlmr-ce",
    "xlmr-bi-encoder": "xlmr-embed",
    "qwen3-embedding": "qwen3-embed",
    "qwen3-reranker": "qwen3-reranker",
    "jina-v3": "jina-v3",
    "modernbert-colbert": "modernbert-colbert",
}
PROXY_ARGS = ("--reconcile-interval", "0", "--journal", "off")
REQUEST_TIMEOUT_S = 300
# Proxies in front of each server: label -> extra arguments. "full" recounts every request.
PROXY_VARIANTS: dict[str, tuple[str, ...]] = {"full": ()}
# The Qwen3-Reranker's proxies are told the score template the server runs with (its
# --chat-template cannot be seen): ``TEMPLATED`` variants get a config file naming it.
FAMILY_PROXY_VARIANTS: dict[str, dict[str, tuple[str, ...]]] = {
    "qwen3-reranker": {
        "full": (),
        "fraction-0.1": ("--recount-fraction", "0.1"),
        "no-template": (),
    },
}
TEMPLATED = {"qwen3-reranker": ("full", "fraction-0.1")}


def wait_discovered(proxy: Process, timeout: float) -> None:
    """Until the proxy has discovered the upstream's model and says why it cannot audit
    it (``/readyz`` 503 with a problem for it)."""
    deadline = time.monotonic() + timeout
    proxy.wait_ready("/healthz", timeout)
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(proxy.url + "/readyz", timeout=5).close()
        except urllib.error.HTTPError as exc:
            if json.loads(exc.read()).get("problems"):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{proxy.name} discovered no model in {timeout:.0f} s:\n{proxy.tail()}")


def proxy_config(family: str, model: Path, logs: Path) -> tuple[str, ...]:
    """``--config FILE`` naming the model's score template, as an operator sets it."""
    path = logs / f"proxy-{family}.yaml"
    template = model / "qwen3_reranker.jinja"
    path.write_text(f"models:\n  {SERVED_NAMES[family]}:\n    template: {template}\n")
    return ("--config", str(path))


_WORDS = "relevance requirements instruction retrieval passages capital question document"
# Longer than the proxy's LONG_TEXT_CHARS (32 KiB), so it is counted in 16 KiB chunks, with
# blank lines as the only separators: every chunk cut falls between two newlines, which the
# Qwen vocabulary merges into one token ("\n\n" -> "ĊĊ"). About 10.7k Qwen tokens.
LONG_NN = "\n\n".join(_WORDS.split()[i % 8] for i in range(3300))
# Paragraphs of sentences separated by blank lines, under the chunking threshold.
PARAGRAPHS = "\n\n".join(f"{d} {d}" for d in DOCS * 6)
# Texts transformers 4.x and 5.x count differently on an XLM-R tokenizer: 5.x rebuilds its
# pipeline without tokenizer.json's NFKC normalizer and splits at every whitespace, tabs
# and newlines included (4.x: at spaces only). The texts of issue #30 among them.
WHITESPACE_Q = "name\tcapital\tcountry"
WHITESPACE_DOCS = [
    "line one\nline two",
    "tab\there",
    "ｆｕｌｌ",  # noqa: RUF001 (full-width on purpose)
    "Paris\tFrance",
    "ＰＡＲＩＳ　２０２４",  # noqa: RUF001
    "Paris is the capital of France.\nBerlin is in Germany.",
]

FAMILY_CASES = [
    Case("whitespace-rerank", "/rerank", {"query": WHITESPACE_Q, "documents": WHITESPACE_DOCS}),
    Case("whitespace-score", "/score", {"text_1": WHITESPACE_DOCS[0], "text_2": WHITESPACE_DOCS}),
    Case("nn-paragraphs", "/rerank", {"query": Q, "documents": [PARAGRAPHS, DOCS[0]]}),
    Case("nn-long-score", "/score", {"text_1": Q, "text_2": LONG_NN}),
    Case("nn-long-rerank-1toN", "/rerank", {"query": Q, "documents": [LONG_NN, DOCS[1]]}),
    Case(
        "nn-long-tpt",
        "/rerank",
        {"query": Q, "documents": [LONG_NN], "truncate_prompt_tokens": 100},
    ),
    Case(
        "max-doc-hangul",
        "/rerank",
        {"query": Q, "documents": HANGUL_DOCS, "max_tokens_per_doc": 2},
        versions_may_differ=True,
    ),
    Case(
        "max-query-hangul-score",
        "/score",
        {"text_1": HANGUL_Q, "text_2": DOCS, "max_tokens_per_query": 2},
        versions_may_differ=True,
    ),
    Case(
        "instruction",
        "/rerank",
        {"query": Q, "documents": DOCS, "instruction": "Find the city that is a capital."},
    ),
    Case(
        "chat-template-kwargs",
        "/score",
        {
            "text_1": Q,
            "text_2": DOCS[:2],
            "chat_template_kwargs": {"instruction": "Judge relevance."},
        },
    ),
]


# Cases a family's server cannot take in reasonable time here, with the reason.
SKIPPED: dict[str, dict[str, str]] = {
    "qwen3-embedding": {
        "padding-max-length": "pads every input to max_model_len (12,288): minutes on 2 cores",
    },
}


def families_on(version: str, families: Iterable[str] = FAMILIES) -> list[str]:
    """The ``families`` measured on ``version`` (from their FIRST_RELEASE on)."""
    major, minor = (int(part) for part in version.split(".")[:2])
    return [f for f in families if (major, minor) >= FIRST_RELEASE[f]]


def cases_for(family: str) -> list[Case]:
    """The matrix of one family: every e2e case and every family case (a case a model
    refuses is recorded with its status), less the family's SKIPPED ones."""
    skipped = SKIPPED.get(family, {})
    return [c for c in (*CASES, *FAMILY_CASES) if c.name not in skipped]


@dataclass
class Row:
    family: str
    version: str
    proxy: str
    case: str
    status: int
    reported: int | None = None
    engine: int | None = None
    billed: int | None = None
    verdict: str | None = None
    versions_may_differ: bool = False
    seconds: float = 0.0
    counted: int | None = None  # the proxy's own count (x-usage-engine-prompt-tokens)

    @property
    def accepted(self) -> bool:
        return self.status == 200

    @property
    def right(self) -> bool:
        """An accepted request billed at the engine count (a refused one bills nothing)."""
        return self.billed == self.engine or not self.accepted


@dataclass
class Measurement:
    rows: list[Row] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def _with_model(body: Any, model: str) -> Any:
    if isinstance(body, dict) and "model" not in body:
        return {"model": model, **body}
    return body


def measure_request(vllm: str, proxy: str, model: str, case: Case) -> dict[str, Any]:
    """One request through the proxy: status, reported, engine growth, billed, verdict
    and the proxy's own count.
    A request that gets no answer in REQUEST_TIMEOUT_S is recorded with status 0."""
    before = metric(vllm)
    started = time.monotonic()
    try:
        status, headers, raw = post(
            proxy + case.path, _with_model(case.body, model), timeout=REQUEST_TIMEOUT_S
        )
    except OSError as exc:  # timeouts and refused connections
        status, headers, raw = 0, {"x-error": repr(exc)}, b""
    seconds = time.monotonic() - started
    engine = int(metric(vllm) - before)
    out: dict[str, Any] = {"status": status, "engine": engine, "seconds": round(seconds, 2)}
    if status == 200:
        usage = json.loads(raw).get("usage") or {}
        reported = headers.get("x-usage-upstream-prompt-tokens")
        counted = headers.get("x-usage-engine-prompt-tokens")
        out.update(
            reported=int(reported) if reported is not None else None,
            billed=usage.get("prompt_tokens"),
            verdict=headers.get("x-usage-verdict"),
            counted=int(counted) if counted is not None else None,
        )
    return out


def measure_server(
    family: str, version: str, vllm: Process, proxies: dict[str, Process]
) -> list[Row]:
    """The family's matrix through each proxy in front of one server, one at a time."""
    rows = []
    for label, proxy in proxies.items():
        for case in cases_for(family):
            got = measure_request(vllm.url, proxy.url, SERVED_NAMES[family], case)
            rows.append(
                Row(
                    family,
                    version,
                    label,
                    case.name,
                    versions_may_differ=case.versions_may_differ,
                    **got,
                )
            )
    return rows


def _batches(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def measure_all(
    versions: Sequence[str],
    families: Sequence[str],
    logs: Path,
    *,
    concurrency: int = 3,
    startup_budget: float = 900.0,
    pythons: dict[str, Path] | None = None,
    proxy_args: Sequence[str] = (),
    say: Callable[[str], None] = lambda _text: None,
) -> Measurement:
    """Serve every family x version, at most ``concurrency`` vLLM servers alive at a time
    (started together, measured in parallel, stopped); each server has ``startup_budget``
    seconds to become ready (a budget per server, not for them all: on a loaded machine
    every start is slower, and a server that hangs still fails within its own);
    ``proxy_args`` go to every proxy. Raises naming the server that did not start and its
    log."""
    pythons = pythons or {v: provision(v) for v in versions}
    models = prepare_models(pythons[versions[0]])
    result = Measurement()
    keys = [(family, version) for version in versions for family in families]
    for batch in _batches(keys, concurrency):
        processes: list[Process] = []
        try:
            servers: dict[tuple[str, str], Process] = {}
            # the batch's servers all at once, or wait
            with reserved(FAMILY_SERVER_SLOTS * len(batch)) as slots:
                for family, version in batch:
                    model = models[family]
                    servers[(family, version)] = start_vllm(
                        pythons[version],
                        model,
                        SERVED_NAMES[family],
                        logs,
                        extra_args=serve_args(family, model),
                        slots=[slots.pop() for _ in range(FAMILY_SERVER_SLOTS)],
                    )
                    processes.append(servers[(family, version)])
            with ThreadPoolExecutor(len(servers)) as pool:
                waits = {
                    key: pool.submit(server.wait_ready, "/health", startup_budget)
                    for key, server in servers.items()
                }
                for (family, version), wait in waits.items():
                    try:
                        took = wait.result()
                    except (RuntimeError, TimeoutError) as exc:
                        log = servers[(family, version)].log
                        raise RuntimeError(
                            f"vLLM {version} ({family}) did not start; log: {log}\n{exc}"
                        ) from exc
                    result.timings[f"start {family} {version}"] = took
                    say(f"vLLM {version} {family} ready in {took:.0f} s")
            proxies: dict[tuple[str, str], dict[str, Process]] = {}
            for key, server in servers.items():
                variants = FAMILY_PROXY_VARIANTS.get(key[0], PROXY_VARIANTS)
                templated = TEMPLATED.get(key[0], ())
                config = proxy_config(key[0], models[key[0]], logs) if templated else ()
                proxies[key] = {
                    label: start_proxy(
                        server.url,
                        logs,
                        *PROXY_ARGS,
                        *proxy_args,
                        *args,
                        *(config if label in templated else ()),
                    )
                    for label, args in variants.items()
                }
                processes.extend(proxies[key].values())
            for group in proxies.values():
                for label, proxy in group.items():
                    if label == "no-template":
                        wait_discovered(proxy, 60)  # not ready: it cannot audit the model
                    else:
                        proxy.wait_ready("/readyz", 60)
            with ThreadPoolExecutor(len(servers)) as pool:
                futures = [
                    pool.submit(measure_server, key[0], key[1], servers[key], proxies[key])
                    for key in servers
                ]
                for future in futures:
                    result.rows.extend(future.result())
        finally:
            for process in reversed(processes):
                process.stop()
    return result


def format_table(rows: Sequence[Row]) -> str:
    """One line per request: reported / engine / the proxy's count / billed / verdict, '<-'
    where billed is not the engine's count."""
    lines = [
        f"{'family':20} {'vllm':7} {'proxy':13} {'case':26} "
        f"{'status':>6} {'reported':>8} {'engine':>7} {'counted':>7} {'billed':>7}  verdict"
    ]
    for row in rows:
        if not row.accepted:
            flag = "   <- the engine worked, the answer is an error" if row.engine else ""
            lines.append(
                f"{row.family:20} {row.version:7} {row.proxy:13} {row.case:26} "
                f"{row.status:>6} {'':>8} {row.engine:>7}{flag}"
            )
            continue
        flag = "" if row.right else "   <- billed != engine"
        lines.append(
            f"{row.family:20} {row.version:7} {row.proxy:13} {row.case:26} "
            f"{row.status:>6} {row.reported!s:>8} {row.engine:>7} {row.counted!s:>7} "
            f"{row.billed!s:>7}  "
            f"{row.verdict}{flag}  ({row.seconds:.1f} s)"
        )
    return "\n".join(lines)


def summary(rows: Sequence[Row]) -> str:
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.family, row.version, row.proxy), []).append(row)
    lines = []
    for (family, version, proxy), group in groups.items():
        accepted = [r for r in group if r.accepted]
        wrong = [r for r in accepted if not r.right]
        unbillable = [r for r in group if not r.accepted and r.engine]
        lines.append(
            f"{family:20} {version:7} {proxy:13} accepted {len(accepted):3}  "
            f"billed at engine {len(accepted) - len(wrong):3}  wrong {len(wrong):3}  "
            f"refused after engine work {len(unbillable)}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", default=list(E2E_VERSIONS))
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the rows and timings here")
    parser.add_argument("--logs", type=Path, help="keep the server logs here")
    parser.add_argument(
        "--upstream-transformers",
        choices=("4", "5"),
        help="count with this transformers major version whatever the release runs (the "
        "control: the wrong one must miscount the whitespace cases of the XLM-R models)",
    )
    args = parser.parse_args(argv)
    pinned = args.upstream_transformers

    def say(text: str) -> None:
        print(f"[families] {text}", file=sys.stderr, flush=True)

    logs = args.logs or Path(tempfile.mkdtemp(prefix="families-"))
    logs.mkdir(parents=True, exist_ok=True)
    say(f"logs in {logs}")
    started = time.monotonic()
    result = measure_all(
        args.versions,
        args.families,
        logs,
        concurrency=args.concurrency,
        startup_budget=3600,
        proxy_args=("--upstream-transformers", pinned) if pinned else (),
        say=say,
    )
    result.timings["total_s"] = time.monotonic() - started
    for row in result.rows:
        row.proxy += f", transformers {pinned}" if pinned else ""
    print(format_table(result.rows))
    print()
    print(summary(result.rows))
    print("timings: " + ", ".join(f"{k}={v:.0f}" for k, v in result.timings.items()))
    if args.json:
        payload = {"rows": [asdict(r) for r in result.rows], "timings": result.timings}
        args.json.write_text(json.dumps(payload, indent=1))
    return 0 if all(r.right for r in result.rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
