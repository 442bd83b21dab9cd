"""Prometheus metrics of one server, in their own registry (so several servers can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("tk_requests", "Translation requests answered, by HTTP status", ["status"], registry=r)
        self.sentences = Counter("tk_sentences", "Sentences received in accepted translation requests", registry=r)
        self.source_tokens = Counter("tk_source_tokens", "Source subword tokens decoded", registry=r)
        self.target_tokens = Counter("tk_target_tokens", "Target subword tokens produced (best hypothesis)", registry=r)
        self.batch_sentences = Histogram("tk_batch_sentences", "Sentences per decode", buckets=SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("tk_batch_padded_tokens", "Padded source tokens per decode",
                                      buckets=(8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096), registry=r)
        self.queue_depth = Gauge("tk_queue_depth", "Sentences waiting for a decode", registry=r)
        self.queue_wait = Histogram("tk_queue_wait_seconds", "Time a sentence waited before its decode began",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.decode_seconds = Histogram("tk_decode_seconds", "Time of one batched decode", buckets=LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("tk_request_latency_seconds", "Translation request latency, arrival to answer",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.ready = Gauge("tk_ready", "1 once the model is loaded and a warm-up translation is done", registry=r)
