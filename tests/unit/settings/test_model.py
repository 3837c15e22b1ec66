"""Settings: zero-config defaults, precedence of flag, environment and file, clear errors
for values the proxy refuses, and the report's options read as serve reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.accounting.types import Family
from proxy.cli import main
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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve"], "--upstream, USAGE_PROXY_UPSTREAM: Field required"),
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


def test_the_reports_options_are_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """usage-proxy report reads its sources as serve does: the same defaults, the
    environment over the config file, and serve's other options in the file ignored."""
    from proxy.settings import load_sources

    for name in ("JOURNAL", "JOURNAL_RETENTION", "LEDGER_DSN", "LIMITS"):
        monkeypatch.delenv(f"USAGE_PROXY_{name}", raising=False)
    defaults = Settings(upstream="http://x")
    sources = load_sources(None)
    for name in type(sources).model_fields:
        assert getattr(sources, name) == getattr(defaults, name), name
    config = tmp_path / "proxy.yaml"
    config.write_text("upstream: http://x\nledger-dsn: postgresql://file/db\nlimits: l.yaml\n")
    monkeypatch.setenv("USAGE_PROXY_LEDGER_DSN", "postgresql://env/db")
    sources = load_sources(config)
    assert (sources.ledger_dsn, sources.limits) == ("postgresql://env/db", Path("l.yaml"))
