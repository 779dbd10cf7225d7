"""Rates and latency percentiles from successive scrapes of a bookie's ``/metrics``.

A bookie exports counts since it started: the adds and reads it answered, and the latency of
each as a histogram (cumulative counts per bucket bound, in seconds; the default ``histograms``
style) or as BookKeeper's summaries (quantiles over the last window, in milliseconds; the
``bookkeeper`` style). Two scrapes ``dt`` apart give adds/s and reads/s (count difference over
``dt``) and the p99 latency of what happened between them (the bucket differences, interpolated
in the bucket as Prometheus' ``histogram_quantile`` does; with summaries, the bookie's own p99).
A count that went down means the bookie restarted: that interval gives no point. The ledger
storage's latency is its checkpoints' (the write cache flushed to the entry logs and the index,
BookKeeper's ledger-storage flush): they are seconds apart, so a point has their mean over the
interval (the ``_sum`` difference over the count difference) when one ended in it.

Nothing here reads a clock or a socket: the collector passes the scrape's text and its times.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

ADD = "bookkeeper_server_ADD_ENTRY_REQUEST"
READ = "bookkeeper_server_READ_ENTRY_REQUEST"
JOURNAL_SYNC = "bookie_journal_JOURNAL_SYNC"
SYNC_TAKEN = "bookie_journal_JOURNAL_SYNC_TAKEN"  # a sync's end to the loop taking it (ours)
CHECKPOINT = "bookie_CHECKPOINT"
WATCHED = (ADD, READ, JOURNAL_SYNC, SYNC_TAKEN, CHECKPOINT)
# AutoRecovery's progress: what the replication workers (in the bookies) copied since start.
REPLICATED_LEDGERS = "replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED"
REPLICATED_BYTES = "replication_worker_NUM_BYTES_WRITTEN"
TOTALS = (REPLICATED_LEDGERS, REPLICATED_BYTES)
QUANTILE = 0.99

# Points kept per bookie and for the cluster: 10 minutes at one scrape a second.
HISTORY_POINTS = 600


@dataclass(frozen=True, slots=True)
class Latency:
    """One operation's successful count since start and its latency distribution: cumulative
    counts per upper bound in seconds (histograms style), or the bookie's own p99 in ms
    (summary style)."""

    count: float
    buckets: tuple[tuple[float, float], ...] = ()
    p99_ms: float | None = None
    total: float = 0.0  # the latencies' sum since start: seconds (histograms) or ms (summaries)

    @property
    def total_ms(self) -> float:
        return self.total * 1000.0 if self.buckets else self.total


@dataclass(frozen=True, slots=True)
class Scrape:
    """What one scrape of a bookie said, at monotonic time ``at_s``."""

    at_s: float
    operations: dict[str, Latency]
    totals: dict[str, float] = field(default_factory=dict)  # the ``TOTALS`` it exported


@dataclass(frozen=True, slots=True)
class Point:
    """One interval between two scrapes: its end (ms since the epoch) and what happened."""

    time_ms: int
    adds_per_s: float
    reads_per_s: float
    add_p99_ms: float | None
    journal_sync_p99_ms: float | None
    read_p99_ms: float | None = None
    checkpoint_ms: float | None = None  # the mean of the checkpoints that ended in the interval
    replicated_ledgers_per_s: float = 0.0
    replicated_bytes_per_s: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "t": self.time_ms,
            "adds": round(self.adds_per_s, 2),
            "reads": round(self.reads_per_s, 2),
            "addP99Ms": _ms(self.add_p99_ms),
            "readP99Ms": _ms(self.read_p99_ms),
            "journalSyncP99Ms": _ms(self.journal_sync_p99_ms),
            "checkpointMs": _ms(self.checkpoint_ms),
            "replicatedLedgers": round(self.replicated_ledgers_per_s, 3),
            "replicatedBytes": round(self.replicated_bytes_per_s, 1),
        }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def parse_scrape(text: str, at_s: float) -> Scrape:
    """The watched operations of a ``/metrics`` text (either style); samples labelled
    ``success="false"`` are left out, other labels (``journalIndex``) summed."""
    counts: dict[str, float] = {}
    totals: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    quantiles: dict[str, float] = {}
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in TOTALS:
            values[family.name] = sum(sample.value for sample in family.samples)
            continue
        if family.name not in WATCHED:
            continue
        for sample in family.samples:
            if sample.labels.get("success", "true") != "true":
                continue
            if sample.name.endswith("_count"):
                counts[family.name] = counts.get(family.name, 0.0) + sample.value
            elif sample.name.endswith("_sum"):
                totals[family.name] = totals.get(family.name, 0.0) + sample.value
            elif sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                found = buckets.setdefault(family.name, {})
                found[bound] = found.get(bound, 0.0) + sample.value
            elif sample.labels.get("quantile") == str(QUANTILE) and not math.isnan(sample.value):
                quantiles[family.name] = max(quantiles.get(family.name, 0.0), sample.value)
    return Scrape(
        at_s,
        {
            name: Latency(
                counts.get(name, 0.0),
                tuple(sorted(buckets.get(name, {}).items())),
                quantiles.get(name),
                totals.get(name, 0.0),
            )
            for name in WATCHED
            if name in counts
        },
        values,
    )


def bucket_deltas(before: Latency, after: Latency) -> tuple[tuple[float, float], ...] | None:
    """The cumulative bucket counts of what happened between two scrapes; None if the bounds
    differ or a count went down (a restart)."""
    if [b for b, _ in before.buckets] != [b for b, _ in after.buckets]:
        return None
    deltas = tuple(
        (bound, now - then)
        for (bound, then), (_, now) in zip(before.buckets, after.buckets, strict=True)
    )
    if any(delta < 0 for _, delta in deltas):
        return None
    return deltas


def merge(histograms: Iterable[tuple[tuple[float, float], ...]]) -> tuple[tuple[float, float], ...]:
    """Cumulative bucket counts summed bound by bound (the cluster's, from its bookies')."""
    total: dict[float, float] = {}
    for histogram in histograms:
        for bound, count in histogram:
            total[bound] = total.get(bound, 0.0) + count
    return tuple(sorted(total.items()))


def quantile_ms(cumulative: tuple[tuple[float, float], ...], q: float = QUANTILE) -> float | None:
    """The ``q`` quantile in ms of cumulative bucket counts (bounds in seconds), interpolated
    linearly inside its bucket; the highest finite bound when it falls in +Inf; None without
    events."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = q * cumulative[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound * 1000.0
            if count == lower_count:
                return bound * 1000.0
            share = (rank - lower_count) / (count - lower_count)
            return (lower_bound + (bound - lower_bound) * share) * 1000.0
        lower_bound, lower_count = bound, count
    return lower_bound * 1000.0


def count_over(cumulative: tuple[tuple[float, float], ...], bound_s: float) -> float | None:
    """How many events of cumulative bucket counts took longer than the first bucket bound at
    or above ``bound_s`` (exactly ``bound_s`` when it is a bound); None without such a bound."""
    for bound, count in cumulative:
        if bound >= bound_s:
            return cumulative[-1][1] - count
    return None


@dataclass(frozen=True, slots=True)
class Interval:
    """What happened on one bookie between two scrapes: counts and bucket differences."""

    seconds: float
    counts: dict[str, float]
    deltas: dict[str, tuple[tuple[float, float], ...]]
    summary_p99_ms: dict[str, float]
    totals_ms: dict[str, float] = field(default_factory=dict)  # latencies' sum over the interval
    grown: dict[str, float] = field(default_factory=dict)  # how much each of ``TOTALS`` grew


def interval(before: Scrape, after: Scrape) -> Interval | None:
    """The interval between two scrapes of one bookie; None if no time passed or the bookie
    restarted between them (a count went down)."""
    seconds = after.at_s - before.at_s
    if seconds <= 0:
        return None
    counts: dict[str, float] = {}
    deltas: dict[str, tuple[tuple[float, float], ...]] = {}
    summaries: dict[str, float] = {}
    totals: dict[str, float] = {}
    for name, now in after.operations.items():
        then = before.operations.get(name)
        if then is None:
            continue
        if now.count < then.count:
            return None
        counts[name] = now.count - then.count
        totals[name] = max(0.0, now.total_ms - then.total_ms)
        found = bucket_deltas(then, now)
        if found:
            deltas[name] = found
        if now.p99_ms is not None:
            summaries[name] = now.p99_ms
    grown = {
        name: max(0.0, value - before.totals[name])  # a worker restarted: counted from zero
        for name, value in after.totals.items()
        if name in before.totals
    }
    return Interval(seconds, counts, deltas, summaries, totals, grown)


def mean_ms(intervals: list[Interval], name: str) -> float | None:
    """The mean latency of ``name`` over the intervals (every bookie's), None without any."""
    count = sum(i.counts.get(name, 0.0) for i in intervals)
    return sum(i.totals_ms.get(name, 0.0) for i in intervals) / count if count else None


def p99_ms(intervals: list[Interval], name: str) -> float | None:
    """The p99 of ``name`` over the intervals (every bookie's histograms merged; with summaries
    only, the highest bookie p99), None without any."""
    if not any(i.counts.get(name) for i in intervals):
        return None
    found = quantile_ms(merge(i.deltas[name] for i in intervals if name in i.deltas))
    if found is not None:
        return found
    summaries = [i.summary_p99_ms[name] for i in intervals if name in i.summary_p99_ms]
    return max(summaries) if summaries else None


def point(intervals: list[Interval], time_ms: int) -> Point:
    """The cluster's (or one bookie's, given one interval) point for the same tick: adds and
    reads per second summed over bookies, p99 of the merged histograms (with summaries: the
    highest bookie p99)."""

    def rate(name: str) -> float:
        return sum(i.counts.get(name, 0.0) / i.seconds for i in intervals)

    return Point(
        time_ms,
        rate(ADD),
        rate(READ),
        p99_ms(intervals, ADD),
        p99_ms(intervals, JOURNAL_SYNC),
        read_p99_ms=p99_ms(intervals, READ),
        checkpoint_ms=mean_ms(intervals, CHECKPOINT),
        replicated_ledgers_per_s=sum(
            i.grown.get(REPLICATED_LEDGERS, 0.0) / i.seconds for i in intervals
        ),
        replicated_bytes_per_s=sum(
            i.grown.get(REPLICATED_BYTES, 0.0) / i.seconds for i in intervals
        ),
    )


@dataclass(frozen=True, slots=True)
class Pace:
    """AutoRecovery's pace over some points: ledgers and bytes copied per second, and the time
    left for ``waiting`` ledgers at that pace (None while nothing is copied)."""

    ledgers_per_s: float
    bytes_per_s: float
    eta_s: float | None


def recovery_pace(points: list[Point], waiting: int) -> Pace:
    """The mean pace of ``points`` (the cluster's, one a tick) and the ETA of ``waiting``."""
    if not points:
        return Pace(0.0, 0.0, None)
    ledgers = sum(p.replicated_ledgers_per_s for p in points) / len(points)
    copied = sum(p.replicated_bytes_per_s for p in points) / len(points)
    eta = waiting / ledgers if waiting and ledgers > 0 else None
    return Pace(ledgers, copied, eta)


class History:
    """The last ``limit`` points, oldest first."""

    def __init__(self, limit: int = HISTORY_POINTS) -> None:
        self._points: deque[Point] = deque(maxlen=limit)

    def add(self, found: Point) -> None:
        self._points.append(found)

    def since(self, time_ms: int = 0) -> list[Point]:
        return [p for p in self._points if p.time_ms > time_ms]

    def latest(self) -> Point | None:
        return self._points[-1] if self._points else None

    def __len__(self) -> int:
        return len(self._points)
