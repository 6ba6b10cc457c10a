"""The edge's Prometheus metrics (``esa_edge_*``): requests by route and status, requests in flight, spool depth
and bytes, Kafka acknowledgement latency. Labels are a closed set (routes the edge serves, status codes): no
path, address or agent a client sent can become a label value.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

ROUTES = ("reports", "enrol", "keys", "healthz", "metrics", "other")


class EdgeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("esa_edge_requests", "HTTP requests answered, by route and status",
                                ["route", "status"], registry=r)
        self.in_flight = Gauge("esa_edge_requests_in_flight", "HTTP requests being handled", registry=r)
        self.ack_seconds = Histogram("esa_edge_kafka_ack_seconds", "produce-to-acknowledgement time of reports "
                                     "sent to Kafka directly", registry=r,
                                     buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
        self.reports = Counter("esa_edge_reports", "reports acknowledged to devices, by where they were durable",
                               ["durable_in"], registry=r)
        self._drained = Counter("esa_edge_spool_drained_records", "spooled reports acknowledged by Kafka", registry=r)
        self.refused = Counter("esa_edge_spool_refused_records", "reports refused with 503: Kafka down and the "
                               "spool full or the disk low", registry=r)
        self.spool_records = Gauge("esa_edge_spool_records", "reports in the spool not yet in Kafka", registry=r)
        self.spool_bytes = Gauge("esa_edge_spool_bytes", "bytes of reports in the spool not yet in Kafka",
                                 registry=r)
        self.kafka_up = Gauge("esa_edge_kafka_up", "1 while reports go to Kafka directly, 0 while they are spooled",
                              registry=r)
        self._kafka = self.reports.labels("kafka")
        self._spool = self.reports.labels("spool")
        self._by_route = {(route, status): self.requests.labels(route, str(status)) for route in ROUTES
                          for status in (200, 202, 204, 304, 400, 403, 404, 405, 413, 415, 429, 503)}

    def bind(self, edge: Any) -> None:
        self.spool_records.set_function(lambda: edge.spool.depth()[0])
        self.spool_bytes.set_function(lambda: edge.spool.depth()[1])
        self.kafka_up.set_function(lambda: 1.0 if edge.kafka_up else 0.0)

    def answered(self, route: str, status: int) -> None:
        counter = self._by_route.get((route, status))
        if counter is None:
            counter = self._by_route[(route, status)] = self.requests.labels(route, str(status))
        counter.inc()

    def acked(self, seconds: float) -> None:
        self.ack_seconds.observe(seconds)
        self._kafka.inc()

    def spooled(self) -> None:
        self._spool.inc()

    def spool_refused(self) -> None:
        self.refused.inc()

    def drained(self, n: int) -> None:
        self._drained.inc(n)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
