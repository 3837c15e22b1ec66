"""The ``usage-proxy`` command line. Flags are generated from the settings model."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from proxy import __version__
from proxy.settings import ENV_PREFIX, Mode, Settings, load_settings

_FILE_ONLY = {"models"}


def _flag_help(name: str) -> str:
    field = Settings.model_fields[name]
    default = "required" if field.is_required() else f"default: {field.get_default()}"
    env = f"{ENV_PREFIX}{name.upper()}"
    return f"{field.description} [env {env}; {default}]"


def build_parser() -> argparse.ArgumentParser:
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
    for name in Settings.model_fields:
        if name in _FILE_ONLY:
            continue
        flag = "--" + name.replace("_", "-")
        choices = [m.value for m in Mode] if name == "mode" else None
        serve.add_argument(flag, dest=name, default=None, choices=choices, help=_flag_help(name))
    return parser


def _format_errors(exc: ValidationError) -> str:
    lines = ["invalid configuration:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "settings"
        flag = "--" + where.replace("_", "-")
        lines.append(f"  {flag} ({ENV_PREFIX}{where.upper()}): {err['msg']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cli: dict[str, Any] = {k: v for k, v in vars(args).items() if k not in {"command", "config"}}
    try:
        settings = load_settings(cli, args.config)
    except ValidationError as exc:
        print(f"usage-proxy: {_format_errors(exc)}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"usage-proxy: {exc}", file=sys.stderr)
        return 2
    from proxy.app import run

    run(settings)
    return 0
