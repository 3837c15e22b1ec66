"""The options of the traffic itself: the upstream, where the proxy listens and in which
mode, the timeouts and size limits of bodies and answers, the connections on both sides,
and each tenant's share of them."""

from __future__ import annotations

from pydantic import AnyHttpUrl, BaseModel, Field

from proxy.settings.choices import Mode


class TrafficOptions(BaseModel):
    """Where the proxy listens, what it forwards to, and the bounds of each request."""

    upstream: AnyHttpUrl = Field(
        description="Base URL of the vLLM server, e.g. http://127.0.0.1:8000."
    )
    host: str = Field("0.0.0.0", description="Address to listen on.")
    port: int = Field(8080, ge=1, le=65535, description="Port to listen on.")
    mode: Mode = Field(
        Mode.REWRITE,
        description="rewrite: usage as a fixed vLLM reports it; annotate: keep the reported "
        "usage and add engine_prompt_tokens/usage_verdict; shadow: body untouched. "
        "All modes add x-usage-* headers.",
    )
    connect_timeout: float = Field(10.0, gt=0, description="Seconds to connect to the upstream.")
    read_timeout: float = Field(
        600.0, gt=0, description="Seconds to wait for upstream headers or the next body chunk."
    )
    accounting_timeout: float = Field(
        5.0,
        gt=0,
        description="Seconds to wait for a recount after the upstream answered; "
        "past it the response is sent unaudited.",
    )
    max_body_bytes: int = Field(
        64 * 1024 * 1024, gt=0, description="Largest audited request body read into memory."
    )
    max_answer_bytes: int = Field(
        256 * 1024 * 1024,
        gt=0,
        description="Largest upstream answer (as sent, and decoded) read into memory to audit "
        "it (uncompressed metered answers: at most 8 MiB); a larger one is passed on as it "
        "arrives, a metered one billed from the usage at its end (its last 64 KiB held "
        "until then), anything else recorded invalid (nothing billed).",
    )
    max_inflight_body_bytes: int = Field(
        128 * 1024 * 1024,
        gt=0,
        description="Bytes of audited/metered request bodies held in memory at once (the "
        "proxy parses and counts them at a few times their size); past it, 503 with "
        "Retry-After. Size it with the memory limit: about 5 bytes of RSS per body byte. Per "
        "worker: a pod of --workers N holds up to N times as much.",
    )
    body_read_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds to receive a whole audited/metered request body; past it, 408.",
    )
    send_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds a client may go without accepting any byte of its answer (as "
        "nginx's send_timeout): one that reads nothing for this long, its connection's send "
        "buffer full, is disconnected, so it cannot hold an upstream connection or a held "
        "answer's memory. A metered answer is still read to its end and billed (aborted).",
    )
    keepalive_timeout: float = Field(
        75.0,
        gt=0,
        description="Seconds a client connection may stay without a complete request: an "
        "idle keep-alive connection, or one whose request headers have not all arrived, is "
        "closed after it (so slow-header clients cannot hold connections).",
    )
    max_connections: int = Field(
        4096,
        ge=1,
        description="Client connections open at once; beyond it a connection gets 503 and "
        "is closed (logged, counted), so a flood cannot exhaust file descriptors. Per worker: "
        "a pod of --workers N accepts up to N times as many.",
    )
    upstream_connections: int = Field(
        256,
        ge=1,
        description="Most connections open to the upstream at once (requests beyond it "
        "wait for a free one), so slow clients cannot exhaust vLLM's connections. Per "
        "worker: a pod of --workers N opens up to N times as many to vLLM.",
    )
    upstream_keepalive: float = Field(
        2.0,
        gt=0,
        description="Seconds an idle upstream connection is kept for reuse. Keep it below "
        "the upstream's own idle timeout (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s): a "
        "request sent on a connection the upstream is closing gets 502.",
    )
    tenant_share: float = Field(
        0.25,
        gt=0,
        le=1,
        description="Share of --upstream-connections (requests in flight) and of "
        "--max-inflight-body-bytes kept for the other tenants: a tenant may use more while "
        "the rest is free, but a request that would take the last share from the others "
        "gets 429 with Retry-After (a tenant's lone request never does). Applies with "
        "--api-keys or --tenant-header; 1 turns it off. Per worker: each worker of a pod "
        "keeps its share of its own connections and bytes.",
    )
    max_documents: int = Field(
        100_000,
        ge=1,
        description="Most documents (or queries) in one score/rerank request; above it "
        "the proxy answers 400 without forwarding.",
    )
