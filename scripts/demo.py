"""``make run``: real vLLM 0.29.0 (CPU) with the packaged MiniLM, the proxy in front of it,
one sample 1:N rerank showing upstream vs corrected usage. Ctrl-C stops both.

Ports: DEMO_VLLM_PORT (default 8000) and DEMO_PROXY_PORT (default 8080).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.vllm_cpu import (
    minilm_dir,
    post,
    provision,
    start_proxy,
    start_vllm,
)

VERSION = os.environ.get("DEMO_VLLM_VERSION", "0.29.0")
SAMPLE = {
    "model": "minilm",
    "query": "What is the capital of France?",
    "documents": [
        "Paris is the capital of France.",
        "The Eiffel Tower is in Paris.",
        "Berlin is in Germany.",
    ],
}


def say(text: str) -> None:
    print(text, flush=True)


def main() -> int:
    logs = Path(tempfile.mkdtemp(prefix="usage-proxy-demo-"))
    say(f"[1/4] vLLM {VERSION} CPU environment (first run installs it, ~70 s) ...")
    started = time.monotonic()
    python = provision(VERSION)
    say(f"      ready in {time.monotonic() - started:.0f} s: {python}")
    vllm_port = int(os.environ.get("DEMO_VLLM_PORT", "8000"))
    proxy_port = int(os.environ.get("DEMO_PROXY_PORT", "8080"))
    say(f"[2/4] starting vLLM with all-MiniLM-L6-v2 on 127.0.0.1:{vllm_port} ...")
    vllm = start_vllm(python, minilm_dir(), "minilm", logs, port=vllm_port)
    proxy = None
    try:
        say(f"      up after {vllm.wait_ready('/health', 600):.0f} s (log: {vllm.log})")
        say(f"[3/4] starting usage-proxy on 127.0.0.1:{proxy_port} ...")
        proxy = start_proxy(vllm.url, logs, port=proxy_port)
        proxy.wait_ready("/readyz", 60)
        say(f"      proxy listens on {proxy.url} (log: {proxy.log})")
        say("      try it:")
        say(f"      curl -si {proxy.url}/rerank -H 'Content-Type: application/json' \\")
        say(f"        -d '{json.dumps(SAMPLE)}'")
        say("[4/4] sample 1:N rerank through the proxy:")
        status, headers, raw = post(proxy.url + "/rerank", SAMPLE)
        usage = json.loads(raw).get("usage")
        say(
            f"      status {status}; upstream reported "
            f"{headers.get('x-usage-upstream-prompt-tokens')} prompt tokens, "
            f"engine processed {headers.get('x-usage-engine-prompt-tokens')}, "
            f"verdict {headers.get('x-usage-verdict')}; client sees usage {usage}"
        )
        say("Running. Press Ctrl-C to stop both servers.")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while vllm.popen.poll() is None and proxy.popen.poll() is None:
            time.sleep(1)
        say("a server exited; stopping")
        return 1
    except KeyboardInterrupt:
        say("\nstopping ...")
        return 0
    finally:
        for process in (proxy, vllm):
            if process is not None:
                process.stop()


if __name__ == "__main__":
    raise SystemExit(main())
