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

from collections.abc import Callable, Mapping
from functools import partial
from typing import Protocol

# Labels of one series, besides the ones a kind of metric adds itself (``success``,
# ``quantile``): BookKeeper's ``journalIndex``, ``ledgerDir`` and ``indexDir``, ``bookie``. The
# series of one name must all have the same label names.
Labels = Mapping[str, str] | None

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

    def successes(self, seconds: float, count: int) -> None:
        """``count`` successes that each took ``seconds`` (the records of one journal group)."""
        ...


class Metrics(Protocol):
    """Each method registers one series: a name with ``labels`` (none by default). A name
    registered again with other label values is another series of the same metric; with the
    same ones, an error."""

    def counter(self, name: str, help_text: str, labels: Labels = None) -> CounterMetric: ...

    def op_stats(
        self, name: str, help_text: str, aliases: tuple[str, ...] = (), labels: Labels = None
    ) -> OpStats:
        """``aliases``: other names the same latencies are exported under (a span BookKeeper
        measures twice, where this bookie has one)."""
        ...

    def gauge_function(
        self, name: str, help_text: str, read: Callable[[], float], labels: Labels = None
    ) -> None: ...

    def counter_function(
        self, name: str, help_text: str, read: Callable[[], float], labels: Labels = None
    ) -> None:
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

    def successes(self, seconds: float, count: int) -> None:
        pass


class NullMetrics:
    """Records nothing: the default where no one scrapes."""

    def counter(self, name: str, help_text: str, labels: Labels = None) -> CounterMetric:
        return _NullCounter()

    def op_stats(
        self, name: str, help_text: str, aliases: tuple[str, ...] = (), labels: Labels = None
    ) -> OpStats:
        return _NullOpStats()

    def gauge_function(
        self, name: str, help_text: str, read: Callable[[], float], labels: Labels = None
    ) -> None:
        pass

    def counter_function(
        self, name: str, help_text: str, read: Callable[[], float], labels: Labels = None
    ) -> None:
        pass


def attribute_gauges(
    metrics: Metrics, owner: object, gauges: tuple[tuple[str, str, str], ...]
) -> None:
    """Gauges that read numeric attributes of ``owner``: (name, help text, attribute) each."""
    for name, help_text, attribute in gauges:
        metrics.gauge_function(name, help_text, partial(read_attribute, owner, attribute))


def read_attribute(owner: object, attribute: str) -> float:
    """``owner.attribute`` as a float (with ``functools.partial``: a gauge's reader)."""
    return float(getattr(owner, attribute))
