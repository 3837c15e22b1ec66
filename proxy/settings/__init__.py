"""Configuration: one pydantic model fed by CLI flags, environment variables and a file,
each through pydantic-settings' own source (CLI, environment, YAML or TOML); the model is
the one list of options, their flags, their ``--help`` and the README table. Its options
are grouped by concern, one module each (``traffic``, ``counting``, ``runtime``,
``tenants``, ``recording``, ``surface``); ``model`` joins them; this is the package's
public face.

Precedence: command-line flag > ``USAGE_PROXY_*`` environment variable > config file
(YAML or TOML, ``--config`` / ``USAGE_PROXY_CONFIG``) > default.
"""

from proxy.settings.choices import (
    ENV_PREFIX,
    FILE_ONLY,
    CacheSalting,
    Durability,
    EventLoop,
    Mode,
    ModelOverride,
    default_journal_path,
)
from proxy.settings.model import Settings, Sources, load_settings, load_sources
from proxy.settings.reference import display_default, reference_table

__all__ = [
    "ENV_PREFIX",
    "FILE_ONLY",
    "CacheSalting",
    "Durability",
    "EventLoop",
    "Mode",
    "ModelOverride",
    "Settings",
    "Sources",
    "default_journal_path",
    "display_default",
    "load_settings",
    "load_sources",
    "reference_table",
]
