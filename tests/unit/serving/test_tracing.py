"""A request's trace: decided once from its headers, sent upstream in place of the
client's trace headers, and named in every answer."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from proxy.serving.tracing import send_trace, tell_trace, trace_of

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_trace_is_decided_once_per_request() -> None:
    """A started trace is the same at every later use (upstream, record, answer)."""
    request = make_mocked_request("POST", "/v1/chat/completions")
    assert trace_of(request) is trace_of(request)
    assert trace_of(request).restarted


def test_the_clients_trace_headers_are_replaced_by_the_requests_trace() -> None:
    """Two client traceparents restart the trace: neither, nor its tracestate, is sent."""
    headers = CIMultiDict([("traceparent", VALID), ("traceparent", VALID), ("tracestate", "a=1")])
    request = make_mocked_request("POST", "/v1/completions", headers=headers)
    sent = CIMultiDict(headers)
    send_trace(request, sent)
    assert sent.getall("traceparent") == [trace_of(request).traceparent] != [VALID]
    assert "tracestate" not in sent


def test_a_valid_trace_is_sent_on_with_its_state() -> None:
    """One valid traceparent goes upstream as it came, tracestate included."""
    headers = CIMultiDict([("traceparent", VALID), ("tracestate", "a=1")])
    request = make_mocked_request("POST", "/v1/completions", headers=headers)
    sent: CIMultiDict[str] = CIMultiDict()
    send_trace(request, sent)
    assert (sent["traceparent"], sent["tracestate"]) == (VALID, "a=1")


async def test_every_answer_names_its_trace() -> None:
    """``traceresponse`` carries the traceparent the request was sent upstream with."""
    request = make_mocked_request("GET", "/healthz", headers={"traceparent": VALID})
    response = web.Response()
    await tell_trace(request, response)
    assert response.headers["traceresponse"] == VALID
