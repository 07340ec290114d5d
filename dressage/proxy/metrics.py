"""Prometheus metrics of one proxy (own registry, so several proxies can share a process)."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


class ProxyMetrics:
    """Requests, tokens, latencies and errors by code."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "dressage_proxy_requests",
            "Chat completion requests by outcome",
            ["stream", "outcome"],
            registry=r,
        )
        self.errors = Counter(
            "dressage_proxy_errors", "Error responses by status and code", ["status", "code"], registry=r
        )
        self.tokens = Counter(
            "dressage_proxy_tokens", "Tokens by kind (prompt, context_delta, generated)", ["kind"], registry=r
        )
        self.latency = Histogram(
            "dressage_proxy_request_seconds",
            "Request latency, end to end",
            ["stream"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "dressage_proxy_overhead_seconds",
            "Latency the proxy adds (request minus engine time)",
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.plan = Histogram(
            "dressage_proxy_plan_seconds",
            "Rendering + incremental tokenization per request",
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.append = Histogram(
            "dressage_proxy_append_seconds",
            "Durable turn append per request",
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.dedupe = Counter(
            "dressage_proxy_retries_deduplicated", "Retried requests answered from the log", registry=r
        )
        self.replayed = Counter(
            "dressage_proxy_turns_replayed",
            "Requests of a resumed session answered from its recorded turns",
            registry=r,
        )
        self.replayed_tokens = Counter(
            "dressage_proxy_tokens_replayed",
            "Generated tokens of recorded turns sent again to a resumed session (not generated)",
            registry=r,
        )
        self.resumes = Counter(
            "dressage_proxy_generation_resumes", "Generations continued after a pause", registry=r
        )
        self.paused = Gauge(
            "dressage_proxy_paused", "1 while generation is paused for a weight update", registry=r
        )
        self.active = Gauge(
            "dressage_proxy_admission_active",
            "Turns in the proxy's own work now (admission control; engine generation excluded)",
            registry=r,
        )
        self.queued = Gauge(
            "dressage_proxy_admission_queued", "Requests waiting in the admission queue now", registry=r
        )
        self.refused = Counter(
            "dressage_proxy_admission_refused",
            "Requests refused under overload (503) by reason (queue_full, queue_timeout)",
            ["reason"],
            registry=r,
        )
        self.sessions = Gauge("dressage_proxy_live_sessions", "Sessions cached in memory", registry=r)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
