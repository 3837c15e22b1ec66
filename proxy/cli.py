"""The ``usage-proxy`` command line. Flags are generated from the settings model."""

from __future__ import annotations

import argparse
import enum
import json
import os
import sqlite3
import sys
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import ValidationError
from pydantic_settings import CliSettingsSource

from proxy import __version__
from proxy.accounting.price_schedule import PriceFile, PriceFileError, load_price_file, one_line
from proxy.accounting.prices import PriceTable
from proxy.journal_commands import (
    add_dead_letters,
    add_exporters,
    add_reconcile,
    journal_option,
    run_dead_letters,
    run_exporters,
    run_reconcile,
)
from proxy.ledger.charges import charge
from proxy.ledger.report import GROUPS, aggregate, row_key
from proxy.ledger.report_formats import FORMATS
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
    add_dead_letters(commands)
    add_exporters(commands)
    add_reconcile(commands)
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
    journal_option(source)
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
