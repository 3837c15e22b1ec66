"""Configuration precedence, validation errors and --help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.accounting.types import Family
from proxy.cli import build_parser, main
from proxy.settings import Mode, Settings, load_settings


def test_zero_config_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only --upstream and --port: everything else has a working default."""
    settings = load_settings({"upstream": "http://vllm:8000/", "port": "9000"}, None)
    assert settings.upstream_base == "http://vllm:8000"
    assert (settings.port, settings.mode, settings.host) == (9000, Mode.REWRITE, "0.0.0.0")


def test_precedence_flag_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag beats the environment, which beats the file, which beats the default."""
    config = tmp_path / "proxy.yaml"
    config.write_text(
        "upstream: http://file:1\nport: 7000\nmode: shadow\nread-timeout: 9\n"
        "models:\n  minilm:\n    family: cross-encoder\n    tokenizer: /models/minilm\n"
    )
    monkeypatch.setenv("USAGE_PROXY_PORT", "7001")
    monkeypatch.setenv("USAGE_PROXY_MODE", "annotate")
    settings = load_settings({"mode": "rewrite", "upstream": None}, config)
    assert settings.upstream_base == "http://file:1"
    assert settings.port == 7001
    assert settings.mode is Mode.REWRITE
    assert settings.read_timeout == 9
    assert settings.models["minilm"].family is Family.CROSS_ENCODER


def test_toml_config(tmp_path: Path) -> None:
    """TOML files work the same way."""
    config = tmp_path / "proxy.toml"
    config.write_text('upstream = "http://toml:2"\n[models.m]\nfamily = "bi-encoder"\n')
    settings = load_settings({}, config)
    assert settings.upstream_base == "http://toml:2"
    assert settings.models["m"].family is Family.BI_ENCODER


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve"], "--upstream (USAGE_PROXY_UPSTREAM): Field required"),
        (["serve", "--upstream", "not a url"], "--upstream"),
        (["serve", "--upstream", "http://x", "--port", "70000"], "--port"),
        (["serve", "--upstream", "http://x", "--log-level", "loud"], "--log-level"),
        (
            ["serve", "--upstream", "http://x", "--config", "/nonexistent.yaml"],
            "cannot read config file",
        ),
    ],
)
def test_bad_values_are_clear_errors(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invalid options exit 2 with the flag and env var named."""
    monkeypatch.delenv("USAGE_PROXY_UPSTREAM", raising=False)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_bad_mode_is_rejected_by_the_parser() -> None:
    """--mode only takes rewrite, annotate or shadow."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--upstream", "http://x", "--mode", "loud"])


def test_help_explains_every_option() -> None:
    """serve --help lists each settings field with its env var and default."""
    out = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name, _field in Settings.model_fields.items():
        if name in ("models", "cloudevents_headers"):  # file/env only (secrets, structure)
            assert "--" + name.replace("_", "-") not in out
            continue
        assert "--" + name.replace("_", "-") in out
        assert f"USAGE_PROXY_{name.upper()}" in out
    assert "PydanticUndefined" not in out
    assert "default: host name" in " ".join(out.split())
    assert "--config" in out


def test_report_help_has_no_literal_percent_escapes() -> None:
    """report --help used to print a literal '%%'."""
    out = subprocess.run(
        [sys.executable, "-m", "proxy", "report", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "%%" not in out
    assert "yesterday" in out
