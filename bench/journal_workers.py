"""The two choices ``serve --workers N`` (issue #61) rests on, measured with 1 and 2
processes: where the workers journal, and which cross-process limiter admits for them.

    .venv/bin/python -m bench.journal_workers [--seconds 2] [--rounds 3] [--dir /tmp]

**Journal.** Durable appends of real usage records (``proxy.ledger.sqlite``'s schema,
rows and multi-row INSERT, opened as ``proxy.ledger.journal.Journal._open`` opens its
file: WAL, ``synchronous=FULL``, the sqlite3 module's 5 s busy timeout) into (a) one
SQLite file per writer process (a shard per worker) and (b) one shared file in WAL mode
that every writer appends to. Each commit is one group, as the journal's thread commits
what is pending: of 1 record (a lone request) and of 16 (a burst). Reported: appends/s
over all writers, commits/s, p50/p99 commit latency, CPU per append, and errors
(``database is locked`` past the busy timeout).

**Limiter.** Sequential admissions from 2 processes, each a reserve then a settle at
three levels (tenant, model, key), through (a) one SQLite file in /dev/shm, every
admission a ``BEGIN IMMEDIATE`` read-modify-write of the GCRA state
(``proxy.limits.rates.Rate``), and (b) a limiter process (the supervisor's role) that
runs the real ``InProcessLimiter`` behind a Unix socket, asked by uvloop clients (one
round trip to reserve; the settle sent without waiting). Reported: reserve latency
p50/p99, admissions/s, and a burst of 2 x 100 against 100 requests per minute, which
must admit exactly 100.

Every case runs ``--rounds`` times, interleaved with the others (a shared disk drifts
within minutes): the medians are printed. Loopback and local files only; stops by itself
(about 90 s with the defaults, 3 rounds of 2 s per case). Prints markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import multiprocessing as mp
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.ledger.records import UsageRecord, new_record_id
from proxy.ledger.sqlite import Row, as_row, create_schema, insert_sql
from proxy.limits.rates import Rate

FORK = mp.get_context("fork")  # the children run the functions of this module as loaded
GROUPS = (1, 16)
LEVELS = (("tenant", "acme"), ("model", "acme/m"), ("key", "acme/abcdefabcdef"))
BURST_LIMIT = 100  # requests per minute, each level


@dataclass(frozen=True, slots=True)
class Run:
    """What one writer or admitting process did: latencies (s), count, CPU (s), errors."""

    latencies: list[float]
    done: int
    cpu: float
    errors: int = 0
    admitted: int = 0


def template_row(instance: str) -> Row:
    """A usage record shaped as an audited embeddings request's (about 600 bytes)."""
    record = UsageRecord(
        tenant="acme",
        key_hash="abcdefabcdef",
        model="intfloat/e5-small-v2",
        endpoint="/v1/embeddings",
        operation="embeddings",
        upstream_version="0.32.0",
        prompt_tokens_reported=12,
        prompt_tokens_billed=12,
        completion_tokens_reported=0,
        completion_tokens_billed=0,
        verdict="exact",
        status=200,
        latency_ms=4.2,
        instance=instance,
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
    return as_row(record)


def fresh(template: Row) -> Row:
    """The template with a new record id (the body carries it too)."""
    old, new = template[0], new_record_id()
    return (new, template[1], template[2], template[3].replace(old, new), template[4])


def open_journal(path: Path) -> sqlite3.Connection:
    """The file as ``Journal._open`` opens it."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    create_schema(db)
    return db


def append_loop(
    path: Path, group: int, queued: bool, start: float, end: float, out: Connection
) -> None:
    """One writer: commit groups of ``group`` fresh records until ``end``; ``queued``:
    each commit waits its turn on a file lock (``flock``) instead of SQLite's busy
    handler, which sleeps 1, 2, 5, 10... ms between tries."""
    db = open_journal(path)
    lock = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT) if queued else -1
    template = template_row(f"w{os.getpid()}")
    latencies: list[float] = []
    errors = 0
    sql = insert_sql(group)
    while time.time() < start:
        time.sleep(0.001)
    cpu = time.process_time()
    while time.time() < end:
        values = [v for _ in range(group) for v in fresh(template)]
        began = time.perf_counter()
        try:
            if queued:
                fcntl.flock(lock, fcntl.LOCK_EX)
            db.execute(sql, values)
        except sqlite3.OperationalError:  # locked past the busy timeout
            errors += 1
            continue
        finally:
            if queued:
                fcntl.flock(lock, fcntl.LOCK_UN)
        latencies.append(time.perf_counter() - began)
    cpu = time.process_time() - cpu
    db.close()
    out.send(Run(latencies, len(latencies) * group, cpu, errors))


def run_processes(
    target: Callable[..., None], args: list[tuple[object, ...]], seconds: float
) -> list[Run]:
    """Start one process per ``args`` (each given start, end and a pipe after its own
    arguments), all released at once; their runs."""
    start = time.time() + 0.5
    end = start + seconds
    pipes, procs = [], []
    for own in args:
        parent, child = FORK.Pipe(duplex=False)
        proc = FORK.Process(target=target, args=(*own, start, end, child))
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    runs = [pipe.recv() for pipe in pipes]
    for proc in procs:
        proc.join(timeout=10)
    return runs


def quantile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


JOURNAL_CASES = (
    (1, "one file"),
    (2, "a shard per writer"),
    (2, "one shared WAL file"),
    (2, "one shared WAL file, commits queued on a file lock"),
)
Figures = dict[str, float]


def journal_case(folder: Path, writers: int, layout: str, group: int, seconds: float) -> Figures:
    """One journal case: its writers on fresh files, released at once."""
    case = Path(tempfile.mkdtemp(dir=folder))
    shared = layout != "a shard per writer"
    names = ["journal.sqlite" if shared else f"journal-{k}.sqlite" for k in range(writers)]
    paths = [case / name for name in names]
    for path in set(paths):  # the schema made once, as a proxy's start makes it
        open_journal(path).close()
    queued = layout.endswith("file lock")
    runs = run_processes(append_loop, [(p, group, queued) for p in paths], seconds)
    lat = [x for r in runs for x in r.latencies]
    done = sum(r.done for r in runs)
    return {
        "appends": done / seconds,
        "commits": sum(len(r.latencies) for r in runs) / seconds,
        "p50": quantile(lat, 0.5) * 1e3,
        "p99": quantile(lat, 0.99) * 1e3,
        "cpu": sum(r.cpu for r in runs) / max(done, 1) * 1e6,
        "errors": sum(r.errors for r in runs),
    }


def journal_rows(folder: Path, seconds: float, rounds: int) -> list[str]:
    """The journal table: every case ``rounds`` times, interleaved (a disk shared with
    other work drifts within minutes); the median of each figure, and the range of
    appends/s."""
    cases = [(w, layout, g) for g in GROUPS for w, layout in JOURNAL_CASES]
    found: dict[tuple[int, str, int], list[Figures]] = {case: [] for case in cases}
    for _ in range(rounds):
        for case in cases:
            found[case].append(journal_case(folder, *case, seconds))
    lines = [
        "| writers | layout | records per commit | appends/s, all writers (range) "
        "| commits/s | commit p50 ms | commit p99 ms | CPU µs per append | locked errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (writers, layout, group), figures in found.items():
        m = {key: statistics.median(f[key] for f in figures) for key in figures[0]}
        low, high = min(f["appends"] for f in figures), max(f["appends"] for f in figures)
        lines.append(
            f"| {writers} | {layout} | {group} | {m['appends']:,.0f} ({low:,.0f}-{high:,.0f}) "
            f"| {m['commits']:,.0f} | {m['p50']:.2f} | {m['p99']:.2f} | {m['cpu']:.0f} "
            f"| {sum(f['errors'] for f in figures):.0f} |"
        )
    return lines


# --- limiter candidate (a): SQLite, BEGIN IMMEDIATE read-modify-write ---------------


def open_limits(path: Path) -> sqlite3.Connection:
    """The limiter's file: WAL, no fsync (rates restart, budgets are rebuilt from the
    journals, as the in-process limiter's are at start)."""
    db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("CREATE TABLE IF NOT EXISTS rates (key TEXT PRIMARY KEY, tat REAL NOT NULL)")
    return db


def sqlite_reserve(db: sqlite3.Connection, amount: int, cost: int, now: float) -> bool:
    """One reservation at every level, or none: GCRA in Python on the rows, in one
    write transaction (the other processes wait at BEGIN IMMEDIATE)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        rates = []
        for _, key in LEVELS:
            row = db.execute("SELECT tat FROM rates WHERE key = ?", (key,)).fetchone()
            rate = Rate(amount, 60.0)
            rate.tat = row[0] if row else 0.0
            rates.append(rate)
        if any(rate.wait(cost, now) > 0 for rate in rates):
            return False
        for (_, key), rate in zip(LEVELS, rates, strict=True):
            rate.take(cost, now)
            db.execute("INSERT OR REPLACE INTO rates VALUES (?, ?)", (key, rate.tat))
        return True
    finally:
        db.execute("COMMIT")


def sqlite_settle(db: sqlite3.Connection, amount: int, given: int) -> None:
    """A settlement below the reservation gives units back: one more write transaction."""
    interval = 60.0 / amount
    db.execute("BEGIN IMMEDIATE")
    try:
        for _, key in LEVELS:
            db.execute("UPDATE rates SET tat = tat - ? WHERE key = ?", (given * interval, key))
    finally:
        db.execute("COMMIT")


def sqlite_admit_loop(
    path: Path, amount: int, attempts: int, start: float, end: float, out: Connection
) -> None:
    """Admissions until ``end`` (or ``attempts`` of them): reserve, then settle."""
    db = open_limits(path)
    latencies: list[float] = []
    admitted = 0
    while time.time() < start:
        time.sleep(0.001)
    cpu = time.process_time()
    while time.time() < end and len(latencies) < attempts:
        began = time.perf_counter()
        ok = sqlite_reserve(db, amount, 1, time.time())
        latencies.append(time.perf_counter() - began)
        if ok:
            admitted += 1
            sqlite_settle(db, amount, 0)
    out.send(Run(latencies, len(latencies), time.process_time() - cpu, admitted=admitted))


# --- limiter candidate (b): the supervisor's InProcessLimiter over a Unix socket ----


def limiter_server(socket_path: Path, amount: int, ready: Connection, out: Connection) -> None:
    """The limiter process: the real in-process limiter, one line per call."""
    import uvloop

    from proxy.limits.limiter import Cost, Ticket, Who
    from proxy.limits.policy import Policies
    from proxy.limitstore.memory import InProcessLimiter

    policies = Policies.model_validate(
        {
            "tenants": {
                "acme": {
                    "requests_per_minute": amount,
                    "models": {"m": {"requests_per_minute": amount}},
                    "keys": {"abcdefabcdef": {"requests_per_minute": amount}},
                }
            }
        }
    )
    limiter = InProcessLimiter(policies)
    who = Who("acme", "m", "abcdefabcdef")
    calls = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        tickets: dict[bytes, Ticket] = {}
        with contextlib.suppress(ConnectionError):
            while line := await reader.readline():
                calls += 1
                op, rid = line.split()
                if op == b"R":
                    decision = await limiter.reserve(who, Cost(0, 0), time.time())
                    if decision.ticket is not None:
                        tickets[rid] = decision.ticket
                    writer.write(b"1\n" if decision.ticket is not None else b"0\n")
                elif (ticket := tickets.pop(rid, None)) is not None:
                    await limiter.settle(ticket, Cost(0, 0), time.time())
        for ticket in tickets.values():  # a client gone: what it did not settle comes back
            await limiter.release(ticket, time.time())
        writer.close()

    async def main() -> None:
        server = await asyncio.start_unix_server(serve, path=str(socket_path))
        cpu = time.process_time()
        ready.send(True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_reader(out.fileno(), stop.set)
        await stop.wait()
        server.close()
        out.send((calls, time.process_time() - cpu))

    uvloop.run(main())


def socket_admit_loop(
    socket_path: Path, amount: int, attempts: int, start: float, end: float, out: Connection
) -> None:
    """Admissions until ``end``: reserve (one round trip), settle (sent, not awaited)."""
    import uvloop

    async def main() -> Run:
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        latencies: list[float] = []
        admitted = 0
        await asyncio.sleep(max(start - time.time(), 0.0))
        cpu = time.process_time()
        while time.time() < end and len(latencies) < attempts:
            rid = new_record_id().encode()
            began = time.perf_counter()
            writer.write(b"R " + rid + b"\n")
            answer = await reader.readline()
            latencies.append(time.perf_counter() - began)
            if answer == b"1\n":
                admitted += 1
                writer.write(b"S " + rid + b"\n")  # billed as reserved: the burst keeps all
        cpu = time.process_time() - cpu
        writer.close()
        return Run(latencies, len(latencies), cpu, admitted=admitted)

    out.send(uvloop.run(main()))


LIMITERS = ("SQLite BEGIN IMMEDIATE (/dev/shm)", "limiter process, Unix socket")


def limiter_runs(folder: Path, name: str, amount: int, attempts: int, span: float) -> Figures:
    """One limiter case with 2 admitting processes (and the limiter process, if any)."""
    server_cpu = 0.0
    if name.startswith("SQLite"):
        path = Path(tempfile.mkdtemp(dir="/dev/shm")) / "limits.sqlite"
        open_limits(path).close()
        runs = run_processes(sqlite_admit_loop, [(path, amount, attempts)] * 2, span)
        for leftover in path.parent.iterdir():
            leftover.unlink()
        path.parent.rmdir()
    else:
        socket_path = Path(tempfile.mkdtemp(dir=folder)) / "limiter.sock"
        ready_r, ready_w = FORK.Pipe(duplex=False)
        stop_r, stop_w = FORK.Pipe()
        server = FORK.Process(target=limiter_server, args=(socket_path, amount, ready_w, stop_w))
        server.start()
        ready_r.recv()
        runs = run_processes(socket_admit_loop, [(socket_path, amount, attempts)] * 2, span)
        stop_r.send(True)
        _, server_cpu = stop_r.recv()
        server.join(timeout=10)
    lat = [x for r in runs for x in r.latencies]
    done = sum(r.done for r in runs)
    return {
        "p50": quantile(lat, 0.5) * 1e6,
        "p99": quantile(lat, 0.99) * 1e6,
        "rate": done / span,
        "client_cpu": sum(r.cpu for r in runs) / max(done, 1) * 1e6,
        "server_cpu": server_cpu / max(done, 1) * 1e6,
        "admitted": sum(r.admitted for r in runs),
    }


def limiter_rows(folder: Path, seconds: float, rounds: int) -> list[str]:
    """The limiter table: each candidate's throughput case (median of ``rounds``) and a
    burst against a per-minute limit (every round's admitted count)."""
    lines = [
        "| limiter | processes | reserve p50 µs | reserve p99 µs | admissions/s (all) "
        "| CPU µs per admission: clients; limiter process "
        "| burst of 2 x 100 at 100/min: admitted, each round |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in LIMITERS:
        figures, bursts = [], []
        for _ in range(rounds):
            figures.append(limiter_runs(folder, name, 10**9, 10**9, seconds))
            bursts.append(limiter_runs(folder, name, BURST_LIMIT, 100, 2.0)["admitted"])
        m = {key: statistics.median(f[key] for f in figures) for key in figures[0]}
        server = f"{m['server_cpu']:.0f}" if m["server_cpu"] else "none"
        lines.append(
            f"| {name} | 2 | {m['p50']:.0f} | {m['p99']:.0f} | {m['rate']:,.0f} "
            f"| {m['client_cpu']:.0f}; {server} | {', '.join(f'{b:.0f}' for b in bursts)} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per case (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="of every case (default 3)")
    parser.add_argument("--dir", default=None, help="where the journals go (default: /tmp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        print(f"## Journal: durable appends ({os.cpu_count()} CPUs, files in {folder})\n")
        print("\n".join(journal_rows(Path(folder), args.seconds, args.rounds)))
        print("\n## Cross-process limiter: admissions from 2 processes\n")
        print("\n".join(limiter_rows(Path(folder), args.seconds, args.rounds)))


if __name__ == "__main__":
    main()
