"""The server's Prometheus metrics (``GET /metrics``, text format), in a registry of their own.

=====================================  =========  ==============================================
name                                   type       what
=====================================  =========  ==============================================
``ptrain_serve_requests_total``        counter    predict/infer requests by ``model``, ``protocol`` (v1, v2), ``status``
``ptrain_serve_request_seconds``       histogram  time from a request's arrival to its answer
``ptrain_serve_queue_depth``           gauge      requests waiting to be batched, by ``model``
``ptrain_serve_batch_size``            histogram  rows per model call (``_sum`` / ``_count``: the mean batch)
``ptrain_serve_worker_restarts_total`` counter    predictor processes restarted after dying
``ptrain_serve_ready``                 gauge      1 when every predictor process of the ``model`` is loaded and warm
``ptrain_serve_connections``           gauge      open client connections
``ptrain_serve_connections_closed``    counter    connections closed by the server, by ``reason`` (header_timeout,
                                                  body_timeout, limit)
=====================================  =========  ==============================================
"""

from __future__ import annotations

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics,
                               generate_latest)

disable_created_metrics()  # no *_created samples: they double the page and say nothing a scraper needs

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServeMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, max_batch_size: int):
        self.registry = CollectorRegistry()
        self._children = {}
        buckets, b = [], 1
        while b < max_batch_size:
            buckets.append(b)
            b *= 2
        buckets.append(max_batch_size)
        self.requests = Counter("ptrain_serve_requests", "Predict/infer requests by model, protocol, HTTP status",
                                ["model", "protocol", "status"], registry=self.registry)
        self.latency = Histogram("ptrain_serve_request_seconds", "Seconds from a request's arrival to its answer",
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.queue_depth = Gauge("ptrain_serve_queue_depth", "Requests waiting to be batched", ["model"],
                                 registry=self.registry)
        self.batch_size = Histogram("ptrain_serve_batch_size", "Rows per model call", buckets=buckets,
                                    registry=self.registry)
        self.worker_restarts = Counter("ptrain_serve_worker_restarts", "Predictor processes restarted after dying",
                                       registry=self.registry)
        self.ready = Gauge("ptrain_serve_ready", "1 when every predictor process of the model is loaded and warm",
                           ["model"], registry=self.registry)
        self.connections = Gauge("ptrain_serve_connections", "Open client connections", registry=self.registry)
        self.connections_closed = Counter("ptrain_serve_connections_closed", "Connections closed by the server",
                                          ["reason"], registry=self.registry)

    def count(self, model: str, protocol: str, status: int) -> None:
        """One answered request (``requests``' child looked up once per label set, not per request)."""
        key = (model, protocol, status)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.requests.labels(model, protocol, str(status))
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
