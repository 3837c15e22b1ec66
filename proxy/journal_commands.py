"""The commands that read and mend a replica's journal: ``reconcile`` (the windows of the
engine's counter against the ledger), ``dead-letters`` (records an exporter rejected:
listed, or replayed) and ``exporters`` (the exporters a journal keeps records for:
listed, or one discarded)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from proxy.ledger.journal_files import (
    discard_exporter,
    list_dead_letters,
    list_exporters,
    read_journal,
    requeue_dead_letters,
)
from proxy.ledger.windows import SettledWindow
from proxy.reporting import instant
from proxy.settings import ENV_PREFIX, default_journal_path


def add_reconcile(commands: Any) -> None:
    rec = commands.add_parser(
        "reconcile",
        help="reconciliation windows: the engine's own token counter against the ledger",
        description="Every --reconcile-interval seconds the proxy reads the upstream's "
        "vllm:prompt_tokens_total (and vllm:generation_tokens_total) at a moment with no "
        "metered request in flight and journals one window: engine growth, reported, "
        "billed, unbilled and overbilled tokens, and the causes it can identify.",
        epilog="example: usage-proxy reconcile --since 2026-11-30T00:00 --format csv",
    )
    rec.add_argument("--since", help="windows ending at or after this time (ISO 8601, UTC)")
    rec.add_argument("--until", help="windows ending before this time (ISO 8601, UTC)")
    rec.add_argument("--format", choices=("table", "csv", "json"), default="table")
    journal_option(rec)


WINDOW_COLUMNS = (
    "end",
    "status",
    "records",
    "engine_prompt_tokens",
    "reported_prompt_tokens",
    "billed_prompt_tokens",
    "unbilled_prompt_tokens",
    "overbilled_prompt_tokens",
    "engine_completion_tokens",
    "billed_completion_tokens",
    "upstream_errors",
    "refused_requests",  # the proxy's own refusals: never forwarded, no engine work
)


def run_reconcile(args: argparse.Namespace) -> int:
    path = _journal_path(args)
    utc = ZoneInfo("UTC")
    since, until = instant(args.since, utc), instant(args.until, utc)
    bodies = read_journal(path, since, until, kind="reconciliation")
    # Read as the model does: a window journaled before causes had codes gets them too.
    windows = [SettledWindow.model_validate_json(b).model_dump(mode="json") for b in bodies]
    if not windows:
        print(nothing_reconciled(path, args.since, args.until), file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps(windows, indent=2))
        return 0
    if args.format == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow([*WINDOW_COLUMNS, "causes"])
        for w in windows:
            causes = "; ".join(f"{c['code']}: {c['message']}" for c in w["causes"])
            writer.writerow([*(w.get(c, 0) for c in WINDOW_COLUMNS), causes])
        sys.stdout.write(out.getvalue())
        return 0
    titles = ("window end (UTC)", "status", "records", "engine", "reported", "billed")
    print(
        f"{titles[0]:26} {titles[1]:13} "
        + " ".join(f"{t:>9}" for t in titles[2:])
        + "  unbilled overbilled  causes"
    )
    for w in windows:
        numbers = [
            w["records"],
            w["engine_prompt_tokens"],
            w["reported_prompt_tokens"],
            w["billed_prompt_tokens"],
        ]
        print(
            f"{w['end'][:26]:26} {w['status']:13} "
            + " ".join(f"{'-' if n is None else n:>9}" for n in numbers)
            + f" {w['unbilled_prompt_tokens']:>9} {w['overbilled_prompt_tokens']:>10}  "
            + ("; ".join(c["code"] for c in w["causes"]) or "-")
        )
    drift = sum(w["unbilled_prompt_tokens"] + w["overbilled_prompt_tokens"] for w in windows)
    print(f"{len(windows)} window(s), prompt-token drift {drift}")
    return 0


def nothing_reconciled(path: Path, since: str | None, until: str | None) -> str:
    """Why an empty list of windows is not a clean bill: nothing was compared at all."""
    span = f" from {since or 'the start'} to {until or 'now'}" if since or until else ""
    return (
        f"usage-proxy reconcile: no reconciliation window in {path}{span}: nothing could be "
        "reconciled, so no drift is known. The proxy journals a window every "
        "--reconcile-interval seconds (0 turns it off) once it can read "
        "vllm:prompt_tokens_total from the upstream's /metrics; its log says why it cannot "
        "(reconcile_failed, e.g. no /metrics)."
    )


def journal_option(parser: Any) -> None:
    parser.add_argument(
        "--journal",
        type=Path,
        default=None,
        help=f"journal file [env {ENV_PREFIX}JOURNAL; default: {default_journal_path()}]",
    )


def add_dead_letters(commands: Any) -> None:
    dead = commands.add_parser(
        "dead-letters",
        help="records an exporter rejected permanently: list them, or replay them",
        description="A record a sink rejects for its content (a PostgreSQL data or "
        "constraint error, a 4xx from the CloudEvents receiver) is kept here instead of "
        "blocking the sink. 'list' shows them; 'replay' marks them to be delivered again "
        "by the running proxy (or the next one to start) once the cause is fixed.",
        epilog="example: usage-proxy dead-letters list --sink postgres; "
        "usage-proxy dead-letters replay --sink postgres",
    )
    dead.add_argument("action", choices=("list", "replay"))
    dead.add_argument("--sink", help="only this sink (postgres, cloudevents, jsonl:PATH)")
    dead.add_argument("--format", choices=("table", "json"), default="table")
    journal_option(dead)


def add_exporters(commands: Any) -> None:
    exporters = commands.add_parser(
        "exporters",
        help="the exporters a journal keeps records for: list them, or discard one",
        description="The journal keeps every record until each exporter it has had "
        "(postgres, cloudevents, jsonl:PATH) has received it, even one the proxy no "
        "longer runs with. 'list' shows them and their backlog; 'discard NAME' forgets "
        "one, so its undelivered records no longer hold retention back (they are pruned "
        "once the remaining exporters have them).",
        epilog="example: usage-proxy exporters list; usage-proxy exporters discard postgres",
    )
    exporters.add_argument("action", choices=("list", "discard"))
    exporters.add_argument("name", nargs="?", help="the exporter to discard")
    journal_option(exporters)


def run_exporters(args: argparse.Namespace) -> int:
    path = _journal_path(args)
    if args.action == "list":
        found = list_exporters(path)
        print(f"{len(found)} exporter(s) in {path}")
        for name, backlog in found.items():
            print(f"{name:24}  {backlog} record(s) not delivered")
        return 0
    if not args.name:
        print("usage-proxy exporters discard: name the exporter", file=sys.stderr)
        return 2
    dropped = discard_exporter(path, args.name)
    if dropped is None:
        print(f"usage-proxy exporters: {path} has no exporter {args.name!r}", file=sys.stderr)
        return 2
    print(
        f"discarded {args.name}: {dropped} record(s) it had not received are no longer kept "
        "for it (pruned once the other exporters have them)"
    )
    return 0


def _journal_path(args: argparse.Namespace) -> Path:
    return args.journal or Path(os.environ.get(f"{ENV_PREFIX}JOURNAL") or default_journal_path())


def run_dead_letters(args: argparse.Namespace) -> int:
    path = _journal_path(args)
    if args.action == "replay":
        count = requeue_dead_letters(path, args.sink)
        print(f"{count} dead letter(s) queued for replay in {path}")
        return 0
    letters = list_dead_letters(path, args.sink)
    if args.format == "json":
        rows = [
            {**json.loads(d.body), "sink": d.sink, "error": d.error, "dead_at": d.at}
            | {"attempts": d.attempts, "requeued": d.requeued}
            for d in letters
        ]
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{len(letters)} dead letter(s) in {path}")
    for d in letters:
        state = "queued for replay" if d.requeued else f"{d.attempts} attempt(s)"
        print(f"{d.at}  {d.sink:12}  {d.record_id}  {state}  {d.error[:120]}")
    return 0
