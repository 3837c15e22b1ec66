"""CloudEvents receivers for the exporter's tests: one that can be down, one that checks
a bearer token and rejects one tenant's records."""

from __future__ import annotations

from typing import Any

from aiohttp import web


class Receiver:
    """An OpenMeter-like ingest endpoint that can be told to fail."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.content_types: set[str] = set()
        self.failing = False

    async def ingest(self, request: web.Request) -> web.Response:
        if self.failing:
            return web.Response(status=503)
        self.content_types.add(request.content_type)
        self.events.extend(await request.json())
        return web.Response(status=204)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/v1/events", self.ingest)
        return app


class StrictReceiver:
    """Demands a bearer token; rejects a batch holding an event of tenant 'evil' with 400
    (as OpenMeter does for an event it cannot ingest); can ask to come back later."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.events: list[dict[str, Any]] = []
        self.unauthorized = 0
        self.throttle: str | None = None
        self.rejecting = True

    async def ingest(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            self.unauthorized += 1
            return web.Response(status=401)
        if self.throttle is not None:
            retry, self.throttle = self.throttle, None
            return web.Response(status=429, headers={"Retry-After": retry})
        batch = await request.json()
        if self.rejecting and any(e["subject"] == "evil" for e in batch):
            return web.json_response({"detail": "invalid event"}, status=400)
        self.events.extend(batch)
        return web.Response(status=204)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/v1/events", self.ingest)
        return app


class OtlpReceiver:
    """An OpenTelemetry collector's OTLP/HTTP metrics endpoint on loopback: each export is
    decoded with the protocol's own message types; ``points`` lists every histogram point
    of a metric as (attributes, count, sum)."""

    def __init__(self) -> None:
        self.exports: list[Any] = []

    async def ingest(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
            ExportMetricsServiceResponse,
        )

        message = ExportMetricsServiceRequest()
        message.ParseFromString(await request.read())
        self.exports.append(message)
        body = ExportMetricsServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/metrics", self.ingest)
        return app

    def metrics(self, name: str) -> list[Any]:
        return [
            metric
            for export in self.exports
            for resource in export.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
        ]

    def points(self, name: str) -> list[tuple[dict[str, Any], int, float]]:
        found = []
        for metric in self.metrics(name):
            for point in metric.histogram.data_points:
                attributes = {a.key: _value(a.value) for a in point.attributes}
                found.append((attributes, point.count, point.sum))
        return found


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value"))
