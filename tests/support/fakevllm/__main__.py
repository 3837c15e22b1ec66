"""Run the fake as a process: ``python -m tests.support.fakevllm --port P --root DIR``."""

from __future__ import annotations

import argparse
from pathlib import Path

from aiohttp import web
from transformers import AutoTokenizer

from tests.support.fakevllm import VLLM_KEEP_ALIVE, FakeVLLM


def main() -> None:
    """Serve one fake vLLM on 127.0.0.1 with the tokenizer in ``--root``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--version", default="0.29.0")
    parser.add_argument("--name", default="minilm", help="the served model's name")
    parser.add_argument("--delay", type=float, default=0.0, help="scoring answers this late")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(str(args.root))
    fake = FakeVLLM(tokenizer, args.root, version=args.version, name=args.name)
    fake.delay = args.delay
    web.run_app(
        fake.app(),
        host="127.0.0.1",
        port=args.port,
        print=None,
        keepalive_timeout=VLLM_KEEP_ALIVE,  # idle connections closed as vLLM's uvicorn does
    )


if __name__ == "__main__":
    main()
