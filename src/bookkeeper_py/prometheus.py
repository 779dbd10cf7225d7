"""The Prometheus adapter of :mod:`bookkeeper_py.metrics`: lock-free latency recorders and
counters exposed at scrape time, in Prometheus' text format, in one of two styles:

* ``histograms`` (the default): latencies as histograms in seconds with a ``success`` label,
  counters as ``<name>_total``, through ``prometheus_client`` (with its process metrics);
* ``bookkeeper``: as BookKeeper's own Prometheus provider writes them, which its Grafana
  dashboards read: latencies as summaries in milliseconds, ``quantile`` labels 0.5 to 1.0
  computed over the last finished window of ``rollover_s`` seconds (BookKeeper's
  ``prometheusStatsLatencyRolloverSeconds``; ``NaN`` when it saw no event), ``_count`` and
  ``_sum`` since start, for ``success="false"`` and ``"true"``; counters without ``_total``;
  gauges as they are; the process metrics (``process_cpu_seconds_total`` ...) too.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from bookkeeper_py.metrics import LATENCY_BUCKETS_S, CounterMetric, OpStats

STYLES = ("histograms", "bookkeeper")
QUANTILES = (0.5, 0.75, 0.95, 0.99, 0.999, 0.9999, 1.0)  # BookKeeper's, labelled as Java prints
# Window buckets for quantiles: logarithmic, 2 % apart from 1 µs (the reported value of a bucket
# is its geometric middle, within 1 % of any latency in it), up to ~4 hours.
_WINDOW_FLOOR_S = 1e-6
_WINDOW_BASE = 1.02
_WINDOW_SCALE = 1.0 / math.log(_WINDOW_BASE)
_WINDOW_BUCKETS = 1200


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


class _Window:
    """Latencies of one outcome for BookKeeper's summaries: counts in fine logarithmic buckets
    for the current window (swapped for a fresh one at scrape time once ``rollover_s`` passed;
    quantiles come from the last finished window), and the count and sum since start."""

    __slots__ = ("count", "current", "finished", "max", "started", "total")

    def __init__(self) -> None:
        self.current = [0] * _WINDOW_BUCKETS
        self.max = 0.0
        self.finished: tuple[list[int], float] | None = None  # counts and max of the last one
        self.started = time.monotonic()
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        index = (
            int(math.log(seconds / _WINDOW_FLOOR_S) * _WINDOW_SCALE)
            if seconds > _WINDOW_FLOOR_S
            else 0
        )
        self.current[index if index < _WINDOW_BUCKETS else _WINDOW_BUCKETS - 1] += 1
        if seconds > self.max:
            self.max = seconds
        self.count += 1
        self.total += seconds

    def roll(self, now: float, rollover_s: float) -> None:
        if now - self.started >= rollover_s:
            self.finished = (self.current, self.max)
            self.current = [0] * _WINDOW_BUCKETS
            self.max = 0.0
            self.started = now

    def quantiles_ms(self) -> list[float]:
        """The quantiles of the last finished window, in ms (NaN without one, or when empty)."""
        if self.finished is None:
            return [math.nan] * len(QUANTILES)
        counts, largest = self.finished
        events = sum(counts)
        if not events:
            return [math.nan] * len(QUANTILES)
        out = []
        for quantile in QUANTILES:
            if quantile >= 1.0:
                out.append(largest * 1000.0)
                continue
            rank = max(1, math.ceil(quantile * events))
            running = 0
            for index, count in enumerate(counts):
                running += count
                if running >= rank:
                    middle = _WINDOW_FLOOR_S * _WINDOW_BASE ** (index + 0.5)
                    out.append(min(middle, largest) * 1000.0)
                    break
        return out


class _PrometheusOpStats:
    """An operation's latencies by outcome: a histogram in seconds (``histograms`` style) or
    BookKeeper's windowed summary (``bookkeeper`` style)."""

    __slots__ = ("_aliases", "_failure", "_help", "_name", "_success", "failure", "success")

    def __init__(self, name: str, help_text: str, style: str, aliases: tuple[str, ...]) -> None:
        self._name, self._help, self._aliases = name, help_text, aliases
        self._success: _Buckets | _Window = _Window() if style == "bookkeeper" else _Buckets()
        self._failure: _Buckets | _Window = _Window() if style == "bookkeeper" else _Buckets()
        self.success: Callable[[float], None] = self._success.observe
        self.failure: Callable[[float], None] = self._failure.observe

    def collect(self) -> Iterator[HistogramMetricFamily]:
        for name in (self._name, *self._aliases):
            family = HistogramMetricFamily(name, self._help, labels=["success"])
            for label, buckets in (("true", self._success), ("false", self._failure)):
                assert isinstance(buckets, _Buckets)
                family.add_metric([label], buckets.cumulative(), buckets.total)
            yield family

    def bookkeeper_lines(self, now: float, rollover_s: float) -> list[str]:
        rows: list[str] = []
        for label, window in (("false", self._failure), ("true", self._success)):
            assert isinstance(window, _Window)
            window.roll(now, rollover_s)
            for quantile, value in zip(QUANTILES, window.quantiles_ms(), strict=True):
                rows.append(f'{{success="{label}",quantile="{quantile!r}"}} {_number(value)}')
            rows.append(f'_count{{success="{label}"}} {window.count}')
            rows.append(f'_sum{{success="{label}"}} {_number(window.total * 1000.0)}')
        lines = []
        for name in (self._name, *self._aliases):
            lines.append(f"# TYPE {name} summary")
            lines += [name + row for row in rows]
        return lines


class _PrometheusCounter:
    """A counter without a lock (see ``_Buckets``): ``<name>_total`` in the ``histograms``
    style, ``<name>`` in BookKeeper's. Its value is kept here, or (``read``) elsewhere."""

    __slots__ = ("_help", "_name", "_read", "value")

    def __init__(self, name: str, help_text: str, read: Callable[[], float] | None = None) -> None:
        self._name, self._help, self._read = name, help_text, read
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def current(self) -> float:
        return float(self._read()) if self._read is not None else self.value

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._help, value=self.current())

    def bookkeeper_lines(self) -> list[str]:
        return [f"# TYPE {self._name} counter", f"{self._name} {_number(self.current())}"]


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


class PrometheusMetrics:
    """Metrics in a registry of their own (several bookies may share a process in tests), in
    ``style`` (see the module)."""

    def __init__(self, style: str = "histograms", rollover_s: float = 60.0) -> None:
        if style not in STYLES:
            raise ValueError(f"metrics style must be one of {', '.join(STYLES)}, not {style!r}")
        self.style = style
        self.rollover_s = rollover_s
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self._gauges: list[tuple[str, Callable[[], float]]] = []
        self._counters: list[_PrometheusCounter] = []
        self._op_stats: list[_PrometheusOpStats] = []

    def counter(self, name: str, help_text: str) -> CounterMetric:
        counter = _PrometheusCounter(name, help_text)
        self.registry.register(counter)
        self._counters.append(counter)
        return counter

    def op_stats(self, name: str, help_text: str, aliases: tuple[str, ...] = ()) -> OpStats:
        stats = _PrometheusOpStats(name, help_text, self.style, aliases)
        if self.style == "histograms":
            self.registry.register(stats)
        self._op_stats.append(stats)
        return stats

    def gauge_function(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        Gauge(name, help_text, registry=self.registry).set_function(read)
        self._gauges.append((name, read))

    def counter_function(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        counter = _PrometheusCounter(name, help_text, read)
        self.registry.register(counter)
        self._counters.append(counter)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric, in this registry's style."""
        if self.style == "histograms":
            return generate_latest(self.registry)
        now = time.monotonic()
        lines: list[str] = []
        for name, read in self._gauges:
            lines += [f"# TYPE {name} gauge", f"{name} {_number(float(read()))}"]
        for counter in self._counters:
            lines += counter.bookkeeper_lines()
        for stats in self._op_stats:
            lines += stats.bookkeeper_lines(now, self.rollover_s)
        process = generate_latest(_ProcessOnly(self.registry)).decode()
        return ("\n".join(lines) + "\n").encode() + process.encode()


class _ProcessOnly(CollectorRegistry):
    """The process collector's metrics of a registry, alone (``process_*``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__()
        self._source = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            if family.name.startswith("process_"):
                yield family
