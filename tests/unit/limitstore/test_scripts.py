"""The store's Lua, read from the package's ``lua/`` files: each script whole, with the
functions it calls defined ahead of it. (Run against a real store by test_redislimiter
and test_guard; the installed wheel's copy by tests/process/test_package.py.)"""

from __future__ import annotations

import re

import pytest

from proxy.limitstore import scripts


@pytest.mark.parametrize(
    ("script", "functions"),
    [
        (scripts.RESERVE, {"complete", "contribute", "claim"}),
        (scripts.SYNC, {"complete", "contribute", "claim"}),
        (scripts.END, set()),
        (scripts.RENEW, set()),
        (scripts.STAMP, set()),
        (scripts.BEAT, set()),
    ],
)
def test_each_script_defines_what_it_calls(script: str, functions: set[str]) -> None:
    """A shared function is defined before the body that calls it; a script that needs
    none carries none."""
    defined = set(re.findall(r"^local function (\w+)\(", script, re.MULTILINE))
    assert defined == functions
    for name in functions:
        assert script.index(f"local function {name}(") < script.rindex(f"{name}(")


def test_the_scripts_are_read_from_the_package_files() -> None:
    """What the limiter registers is the text of ``lua/*.lua``, not a copy in Python."""
    from importlib.resources import files

    lua = files("proxy.limitstore") / "lua"
    names = sorted(p.name for p in lua.iterdir() if p.name.endswith(".lua"))
    assert names == [
        f"{n}.lua"
        for n in sorted(
            ["beat", "claim", "complete", "contribute", "end", "renew", "reserve", "stamp", "sync"]
        )
    ]
    assert (lua / "end.lua").read_text(encoding="utf-8") == scripts.END
    assert scripts.RESERVE.endswith((lua / "reserve.lua").read_text(encoding="utf-8"))
