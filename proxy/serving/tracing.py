"""The trace each request belongs to (``proxy.wire.tracecontext``): read once from the
client's headers, sent upstream as ``traceparent`` (and ``tracestate``), kept in the
usage record, and told back to the client as ``traceresponse`` (W3C Trace Context
Level 2), so a trace the proxy started can still be quoted in a billing dispute."""

from __future__ import annotations

from aiohttp import web
from multidict import CIMultiDict

from proxy.wire.tracecontext import TraceContext, continue_or_start

TRACE = web.RequestKey("trace", TraceContext)
TRACE_HEADERS = ("traceparent", "tracestate")


def trace_of(request: web.Request) -> TraceContext:
    """The request's trace, decided on first use and the same for the rest of it."""
    trace = request.get(TRACE)
    if trace is None:
        headers = request.headers
        trace = continue_or_start(
            headers.getall("traceparent", []), headers.getall("tracestate", [])
        )
        request[TRACE] = trace
    return trace


def send_trace(request: web.Request, headers: CIMultiDict[str]) -> None:
    """Replace whatever trace headers the client sent with the request's trace."""
    trace = trace_of(request)
    for name in TRACE_HEADERS:
        headers.popall(name, None)
    headers["traceparent"] = trace.traceparent
    if trace.state is not None:
        headers["tracestate"] = trace.state


async def tell_trace(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every answer names the trace its request was sent in."""
    response.headers["traceresponse"] = trace_of(request).traceparent
