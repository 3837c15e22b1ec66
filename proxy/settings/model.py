"""The two models options are read into: ``Settings``, every option of ``usage-proxy
serve`` (its groups, one module each, are its bases), and ``Sources``, what ``usage-proxy
report`` shares with it; each read from flags, environment and file.

Precedence: command-line flag > ``USAGE_PROXY_*`` environment variable > config file
(YAML or TOML, ``--config`` / ``USAGE_PROXY_CONFIG``) > default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from proxy.settings.choices import ENV_PREFIX, default_journal_path
from proxy.settings.counting import CountingOptions
from proxy.settings.files import file_source
from proxy.settings.recording import RecordingOptions
from proxy.settings.runtime import RuntimeOptions
from proxy.settings.surface import SurfaceOptions
from proxy.settings.tenants import TenantOptions
from proxy.settings.traffic import TrafficOptions


class _FileSourced(BaseSettings):
    """Flags (or values given to the constructor) > ``USAGE_PROXY_*`` environment > the
    file in ``config_file``, where one is set (a subclass bound to one file sets it)."""

    config_file: ClassVar[Path | None] = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # A CLI source given to the constructor goes first (pydantic-settings puts it there).
        if cls.config_file is None:
            return init_settings, env_settings
        return init_settings, env_settings, file_source(settings_cls, cls.config_file)


# pydantic orders the fields from the last base to the first: the groups are listed in
# reverse, so that --help and the README read as before (traffic first, surface last).
class Settings(
    SurfaceOptions,
    RecordingOptions,
    TenantOptions,
    RuntimeOptions,
    CountingOptions,
    TrafficOptions,
    _FileSourced,
):
    """Every option of ``usage-proxy serve``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    @property
    def metering(self) -> bool:
        return self.journal.lower() != "off"

    @property
    def upstream_base(self) -> str:
        return str(self.upstream).rstrip("/")


def load_settings(
    cli: dict[str, Any],
    config_file: Path | None,
    *,
    flags: CliSettingsSource[Settings] | None = None,
) -> Settings:
    """Build settings from the ``serve`` flags (a pydantic-settings CLI source), or from
    CLI values given as a mapping (None means 'not given'), and an optional file."""
    given: dict[str, Any] = {k: v for k, v in cli.items() if v is not None}
    given["_cli_settings_source"] = flags  # BaseSettings' own argument, not a field

    class _Bound(Settings):
        config_file: ClassVar[Path | None] = None

    _Bound.config_file = config_file
    return _Bound(**given)


class Sources(_FileSourced):
    """The options ``usage-proxy report`` shares with ``serve``, read as ``serve`` reads
    them (flags > ``USAGE_PROXY_*`` environment > the ``--config`` file > default): where
    the records are and the limits file. Every other option of the file is ignored."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    journal: str = Field(default_factory=lambda: str(default_journal_path()))
    journal_retention: float = Field(default=168.0, ge=0)
    ledger_dsn: str | None = None
    limits: Path | None = None


def load_sources(config_file: Path | None) -> Sources:
    """The report's options from the environment and ``config_file`` (flags are the
    command's own, applied over these)."""

    class _Bound(Sources):
        config_file: ClassVar[Path | None] = None

    _Bound.config_file = config_file
    return _Bound()
