"""Start-up mistakes (issue #39 case 9) end in one line naming the flag or file and what to
do, exit code 2, no traceback: the real ``usage-proxy serve`` process, one per mistake."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.vllm_cpu import free_port


@pytest.fixture
def taken() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def serve(tmp_path: Path, *args: str) -> tuple[int, str]:
    argv = [sys.executable, "-m", "proxy", "serve", "--upstream", "http://127.0.0.1:9"]
    argv += ["--host", "127.0.0.1", "--journal", str(tmp_path / "j.sqlite"), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, done.stderr


def one_line(rc: int, err: str) -> str:
    assert rc == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("usage-proxy: ")
    return last


def keys(tmp_path: Path, text: str) -> str:
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    return str(path)


def test_main_port_in_use(tmp_path: Path, taken: int) -> None:
    """Was a 19-line traceback with rc 1."""
    line = one_line(*serve(tmp_path, "--port", str(taken)))
    assert f"cannot listen on 127.0.0.1:{taken} (--port): address already in use" in line
    assert "choose another --port" in line


def test_admin_port_in_use(tmp_path: Path, taken: int) -> None:
    """The admin port names its own flag."""
    args = ("--port", str(free_port()), "--admin-host", "127.0.0.1", "--admin-port", str(taken))
    line = one_line(*serve(tmp_path, *args))
    assert f"127.0.0.1:{taken} (--admin-port): address already in use" in line


def test_plaintext_key(tmp_path: Path) -> None:
    """A plaintext key in the key file: the file, the tenant, the digest recipe; the key
    itself is never echoed."""
    path = keys(tmp_path, "acme: sk-very-secret\n")
    line = one_line(*serve(tmp_path, "--port", str(free_port()), "--api-keys", path))
    assert line.startswith(f"usage-proxy: --api-keys {path}: tenant 'acme'")
    assert "printf %s 'THE-KEY' | sha256sum" in line
    assert "sk-very-secret" not in line


def test_broken_yaml_key_file(tmp_path: Path) -> None:
    """Broken YAML: the message names the file and the line (it named neither)."""
    path = keys(tmp_path, "acme: [unclosed\n")
    line = one_line(*serve(tmp_path, "--port", str(free_port()), "--api-keys", path))
    assert line.startswith(f"usage-proxy: --api-keys {path}: not valid YAML/JSON at line")


def test_missing_key_file(tmp_path: Path) -> None:
    """A key file that is not there."""
    path = str(tmp_path / "nope.yaml")
    line = one_line(*serve(tmp_path, "--port", str(free_port()), "--api-keys", path))
    assert line == f"usage-proxy: --api-keys {path}: no such file; create it or fix the path"


@pytest.mark.parametrize("journal", ["/proc/usage.sqlite", "/proc/usage/j.sqlite"])
def test_journal_that_cannot_be_written(tmp_path: Path, journal: str) -> None:
    """A journal where nothing can be written (as a read-only mount: /proc refuses even
    root): the path, the flag and the fix, not "unable to open database file" alone."""
    line = one_line(*serve(tmp_path, "--port", str(free_port()), "--journal", journal))
    assert line.startswith(f"usage-proxy: cannot open the journal {journal} (--journal): ")
    assert "mount a writable volume there" in line
