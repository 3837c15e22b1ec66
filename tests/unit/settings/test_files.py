"""The config file: TOML as YAML, option names as the flags spell them."""

from __future__ import annotations

from pathlib import Path

from proxy.accounting.types import Family
from proxy.settings import load_settings


def test_toml_config(tmp_path: Path) -> None:
    """TOML files work the same way."""
    config = tmp_path / "proxy.toml"
    config.write_text('upstream = "http://toml:2"\n[models.m]\nfamily = "bi-encoder"\n')
    settings = load_settings({}, config)
    assert settings.upstream_base == "http://toml:2"
    assert settings.models["m"].family is Family.BI_ENCODER
