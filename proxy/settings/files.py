"""The config file (``--config`` / ``USAGE_PROXY_CONFIG``): pydantic-settings' TOML source
for a ``.toml`` file and its YAML source otherwise, options keyed as the fields, every
error naming the file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from proxy.accounting.money import UniqueKeyLoader


def file_source(settings_cls: type[BaseSettings], path: Path) -> PydanticBaseSettingsSource:
    """pydantic-settings' TOML source for a ``.toml`` file, its YAML source otherwise."""
    if not path.is_file():
        raise ValueError(f"cannot read config file {path}: no such file")
    if path.suffix == ".toml":
        return _TomlFile(settings_cls, toml_file=path)
    return _YamlFile(settings_cls, yaml_file=path)


class _YamlFile(YamlConfigSettingsSource):
    def _read_file(self, file_path: Any) -> dict[str, Any]:
        return option_names(file_path, _unique_keys)


def _unique_keys(path: Path) -> Any:
    """pydantic-settings' YAML reading (UTF-8, an empty file is no options), refusing an
    option given twice: YAML would silently keep the later, and an operator who set
    ``read-timeout`` at the top and again at the bottom would run with the one they did
    not look at."""
    with path.open(encoding="utf-8") as text:
        return yaml.load(text, Loader=UniqueKeyLoader) or {}  # a SafeLoader subclass


class _TomlFile(TomlConfigSettingsSource):
    def _read_file(self, file_path: Any) -> dict[str, Any]:
        return option_names(file_path, super()._read_file)


def option_names(path: Path, read: Callable[[Path], Any]) -> dict[str, Any]:
    """A file's options, keyed as the fields (``read-timeout`` as a flag spells it is
    ``read_timeout``); every error names the file."""
    try:
        data = read(path)
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc.strerror}") from exc
    except (ValueError, yaml.YAMLError) as exc:  # TOMLDecodeError is a ValueError
        raise ValueError(f"config file {path} is not valid: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of option names to values")
    options: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name in options:
            raise ValueError(
                f"config file {path} is not valid: {name!r} is given twice (spelled "
                f"{key!r} once): an option may appear once only"
            )
        options[name] = value
    return options
