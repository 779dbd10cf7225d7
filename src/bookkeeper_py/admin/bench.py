"""``bookkeeper bench``: throughput and latency of a cluster, modelled on BookKeeper's
``bin/benchmark writes|reads``.

    bookkeeper bench writes --local 3 --ensemble 3 --write-quorum 2 --ack-quorum 2 --seconds 10
    bookkeeper bench writes --metadata-uri URI --rate 20000 --entry-size 1024 --json
    bookkeeper bench reads --local 3 --entries 100000          # catch-up reads of closed ledgers
    bookkeeper bench reads --local 3 --tail --rate 10000        # a tailing reader's lag

Writes: ``--writers`` writers share one client (one process, one event loop), each adding to
``--ledgers-per-writer`` ledgers in turn. With ``--rate`` the run is *open loop*: adds are issued
on a fixed schedule and each latency is measured from the moment its add was due, so a stall
shows up in every add it delays (no coordinated omission); without it each writer keeps
``--in-flight`` adds outstanding (closed loop). Latencies go into an HdrHistogram (1 µs to 60 s,
3 significant digits); ``--warmup`` seconds are left out of every figure. A progress line per
second goes to stderr (unless ``--quiet``); the report (or ``--json``) to stdout.

Reads: ``--entries`` entries are written to ``--ledgers-per-writer`` ledgers, which are closed,
every copy acknowledged (an ack quorum of the write quorum: with fewer, a bookie that falls behind
while the others acknowledge can be left without some entries, which a reader then reads around,
the failure path rather than catching up), then read back from the start by one reader per ledger
(``--read-batch`` entries per request, each entry from one replica), MB/s and batch latencies
reported. ``--tail``: a reader in another process follows a live writer (long polls) and the lag
from each add's acknowledgement to the reader's receipt is reported.

Catch-up reads stop after ``--seconds`` of reading if the entries are not all read by then.

``--local N`` starts N bookie processes on an embedded SQLite metadata store for the run; their
own metrics over the measured window are reported too (``BookieScrapes``): the p99 of their add
requests and of their journals' fdatasyncs, which say how much of an add's latency the bookies
and the disk account for, and how many syncs a bookie took 25 ms or more (the disk's stalls).

CPU per entry: the CPU time (user + system) that the client (this process), and with
``--local`` each bookie, used over the measured window, divided by the entries measured; a
figure that survives the machine's noise better than entries per second. (Writes: the window
runs from the end of the warm-up to the last acknowledgement.)

Ctrl-C stops the run cleanly: no new operation is issued, those in flight finish, the ledgers
are closed, and the report of what was measured so far is printed, marked as interrupted
(``"interrupted": true`` in ``--json``); the exit status is then 130. A second Ctrl-C stops at
once.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import collections
import contextlib
import gc
import json
import logging
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import psutil
from hdrh.histogram import HdrHistogram

from bookkeeper_py import aio
from bookkeeper_py import loop as event_loop
from bookkeeper_py.admin import CommandError
from bookkeeper_py.admin.client_auth import client_options, options_for, secret_file
from bookkeeper_py.dashboard import metrics as dashboard_metrics
from bookkeeper_py.errors import BKError
from bookkeeper_py.wire.digest import DigestType

LOWEST_US, HIGHEST_US, DIGITS = 1, 60_000_000, 3
PERCENTILES = (50.0, 95.0, 99.0, 99.9)


def histogram() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)


def summary(h: HdrHistogram) -> dict[str, float]:
    """Percentiles and max in milliseconds."""
    out = {f"p{p:g}_ms": h.get_value_at_percentile(p) / 1000 for p in PERCENTILES}
    out["max_ms"] = h.get_max_value() / 1000
    out["mean_ms"] = h.get_mean_value() / 1000
    return out


@dataclass
class _Tally:
    issued: int = 0
    outstanding: int = 0  # adds issued and not answered yet
    failed: int = 0
    issuing: bool = True  # until every writer stopped issuing adds
    last: float = 0.0  # when the last measured add was acknowledged


@dataclass
class Report:
    kind: str
    entries: int
    seconds: float
    entry_size: int
    latency: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    failures: int = 0
    interrupted: bool = False  # Ctrl-C: the figures are of the part measured before it
    elapsed_s: float = 0.0  # from the start of the workload to its end (or interruption)
    cpu_s: dict[str, float] = field(default_factory=dict)  # process -> CPU s in the window
    # The bookies' own latency metrics over the window (``BookieScrapes``): ms and per second.
    bookies: dict[str, float] = field(default_factory=dict)
    # Open-loop writes: how late the client issued its adds, from their due times to the loop
    # pass that issued them (OpenMessaging Benchmark's "publish delay"); part of the latency.
    send_delay: dict[str, float] = field(default_factory=dict)

    @property
    def cpu_per_entry_us(self) -> dict[str, float]:
        """Process -> µs of CPU per entry measured."""
        if not self.entries:
            return {}
        return {name: 1e6 * cpu / self.entries for name, cpu in self.cpu_s.items()}

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.entries_per_s * self.entry_size / 1e6

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["entries_per_s"] = self.entries_per_s
        data["mb_per_s"] = self.mb_per_s
        data["cpu_per_entry_us"] = self.cpu_per_entry_us
        return data

    def text(self) -> str:
        what = {"writes": "adds", "reads": "entries read", "tail": "entries followed"}[self.kind]
        latency_name = {"writes": "add latency", "reads": "batch latency", "tail": "lag"}[self.kind]
        lines = [
            f"{self.entries:,} {what} in {self.seconds:.2f} s: {self.entries_per_s:,.0f}/s, "
            f"{self.mb_per_s:,.1f} MB/s ({self.entry_size} B entries)"
            + (f", {self.failures} failed" if self.failures else ""),
            f"{latency_name} (ms): "
            + (
                "  ".join(f"{k[:-3]} {v:.3f}" for k, v in self.latency.items() if k != "mean_ms")
                or "not measured"
            ),
        ]
        if self.send_delay:
            lines.append(
                "of which issued late (ms, from the due time to the client's issue): "
                + "  ".join(f"{k[:-3]} {self.send_delay[k]:.3f}" for k in ("p50_ms", "p99_ms"))
            )
        if self.cpu_s and self.entries:
            lines.append(
                "CPU per entry (µs): "
                + "  ".join(f"{name} {us:.1f}" for name, us in self.cpu_per_entry_us.items())
            )
        if self.bookies:
            lines.append(BookieScrapes.text(self.bookies))
        if self.interrupted:
            lines.insert(0, f"interrupted after {self.elapsed_s:.1f} s: partial results")
        return "\n".join(lines)


class CpuMeter:
    """The CPU time (user + system) of processes over a window: this one, the client, and others
    by name (bookies). A process that ends during the window counts what it used until then.
    The kernel counts in clock ticks (10 ms), so a window should hold seconds of work for the
    per-entry figures to mean something."""

    def __init__(
        self, others: Mapping[str, int] | None = None, scrapes: BookieScrapes | None = None
    ) -> None:
        self._processes = {"client": psutil.Process()}
        for name, pid in (others or {}).items():
            self.add(name, pid)
        self._started: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self.scrapes = scrapes

    def add(self, name: str, pid: int) -> None:
        with contextlib.suppress(psutil.Error):
            self._processes[name] = psutil.Process(pid)

    def _now(self) -> dict[str, float]:
        found = {}
        for name, process in self._processes.items():
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue  # gone: its last reading stands
            found[name] = times.user + times.system
        self._last.update(found)
        return found

    def start(self) -> None:
        self._started = self._now()
        if self.scrapes is not None:
            self.scrapes.start()

    def stop(self) -> dict[str, float]:
        """CPU seconds of each process since ``start`` (empty if it never started)."""
        self._now()
        if self.scrapes is not None:
            self.scrapes.stop()
        return {
            name: self._last[name] - started
            for name, started in self._started.items()
            if name in self._last
        }


class BookieScrapes:
    """The bookies' own latency metrics over the measured window, next to the client's: each
    bookie's ``/metrics`` (its add requests and its journal's ``fdatasync``s alone, ``name[]``)
    fetched as the window starts and again once it ended, and compared after it (the parsing
    is not counted in the client's CPU). The p99 of the bookies' adds (a request in to its
    answer out) and of their journals' syncs (the kernel's and the disk's time alone) say how
    much of the client's latency the bookies and the disk account for. The quantiles come from
    the histograms' bucket differences, interpolated as the dashboard does."""

    NAMES = (dashboard_metrics.ADD, dashboard_metrics.JOURNAL_SYNC, dashboard_metrics.SYNC_TAKEN)
    TIMEOUT_S = 10.0
    # A journal sync this long is a stall of the disk (a bucket bound of the sync histogram):
    # the count of them per bookie says whether a run's tail met one, which no code avoids.
    STALL_S = 0.025

    def __init__(self, urls: Mapping[str, str]) -> None:
        """``urls``: bookie name -> the base URL of its HTTP server."""
        self.urls = dict(urls)
        self._first: asyncio.Future[list[tuple[float, str] | None]] | None = None
        self._last: asyncio.Future[list[tuple[float, str] | None]] | None = None

    def start(self) -> None:
        """Fetches the first scrapes (in the background: the window starts now)."""
        self._first = asyncio.ensure_future(self._fetch())

    def stop(self) -> None:
        """Fetches the last scrapes (in the background: the window ended now)."""
        if self._first is not None and self._last is None:
            self._last = asyncio.ensure_future(self._fetch())

    async def _fetch(self) -> list[tuple[float, str] | None]:
        timeout = aiohttp.ClientTimeout(total=self.TIMEOUT_S)
        query = [("name[]", name) for name in self.NAMES]

        async def one(session: aiohttp.ClientSession, url: str) -> tuple[float, str] | None:
            try:
                async with session.get(url + "/metrics", params=query) as answer:
                    answer.raise_for_status()
                    text = await answer.text()
            except (aiohttp.ClientError, TimeoutError):
                return None  # that bookie is left out of the figures
            return time.monotonic(), text

        async with aiohttp.ClientSession(timeout=timeout) as session:
            return list(await asyncio.gather(*(one(session, url) for url in self.urls.values())))

    async def figures(self) -> dict[str, float]:
        """The figures of the window (empty if it never started, or no bookie answered both
        times)."""
        if self._first is None:
            return {}
        self.stop()
        assert self._last is not None
        first, last = await self._first, await self._last
        intervals = []
        for before, after in zip(first, last, strict=True):
            if before is None or after is None:
                continue
            found = dashboard_metrics.interval(
                dashboard_metrics.parse_scrape(before[1], before[0]),
                dashboard_metrics.parse_scrape(after[1], after[0]),
            )
            if found is not None:
                intervals.append(found)
        if not intervals:
            return {}
        point = dashboard_metrics.point(intervals, 0)
        figures = {"bookies_measured": float(len(intervals))}
        for key, value in (
            ("add_p99_ms", point.add_p99_ms),
            ("journal_sync_p99_ms", point.journal_sync_p99_ms),
            # how late the bookies' loops took their syncs' answers (a busy or starved loop)
            (
                "sync_taken_p99_ms",
                dashboard_metrics.p99_ms(intervals, dashboard_metrics.SYNC_TAKEN),
            ),
        ):
            if value is not None:
                figures[key] = value
        add_mean = dashboard_metrics.mean_ms(intervals, dashboard_metrics.ADD)
        if add_mean is not None:  # from a request's arrival to its answer
            figures["add_mean_ms"] = add_mean
        sync = dashboard_metrics.JOURNAL_SYNC
        sync_mean = dashboard_metrics.mean_ms(intervals, sync)
        if sync_mean is not None:
            figures["journal_syncs_per_s"] = sum(
                i.counts.get(sync, 0.0) / i.seconds for i in intervals
            ) / len(intervals)
            figures["journal_sync_mean_ms"] = sync_mean
        stalls = [
            over
            for i in intervals
            if sync in i.deltas
            and (over := dashboard_metrics.count_over(i.deltas[sync], self.STALL_S)) is not None
        ]
        if stalls:
            figures["journal_stalls_per_bookie"] = sum(stalls) / len(stalls)
        return figures

    @staticmethod
    def text(figures: Mapping[str, float]) -> str:
        parts = []
        if "add_p99_ms" in figures:
            mean = f", mean {figures['add_mean_ms']:.3f}" if "add_mean_ms" in figures else ""
            parts.append(f"add p99 {figures['add_p99_ms']:.3f}{mean}")
        if "journal_sync_p99_ms" in figures:
            parts.append(
                f"journal fdatasync p99 {figures['journal_sync_p99_ms']:.3f}, mean "
                f"{figures['journal_sync_mean_ms']:.3f} "
                f"({figures['journal_syncs_per_s']:,.0f}/s a bookie)"
            )
        if "sync_taken_p99_ms" in figures:
            parts.append(f"syncs taken by the loop p99 {figures['sync_taken_p99_ms']:.3f}")
        if "journal_stalls_per_bookie" in figures:
            parts.append(
                f"{figures['journal_stalls_per_bookie']:.1f} syncs over "
                f"{BookieScrapes.STALL_S * 1000:.0f} ms a bookie"
            )
        return f"bookies' own metrics (ms, {figures['bookies_measured']:.0f} bookies): " + (
            "  ".join(parts) or "no adds or syncs"
        )


PACE_TICK_S = 0.001  # the shortest wait of an open-loop schedule


class Interrupt:
    """Ctrl-C during a measurement: the first SIGINT asks the workload to wind down (``stop``
    is set; the workloads check it where they issue work), a second one raises
    ``KeyboardInterrupt`` at once."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.started = time.monotonic()
        self._installed = False

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, self._first)
        except (ValueError, RuntimeError, NotImplementedError):
            return  # not the main thread (a script measuring in a thread): no Ctrl-C handling
        self._installed = True

    def _first(self) -> None:
        self.stop.set()
        loop = asyncio.get_running_loop()
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self._installed = False
        print(
            "interrupted: finishing what is in flight (Ctrl-C again stops at once)",
            file=sys.stderr,
            flush=True,
        )

    async def pause_until(self, when: float) -> None:
        """An open-loop schedule's wait for its next due time (``time.monotonic()``), at least
        ``PACE_TICK_S``: what fell due meanwhile is issued together, as an application at that
        rate sends in bursts (each latency still counts from its add's due time); a wait of
        less would spin the loop for an add or two per pass. Ctrl-C ends a long wait early."""
        delay = max(when - time.monotonic(), PACE_TICK_S)
        if delay <= 10 * PACE_TICK_S:
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), delay)

    def uninstall(self) -> None:
        if self._installed:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
            self._installed = False

    @property
    def requested(self) -> bool:
        return self.stop.is_set()

    def mark(self, report: Report) -> Report:
        if self.requested:
            report.interrupted = True
            report.elapsed_s = time.monotonic() - self.started
        return report


class Progress:
    """Latencies of a run, kept raw (an ``array`` append per add: recording into an
    HdrHistogram in the hot path cost ~5 µs an add, a sixth of the client's work) and folded
    into the histogram at the end; one line per second on stderr with the interval's p99."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.latencies_us = array.array("q")
        self.count = 0  # entries done (a read batch records one latency for many)
        self._started = time.monotonic()
        self._last = self._started
        self._last_count = 0
        self._last_index = 0

    def record(self, latency_us: int, entries: int = 1) -> None:
        self.latencies_us.append(latency_us)
        self.count += entries

    def tick(self, now: float) -> None:
        if now - self._last < 1.0:
            return
        if not self.quiet:
            rate = (self.count - self._last_count) / (now - self._last)
            interval = sorted(self.latencies_us[self._last_index :])
            p99 = interval[int(0.99 * (len(interval) - 1))] / 1000 if interval else 0.0
            print(
                f"[{now - self._started:5.0f} s] {rate:12,.0f}/s   p99 {p99:8.3f} ms   "
                f"total {self.count:,}",
                file=sys.stderr,
                flush=True,
            )
        self._last, self._last_count = now, self.count
        self._last_index = len(self.latencies_us)

    def histogram(self) -> HdrHistogram:
        return folded(self.latencies_us)


def folded(latencies_us: Iterable[int]) -> HdrHistogram:
    """A histogram of ``latencies_us`` (clamped to its range), folded by value: a run's take a
    few thousand distinct values, so each is recorded once with its count (one pure-Python
    ``record_value`` per add took 1.5 s for 600,000 adds after every run)."""
    h = histogram()
    for latency_us, count in collections.Counter(latencies_us).items():
        h.record_value(min(max(latency_us, LOWEST_US), HIGHEST_US), count)
    return h


# -- writes ------------------------------------------------------------------------------------


async def run_writes(
    client: aio.BookKeeper,
    args: argparse.Namespace,
    interrupt: Interrupt | None = None,
    meter: CpuMeter | None = None,
) -> Report:
    interrupt = interrupt or Interrupt()
    meter = meter or CpuMeter()
    quorum = (args.ensemble, args.write_quorum, args.ack_quorum)
    digest = DigestType[args.digest.upper()]
    payload = os.urandom(args.entry_size)
    writers = [
        [
            await client.create_ledger(*quorum, digest_type=digest, password=b"bench")
            for _ in range(args.ledgers_per_writer)
        ]
        for _ in range(args.writers)
    ]
    loop = asyncio.get_running_loop()
    progress = Progress(args.quiet)
    start = time.monotonic()
    warm_until = start + args.warmup
    stop_at: float | None = (
        start + float(args.warmup) + float(args.seconds) if args.entries is None else None
    )
    limit: int | None = None if args.entries is None else int(args.entries)
    state = _Tally()
    errors_seen: list[BKError] = []
    all_done = loop.create_future()
    if args.warmup > 0:
        loop.call_later(args.warmup, meter.start)
    else:
        meter.start()

    def stop_issuing() -> None:
        state.issuing = False
        if not state.outstanding and not all_done.done():
            all_done.set_result(None)

    # Each ledger answers its adds to one callback. A writer's k-th add goes to its ledger
    # k mod L and gets entry id k // L there (the bench made the ledgers: ids from 0, in order),
    # so an answer finds k again, and with it the add's due time in the writer's schedule (open
    # loop) or its issue time (closed loop, kept by k): no object and no dict entry per add (a
    # partial per add lived as long as its add, a thousand at once, and the collector went over
    # them every few hundred adds; a dict of due times per ledger was a fifth of the client's
    # bytecodes per add at 20,000/s).
    ledgers = len(writers[0])
    closed = not args.rate
    interval = args.writers / args.rate if args.rate else 0.0
    first_due = [start + writer * interval / args.writers for writer in range(args.writers)]
    issued = [0] * args.writers  # adds issued, per writer
    issued_at = [array.array("d") for _ in writers]  # closed loop: each add's issue time, by k
    send_delays_us = array.array("q")  # open loop: each measured add's issue past its due time
    latencies_us = progress.latencies_us

    def failed_to_issue(error: BKError) -> None:
        state.failed += 1
        errors_seen.append(error)

    def may_issue() -> int:
        """How many more adds may be issued now (the run's limit), 0 once none may: the run is
        over, interrupted or limited, or the writers failed (the error is counted, and the run
        ends when nothing is left outstanding)."""
        if not state.issuing or interrupt.requested or errors_seen:
            return 0
        return 1 << 62 if limit is None else limit - state.issued

    def issue(writer: int, now: float) -> bool:
        """Closed loop: sends one add of ``writer``, on its ledgers in turn: no future, one
        callback per ledger (``add_entry_callback``, as Java's benchmark uses ``asyncAddEntry``
        with a callback; the bench's own CPU counts as the client's). False once no more adds
        are to be issued (``may_issue``)."""
        if may_issue() <= 0:
            return False
        k = issued[writer]
        ledger = k % ledgers
        try:
            writers[writer][ledger].add_entry_callback(payload, answers[writer][ledger])
        except BKError as error:
            failed_to_issue(error)
            return False
        issued_at[writer].append(now)
        issued[writer] = k + 1
        state.issued += 1
        state.outstanding += 1
        return True

    def issue_due(writer: int, now: float) -> bool:
        """Open loop: sends every add of ``writer`` due by ``now`` and not sent yet, in one
        loop (what fell due meanwhile goes out together, as an application at that rate sends
        in bursts); records how late each measured one went. False once no more adds are to be
        issued (``may_issue``, or the schedule's end)."""
        first = issued[writer]
        base = first_due[writer]
        last = math.floor((now - base) / interval)  # the last add due by now
        if stop_at is not None:
            last = min(last, math.ceil((stop_at - base) / interval) - 1)
        allowed = may_issue()
        if last >= first + allowed:
            last = first + allowed - 1
        adds, callbacks = adders[writer], answers[writer]
        k = first
        try:
            for k in range(first, last + 1):
                adds[k % ledgers](payload, callbacks[k % ledgers])
            k = last + 1
        except BKError as error:
            failed_to_issue(error)
        issued[writer] = k
        state.issued += k - first
        state.outstanding += k - first
        measured_from = max(first, math.ceil((warm_until - base) / interval))
        if measured_from < k:
            late_us = (now - base) * 1e6
            step_us = interval * 1e6
            send_delays_us.extend([int(late_us - j * step_us) for j in range(measured_from, k)])
        if k <= last or (stop_at is not None and base + k * interval >= stop_at):
            return False
        return allowed > k - first

    def answered(writer: int, ledger: int, entry_id: int, error: BKError | None) -> None:
        """An add acknowledged (or failed): its latency from when it was due recorded (past
        the warm-up); in the closed loop, the writer's next add issued."""
        now = time.monotonic()
        k = entry_id * ledgers + ledger
        due = issued_at[writer][k] if closed else first_due[writer] + k * interval
        state.outstanding -= 1
        if error is not None:
            state.failed += 1
        elif due >= warm_until:  # measured: its latency (progress.record, inline)
            latencies_us.append(int((now - due) * 1e6))
            state.last = now
        if closed and state.issuing and not issue(writer, now):
            stop_issuing()  # every writer stops on the same condition
        elif not state.outstanding and not state.issuing and not all_done.done():
            all_done.set_result(None)

    answers = [[partial(answered, w, i) for i in range(len(h))] for w, h in enumerate(writers)]
    adders = [[handle.add_entry_callback for handle in handles] for handles in writers]
    if stop_at is not None and closed:
        # The closed loop's end. The open loop's schedule ends itself (``issue_due``): an add due
        # before the end is issued even if the loop gets to it only after, late as it is (a timer
        # here ended the run first and dropped the last adds of a late loop unmeasured).
        loop.call_later(stop_at - time.monotonic(), stop_issuing)
    if args.rate:
        # Open loop: every writer issues its share on a fixed schedule.

        async def paced(writer: int) -> None:
            while True:
                now = time.monotonic()
                if not issue_due(writer, now):
                    return
                progress.count = len(latencies_us)
                progress.tick(now)
                if interrupt.requested:
                    return
                await interrupt.pause_until(first_due[writer] + issued[writer] * interval)

        await asyncio.gather(*(paced(w) for w in range(args.writers)))
        stop_issuing()
    else:
        # Closed loop: each writer keeps --in-flight adds outstanding; an answer records its
        # add and issues the writer's next (``answered``); the progress line is a timer.
        def ticking() -> None:
            progress.count = len(latencies_us)
            progress.tick(time.monotonic())
            if state.issuing:
                loop.call_later(1.0, ticking)

        loop.call_later(1.0, ticking)
        for writer in range(args.writers):
            for _ in range(args.in_flight):
                if not issue(writer, time.monotonic()):
                    stop_issuing()
                    break
    await all_done
    cpu = meter.stop()
    if errors_seen and not args.quiet:
        print(f"the writers failed: {errors_seen[0]}", file=sys.stderr)
    for handles in writers:
        for handle in handles:
            await handle.close()
    acked_measured = len(latencies_us)
    # from the first measured add's due (or issue) time, the warm-up's end, to the last answer
    seconds = max(state.last - warm_until, 1e-9)
    return interrupt.mark(
        Report(
            "writes",
            acked_measured,
            seconds,
            args.entry_size,
            summary(progress.histogram()) if acked_measured else {},
            settings(args),
            state.failed,
            cpu_s=cpu,
            send_delay=summary(folded(send_delays_us)) if send_delays_us else {},
        )
    )


# -- reads -------------------------------------------------------------------------------------


async def run_catchup_reads(
    client: aio.BookKeeper,
    args: argparse.Namespace,
    interrupt: Interrupt | None = None,
    meter: CpuMeter | None = None,
) -> Report:
    """Writes ``--entries`` to closed ledgers, then reads them back for at most ``--seconds``."""
    interrupt = interrupt or Interrupt()
    meter = meter or CpuMeter()
    # Every copy acknowledged: see the module's doc.
    quorum = (args.ensemble, args.write_quorum, args.write_quorum)
    digest = DigestType[args.digest.upper()]
    payload = os.urandom(args.entry_size)
    total = args.entries or 100_000
    ledgers = []
    per_ledger = max(1, total // args.ledgers_per_writer)
    for _ in range(args.ledgers_per_writer):
        if interrupt.requested:
            break
        handle = await client.create_ledger(*quorum, digest_type=digest, password=b"bench")
        # (no list of the adds' futures left behind: kept through the reads, its hundreds of
        # thousands of objects were walked by each full pass of the garbage collector)
        await asyncio.gather(*(handle.add_entry_async(payload) for _ in range(per_ledger)))
        await handle.close()
        ledgers.append(handle.ledger_id)
    if not args.quiet:
        print(f"wrote {per_ledger * len(ledgers):,} entries; reading", file=sys.stderr)
    progress = Progress(args.quiet)

    async def read_ledger(ledger_id: int) -> int:
        reader = await client.open_ledger(ledger_id, b"bench")
        count = 0
        for first in range(0, reader.last_add_confirmed + 1, args.read_batch):
            if interrupt.requested or time.monotonic() >= stop_at:
                break
            last = min(first + args.read_batch - 1, reader.last_add_confirmed)
            started = time.monotonic()
            entries = await reader.read_entries(first, last)
            progress.record(int((time.monotonic() - started) * 1e6), len(entries))
            progress.tick(time.monotonic())
            count += len(entries)
        return count

    start = time.monotonic()
    stop_at = start + float(args.seconds)
    meter.start()
    counts = await asyncio.gather(*(read_ledger(ledger_id) for ledger_id in ledgers))
    seconds = time.monotonic() - start
    return interrupt.mark(
        Report(
            "reads",
            sum(counts),
            seconds,
            args.entry_size,
            summary(progress.histogram()) if sum(counts) else {},
            settings(args),
            cpu_s=meter.stop(),
        )
    )


async def _follow(
    uri: str, ledger_id: int, count: int, pipe: Connection, secret_path: str | None
) -> None:
    client = await aio.BookKeeper.connect(uri, **options_for(secret_path))
    try:
        handle = await client.open_ledger_no_recovery(ledger_id, b"bench")
        pipe.send("ready")
        seen = [0.0] * count
        got = 0
        async for entry in handle.follow(0, timeout_ms=1000):
            if entry.entry_id < count:
                seen[entry.entry_id] = time.monotonic()
                got += 1
            if got == count:
                break
        pipe.send(seen)
    finally:
        await client.close()


def _follower(
    uri: str, ledger_id: int, count: int, pipe: Connection, secret_path: str | None = None
) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        event_loop.run(_follow(uri, ledger_id, count, pipe, secret_path))


async def run_tail(
    client: aio.BookKeeper,
    uri: str,
    args: argparse.Namespace,
    interrupt: Interrupt | None = None,
    meter: CpuMeter | None = None,
) -> Report:
    """A writer at ``--rate`` and a reader in another process following it; lag per entry =
    the reader's receipt - the writer's ack (CLOCK_MONOTONIC, shared by the processes). The
    writer goes on 0.2 s past the measured entries: readers learn of an entry from the LAC that
    later entries carry. Ctrl-C: the writer stops, and the report says what it wrote (the lag
    is measured over complete runs only)."""
    interrupt = interrupt or Interrupt()
    meter = meter or CpuMeter()
    rate = args.rate or 10_000
    measured_count = int(rate * args.seconds)
    count = measured_count + int(rate * 0.2) + 1
    quorum = (args.ensemble, args.write_quorum, args.ack_quorum)
    handle = await client.create_ledger(
        *quorum, digest_type=DigestType[args.digest.upper()], password=b"bench"
    )
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    reader = context.Process(
        target=_follower,
        args=(uri, handle.ledger_id, measured_count, theirs, secret_file(args)),
        daemon=True,
    )
    reader.start()
    try:
        if not ours.poll(60) or ours.recv() != "ready":
            raise RuntimeError("the tailing reader did not start within 60 s")
        if reader.pid is not None:
            meter.add("reader", reader.pid)
        acked = [0.0] * count
        payload = os.urandom(args.entry_size)
        loop = asyncio.get_running_loop()
        all_acked = loop.create_future()
        failures: list[BKError] = []
        answered = 0

        def note_ack(entry_id: int, error: BKError | None) -> None:
            """The add's acknowledgement time, noted as the writer completes it."""
            nonlocal answered
            acked[entry_id] = time.monotonic()
            answered += 1
            if error is not None:
                failures.append(error)
            finished = answered == issued and (issued == count or interrupt.requested)
            if finished and not all_acked.done():
                all_acked.set_result(None)

        start = time.monotonic()
        meter.start()
        issued = 0
        while issued < count and not interrupt.requested:
            due = min(count, int((time.monotonic() - start) * rate) + 1)
            while issued < due:
                handle.add_entry_callback(payload, note_ack)
                issued += 1
            await interrupt.pause_until(start + issued / rate)
        if answered < issued:
            await all_acked
        if failures:
            raise failures[0]
        elapsed = time.monotonic() - start
        cpu = meter.stop()
        await handle.close()
        if interrupt.requested:
            return interrupt.mark(
                Report("tail", issued, elapsed, args.entry_size, {}, settings(args))
            )
        if not await asyncio.to_thread(ours.poll, 120):
            raise RuntimeError("the tailing reader did not see every entry within 120 s")
        seen = ours.recv()
    finally:
        reader.join(1 if interrupt.requested else 30)
        if reader.is_alive():
            reader.kill()
            reader.join(10)
    lags_us = [int((seen[i] - acked[i]) * 1e6) for i in range(measured_count)]
    negative = sum(lag_us < 0 for lag_us in lags_us)
    lags = folded(lags_us)
    report = Report(
        "tail", count, elapsed, args.entry_size, summary(lags), settings(args), cpu_s=cpu
    )
    report.settings["lag_measured_entries"] = measured_count
    report.settings["negative_lags"] = negative  # the writer's loop noted its ack late
    return report


def settings(args: argparse.Namespace) -> dict[str, Any]:
    keep = (
        "local",
        "writers",
        "ledgers_per_writer",
        "entry_size",
        "ensemble",
        "write_quorum",
        "ack_quorum",
        "digest",
        "in_flight",
        "rate",
        "seconds",
        "entries",
        "warmup",
        "read_batch",
        "use_v3",
    )
    return {k: getattr(args, k) for k in keep if hasattr(args, k)}


# -- the command -------------------------------------------------------------------------------


@contextlib.contextmanager
def cluster_for(
    args: argparse.Namespace,
) -> Iterator[tuple[str, dict[str, int], dict[str, str]]]:
    """The metadata URI to measure, and the bookies whose CPU and metrics are measured
    (``--local``)."""
    if args.local:
        from bookkeeper_py.testing.local_cluster import LocalCluster

        with LocalCluster(args.local) as cluster:
            yield cluster.metadata_uri, bookie_pids(cluster), bookie_metrics_urls(cluster)
        return
    uri = args.metadata_uri or os.environ.get("BOOKKEEPER_METADATA_URI")
    if not uri:
        raise CommandError(
            "no cluster to measure; pass --local N or --metadata-uri URI (or set "
            "BOOKKEEPER_METADATA_URI)"
        )
    yield uri, {}, {}


def bookie_pids(cluster: Any) -> dict[str, int]:
    """Bookie id -> PID of a ``LocalCluster``'s running bookies."""
    return {
        bookie.bookie_id: bookie.process.pid
        for bookie in cluster.bookies
        if bookie.process is not None and bookie.running
    }


def bookie_metrics_urls(cluster: Any) -> dict[str, str]:
    """Bookie id -> the base URL of the HTTP server of a ``LocalCluster``'s running bookies."""
    return {
        bookie.bookie_id: f"http://127.0.0.1:{bookie.http_port}"
        for bookie in cluster.bookies
        if bookie.process is not None and bookie.running
    }


async def measure(
    uri: str,
    args: argparse.Namespace,
    processes: Mapping[str, int] | None = None,
    metrics_urls: Mapping[str, str] | None = None,
) -> Report:
    """One measurement against the cluster at ``uri`` (``args`` from ``build_arguments``); the
    CPU of ``processes`` (name -> PID: bookies) is measured with the client's, and the latency
    metrics of the bookies at ``metrics_urls`` (name -> HTTP base URL) over the same window."""
    client = await aio.BookKeeper.connect(
        uri,
        use_v3=args.use_v3,
        throttle=max(args.in_flight, 1) if not args.rate else 100_000,
        request_timeout_s=30.0,
        **client_options(args),
    )
    # The objects of the process so far (modules, the client) out of the collector's sight while
    # measuring: a full collection over them pauses the loop for tens of ms, which would show in
    # the latencies as a stall of the cluster.
    gc.collect()
    gc.freeze()
    interrupt = Interrupt()
    interrupt.install()
    meter = CpuMeter(processes, BookieScrapes(metrics_urls) if metrics_urls else None)
    try:
        if args.workload == "writes":
            report = await run_writes(client, args, interrupt, meter)
        elif args.tail:
            report = await run_tail(client, uri, args, interrupt, meter)
        else:
            report = await run_catchup_reads(client, args, interrupt, meter)
        if meter.scrapes is not None:
            report.bookies = await meter.scrapes.figures()
        return report
    finally:
        interrupt.uninstall()
        gc.unfreeze()
        await client.close()


def run(args: argparse.Namespace) -> Report:
    if not getattr(args, "verbose", False):
        logging.getLogger().setLevel(logging.WARNING)  # the report and progress lines only
    if args.ensemble < args.write_quorum or args.write_quorum < args.ack_quorum:
        raise CommandError(
            f"-e {args.ensemble} -w {args.write_quorum} -a {args.ack_quorum}: need ensemble >= "
            "write quorum >= ack quorum"
        )
    if args.local and args.local < args.ensemble:
        raise CommandError(
            f"--local {args.local} bookies cannot hold an ensemble of {args.ensemble}; start "
            "more bookies or make the ensemble smaller"
        )
    with cluster_for(args) as (uri, processes, metrics_urls):
        report = event_loop.run(measure(uri, args, processes, metrics_urls))
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print(report.text())
    if report.interrupted:
        sys.stdout.flush()
        raise SystemExit(130)
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", choices=("writes", "reads"))
    parser.add_argument("--metadata-uri", help="a running cluster ($BOOKKEEPER_METADATA_URI)")
    parser.add_argument("--local", type=int, default=0, help="start N bookies for the run")
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--ledgers-per-writer", type=int, default=1)
    parser.add_argument("--entry-size", type=int, default=1024)
    parser.add_argument("--ensemble", "-e", type=int, default=3)
    parser.add_argument("--write-quorum", "-w", type=int, default=2)
    parser.add_argument("--ack-quorum", "-a", type=int, default=2)
    parser.add_argument("--digest", default="crc32c", choices=("crc32", "crc32c", "mac", "dummy"))
    parser.add_argument("--in-flight", type=int, default=1000, help="closed loop, per writer")
    parser.add_argument("--rate", type=float, default=0.0, help="adds/s, open loop (0: closed)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=10.0,
        help="measured duration of writes and --tail; reads stop after it if not done",
    )
    parser.add_argument(
        "--entries",
        type=int,
        default=None,
        help="writes: instead of --seconds; reads: entries to write, then read back",
    )
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds left out")
    parser.add_argument("--read-batch", type=int, default=1000)
    parser.add_argument("--tail", action="store_true", help="reads: a tailing reader's lag")
    parser.add_argument("--use-v3", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def build_arguments(argv: list[str]) -> argparse.Namespace:
    """``bookkeeper bench`` arguments, for scripts that measure without the command line."""
    parser = argparse.ArgumentParser(prog="bookkeeper bench")
    add_arguments(parser)
    return parser.parse_args(argv)
