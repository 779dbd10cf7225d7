"""The Prometheus adapter of :mod:`bookkeeper_py.metrics`: lock-free latency buckets and counters
exposed by a collector at scrape time, in Prometheus' text format."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from bookkeeper_py.metrics import LATENCY_BUCKETS_S, CounterMetric, OpStats


class _Buckets:
    """One latency histogram, without locks: each metric is updated from one thread (the
    loop, or the journal thread), and an update is two list/float increments — a
    ``prometheus_client.Histogram.observe`` takes three locks, which the profile of the bookie's
    add path showed as a tenth of its time."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*LATENCY_BUCKETS_S, math.inf), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == math.inf else repr(bound), running))
        return out


class _PrometheusOpStats:
    """An operation's latencies as a Prometheus histogram with a ``success`` label, exposed by a
    collector at scrape time."""

    __slots__ = ("_failure", "_help", "_name", "_success")

    def __init__(self, name: str, help_text: str) -> None:
        self._name, self._help = name, help_text
        self._success = _Buckets()
        self._failure = _Buckets()

    def success(self, seconds: float) -> None:
        self._success.observe(seconds)

    def failure(self, seconds: float) -> None:
        self._failure.observe(seconds)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._help, labels=["success"])
        for label, buckets in (("true", self._success), ("false", self._failure)):
            family.add_metric([label], buckets.cumulative(), buckets.total)
        yield family


class _PrometheusCounter:
    """A counter without a lock (see ``_Buckets``), exposed as ``<name>_total``."""

    __slots__ = ("_help", "_name", "value")

    def __init__(self, name: str, help_text: str) -> None:
        self._name, self._help = name, help_text
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._help, value=self.value)


class PrometheusMetrics:
    """Metrics in a registry of their own (several bookies may share a process in tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def counter(self, name: str, help_text: str) -> CounterMetric:
        counter = _PrometheusCounter(name, help_text)
        self.registry.register(counter)
        return counter

    def op_stats(self, name: str, help_text: str) -> OpStats:
        stats = _PrometheusOpStats(name, help_text)
        self.registry.register(stats)
        return stats

    def gauge_function(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        Gauge(name, help_text, registry=self.registry).set_function(read)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
