"""Prometheus metrics of the gateway: requests by status, TTFT, TPOT, end-to-end latency."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "llmq_requests",
            "Chat completion requests by model and outcome.",
            ["model", "status"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "llmq_time_to_first_token_seconds",
            "Arrival to first token.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "llmq_time_per_output_token_seconds",
            "Mean gap between tokens after the first, per request.",
            ["model"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28),
            registry=self.registry,
        )
        self.ttft_error = Histogram(
            "llmq_ttft_prediction_error_ratio",
            "Admission's predicted TTFT against the actual one: (predicted - actual) / actual "
            "(negative: the request waited longer than predicted).",
            ["model"],
            buckets=(-0.9, -0.5, -0.2, -0.1, 0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
            registry=self.registry,
        )
        self.ttft_abs_error = Histogram(
            "llmq_ttft_prediction_abs_error_ratio",
            "|predicted - actual| / actual of admission's TTFT prediction.",
            ["model"],
            buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0),
            registry=self.registry,
        )
        self.ttft_calibration = Gauge(
            "llmq_ttft_calibration_factor",
            "What admission multiplies its raw TTFT predictions by, learnt per pool from the "
            "actual TTFTs (1: the raw model is right).",
            ["pool"],
            registry=self.registry,
        )
        self.e2e = Histogram(
            "llmq_e2e_request_latency_seconds",
            "Arrival to last token.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def observe_prediction(self, model: str, predicted_s: float, actual_s: float) -> None:
        """Record how far admission's TTFT prediction was from the actual TTFT."""
        if actual_s <= 0:
            return
        error = (predicted_s - actual_s) / actual_s
        self.ttft_error.labels(model).observe(error)
        self.ttft_abs_error.labels(model).observe(abs(error))
