"""What a server tells Prometheus: its requests (counts by endpoint and status, latency
histograms), each model's version and age, the checkpoints it loaded and refused, and how
fresh its answers are (a checkpoint's write to its load, and to its first answer).

A request pays for its own numbers only: an observation is a bisect and two list increments
(no lock: the request path runs on one event loop thread), and the series are built when
Prometheus scrapes (`metrics_registry`, prometheus-client's exposition and the process
collectors, as the worker's).
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
import typing

__all__ = ["ServingMetrics", "Histogram", "metrics_registry", "LATENCY_BUCKETS",
           "FRESHNESS_BUCKETS"]

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
FRESHNESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Connections the HTTP layer ends before a request reaches the app (`app.bounded_protocol`),
#: by reason, with the fix each one's log line names.
REFUSALS = {
    "head_timeout": "a request head did not arrive within --request-timeout: clients must send "
                    "a request whole, or raise --request-timeout",
    "head_too_large": "a request head (its line and headers) was above 64 KiB: send fewer or "
                      "shorter headers",
    "unparsable": "a request was not HTTP/1.1 the parser could read: check what connects to "
                  "this port",
    "too_many_connections": "256 connections were held at once (one more is answered 503): "
                            "clients should reuse connections, or run more replicas",
}
#: Seconds between two log lines of one refusal reason.
REFUSAL_LOG_INTERVAL = 60.0
log = logging.getLogger("connectors.serving")
#: The endpoints requests are counted by (a closed set: a scan of random paths makes no series).
ENDPOINTS = ("infer", "model_metadata", "model_ready", "server_metadata", "live", "ready",
             "metrics", "other")


class Histogram:
    """Counts of observations at or below each bound (and above all), and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: typing.Sequence[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, int]]:
        cumulative, out = 0, []
        for bound, count in zip((*self.bounds, math.inf), self.counts):
            cumulative += count
            out.append(("+Inf" if bound == math.inf else repr(float(bound)), cumulative))
        return out


class ServingMetrics:
    """The server's counts, updated by the app (`request`) and the follower (`first_answer`)."""

    def __init__(self) -> None:
        self.latency = {endpoint: Histogram(LATENCY_BUCKETS) for endpoint in ENDPOINTS}
        self.responses: dict[tuple[str, int], int] = {}
        self.records = 0
        self.first_answer = Histogram(FRESHNESS_BUCKETS)
        self.load_delay = Histogram(FRESHNESS_BUCKETS)
        self._lock = threading.Lock()  # (first answers and loads come from other threads)
        self.refusals = dict.fromkeys(REFUSALS, 0)
        self._refusals_logged: dict[str, tuple[float, int]] = {}  # reason -> (when, count then)

    def refused(self, reason: str) -> None:
        """A connection ended by the HTTP layer before its request reached the app: counted,
        and logged once a `REFUSAL_LOG_INTERVAL` a reason (with the count since and the
        fix)."""
        self.refusals[reason] += 1
        now = time.monotonic()
        when, before = self._refusals_logged.get(reason, (-math.inf, 0))
        if now - when >= REFUSAL_LOG_INTERVAL:
            count = self.refusals[reason]
            self._refusals_logged[reason] = (now, count)
            log.warning("%d connection(s) refused since the last line (%s): %s", count - before,
                        reason, REFUSALS[reason])

    def request(self, endpoint: str, status: int, seconds: float, records: int = 0) -> None:
        self.latency[endpoint].observe(seconds)
        key = (endpoint, status)
        self.responses[key] = self.responses.get(key, 0) + 1
        self.records += records

    def loaded(self, served: typing.Any) -> None:
        """A version loaded: its delay from the checkpoint's write."""
        with self._lock:
            self.load_delay.observe(max(0.0, served.loaded_at - served.written_at))

    def answered_first(self, served: typing.Any) -> None:
        """A version's first answer: its delay from the checkpoint's write."""
        with self._lock:
            self.first_answer.observe(max(0.0, served.first_answer_at - served.written_at))


def metrics_registry(follower: typing.Any, metrics: ServingMetrics) -> typing.Any:
    """A prometheus-client registry of the server's series and the process collectors."""
    from prometheus_client import (
        CollectorRegistry,
        GCCollector,
        PlatformCollector,
        ProcessCollector,
    )

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(follower, metrics))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class _Collector:
    def __init__(self, follower: typing.Any, metrics: ServingMetrics):
        self.follower = follower
        self.metrics = metrics

    def describe(self) -> list:
        return []

    def collect(self) -> typing.Iterator[typing.Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            InfoMetricFamily,
        )

        follower, metrics = self.follower, self.metrics
        view = follower.view
        now = time.time()
        name = follower.model_name
        ready, _ = follower.readiness(now)
        info = InfoMetricFamily("streammargin_serve", "The server: its model name, group and "
                                "scope.", labels=["model", "group", "scope"])
        info.add_metric([name, follower.config.group_id, view.scope], {})
        yield info
        yield GaugeMetricFamily("streammargin_serve_ready",
                                "1 while /v2/health/ready answers 200.", value=float(ready))
        requests = CounterMetricFamily("streammargin_serve_requests",
                                       "HTTP requests answered, by endpoint and status code.",
                                       labels=["endpoint", "code"])
        for (endpoint, status), count in sorted(metrics.responses.items()):
            requests.add_metric([endpoint, str(status)], count)
        yield requests
        refused = CounterMetricFamily(
            "streammargin_serve_connections_refused",
            "Connections the HTTP layer ended before their request reached the server, by "
            "reason (head_timeout, head_too_large, unparsable, too_many_connections).",
            labels=["reason"])
        for reason, count in metrics.refusals.items():
            refused.add_metric([reason], count)
        yield refused
        latency = HistogramMetricFamily(
            "streammargin_serve_request_duration_seconds",
            "Time from a request's body read to its response handed to the server, by "
            "endpoint.", labels=["endpoint"])
        for endpoint, histogram in metrics.latency.items():
            if histogram.counts[-1] or any(histogram.counts):
                latency.add_metric([endpoint], histogram.buckets(), histogram.total)
        yield latency
        yield CounterMetricFamily("streammargin_serve_records",
                                  "Records scored (rows of inference requests answered).",
                                  value=metrics.records)
        counters = follower.counters
        checkpoints = CounterMetricFamily(
            "streammargin_serve_checkpoints",
            "Checkpoints read, by outcome: loaded (decoded, served), refused (corrupt, hostile, "
            "of other settings: the previous version serves on), superseded (topic scope: a "
            "newer one of the same read served instead).", labels=["outcome"])
        checkpoints.add_metric(["loaded"], counters.loaded)
        checkpoints.add_metric(["refused"], counters.refused)
        checkpoints.add_metric(["superseded"], counters.superseded)
        yield checkpoints
        yield CounterMetricFamily("streammargin_serve_checkpoint_read_failures",
                                  "Reads of the checkpoint topic that failed (a broker outage, no"
                                  " topic yet); the models loaded serve on.",
                                  value=counters.read_failures)
        if follower.last_read_at is not None:
            yield GaugeMetricFamily("streammargin_serve_last_read_timestamp_seconds",
                                    "Unix time of the last read of the checkpoint topic that "
                                    "worked.", value=follower.last_read_at)
        load_delay = HistogramMetricFamily(
            "streammargin_serve_checkpoint_load_delay_seconds",
            "From a checkpoint's write (the worker's clock) to its model served.")
        first = HistogramMetricFamily(
            "streammargin_serve_first_answer_delay_seconds",
            "From a checkpoint's write (the worker's clock) to the first answer of its model.")
        with metrics._lock:
            load_delay.add_metric([], metrics.load_delay.buckets(), metrics.load_delay.total)
            first.add_metric([], metrics.first_answer.buckets(), metrics.first_answer.total)
        yield load_delay
        yield first
        labels = ["topic", "partition"]
        version = InfoMetricFamily("streammargin_serve_model_version",
                                   "The version each model answers with now (its checkpoint's "
                                   "offset on the checkpoint topic).",
                                   labels=[*labels, "version"])
        age = GaugeMetricFamily("streammargin_serve_model_age_seconds",
                                "Seconds since the worker wrote the checkpoint each model "
                                "answers with.", labels=labels)
        learnt = GaugeMetricFamily("streammargin_serve_model_next_offset",
                                   "The input offset each model had learnt up to.", labels=labels)
        labelled = GaugeMetricFamily("streammargin_serve_model_labelled",
                                     "Labelled records behind each model's metrics.",
                                     labels=labels)
        size = GaugeMetricFamily("streammargin_serve_model_checkpoint_bytes",
                                 "Bytes of the checkpoint each model was decoded from.",
                                 labels=labels)
        for (topic, partition), served in sorted(view.current.items()):
            where = [topic, "all" if partition < 0 else str(partition)]
            version.add_metric([*where, served.version], {})
            age.add_metric(where, served.age(now))
            if served.next_offset is not None:
                learnt.add_metric(where, served.next_offset)
            labelled.add_metric(where, served.labelled)
            size.add_metric(where, served.checkpoint_bytes)
        yield from (version, age, learnt, labelled, size)
        yield GaugeMetricFamily("streammargin_serve_versions_kept",
                                "Versions kept addressable (/versions/{v}), every model's.",
                                value=len(view.versions))
