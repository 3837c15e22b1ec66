"""The config file: TOML as YAML, option names as the flags spell them."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.accounting.types import Family
from proxy.settings import load_settings


def test_toml_config(tmp_path: Path) -> None:
    """TOML files work the same way."""
    config = tmp_path / "proxy.toml"
    config.write_text('upstream = "http://toml:2"\n[models.m]\nfamily = "bi-encoder"\n')
    settings = load_settings({}, config)
    assert settings.upstream_base == "http://toml:2"
    assert settings.models["m"].family is Family.BI_ENCODER


def test_an_option_given_twice_in_yaml_is_refused(tmp_path: Path) -> None:
    """YAML keeps the later of two equal keys silently; the config file names both lines."""
    config = tmp_path / "proxy.yaml"
    config.write_text("upstream: http://a:1\nread-timeout: 30\nread-timeout: 600\n")
    with pytest.raises(ValueError, match=r"proxy.yaml is not valid.*'read-timeout' is given twice"):
        load_settings({}, config)


@pytest.mark.parametrize("name", ["proxy.yaml", "proxy.toml"])
def test_an_option_spelled_two_ways_is_refused(tmp_path: Path, name: str) -> None:
    """``read-timeout`` and ``read_timeout`` are one option: given both, neither is
    silently dropped."""
    config = tmp_path / name
    sep = ": " if name.endswith("yaml") else " = "
    config.write_text(f'upstream{sep}"http://a:1"\nread-timeout{sep}30\nread_timeout{sep}600\n')
    with pytest.raises(ValueError, match=rf"{name} is not valid: 'read_timeout' is given twice"):
        load_settings({}, config)


def test_a_yaml_option_once_each_still_loads(tmp_path: Path) -> None:
    """Distinct options, and an empty mapping under a key, load as before."""
    config = tmp_path / "proxy.yaml"
    config.write_text("upstream: http://a:1\nread-timeout: 30\nmodels: {}\n")
    settings = load_settings({}, config)
    assert settings.read_timeout == 30
