"""The ``usage-proxy`` command line. Flags are generated from the settings model."""

from __future__ import annotations

import argparse
import csv
import enum
import io
import json
import os
import sqlite3
import sys
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args, get_origin
from zoneinfo import ZoneInfo

import yaml
from pydantic import ValidationError
from pydantic_settings import CliSettingsSource

from proxy import __version__
from proxy.accounting.price_schedule import PriceFile, PriceFileError, load_price_file, one_line
from proxy.accounting.prices import PriceTable
from proxy.ledger.charges import charge
from proxy.ledger.journal_files import (
    discard_exporter,
    list_dead_letters,
    list_exporters,
    read_journal,
    requeue_dead_letters,
)
from proxy.ledger.report import GROUPS, aggregate, row_key
from proxy.ledger.report_formats import FORMATS
from proxy.ledger.windows import SettledWindow
from proxy.limits.costs import unpriced
from proxy.limits.policy import Policies
from proxy.limits.problems import (
    LimitsFileError,
    mistakes,
    name_mistakes,
    names_of,
    plain_message,
    read_limits,
    summary,
)
from proxy.reporting import (
    TIME_HELP,
    budget_rows,
    choose_source,
    instant,
    report_zone,
    shown,
)
from proxy.serving.tenancy import KeyFileError, load_api_keys
from proxy.settings import (
    ENV_PREFIX,
    FILE_ONLY,
    Settings,
    default_journal_path,
    display_default,
    load_settings,
    load_sources,
)


def _flag_help(name: str) -> str:
    field = Settings.model_fields[name]
    shown = display_default(name)
    default = shown if shown == "required" else f"default: {shown}"
    env = f"{ENV_PREFIX}{name.upper()}"
    return f"{field.description} [env {env}; {default}]"


def _choices(annotation: Any) -> list[str] | None:
    """The values an enum or Literal setting takes, as written on the command line."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(member.value) for member in annotation]
    if get_origin(annotation) is Literal:
        return [str(value) for value in get_args(annotation)]
    return None


def _add_setting(parser: argparse.ArgumentParser, *flags: str, **options: Any) -> None:
    """Add one settings field as a ``serve`` flag (pydantic-settings' CLI source calls
    this for each): the help names its environment variable and default, argparse checks
    and lists an enum's or Literal's values, a boolean is a plain flag that still takes
    ``true``/``false``, and structured or secret fields stay out of argv."""
    name = options["dest"]
    if name in FILE_ONLY:
        return
    options["help"] = _flag_help(name)
    choices = _choices(Settings.model_fields[name].annotation)
    if choices:
        options.pop("metavar", None)
        options["choices"] = choices
    elif options.get("metavar") == "bool":
        options |= {"nargs": "?", "const": "true", "metavar": "true|false"}
    parser.add_argument(*flags, **options)


def build_parser() -> tuple[argparse.ArgumentParser, CliSettingsSource[Settings]]:
    """The ``usage-proxy`` commands, and the source that reads ``serve``'s flags (one per
    settings field, made by pydantic-settings from the model)."""
    parser = argparse.ArgumentParser(
        prog="usage-proxy",
        description="Usage-auditing reverse proxy for vLLM. It forwards every request "
        "unchanged and reports engine-level prompt tokens for /score and /rerank.",
        epilog="Run 'usage-proxy serve --help' for every option.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run the proxy in front of a vLLM server",
        description="Run the proxy. Every option can also come from the environment "
        f"({ENV_PREFIX}<NAME>) or from a YAML/TOML file given with --config; "
        "flags win over the environment, which wins over the file.",
    )
    serve.add_argument(
        "--config",
        type=Path,
        default=os.environ.get(f"{ENV_PREFIX}CONFIG"),
        help=f"YAML or TOML file with options, incl. per-model overrides [env {ENV_PREFIX}CONFIG]",
    )
    flags: CliSettingsSource[Settings] = CliSettingsSource(
        Settings,
        root_parser=serve,
        cli_kebab_case=True,
        cli_hide_none_type=True,
        add_argument_method=_add_setting,
    )
    _add_report(commands)
    _add_dead_letters(commands)
    _add_exporters(commands)
    _add_reconcile(commands)
    _add_limits(commands)
    return parser, flags


def _add_limits(commands: Any) -> None:
    limits = commands.add_parser(
        "limits",
        help="check a limits file before the proxy loads it",
        description="'check FILE' reads the limits file as serve does and says every "
        "problem in one pass, one line each on stderr (a misspelt limit or unit with what "
        "it probably meant, a value that is no limit, a name given twice, a file that "
        "limits nothing; with --api-keys a tenant or key the key file lacks; with --models "
        "or --upstream a model the upstream does not serve; a cost_per_* budget without "
        "--prices, or on a model without a price in force), then exits 2; or prints what "
        "the file sets and exits 0.",
        epilog="example: usage-proxy limits check limits.yaml --api-keys keys.yaml "
        "--prices prices.yaml --upstream http://127.0.0.1:8000",
    )
    limits.add_argument("action", choices=("check",))
    limits.add_argument("file", type=Path, metavar="FILE")
    limits.add_argument("--api-keys", type=Path, metavar="FILE", help="serve's --api-keys file")
    limits.add_argument(
        "--prices",
        type=Path,
        metavar="FILE",
        help="serve's --prices file: every model a cost_per_* budget applies to must have "
        "a price in force now (without it, a cost_per_* budget is a problem, as in serve)",
    )
    served = limits.add_mutually_exclusive_group()
    served.add_argument("--models", help="the served model names, comma-separated")
    served.add_argument("--upstream", help="ask this vLLM's /v1/models for the served names")


def run_limits(args: argparse.Namespace) -> int:
    problems, policies = _limits_problems(args)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems or policies is None:
        return 2
    print(f"{args.file}: OK, {summary(policies)}; periods in {policies.timezone}")
    return 0


def _limits_problems(args: argparse.Namespace) -> tuple[list[str], Policies | None]:
    """Every problem of the file and of the files it is checked with, in one pass."""
    found: list[str] = []
    policies, names = None, {}
    try:
        policies = read_limits(_existing(args.file, "the limits file"))
        names = names_of(policies)
        found.extend(f"{args.file}: {p}" for p in mistakes(policies))
    except LimitsFileError as exc:
        found.extend(f"{args.file}: {p}" for p in exc.problems)
        names = exc.names
    except UnicodeDecodeError as exc:
        found.append(f"{args.file}: not UTF-8 text ({exc.reason} at byte {exc.start})")
    except ValueError as exc:  # no file there: the other files are still read
        found.append(str(exc))
    digests = None
    if args.api_keys:
        try:
            digests = load_api_keys(args.api_keys)
        except KeyFileError as exc:
            found.append(f"--api-keys {exc}")
    models = None
    if args.upstream:
        try:
            models = _served(args.upstream)
        except ValueError as exc:  # said with the rest; the model names go unchecked
            found.append(f"--upstream {exc}")
    if args.models is not None:
        models = [m.strip() for m in args.models.split(",") if m.strip()]
    tenants = set(digests.values()) if digests is not None else None
    near = name_mistakes(names, models=models, tenants=tenants, digests=digests)
    found.extend(f"{args.file}: {p}" for p in near)
    table = None
    if args.prices:
        try:
            table = _prices(args.prices)
        except ValueError as exc:
            found.append(str(exc))
            return found, policies
    if policies is not None:
        money = unpriced(policies, table, models or [], datetime.now(UTC))
        found.extend([f"{args.file}: {money}"] if money else [])
    return found, policies


def _existing(path: Path, flag: str) -> Path:
    """``path``, or ``ValueError`` naming the flag when no file is there (no [Errno 2])."""
    if not path.exists():
        raise ValueError(f"{flag} {path} does not exist: fix the path")
    return path


def _served(upstream: str) -> list[str]:
    """The model names a vLLM serves (its /v1/models)."""
    url = upstream.rstrip("/") + "/v1/models"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            listing = json.load(answer)
        return [str(m["id"]) for m in listing["data"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot list the models of {url}: {exc}") from None


def _add_reconcile(commands: Any) -> None:
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
    _journal_option(rec)


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


def _journal_option(parser: Any) -> None:
    parser.add_argument(
        "--journal",
        type=Path,
        default=None,
        help=f"journal file [env {ENV_PREFIX}JOURNAL; default: {default_journal_path()}]",
    )


def _add_dead_letters(commands: Any) -> None:
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
    _journal_option(dead)


def _add_exporters(commands: Any) -> None:
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
    _journal_option(exporters)


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


def _add_report(commands: Any) -> None:
    report = commands.add_parser(
        "report",
        help="usage per tenant, model, operation or day, from the journal or the ledger",
        description="Requests; prompt (input) and completion (output) tokens, each as vLLM "
        "reported them and as billed; the over-report (tokens and % of reported); tokens "
        "billed without proof (mismatch, unaudited) and verdict counts; grouped as asked, "
        "with per-tenant subtotals, totals, the period and the first and last record. "
        "CSV has the detail rows only, so a spreadsheet's sums are the totals.",
        epilog="examples: usage-proxy report --since yesterday; usage-proxy report --since "
        "2026-11-01 --until 2026-12-01 --group-by tenant,day,operation --format csv; "
        "usage-proxy report --since 7d --format html --output usage.html",
    )
    source = report.add_mutually_exclusive_group()
    _journal_option(source)
    source.add_argument(
        "--ledger-dsn",
        help=f"read this PostgreSQL ledger [env {ENV_PREFIX}LEDGER_DSN or ledger_dsn in "
        "--config, as serve reads it: a configured ledger is read before the journal]",
    )
    _config_option(report)
    report.add_argument("--since", help=f"start of the range, inclusive ({TIME_HELP})")
    report.add_argument("--until", help=f"end of the range, exclusive ({TIME_HELP})")
    report.add_argument(
        "--timezone",
        metavar="ZONE",
        help="read dates and group days in this zone, e.g. Europe/Paris (default: the "
        "limits file's timezone with --limits, else the price file's with --prices, else UTC)",
    )
    report.add_argument(
        "--group-by",
        default="tenant,model,operation",
        help=f"comma-separated, from {', '.join(GROUPS)} (default: tenant,model,operation)",
    )
    report.add_argument("--format", choices=sorted(FORMATS), default="table")
    report.add_argument("--output", type=Path, help="write here instead of stdout")
    report.add_argument(
        "--limits",
        type=Path,
        metavar="FILE",
        help="the proxy's limits file: add each budget's use in its period holding the "
        "report's end, and in the one it is in now (table, JSON and HTML; the CSV keeps its "
        "detail rows only). Read from one replica's journal, a budget shows what that "
        f"replica billed; from the ledger, what every replica billed [env {ENV_PREFIX}LIMITS "
        "or limits in --config]",
    )
    report.add_argument(
        "--prices",
        type=Path,
        metavar="FILE",
        help="the proxy's price file: add the amounts, every record priced at the price in "
        "force at its time: per tenant, model, unit and price, and each tenant's amount "
        "rounded once (CSV: each row's amounts and its tenant's amount due)",
    )


def _config_option(parser: Any) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=os.environ.get(f"{ENV_PREFIX}CONFIG"),
        help=f"serve's YAML or TOML options file, read for the options this command "
        f"shares with serve [env {ENV_PREFIX}CONFIG]",
    )


def run_report(args: argparse.Namespace) -> int:
    options = load_sources(args.config)
    source = choose_source(args.journal, args.ledger_dsn, options)
    limits = args.limits or options.limits
    policies = _policies(limits) if limits else None
    price_file = _price_file(args.prices) if args.prices else None
    table = price_file.table() if price_file is not None else None
    if policies is not None and table is None and any(policies.budgeted_models()):
        raise ValueError(f"--limits {limits} has cost_per_* budgets: give --prices too")
    zone, why = report_zone(args.timezone, policies, price_file)
    since, until = instant(args.since, zone), instant(args.until, zone)
    if since and until and datetime.fromisoformat(since) >= datetime.fromisoformat(until):
        raise ValueError(
            f"--since {args.since} ({since}) is not before --until {args.until} ({until}): "
            "the range is empty; --since is inclusive, --until exclusive"
        )
    groups = [g.strip() for g in args.group_by.split(",") if g.strip()]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or not groups:
        raise ValueError(f"--group-by takes {', '.join(GROUPS)}; not {', '.join(unknown)}")
    records = source.read(since, until)
    now = datetime.now(UTC)
    described = source.describe()
    print(f"usage-proxy report: {len(records)} record(s) from the {described}", file=sys.stderr)
    print(f"usage-proxy report: dates read in {zone} ({why})", file=sys.stderr)
    gap = source.gap(since, now)
    if gap:
        print(f"usage-proxy report: warning: {gap}", file=sys.stderr)
    priced = None if table is None else charge(records, table, lambda r: row_key(r, groups, zone))
    budgets = () if policies is None else budget_rows(policies, source.read, until, now, table)
    report = aggregate(
        records,
        group_by=groups,
        since=shown(since, zone),
        until=shown(until, zone),
        generated_at=now.isoformat(timespec="seconds"),
        zone=zone,
        source=described,
        charges=priced,
        budgets=budgets,
    )
    text = FORMATS[args.format](report)
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def _prices(path: Path) -> PriceTable:
    return _price_file(path).table()


def _price_file(path: Path) -> PriceFile:
    try:
        return load_price_file(_existing(path, "--prices"))
    except (UnicodeDecodeError, yaml.YAMLError, ValidationError, PriceFileError) as exc:
        raise ValueError(f"--prices {path} is not a valid price file: {one_line(exc)}") from None


def _policies(path: Path) -> Policies:
    try:
        return read_limits(_existing(path, "--limits"))
    except (UnicodeDecodeError, LimitsFileError) as exc:
        raise ValueError(f"--limits {path} is not a valid limits file: {exc}") from None


def _format_errors(exc: ValidationError, config: Path | None) -> str:
    """One line per refused value, naming every place it can be set."""
    lines = ["invalid configuration:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "settings"
        name = err["loc"][0] if err["loc"] else where
        if err["type"] == "extra_forbidden":
            origin = f"`{where}` in {config}" if config else f"`{where}`"
            lines.append(f"  {origin} is not a setting (usage-proxy serve --help lists them)")
            continue
        places = [] if name in FILE_ONLY else ["--" + str(name).replace("_", "-")]
        places.append(f"{ENV_PREFIX}{str(name).upper()}")
        listed = ", ".join(places) + (f" or `{where}` in {config}" if config else "")
        lines.append(f"  {listed}: {plain_message(err)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser, flags = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("report", "dead-letters", "exporters", "reconcile", "limits"):
        command = {
            "report": run_report,
            "dead-letters": run_dead_letters,
            "exporters": run_exporters,
            "reconcile": run_reconcile,
            "limits": run_limits,
        }[args.command]
        try:
            return command(args)
        except (OSError, ValueError, sqlite3.Error) as exc:
            print(f"usage-proxy {args.command}: {exc}", file=sys.stderr)
            return 2
    try:
        settings = load_settings({}, args.config, flags=flags(parsed_args=args))
    except ValidationError as exc:
        print(f"usage-proxy: {_format_errors(exc, args.config)}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"usage-proxy: {exc}", file=sys.stderr)
        return 2
    from proxy.serving.supervisor import main as serve  # the other commands need no server

    return serve(settings)
