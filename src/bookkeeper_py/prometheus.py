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
from collections.abc import Callable, Collection, Iterator
from typing import Protocol, cast

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from bookkeeper_py.metrics import LATENCY_BUCKETS_S, CounterMetric, Labels, OpStats
from bookkeeper_py.speedups import native

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

    def observe_many(self, seconds: float, count: int) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += count
        self.total += seconds * count


class _Histogram(Protocol):
    """``_Buckets``, or the C speedups' ``LatencyBuckets``: the same counts."""

    @property
    def counts(self) -> list[int]: ...

    @property
    def total(self) -> float: ...

    def observe(self, seconds: float) -> None: ...

    def observe_many(self, seconds: float, count: int) -> None: ...


def _latency_buckets() -> _Histogram:
    """A histogram over ``LATENCY_BUCKETS_S``: the C speedups' ``LatencyBuckets`` where they are
    built (the same counts, without a Python frame per update), else ``_Buckets``."""
    if native is not None:
        buckets: _Histogram = native.LatencyBuckets(LATENCY_BUCKETS_S)
        return buckets
    return _Buckets()


def _cumulative(buckets: _Histogram) -> list[tuple[str, float]]:
    """A histogram's cumulative counts by bound, as Prometheus' ``le`` labels want them."""
    out: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*LATENCY_BUCKETS_S, math.inf), buckets.counts, strict=True):
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

    def observe_many(self, seconds: float, count: int) -> None:
        index = (
            int(math.log(seconds / _WINDOW_FLOOR_S) * _WINDOW_SCALE)
            if seconds > _WINDOW_FLOOR_S
            else 0
        )
        self.current[index if index < _WINDOW_BUCKETS else _WINDOW_BUCKETS - 1] += count
        if seconds > self.max:
            self.max = seconds
        self.count += count
        self.total += seconds * count

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

    __slots__ = ("_failure", "_success", "failure", "success", "successes")

    def __init__(self, style: str) -> None:
        self._success: _Histogram | _Window = (
            _Window() if style == "bookkeeper" else _latency_buckets()
        )
        self._failure: _Histogram | _Window = (
            _Window() if style == "bookkeeper" else _latency_buckets()
        )
        # The recorders' own methods: an update is one call, no frame of this class's.
        self.success: Callable[[float], None] = self._success.observe
        self.failure: Callable[[float], None] = self._failure.observe
        self.successes: Callable[[float, int], None] = self._success.observe_many

    def add_to(self, family: HistogramMetricFamily, values: list[str]) -> None:
        for label, buckets in (("true", self._success), ("false", self._failure)):
            assert not isinstance(buckets, _Window)
            family.add_metric([label, *values], _cumulative(buckets), buckets.total)

    def roll(self, now: float, rollover_s: float) -> None:
        """Ends the windows once ``rollover_s`` passed (once a scrape: aliases share them)."""
        for window in (self._failure, self._success):
            assert isinstance(window, _Window)
            window.roll(now, rollover_s)

    def bookkeeper_rows(self, labels: str) -> list[str]:
        rows: list[str] = []
        for label, window in (("false", self._failure), ("true", self._success)):
            assert isinstance(window, _Window)
            for quantile, value in zip(QUANTILES, window.quantiles_ms(), strict=True):
                rows.append(
                    f'{{success="{label}",quantile="{quantile!r}"{labels}}} {_number(value)}'
                )
            rows.append(f'_count{{success="{label}"{labels}}} {window.count}')
            rows.append(f'_sum{{success="{label}"{labels}}} {_number(window.total * 1000.0)}')
        return rows


class _PrometheusCounter:
    """A counter without a lock (see ``_Buckets``). Its value is kept here, or (``read``)
    elsewhere."""

    __slots__ = ("_read", "value")

    def __init__(self, read: Callable[[], float] | None = None) -> None:
        self._read = read
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def current(self) -> float:
        return float(self._read()) if self._read is not None else self.value


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _label_value(value: str) -> str:
    """A label value escaped as the text format wants it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


_Series = _PrometheusOpStats | _PrometheusCounter | Callable[[], float]


class _Family:
    """The series of one metric name: its kind, help text, label names, and each series' label
    values with what records or reads it."""

    __slots__ = ("help", "kind", "label_names", "name", "series")

    def __init__(self, name: str, kind: str, help_text: str, label_names: tuple[str, ...]):
        self.name, self.kind, self.help, self.label_names = name, kind, help_text, label_names
        self.series: dict[tuple[str, ...], _Series] = {}

    def metric(self) -> Metric:
        """The family for ``prometheus_client`` (``histograms`` style)."""
        names = list(self.label_names)
        if self.kind == "summary":
            histogram = HistogramMetricFamily(self.name, self.help, labels=["success", *names])
            for values, stats in self.series.items():
                assert isinstance(stats, _PrometheusOpStats)
                stats.add_to(histogram, list(values))
            return histogram
        if self.kind == "counter":
            counters = CounterMetricFamily(self.name, self.help, labels=names)
            for values, counter in self.series.items():
                assert isinstance(counter, _PrometheusCounter)
                counters.add_metric(list(values), counter.current())
            return counters
        gauges = GaugeMetricFamily(self.name, self.help, labels=names)
        for values, read in self.series.items():
            assert callable(read) and not isinstance(read, _PrometheusCounter)
            gauges.add_metric(list(values), float(read()))
        return gauges

    def bookkeeper_lines(self) -> list[str]:
        """The family as BookKeeper's provider writes it (``bookkeeper`` style)."""
        lines = [f"# TYPE {self.name} {self.kind}"]
        for values, series in self.series.items():
            pairs = [
                f'{name}="{_label_value(value)}"'
                for name, value in zip(self.label_names, values, strict=True)
            ]
            if isinstance(series, _PrometheusOpStats):
                labels = "".join("," + pair for pair in pairs)
                rows = series.bookkeeper_rows(labels)
                lines += [self.name + row for row in rows]
                continue
            value = series.current() if isinstance(series, _PrometheusCounter) else series()
            selector = "{" + ",".join(pairs) + "}" if pairs else ""
            lines.append(f"{self.name}{selector} {_number(float(value))}")
        return lines


class PrometheusMetrics:
    """Metrics in a registry of their own (several bookies may share a process in tests), in
    ``style`` (see the module)."""

    def __init__(self, style: str = "histograms", rollover_s: float = 60.0) -> None:
        if style not in STYLES:
            raise ValueError(f"metrics style must be one of {', '.join(STYLES)}, not {style!r}")
        self.style = style
        self.rollover_s = rollover_s
        self.registry = CollectorRegistry()
        self._process = ProcessCollector(registry=self.registry)
        self._families: dict[str, _Family] = {}  # in registration order
        self.registry.register(self)

    def _add(self, name: str, kind: str, help_text: str, labels: Labels, series: _Series) -> None:
        pairs = sorted((labels or {}).items())
        label_names = tuple(name for name, _ in pairs)
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _Family(name, kind, help_text, label_names)
        elif family.kind != kind or family.label_names != label_names:
            raise ValueError(
                f"metric {name} is already a {family.kind} labelled "
                f"{list(family.label_names)}: it cannot also be a {kind} labelled "
                f"{list(label_names)}"
            )
        values = tuple(value for _, value in pairs)
        if values in family.series:
            raise ValueError(f"metric {name} {dict(pairs)} is registered twice")
        family.series[values] = series

    def counter(self, name: str, help_text: str, labels: Labels = None) -> CounterMetric:
        counter = _PrometheusCounter()
        self._add(name, "counter", help_text, labels, counter)
        return counter

    def op_stats(
        self, name: str, help_text: str, aliases: tuple[str, ...] = (), labels: Labels = None
    ) -> OpStats:
        stats = _PrometheusOpStats(self.style)
        for exported in (name, *aliases):
            self._add(exported, "summary", help_text, labels, stats)
        return stats

    def gauge_function(
        self, name: str, help_text: str, read: Callable[[], float], labels: Labels = None
    ) -> None:
        self._add(name, "gauge", help_text, labels, read)

    def counter_function(
        self, name: str, help_text: str, read: Callable[[], float], labels: Labels = None
    ) -> None:
        self._add(name, "counter", help_text, labels, _PrometheusCounter(read))

    def collect(self) -> Iterator[Metric]:
        """This registry's own metrics for ``prometheus_client`` (the ``histograms`` style)."""
        for family in list(self._families.values()):
            yield family.metric()

    def render(self, names: Collection[str] = ()) -> bytes:
        """The Prometheus text exposition of every metric, in this registry's style; with
        ``names``, of the families so named alone (``/metrics?name[]=...``: a scraper that
        wants a few series is not made to wait for, nor the bookie to write, all of them)."""
        wanted = set(names)
        if self.style == "histograms":
            if not wanted:
                return generate_latest(self.registry)
            return generate_latest(
                cast(CollectorRegistry, _Collecting(lambda: self._named(wanted)))
            )
        now = time.monotonic()
        families = [
            family for family in self._families.values() if not wanted or family.name in wanted
        ]
        rolled: set[int] = set()
        for family in families:
            for series in list(family.series.values()):
                if isinstance(series, _PrometheusOpStats) and id(series) not in rolled:
                    rolled.add(id(series))
                    series.roll(now, self.rollover_s)
        lines: list[str] = []
        for kind in ("gauge", "counter", "summary"):
            for family in families:
                if family.kind == kind:
                    lines += family.bookkeeper_lines()
        process = generate_latest(
            cast(CollectorRegistry, _Collecting(lambda: self._processes(wanted)))
        )
        return ("\n".join(lines) + "\n").encode() + process

    def _named(self, wanted: set[str]) -> Iterator[Metric]:
        """The families named in ``wanted``, from their own series alone: collecting every
        family and keeping the named ones took 1.3 ms of a bookie's loop a scrape (the process
        collector's reads of /proc among them)."""
        for family in list(self._families.values()):
            if family.name in wanted:
                yield family.metric()
        yield from self._processes(wanted)

    def _processes(self, wanted: set[str]) -> Iterator[Metric]:
        """The process collector's families (``process_*``): all with ``wanted`` empty, else
        the named ones (none read when none is named)."""
        if wanted and not any(name.startswith("process_") for name in wanted):
            return
        for metric in self._process.collect():
            if not wanted or metric.name in wanted:
                yield metric


class _Collecting:
    """What ``generate_latest`` reads: an object whose ``collect`` yields metric families."""

    def __init__(self, collect: Callable[[], Iterator[Metric]]) -> None:
        self.collect = collect
