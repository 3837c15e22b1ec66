"""The options as people and scripts know them: every flag and ``USAGE_PROXY_*`` name is
the one it was when the settings were one module (tests/data/settings_names.txt, written
from it), in the same order, and each default reads as a person would write it."""

from __future__ import annotations

from pathlib import Path

from proxy.settings import ENV_PREFIX, FILE_ONLY, Settings, display_default, reference_table

NAMES = Path(__file__).resolve().parents[2] / "data" / "settings_names.txt"


def test_every_flag_and_environment_name_is_unchanged() -> None:
    """Splitting the settings by concern renamed, dropped or reordered nothing."""
    names = [
        ("(env/file only)" if name in FILE_ONLY else "--" + name.replace("_", "-"))
        + f" {ENV_PREFIX}{name.upper()}"
        for name in Settings.model_fields
    ]
    assert names == NAMES.read_text().splitlines()


def test_the_table_has_a_row_per_option_with_its_names() -> None:
    """The README table (tests/test_docs.py holds it there) lists every option once, with
    its flag and its environment variable."""
    rows = reference_table().splitlines()[2:]
    assert len(rows) == len(Settings.model_fields)
    for row, line in zip(rows, NAMES.read_text().splitlines(), strict=True):
        flag, env = line.rsplit(" ", 1)
        assert f"`{env}`" in row
        assert flag == "(env/file only)" or f"`{flag}`" in row


def test_defaults_read_as_a_person_writes_them() -> None:
    """Required, unset, the host name and the journal's path are said, not shown raw."""
    assert display_default("upstream") == "required"
    assert display_default("ledger_dsn") == "unset"
    assert display_default("instance") == "host name"
    assert display_default("journal").startswith("$XDG_STATE_HOME/")
    assert display_default("mode") == "rewrite"
