"""The usage-proxy command line: its parser and its --help texts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from proxy.cli import build_parser
from proxy.settings import FILE_ONLY, Settings


def help_text(command: str) -> str:
    """What ``python -m proxy COMMAND --help`` prints, as an operator sees it."""
    argv = [sys.executable, "-m", "proxy", command, "--help"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def test_bad_mode_is_rejected_by_the_parser() -> None:
    """--mode only takes rewrite, annotate or shadow."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--upstream", "http://x", "--mode", "loud"])


def test_help_explains_every_option() -> None:
    """serve --help lists each settings field with its env var and default."""
    out = help_text("serve")
    for name, _field in Settings.model_fields.items():
        if name in FILE_ONLY:  # file/env only (secrets, structure)
            assert "--" + name.replace("_", "-") not in out
            continue
        assert "--" + name.replace("_", "-") in out
        assert f"USAGE_PROXY_{name.upper()}" in out
    assert "PydanticUndefined" not in out
    assert "default: host name" in " ".join(out.split())
    assert "--config" in out


def test_report_help_has_no_literal_percent_escapes() -> None:
    """report --help used to print a literal '%%'."""
    out = help_text("report")
    assert "%%" not in out
    assert "yesterday" in out
