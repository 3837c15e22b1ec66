"""A throwaway PostgreSQL cluster from the server binaries, in a temp directory.

No system service is used. As root the cluster runs as the ``postgres`` user (initdb
refuses root). Where no binaries exist the tests that need it skip loudly, except under
CI=true, where they fail: CI must install them (.ci/run does).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from scripts.vllm_cpu import free_port


def server_bindir() -> Path | None:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(candidate, "initdb").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


@dataclass
class Cluster:
    bindir: Path
    datadir: Path
    port: int
    user_prefix: list[str]

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self.user_prefix, str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.datadir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._ctl("start", "-w", "-o", options, "-l", str(self.datadir / "server.log"))

    def stop(self, mode: str = "fast") -> None:
        self._ctl("stop", "-w", "-m", mode)


def start_cluster(base: Path) -> Cluster:
    bindir = server_bindir()
    if bindir is None:
        message = "PostgreSQL server binaries not found (apt-get install postgresql)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    datadir = base / "pgdata"
    prefix: list[str] = []
    datadir.mkdir()
    if os.geteuid() == 0:
        prefix = ["runuser", "-u", "postgres", "--"]
        shutil.chown(base, "postgres")
        shutil.chown(datadir, "postgres")
    subprocess.run(
        [
            *prefix,
            str(bindir / "initdb"),
            "-D",
            str(datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=120,
    )
    cluster = Cluster(bindir, datadir, free_port(), prefix)
    cluster.start()
    return cluster


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    """A session-wide cluster in its own world-traversable temp dir (pytest's is 0700)."""
    base = Path(tempfile.mkdtemp(prefix="usage-proxy-pg-"))
    base.chmod(0o755)
    try:
        cluster = start_cluster(base)
        try:
            yield cluster
        finally:
            cluster.stop("immediate")
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def fresh_database(cluster: Cluster) -> str:
    """A new, empty database on ``cluster``: each test its own ledger."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(cluster.dsn)
    await conn.execute(f"CREATE DATABASE {name}")
    await conn.close()
    return cluster.dsn.rsplit("/", 1)[0] + "/" + name
