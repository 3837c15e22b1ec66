"""vllm-usage-proxy: a usage-auditing reverse proxy for vLLM's scoring endpoints."""

__version__ = "0.1.0"
