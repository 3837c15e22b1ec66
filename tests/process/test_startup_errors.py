"""Start-up mistakes (issue #39 case 9) end in one line naming the flag or file and what to
do, exit code 2, no traceback: the real ``usage-proxy serve`` process, one per mistake (all
started at once, so the module costs one start-up's time)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.vllm_cpu import free_port

JOURNALS = ("/proc/usage.sqlite", "/proc/usage/j.sqlite")  # unwritable even for root


def argv(workdir: Path, *args: str) -> list[str]:
    base = [sys.executable, "-m", "proxy", "serve", "--upstream", "http://127.0.0.1:9"]
    return [*base, "--host", "127.0.0.1", "--journal", str(workdir / "j.sqlite"), *args]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    """Each mistake's exit code and stderr, keyed by the mistake; also the paths used."""
    tmp = tmp_path_factory.mktemp("startup")
    (tmp / "plain.yaml").write_text("acme: sk-very-secret\n")
    (tmp / "broken.yaml").write_text("acme: [unclosed\n")
    (tmp / "limits.yaml").write_text("tenants: {acme: {requests_per_minute: 10}}\n")
    (tmp / "binary").write_bytes(b"\xff\xfe\x00secret")
    store = ("--limits", str(tmp / "limits.yaml"), "--limits-store", "redis://127.0.0.1:9/0")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        admin = ("--admin-host", "127.0.0.1", "--admin-port", port)
        cases = {
            "port": argv(tmp, "--port", port),
            "admin": argv(tmp, "--port", str(free_port()), *admin),
            "plain": argv(tmp, "--port", str(free_port()), "--api-keys", str(tmp / "plain.yaml")),
            "broken": argv(tmp, "--port", str(free_port()), "--api-keys", str(tmp / "broken.yaml")),
            "missing": argv(tmp, "--port", str(free_port()), "--api-keys", str(tmp / "no.yaml")),
            **{j: argv(tmp, "--port", str(free_port()), "--journal", j) for j in JOURNALS},
            "no-limits": argv(tmp, "--port", str(free_port()), "--limits", str(tmp / "no.yaml")),
            **{
                name: argv(
                    tmp,
                    "--port",
                    str(free_port()),
                    *store,
                    "--limits-store-password-file",
                    str(tmp / name),
                )
                for name in ("no-password", "binary")
            },
        }
        running = {
            k: subprocess.Popen(a, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
            for k, a in cases.items()
        }
        try:
            results = {}
            for key, process in running.items():
                err = process.communicate(timeout=60)[1]
                results[key] = (process.returncode, err)
        finally:
            for p in running.values():
                p.kill()
    return {**results, "_port": (0, port), "_dir": (0, str(tmp))}


def one_line(outcome: tuple[int, str]) -> str:
    rc, err = outcome
    assert rc == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("usage-proxy: ")
    return last


def test_main_port_in_use(outcomes: dict[str, tuple[int, str]]) -> None:
    """Was a 19-line traceback with rc 1."""
    port = outcomes["_port"][1]
    line = one_line(outcomes["port"])
    assert f"cannot listen on 127.0.0.1:{port} (--port): address already in use" in line
    assert "choose another --port" in line


def test_admin_port_in_use(outcomes: dict[str, tuple[int, str]]) -> None:
    """The admin port names its own flag."""
    port = outcomes["_port"][1]
    line = one_line(outcomes["admin"])
    assert f"127.0.0.1:{port} (--admin-port): address already in use" in line


def test_plaintext_key(outcomes: dict[str, tuple[int, str]]) -> None:
    """A plaintext key in the key file: the file, the tenant, the digest recipe; the key
    itself is never echoed."""
    path = Path(outcomes["_dir"][1]) / "plain.yaml"
    line = one_line(outcomes["plain"])
    assert line.startswith(f"usage-proxy: --api-keys {path}: tenant 'acme'")
    assert "printf %s 'THE-KEY' | sha256sum" in line
    assert "sk-very-secret" not in outcomes["plain"][1]


def test_broken_yaml_key_file(outcomes: dict[str, tuple[int, str]]) -> None:
    """Broken YAML: the message names the file and the line (it named neither)."""
    path = Path(outcomes["_dir"][1]) / "broken.yaml"
    line = one_line(outcomes["broken"])
    assert line.startswith(f"usage-proxy: --api-keys {path}: not valid YAML/JSON at line")


def test_missing_key_file(outcomes: dict[str, tuple[int, str]]) -> None:
    """A key file that is not there."""
    path = Path(outcomes["_dir"][1]) / "no.yaml"
    line = one_line(outcomes["missing"])
    assert line == f"usage-proxy: --api-keys {path}: no such file; create it or fix the path"


@pytest.mark.parametrize("journal", JOURNALS)
def test_journal_that_cannot_be_written(outcomes: dict[str, tuple[int, str]], journal: str) -> None:
    """A journal where nothing can be written (as a read-only mount: /proc refuses even
    root): the path, the flag and the fix, not "unable to open database file" alone."""
    line = one_line(outcomes[journal])
    assert line.startswith(f"usage-proxy: cannot open the journal {journal} (--journal): ")
    assert "mount a writable volume there" in line


def test_missing_limits_file(outcomes: dict[str, tuple[int, str]]) -> None:
    """``--limits`` naming no file: the flag, the path and why (was a traceback)."""
    path = Path(outcomes["_dir"][1]) / "no.yaml"
    line = one_line(outcomes["no-limits"])
    assert line.startswith(f"usage-proxy: cannot read --limits {path}: No such file")


@pytest.mark.parametrize(
    ("name", "why"), [("no-password", "No such file or directory"), ("binary", "not UTF-8 text")]
)
def test_unreadable_store_password_file(
    outcomes: dict[str, tuple[int, str]], name: str, why: str
) -> None:
    """A missing or non-UTF-8 ``--limits-store-password-file``: one line naming it (was a
    traceback), the bytes never echoed."""
    path = Path(outcomes["_dir"][1]) / name
    line = one_line(outcomes[name])
    assert line.startswith(f"usage-proxy: cannot read --limits-store-password-file {path}: {why}")
    assert "secret" not in outcomes[name][1]
