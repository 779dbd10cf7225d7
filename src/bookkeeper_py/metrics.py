"""One small metrics interface and a no-op implementation (the Prometheus adapter is
:mod:`bookkeeper_py.prometheus`, so that the storage engine loads no metrics library).

Code records through ``Metrics`` (counters, gauges, operation latencies with success/failure as
BookKeeper's ``OpStatsLogger`` does) and never imports a metrics library itself. Names are
BookKeeper's, with its scope prefixes (``bookkeeper_server_``, ``bookie_``, ``bookie_journal_``,
``bookie_gc_``). Latencies are Prometheus histograms in seconds with a ``success`` label, or
(``metricsStyle=bookkeeper``) summaries in milliseconds as BookKeeper's own provider exports them
(:mod:`bookkeeper_py.prometheus`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol

LATENCY_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class CounterMetric(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class OpStats(Protocol):
    """Latencies of one operation, split by outcome."""

    def success(self, seconds: float) -> None: ...

    def failure(self, seconds: float) -> None: ...


class Metrics(Protocol):
    def counter(self, name: str, help_text: str) -> CounterMetric: ...

    def op_stats(self, name: str, help_text: str, aliases: tuple[str, ...] = ()) -> OpStats:
        """``aliases``: other names the same latencies are exported under (a span BookKeeper
        measures twice, where this bookie has one)."""
        ...

    def gauge_function(self, name: str, help_text: str, read: Callable[[], float]) -> None: ...

    def counter_function(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        """A counter whose value ``read()`` gives at scrape time (a count kept elsewhere)."""
        ...


class _NullCounter:
    def inc(self, amount: float = 1) -> None:
        pass


class _NullOpStats:
    def success(self, seconds: float) -> None:
        pass

    def failure(self, seconds: float) -> None:
        pass


class NullMetrics:
    """Records nothing: the default where no one scrapes."""

    def counter(self, name: str, help_text: str) -> CounterMetric:
        return _NullCounter()

    def op_stats(self, name: str, help_text: str, aliases: tuple[str, ...] = ()) -> OpStats:
        return _NullOpStats()

    def gauge_function(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        pass

    def counter_function(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        pass


def attribute_gauges(
    metrics: Metrics, owner: object, gauges: tuple[tuple[str, str, str], ...]
) -> None:
    """Gauges that read numeric attributes of ``owner``: (name, help text, attribute) each."""
    for name, help_text, attribute in gauges:
        metrics.gauge_function(name, help_text, partial(_read_number, owner, attribute))


def _read_number(owner: object, attribute: str) -> float:
    return float(getattr(owner, attribute))
