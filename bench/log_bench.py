"""The targets of logs built from ledgers (issue 18), measured with the asyncio API
(``bookkeeper_py.log``) on a local cluster of three bookie processes (embedded SQLite metadata),
ledgers 3/2/2 (``--quorum``), CRC32C, fsync before every ack (the bookies' defaults; more
options with ``--bookie-args``). Each mode runs on a cluster of its own, ``--runs`` times; the
medians are printed.

    python bench/log_bench.py append   [--runs 3] [--seconds 5] [--sizes 100,1024]
    python bench/log_bench.py tail     [--runs 3] [--rate 100000] [--warmup 2] [--tail-seconds 10]
    python bench/log_bench.py catchup  [--runs 3] [--records 2000000]
    python bench/log_bench.py recovery [--runs 3] [--segment-records 10000]
    python bench/log_bench.py all      [--json]

append: one writer appends records of each ``--sizes`` for ``--seconds`` (every ``--yield-every``
records it awaits ``writer.drain()`` and lets the loop run), then ``flush()``; the time is from
the first append to the end of the flush. Targets: 100 B records >= 500,000 records/s, 1 KiB
records >= 150 MB/s.

tail: a writer appends 100 B records at ``--rate`` records/s (paced by a 1 ms timer: each tick
appends the records due by then) while a reader in another process (its own event loop and GIL)
tails the log from "latest". Each record carries its append time (``time.time()``, shared by the
processes); lag from append = the reader's receipt - that time, over ``--tail-seconds`` after
``--warmup``. Lag from acknowledgement = the receipt - when the writer saw the first record of
the record's tick acknowledged (acknowledgements come in order: at least the record's own lag;
the reader's receipts go to a file the writer's process reads). The writer's schedule delay
(how late a tick appended its oldest due record) tells whether it kept the rate. Target: p99
lag from acknowledgement to delivery < 10 ms at 100,000 records/s.

catchup: ``--records`` 100 B records are written to a log and the writer closed (not timed), then
a new client reads the whole log with ``follow=False`` through ``read_batch()``. Target: >=
1,000,000 records/s.

recovery: a writer in another process appends ``--segment-records`` records, rolls, appends as
many again (all acknowledged), and is SIGKILLed; it never closes the first segment (a writer
killed in the middle of a roll), so the last two segments are open. ``describe`` counts them,
then ``open_writer`` (fence and recover both, CAS the list) is timed on a client already
connected. Target: < 1 s.

CPU: client CPU is the process CPU time (all threads) of the process that appends or reads,
divided by the records; the bookies' is the sum of the three bookie processes' CPU time (psutil)
over the same span. As ``bookkeeper bench``, the objects of the process are frozen out of the
garbage collector's sight while measuring (``gc.freeze()``). Every run also reports the CPU used
by processes outside the benchmark's (``others_cpu_percent``, in % of one core; the kernel's
threads take ~10 % on a quiet machine) and the disk writes of others: on a shared machine,
``--max-others-cpu 30`` runs a disturbed run again (``--max-discarded`` times at most).

tail diagnostics: the writer's append-to-acknowledgement latency of the first record of each
tick (``ack_*``), and the 100 ms windows in which a lag (``slow_windows``) or an ack
(``slow_ack_windows``) passed 10 ms, in seconds from the measured window's start.

With ``--json`` the summary goes to stderr and one JSON line per mode to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import json
import math
import os
import shlex
import signal
import statistics
import struct
import sys
import time
from array import array
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import psutil

from bookkeeper_py import aio
from bookkeeper_py.log import LogConfig, LogNamespace, LogWriter, PendingAppend
from bookkeeper_py.testing import LocalCluster

SCRIPT = os.path.abspath(__file__)
NAMESPACE = "bench"
# A tailed record: its append time and its due time (time.time()), its number (STOP ends).
HEADER = struct.Struct("<ddq")
STOP = -1
SLOW_LAG_S = 0.010  # tail: lags over this are listed by 100 ms of appends ("slow_windows")
SUBPROCESS_START_S = 120.0  # a subprocess's first line (connected, opened)
MODES = ("append", "tail", "catchup", "recovery")
DISCARD_PAUSE_S = 10.0  # after a run discarded for others' CPU use

T = TypeVar("T")


# -- measuring ----------------------------------------------------------------------------------


def run_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Runs on uvloop when installed (as the bookies and ``bookkeeper bench`` do)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)  # type: ignore[no-any-return]


def bookies_cpu_s(cluster: LocalCluster | None) -> float:
    """CPU seconds (user + system) the cluster's bookie processes have used so far."""
    total = 0.0
    for bookie in cluster.bookies if cluster is not None else ():
        if bookie.process is not None:
            times = psutil.Process(bookie.process.pid).cpu_times()
            total += times.user + times.system
    return total


def family_usage(processes: list[psutil.Process]) -> tuple[float, int]:
    """CPU seconds and bytes written to storage by these processes (this one and its
    descendants) so far."""
    cpu, written = 0.0, 0
    for process in processes:
        try:
            times = process.cpu_times()
            written += process.io_counters().write_bytes
        except psutil.NoSuchProcess:
            continue
        cpu += times.user + times.system
    return cpu, written


def disk_written() -> int:
    counters = psutil.disk_io_counters()
    return counters.write_bytes if counters is not None else 0


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores."""
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    total = sum(times)
    return total - idle, total


@dataclass
class Span:
    """Wall time, this process's CPU time and the bookies' CPU time over a span."""

    cluster: LocalCluster | None
    started: float = 0.0
    cpu: float = 0.0
    bookies: float = 0.0
    machine: tuple[float, float] = (0.0, 0.0)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    bookies_s: float = 0.0
    machine_busy: float = 0.0  # of all cores, every process (0 to 1)
    family: list[psutil.Process] | None = None
    family_used: tuple[float, int] = (0.0, 0)
    disk: int = 0
    others_s: float = 0.0  # CPU used outside this process and its descendants
    others_written: int = 0  # bytes written to the disks by others (the kernel counts)

    def start(self) -> Span:
        gc.collect()
        gc.freeze()
        self.bookies = bookies_cpu_s(self.cluster)
        me = psutil.Process()
        self.family = [me, *me.children(recursive=True)]
        self.family_used = family_usage(self.family)
        self.disk = disk_written()
        self.machine = machine_cpu_s()
        self.cpu = time.process_time()
        self.started = time.monotonic()
        return self

    def stop(self) -> Span:
        self.wall_s = time.monotonic() - self.started
        self.cpu_s = time.process_time() - self.cpu
        self.bookies_s = bookies_cpu_s(self.cluster) - self.bookies
        busy, total = (now - then for now, then in zip(machine_cpu_s(), self.machine, strict=True))
        self.machine_busy = busy / total if total > 0 else math.nan
        assert self.family is not None
        family_cpu, family_written = family_usage(self.family)
        # (a span shorter than the machine counters' tick shows no time at all: nothing seen)
        self.others_s = (
            busy / total * psutil.cpu_count() * self.wall_s - (family_cpu - self.family_used[0])
            if total > 0
            else 0.0
        )
        self.others_written = disk_written() - self.disk - (family_written - self.family_used[1])
        gc.unfreeze()
        return self

    def per_record(self, records: int) -> dict[str, float]:
        count = max(records, 1)
        return {
            "client_cpu_us_per_record": self.cpu_s / count * 1e6,
            "bookies_cpu_us_per_record": self.bookies_s / count * 1e6,
            "client_cpu_percent": 100 * self.cpu_s / max(self.wall_s, 1e-9),
            "machine_cpu_busy_percent": 100 * self.machine_busy,
            # other processes and kernel threads (I/O, loopback), in % of one core: a high
            # figure means the run shared the machine with something else
            "others_cpu_percent": 100 * self.others_s / max(self.wall_s, 1e-9),
            # written to the disks, less what this process and its descendants wrote: file
            # system journal and metadata, and other processes (their fsyncs slow the bookies')
            "others_disk_mb_per_s": self.others_written / max(self.wall_s, 1e-9) / 1e6,
        }


def percentiles_ms(values: array[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"p50_ms": math.nan, "p99_ms": math.nan, "p99.9_ms": math.nan, "max_ms": math.nan}

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {"p50_ms": at(0.5), "p99_ms": at(0.99), "p99.9_ms": at(0.999), "max_ms": at(1.0)}


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every numeric figure of the runs (booleans: true if all are)."""
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, bool):
            out[key] = all(run[key] for run in runs)
        elif isinstance(value, int | float):
            out[key] = statistics.median(run[key] for run in runs)
    return out


async def connect(uri: str) -> aio.BookKeeper:
    return await aio.BookKeeper.connect(uri)


async def produce(
    writer: LogWriter, payload: bytes, every: int, records: int, seconds: float
) -> int:
    """Appends ``payload`` until ``records`` were appended (0: no limit) or ``seconds`` passed
    (0: no limit), then flushes; the number appended. Every ``every`` records it awaits
    ``drain()`` and yields to the loop: below its high-water mark ``drain()`` returns without
    yielding, and the loop must run for entries to go out and acks to come in."""
    append = writer.append
    deadline = time.monotonic() + seconds if seconds else math.inf
    count = 0
    while not records or count < records:
        n = min(every, records - count) if records else every
        for _ in range(n):
            append(payload)
        count += n
        await writer.drain()
        await asyncio.sleep(0)
        if time.monotonic() >= deadline:
            break
    await writer.flush()
    return count


async def new_log(client: aio.BookKeeper, name: str, quorum: tuple[int, int, int]) -> LogNamespace:
    namespace = LogNamespace(client, NAMESPACE)
    await namespace.create_log(name, LogConfig(*quorum))
    return namespace


def log_name(mode: str, run: int) -> str:
    return f"{mode}-{run}-{os.getpid()}-{time.time_ns()}"


async def spawn(role: str, *args: str) -> asyncio.subprocess.Process:
    """This script in another process (a session of its own: Ctrl-C reaches this process,
    which kills it by its PID)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        SCRIPT,
        "--role",
        role,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
    )


async def first_line(process: asyncio.subprocess.Process, timeout_s: float) -> str:
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), timeout_s)
    if not line:
        await process.wait()
        raise RuntimeError(f"the {SCRIPT} subprocess exited ({process.returncode}) early")
    return line.decode()


async def kill(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await process.wait()


async def measured_runs(
    label: str, args: argparse.Namespace, one: Callable[[int], Awaitable[dict[str, Any]]]
) -> tuple[list[dict[str, Any]], int]:
    """``args.runs`` runs of ``one``, and how many were discarded: with ``--max-others-cpu``,
    a run during which other processes (another test run on a shared machine) used more CPU
    than that is run again, up to ``--max-discarded`` times in all, after a pause."""
    kept: list[dict[str, Any]] = []
    discarded = 0
    while len(kept) < args.runs:
        figures = await one(len(kept) + discarded)
        others = figures.get("others_cpu_percent", figures.get("writer_others_cpu_percent", 0.0))
        if args.max_others_cpu and others > args.max_others_cpu and discarded < args.max_discarded:
            discarded += 1
            say(
                f"  {label}: run discarded, others used {others:.0f} % of a core: " + brief(figures)
            )
            await asyncio.sleep(DISCARD_PAUSE_S)
            continue
        kept.append(figures)
        say(f"  {label}, run {len(kept)}: " + brief(figures))
    return kept, discarded


# -- append -------------------------------------------------------------------------------------


async def append_run(
    cluster: LocalCluster, size: int, run: int, args: argparse.Namespace
) -> dict[str, Any]:
    client = await connect(cluster.metadata_uri)
    try:
        name = log_name("append", run)
        namespace = await new_log(client, name, args.quorum)
        writer = await namespace.open_writer(
            name, batch_bytes=args.batch_bytes, flush_delay_ms=args.flush_delay_ms
        )
        payload = os.urandom(size)
        span = Span(cluster).start()
        try:
            records = await produce(writer, payload, args.yield_every, 0, args.seconds)
        finally:
            span.stop()
        rolls = writer.rolls
        await writer.close()
    finally:
        await client.close()
    return {
        "records": records,
        "seconds": span.wall_s,
        "records_per_s": records / span.wall_s,
        "mb_per_s": records * size / span.wall_s / 1e6,
        **span.per_record(records),
        "rolls": rolls,
    }


async def append_mode(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {}
    discarded = 0
    for size in args.sizes:

        def one(run: int, size: int = size) -> Awaitable[dict[str, Any]]:
            bound = args.seconds + args.run_timeout
            return asyncio.wait_for(append_run(cluster, size, run, args), bound)

        runs[str(size)], dropped = await measured_runs(f"append {size} B", args, one)
        discarded += dropped
    median = {size: medians(values) for size, values in runs.items()}
    targets = {}
    if "100" in median:
        targets["100 B records >= 500,000 records/s"] = median["100"]["records_per_s"] >= 500_000
    if "1024" in median:
        targets["1 KiB records >= 150 MB/s"] = median["1024"]["mb_per_s"] >= 150
    for size, figures in median.items():
        say(
            f"append, {size} B records, median of {args.runs}: "
            f"{figures['records_per_s']:,.0f} records/s ({figures['mb_per_s']:,.1f} MB/s), "
            f"client CPU {figures['client_cpu_us_per_record']:.2f} µs/record "
            f"({figures['client_cpu_percent']:.0f} % of a core), bookies' CPU "
            f"{figures['bookies_cpu_us_per_record']:.2f} µs/record, rolls {figures['rolls']:g}; "
            f"machine {figures['machine_cpu_busy_percent']:.0f} % busy, others "
            f"{figures['others_cpu_percent']:.0f} % of a core"
        )
    return {"median": median, "runs": runs, "discarded": discarded, "targets": targets}


# -- tail ---------------------------------------------------------------------------------------


class AckSampler:
    """The acknowledgement time of the first record of each tick, its append-to-acknowledgement
    latency, and the 100 ms of appends in which that passed ``SLOW_LAG_S``."""

    def __init__(self) -> None:
        self.latencies = array("d")
        self.slow: dict[float, float] = {}
        self.first_numbers = array("q")  # of each acknowledged tick, increasing
        self.acked_at = array("d")  # time.time() of its acknowledgement

    def sample(self, pending: PendingAppend, number: int, stamp: float, since: float) -> None:
        def acknowledged(done: PendingAppend) -> None:
            try:
                done.result()
            except Exception:
                return
            now = time.time()
            self.first_numbers.append(number)
            self.acked_at.append(now)
            latency = now - stamp
            self.latencies.append(latency)
            if latency > SLOW_LAG_S:
                bucket = int(since * 10) / 10
                self.slow[bucket] = max(self.slow.get(bucket, 0.0), latency)

        pending.add_done_callback(acknowledged)

    def lags_from_ack(self, numbers: array[int], receipts: array[float]) -> array[float]:
        """Each received record's receipt time - the acknowledgement time of the first record
        of its tick: acknowledgements come in order, so that is at least its own lag from its
        acknowledgement (records of a tick not sampled are left out)."""
        lags = array("d")
        firsts, acked = self.first_numbers, self.acked_at
        for number, receipt in zip(numbers, receipts, strict=True):
            tick = bisect.bisect_right(firsts, number) - 1
            if tick >= 0:
                lags.append(receipt - acked[tick])
        return lags

    def figures(self) -> dict[str, Any]:
        found = percentiles_ms(self.latencies)
        return {
            "ack_p50_ms": found["p50_ms"],
            "ack_p99_ms": found["p99_ms"],
            "ack_max_ms": found["max_ms"],
            "slow_ack_windows": [[t, round(v * 1000, 1)] for t, v in sorted(self.slow.items())],
        }


async def paced_writer(
    writer: LogWriter, cluster: LocalCluster, args: argparse.Namespace
) -> tuple[AckSampler, dict[str, Any]]:
    """Appends at ``args.rate`` records/s on a 1 ms timer for warm-up + window + 0.5 s, then the
    STOP record; the acknowledgements sampled and the writer's figures over the window."""
    rate, warmup, window = args.rate, args.warmup, args.tail_seconds
    total_s = warmup + window + 0.5
    pad = bytes(max(0, args.record_size - HEADER.size))
    pack = HEADER.pack
    append = writer.append
    delays = array("d")
    acks = AckSampler()
    span = Span(cluster)
    wall0 = time.time()
    t0 = time.monotonic()
    sent = 0
    window_start: int | None = None
    window_end: int | None = None
    while True:
        elapsed = time.monotonic() - t0
        if elapsed >= total_s:
            break
        if window_start is None and elapsed >= warmup:
            window_start = sent
            span.start()
        elif window_start is not None and window_end is None and elapsed >= warmup + window:
            window_end = sent
            span.stop()
        due = int(elapsed * rate) + 1
        if due > sent:
            if window_start is not None and window_end is None:
                delays.append(elapsed - sent / rate)
                stamp = time.time()
                pending = append(pack(stamp, wall0 + sent / rate, sent) + pad)
                acks.sample(pending, sent, stamp, elapsed - warmup)
                sent += 1
            for number in range(sent, due):
                append(pack(time.time(), wall0 + number / rate, number) + pad)
            sent = due
        await writer.drain()
        await asyncio.sleep(
            max(0.0, t0 + (math.floor(elapsed * 1000) + 1) / 1000 - time.monotonic())
        )
    append(pack(time.time(), 0.0, STOP) + pad)
    await writer.flush()
    assert window_start is not None and window_end is not None
    appended = window_end - window_start
    return acks, {
        "appended_per_s": appended / window,
        "kept_rate": appended >= 0.99 * rate * window,
        "schedule_delay_p99_ms": percentiles_ms(delays)["p99_ms"],
        "schedule_delay_max_ms": percentiles_ms(delays)["max_ms"],
        **acks.figures(),
        **{f"writer_{k}": v for k, v in span.per_record(appended).items()},
        "rolls": writer.rolls,
    }


async def tail_run(cluster: LocalCluster, run: int, args: argparse.Namespace) -> dict[str, Any]:
    client = await connect(cluster.metadata_uri)
    name = log_name("tail", run)
    process = None
    receipts_path = os.path.join(cluster.base_directory, f"tail-receipts-{run}")
    try:
        namespace = await new_log(client, name, args.quorum)
        writer = await namespace.open_writer(
            name, batch_bytes=args.batch_bytes, flush_delay_ms=args.flush_delay_ms
        )
        process = await spawn(
            "tail-reader",
            f"--uri={cluster.metadata_uri}",
            f"--log={name}",
            f"--rate={args.rate}",
            f"--warmup={args.warmup}",
            f"--tail-seconds={args.tail_seconds}",
            f"--run-timeout={args.run_timeout}",
            f"--receipts={receipts_path}",
        )
        await first_line(process, SUBPROCESS_START_S)  # the reader is at "latest"
        acks, written = await paced_writer(writer, cluster, args)
        await writer.close()
        read = json.loads(await first_line(process, args.run_timeout))
        await process.wait()
    finally:
        if process is not None:
            await kill(process)
        await client.close()
    numbers, receipts = read_receipts(receipts_path)
    os.unlink(receipts_path)
    from_ack = percentiles_ms(acks.lags_from_ack(numbers, receipts))
    return {
        **{f"from_ack_{k}": v for k, v in from_ack.items()},
        **read,
        **written,
    }


def write_receipts(path: str, numbers: array[int], receipts: array[float]) -> None:
    """The tail reader's measured records: their numbers and receipt times (time.time())."""
    with open(path, "wb") as out:
        out.write(struct.pack("<q", len(numbers)))
        numbers.tofile(out)
        receipts.tofile(out)


def read_receipts(path: str) -> tuple[array[int], array[float]]:
    numbers, receipts = array("q"), array("d")
    with open(path, "rb") as source:
        (count,) = struct.unpack("<q", source.read(8))
        numbers.fromfile(source, count)
        receipts.fromfile(source, count)
    return numbers, receipts


async def tail_reader(args: argparse.Namespace) -> dict[str, Any]:
    """The reader's side of ``tail``: prints a line once it is at "latest", then its figures."""
    client = await connect(args.uri)
    try:
        reader = await LogNamespace(client, NAMESPACE).open_reader(args.log, "latest")
        print("ready", flush=True)
        lags, due_lags = array("d"), array("d")
        numbers, receipts = array("q"), array("d")
        slow: dict[float, float] = {}  # 100 ms of appends (from the window's start) -> max lag
        received = gaps = 0
        expected = 0
        wall0 = math.nan
        span = Span(None)
        async with asyncio.timeout(args.warmup + args.tail_seconds + args.run_timeout):
            while True:
                records = await reader.read_batch()
                now = time.time()
                if not records:
                    break
                if not received:
                    span.start()
                for record in records:
                    stamp, due, number = HEADER.unpack_from(record.data)
                    if number == STOP:
                        break
                    if not received:
                        wall0 = due - number / args.rate
                    gaps += number != expected
                    expected = number + 1
                    received += 1
                    if wall0 + args.warmup <= due < wall0 + args.warmup + args.tail_seconds:
                        lags.append(now - stamp)
                        due_lags.append(now - due)
                        numbers.append(number)
                        receipts.append(now)
                        if now - stamp > SLOW_LAG_S:
                            bucket = int((due - wall0 - args.warmup) * 10) / 10
                            slow[bucket] = max(slow.get(bucket, 0.0), now - stamp)
                else:
                    continue
                break
        span.stop()
        await reader.close()
    finally:
        await client.close()
    write_receipts(args.receipts, numbers, receipts)
    return {
        **percentiles_ms(lags),
        "lag_from_due_p99_ms": percentiles_ms(due_lags)["p99_ms"],
        "measured_records": len(lags),
        "received": received,
        "gaps": gaps,
        "reader_client_cpu_us_per_record": span.cpu_s / max(received, 1) * 1e6,
        "slow_windows": [[t, round(lag * 1000, 1)] for t, lag in sorted(slow.items())],
    }


async def tail_mode(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    bound = args.warmup + args.tail_seconds + 2 * args.run_timeout + SUBPROCESS_START_S
    runs, discarded = await measured_runs(
        "tail", args, lambda run: asyncio.wait_for(tail_run(cluster, run, args), bound)
    )
    median = medians(runs)
    say(
        f"tail, {args.record_size} B records at {args.rate:,.0f} records/s, reader in another "
        f"process, {args.tail_seconds:g} s after {args.warmup:g} s of warm-up, median of "
        f"{args.runs}: lag from acknowledgement p50 {median['from_ack_p50_ms']:.2f} ms, p99 "
        f"{median['from_ack_p99_ms']:.2f} ms, p99.9 {median['from_ack_p99.9_ms']:.2f} ms, max "
        f"{median['from_ack_max_ms']:.2f} ms; lag from append p50 {median['p50_ms']:.2f} ms, p99 "
        f"{median['p99_ms']:.2f} ms, p99.9 {median['p99.9_ms']:.2f} ms, max "
        f"{median['max_ms']:.2f} ms; writer appended "
        f"{median['appended_per_s']:,.0f}/s (kept the rate in every run: {median['kept_rate']}, "
        f"schedule delay p99 {median['schedule_delay_p99_ms']:.2f} ms), writer CPU "
        f"{median['writer_client_cpu_us_per_record']:.2f} µs/record, reader CPU "
        f"{median['reader_client_cpu_us_per_record']:.2f} µs/record, bookies' CPU "
        f"{median['writer_bookies_cpu_us_per_record']:.2f} µs/record; append-to-ack p99 "
        f"{median['ack_p99_ms']:.2f} ms; machine {median['writer_machine_cpu_busy_percent']:.0f} "
        f"% busy, others {median['writer_others_cpu_percent']:.0f} % of a core"
    )
    return {
        "median": median,
        "runs": runs,
        "discarded": discarded,
        "targets": {"p99 lag from acknowledgement < 10 ms": median["from_ack_p99_ms"] < 10},
    }


# -- catch-up reads -----------------------------------------------------------------------------


async def catchup_run(cluster: LocalCluster, run: int, args: argparse.Namespace) -> dict[str, Any]:
    name = log_name("catchup", run)
    client = await connect(cluster.metadata_uri)
    try:
        namespace = await new_log(client, name, args.quorum)
        writer = await namespace.open_writer(
            name, batch_bytes=args.batch_bytes, flush_delay_ms=args.flush_delay_ms
        )
        await produce(writer, os.urandom(args.record_size), args.yield_every, args.records, 0)
        await writer.close()
        segments = len(writer.metadata.segments)
    finally:
        await client.close()
    client = await connect(cluster.metadata_uri)
    try:
        namespace = LogNamespace(client, NAMESPACE)
        await namespace.read_log(name)  # connected to the metadata store before timing
        read = 0
        span = Span(cluster).start()
        try:
            reader = await namespace.open_reader(name, "earliest", follow=False)
            while records := await reader.read_batch():
                read += len(records)
        finally:
            span.stop()
        await reader.close()
    finally:
        await client.close()
    if read != args.records:
        raise RuntimeError(f"catch-up read {read:,} records of {args.records:,}")
    return {
        "records": read,
        "segments": segments,
        "seconds": span.wall_s,
        "records_per_s": read / span.wall_s,
        "mb_per_s": read * args.record_size / span.wall_s / 1e6,
        **span.per_record(read),
    }


async def catchup_mode(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    bound = args.run_timeout * 2
    runs, discarded = await measured_runs(
        "catchup", args, lambda run: asyncio.wait_for(catchup_run(cluster, run, args), bound)
    )
    median = medians(runs)
    say(
        f"catchup, {args.records:,} records of {args.record_size} B, follow=False, median of "
        f"{args.runs}: {median['records_per_s']:,.0f} records/s ({median['mb_per_s']:,.1f} "
        f"MB/s), client CPU {median['client_cpu_us_per_record']:.2f} µs/record, bookies' CPU "
        f"{median['bookies_cpu_us_per_record']:.2f} µs/record; others "
        f"{median['others_cpu_percent']:.0f} % of a core"
    )
    target = {">= 1,000,000 records/s": median["records_per_s"] >= 1_000_000}
    return {"median": median, "runs": runs, "discarded": discarded, "targets": target}


# -- recovery -----------------------------------------------------------------------------------


async def recovery_writer(args: argparse.Namespace) -> dict[str, Any]:
    """The killed writer of ``recovery``: two segments of ``--segment-records`` records, the
    first never closed; prints its figures and waits to be killed."""

    async def abandon(self: LogWriter, *args: object, **kwargs: object) -> None:
        return None  # killed in the middle of a roll: the previous segment stays open

    LogWriter._close_segment = abandon  # type: ignore[method-assign,assignment]
    client = await connect(args.uri)
    writer = await LogNamespace(client, NAMESPACE).open_writer(
        args.log, batch_bytes=args.batch_bytes, flush_delay_ms=args.flush_delay_ms
    )
    payload = os.urandom(args.record_size)
    for segment in range(2):
        await produce(writer, payload, args.yield_every, args.segment_records, 0)
        if segment == 0:
            await writer.roll()
    print(json.dumps({"next_sequence": writer.next_sequence}), flush=True)
    await asyncio.sleep(args.run_timeout)  # SIGKILLed before this ends
    return {}


async def recovery_run(cluster: LocalCluster, run: int, args: argparse.Namespace) -> dict[str, Any]:
    name = log_name("recovery", run)
    client = await connect(cluster.metadata_uri)
    try:
        namespace = await new_log(client, name, args.quorum)
        process = await spawn(
            "recovery-writer",
            f"--uri={cluster.metadata_uri}",
            f"--log={name}",
            f"--segment-records={args.segment_records}",
            f"--record-size={args.record_size}",
            f"--batch-bytes={args.batch_bytes}",
            f"--flush-delay-ms={args.flush_delay_ms}",
            f"--run-timeout={args.run_timeout}",
        )
        try:
            written = json.loads(await first_line(process, SUBPROCESS_START_S))
        finally:
            await kill(process)
        description = await namespace.describe(name)
        open_before = {s.sequence for s in description.metadata.segments if s.is_open}
        started = time.monotonic()
        writer = await namespace.open_writer(name)
        seconds = time.monotonic() - started
        recovered = [s for s in writer.metadata.segments if s.sequence in open_before]
        next_sequence = writer.next_sequence
        await writer.close()
    finally:
        await client.close()
    if next_sequence != written["next_sequence"] or any(s.is_open for s in recovered):
        raise RuntimeError(
            f"recovery: the new writer starts at {next_sequence}, the killed one had appended "
            f"{written['next_sequence']}; recovered segments {recovered}"
        )
    return {
        "seconds": seconds,
        "open_segments_before": len(open_before),
        "recovered_segments": len(recovered),
        "recovered_records": sum(s.record_count for s in recovered),
        "recovered_entries": sum(s.last_entry + 1 for s in recovered),
    }


async def recovery_mode(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    bound = SUBPROCESS_START_S + args.run_timeout
    runs, discarded = await measured_runs(
        "recovery", args, lambda run: asyncio.wait_for(recovery_run(cluster, run, args), bound)
    )
    median = medians(runs)
    say(
        f"recovery, open_writer over {median['open_segments_before']:g} open segments of "
        f"{args.segment_records:,} records (writer SIGKILLed mid-roll), median of {args.runs}: "
        f"{median['seconds'] * 1000:,.0f} ms, {median['recovered_segments']:g} segments and "
        f"{median['recovered_records']:,.0f} records ({median['recovered_entries']:,.0f} "
        "entries) recovered"
    )
    return {
        "median": median,
        "runs": runs,
        "discarded": discarded,
        "targets": {"< 1 s": median["seconds"] < 1},
    }


# -- the command --------------------------------------------------------------------------------

JSON_OUTPUT = False


def say(line: str) -> None:
    print(line, file=sys.stderr if JSON_OUTPUT else sys.stdout, flush=True)


def brief(figures: dict[str, Any]) -> str:
    return ", ".join(
        f"{k} {v:,.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()
    )


MODE_RUNNERS: dict[str, Callable[[LocalCluster, argparse.Namespace], Awaitable[dict[str, Any]]]] = {
    "append": append_mode,
    "tail": tail_mode,
    "catchup": catchup_mode,
    "recovery": recovery_mode,
}
ROLES = {"tail-reader": tail_reader, "recovery-writer": recovery_writer}


def run_mode(mode: str, args: argparse.Namespace) -> None:
    """One mode on a cluster of its own; its JSON line with ``--json``."""
    started = time.monotonic()
    with LocalCluster(3, bookie_args=shlex.split(args.bookie_args)) as cluster:
        result = run_loop(MODE_RUNNERS[mode](cluster, args))  # type: ignore[arg-type]
    for target, met in result["targets"].items():
        say(f"  target {target}: {'met' if met else 'MISSED'}")
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "role", "uri", "log")}
        line = {"mode": mode, "settings": settings, "elapsed_s": time.monotonic() - started}
        print(json.dumps({**line, **result}), flush=True)


def new_parser(description: str | None, modes: tuple[str, ...]) -> argparse.ArgumentParser:
    """A benchmark's parser with what every one takes first: the mode (or all), --runs, --json."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", choices=(*modes, "all"), default="all")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    return parser


def add_common_arguments(parser: argparse.ArgumentParser, roles: tuple[str, ...]) -> None:
    """The options every benchmark of logs takes (this one's and spark_bench.py's)."""
    parser.add_argument(
        "--bookie-args",
        default="",
        help="extra options of every bookie, e.g. --bookie-args='--flush-interval-ms 60000'",
    )
    parser.add_argument(
        "--max-others-cpu",
        type=float,
        default=0.0,
        help="run again a run during which other processes used more CPU than this, in %% of "
        "one core (0: keep every run); kernel threads take ~10 %% here when the machine is quiet",
    )
    parser.add_argument("--max-discarded", type=int, default=6, help="runs run again, in all")
    parser.add_argument("--role", choices=roles, help=argparse.SUPPRESS)
    parser.add_argument("--uri", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)


def arguments() -> argparse.Namespace:
    parser = new_parser(__doc__, MODES)
    parser.add_argument("--seconds", type=float, default=5.0, help="append: per run")
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[100, 1024],
        help="append: record sizes in bytes",
    )
    parser.add_argument(
        "--quorum",
        type=lambda text: tuple(int(x) for x in text.split(",")),
        default=(3, 2, 2),
        help="the logs' ledgers: ensemble,write quorum,ack quorum (3 bookies)",
    )
    parser.add_argument("--record-size", type=int, default=100, help="tail, catchup, recovery")
    parser.add_argument("--rate", type=float, default=100_000, help="tail: records/s")
    parser.add_argument("--warmup", type=float, default=2.0, help="tail: seconds left out")
    parser.add_argument("--tail-seconds", type=float, default=10.0, help="tail: measured")
    parser.add_argument("--records", type=int, default=2_000_000, help="catchup: log length")
    parser.add_argument("--segment-records", type=int, default=10_000, help="recovery")
    parser.add_argument("--batch-bytes", type=int, default=256 * 1024, help="the writers'")
    parser.add_argument("--flush-delay-ms", type=float, default=1.0, help="the writers'")
    parser.add_argument("--yield-every", type=int, default=1000, help="append: records")
    parser.add_argument(
        "--run-timeout", type=float, default=300.0, help="bound on each run's own steps (s)"
    )
    add_common_arguments(parser, tuple(ROLES))
    parser.add_argument("--receipts", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    global JSON_OUTPUT
    args = arguments()
    if args.role:
        result = run_loop(ROLES[args.role](args))
        print(json.dumps(result), flush=True)
        return
    JSON_OUTPUT = args.json
    for mode in MODES if args.mode == "all" else (args.mode,):
        run_mode(mode, args)


if __name__ == "__main__":
    main()
