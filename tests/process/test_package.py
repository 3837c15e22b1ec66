"""The installed wheel carries what the proxy reads from its package at start: the limits
store's Lua (``proxy/limitstore/lua/*.lua``), the ledger's DDL and the report's template.
The wheel is built from this tree, installed alone into a folder, and the scripts are
loaded from there, not from the source."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

LOAD = """
import sys
from proxy.limitstore import scripts
assert scripts.__file__.startswith(sys.argv[1]), scripts.__file__
print(len(scripts.RESERVE), len(scripts.SYNC), len(scripts.END), len(scripts.BEAT))
"""


def test_the_wheel_holds_and_loads_the_package_data(tmp_path: Path) -> None:
    """Every ``.lua`` file, ``ledger.sql`` and the HTML template are in the wheel, and the
    scripts module reads its Lua from the installed copy."""
    source = tmp_path / "source"
    source.mkdir()
    shutil.copytree(ROOT / "proxy", source / "proxy", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(tmp_path), str(source)], check=True)
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    lua = {p.relative_to(ROOT).as_posix() for p in (ROOT / "proxy/limitstore/lua").glob("*.lua")}
    assert lua
    assert lua <= names
    assert {"proxy/ledger/sinks/ledger.sql", "proxy/ledger/templates/report.html.j2"} <= names
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD, str(site)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert all(int(n) > 0 for n in loaded.stdout.split())
