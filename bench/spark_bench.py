"""The targets of the Spark connector (issue 19), measured on Spark ``local[2]`` on this
2-core machine, over a local cluster of three bookie processes (embedded SQLite metadata), logs
of ledgers 3/2/2 (``--quorum``), CRC32C, fsync before every ack (the bookies' defaults). Each
mode runs on a cluster of its own, ``--runs`` times, in one Spark session
(``bookkeeper_py.spark.session.spark_session``) started once for the process; the medians
are printed.

    python bench/spark_bench.py read   [--runs 3] [--records 10000000]
    python bench/spark_bench.py stream [--runs 3] [--rate 10000] [--warmup 10] [--window 10]
    python bench/spark_bench.py write  [--runs 3] [--records 10000000]
    python bench/spark_bench.py all    [--json]

read: ``--records`` 100 B records are appended to log ``bench/read`` with the asyncio log writer
and the writer closed (not timed); two warm-up reads, the timed job with the rows counted
(``observe``) and the timed job itself, fork the Python workers, let the JVM compile the job's
code and fill the page cache; then each run times
``spark.read.format("bookkeeper")...load().write.format("noop").mode("overwrite").save()``
end to end (planning included). Target: >= 2,000,000 records/s once the session is warm
(Spark's own ceiling for Arrow batches from a Python data source is ~4.6 M rows/s on these 2
cores: ``../shared/reference/pyspark-datasource.md``).

stream: a writer in another process (its own event loop and GIL) appends 100 B records at
``--rate`` records/s (paced by a 1 ms timer, as ``log_bench.py tail``), each carrying its
append time (``time.time()``) and its number; a Structured Streaming query reads the log
(``startingOffsets`` latest, ``trigger(processingTime=--trigger-ms)``) into ``foreachBatch``,
which pulls the batch's record headers to the driver (``toArrow()`` of the first 16 bytes of
each payload: that is when the records have reached the sink) and takes, for each record, lag =
now - its append time. The lags of the records appended over ``--window`` s after ``--warmup`` s
are reported; every one of them must arrive once. Target: p99 lag from append to the sink
< 1 s at 10,000 records/s with a 100 ms trigger (and the writer kept the rate).

stream diagnostics: the median of each part of the micro-batches that started in the window,
from Spark's progress reports (``batch_<part>_p50_ms``: ``addBatch`` is the ``foreachBatch``
function, the log's read included; ``walCommit`` and ``commitOffsets`` write the checkpoint's
offset and commit logs; ``latestOffset`` asks the source where the log ends), the interval
between the batches that reached the sink (``batch_interval_*``) and how long their
``toArrow()`` took (``pull_*``).

write: ``spark.range(--records).selectExpr(<100 B binary payload: 92 constant bytes, the id>)
.write.format("bookkeeper").mode("append").save()`` timed end to end (tasks' ledgers written,
the job's commit), after a warm-up write of ``--warmup-records``; each run checks that the log
holds exactly ``--records`` more records (``describe``). Target: >= 500,000 records/s.

CPU: the client's CPU is that of this process's tree without the bookies (and without the
stream mode's writer): the Spark JVM, its Python workers (data source planners, the streaming
source runner, the executors' workers) and this driver process, reaped children included
(psutil). It is split into the JVM's (``jvm_cpu_us_per_record``) and the Python processes'
(``python_cpu_us_per_record``, this driver included). The bookies' is the sum of the three
bookie processes' CPU. Every run also reports the CPU used by processes outside this process
tree (``others_cpu_percent``, in % of one core; kernel threads take ~10 % on a quiet machine):
``--max-others-cpu 30`` runs a disturbed run again (``--max-discarded`` times at most).

With ``--json`` the summary goes to stderr and one JSON line per mode to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import shlex
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# the measuring helpers of the log benchmark, next to this script (its directory is on the path)
import log_bench
import numpy as np
import psutil
from log_bench import (
    DISCARD_PAUSE_S,
    add_common_arguments,
    bookies_cpu_s,
    brief,
    connect,
    disk_written,
    machine_cpu_s,
    medians,
    new_log,
    new_parser,
    percentiles_ms,
    produce,
    run_loop,
    say,
)

from bookkeeper_py.log import LogNamespace
from bookkeeper_py.testing import LocalCluster

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SCRIPT = os.path.abspath(__file__)
# log_bench's namespace (new_log makes logs there); each mode has a cluster of its own, so the
# logs' names are short, as real ones are: every row read carries it (the column log)
NAMESPACE = "bench"
MASTER = "local[2]"
MODES = ("read", "stream", "write")
# A streamed record: its append time (time.time()) and its number (the rest is padding).
STAMP = struct.Struct("<dq")
# A written record: a constant, then the row's id (8 bytes, big-endian). Cheap for the JVM to
# make: lpad(cast(id as string), 100) costs it ~0.75 µs a row (UTF8String.lpad copies the pad
# a byte at a time), more than the connector's whole write path.
WRITE_PAYLOAD_SQL = "concat(X'{constant}', unhex(lpad(hex(id), 16, '0'))) AS payload"
SUBPROCESS_START_S = 120.0  # the stream writer's first line (connected, opened)
FIRST_BATCH_S = 120.0  # a streaming query's first micro-batch (the runner's Python process)


# -- measuring ----------------------------------------------------------------------------------


@dataclass
class TreeUsage:
    """CPU seconds (reaped children's included) and bytes written by this process tree so far:
    in all, by the client (without the excluded subtrees: the bookies, the stream writer), and
    the client's split into the JVM and the Python processes."""

    family_cpu: float = 0.0
    family_written: int = 0
    client_cpu: float = 0.0
    jvm_cpu: float = 0.0

    @property
    def python_cpu(self) -> float:
        return self.client_cpu - self.jvm_cpu


def tree_usage(excluded: frozenset[int]) -> TreeUsage:
    """This process and its descendants (at most a few dozen processes), by walking down."""
    usage = TreeUsage()
    pending: list[tuple[psutil.Process, bool]] = [(psutil.Process(), True)]
    for _ in range(10_000):
        if not pending:
            break
        process, client = pending.pop()
        client = client and process.pid not in excluded
        try:
            times = process.cpu_times()
            written = process.io_counters().write_bytes
            children = process.children()
            java = process.name().startswith("java")
        except psutil.NoSuchProcess:
            continue
        cpu = times.user + times.system + times.children_user + times.children_system
        usage.family_cpu += cpu
        usage.family_written += written
        if client:
            usage.client_cpu += cpu
            usage.jvm_cpu += cpu if java else 0.0
        pending.extend((child, client) for child in children)
    return usage


@dataclass
class Span:
    """Wall time, the client's CPU (this process tree without ``excluded``), the bookies' CPU
    and what other processes used over a span."""

    cluster: LocalCluster
    excluded: frozenset[int] = frozenset()
    started: float = 0.0
    before: TreeUsage = field(default_factory=TreeUsage)
    bookies: float = 0.0
    machine: tuple[float, float] = (0.0, 0.0)
    disk: int = 0
    wall_s: float = 0.0
    client_s: float = 0.0
    jvm_s: float = 0.0
    python_s: float = 0.0
    bookies_s: float = 0.0
    machine_busy: float = 0.0  # of all cores, every process (0 to 1)
    others_s: float = 0.0  # CPU used outside this process tree
    others_written: int = 0  # bytes written to the disks by others (the kernel counts)

    def _excluded(self) -> frozenset[int]:
        bookies = {b.process.pid for b in self.cluster.bookies if b.process is not None}
        return self.excluded | bookies

    def start(self) -> Span:
        self.bookies = bookies_cpu_s(self.cluster)
        self.before = tree_usage(self._excluded())
        self.disk = disk_written()
        self.machine = machine_cpu_s()
        self.started = time.monotonic()
        return self

    def stop(self) -> Span:
        self.wall_s = time.monotonic() - self.started
        busy, total = (now - then for now, then in zip(machine_cpu_s(), self.machine, strict=True))
        after = tree_usage(self._excluded())
        self.bookies_s = bookies_cpu_s(self.cluster) - self.bookies
        self.client_s = after.client_cpu - self.before.client_cpu
        self.jvm_s = after.jvm_cpu - self.before.jvm_cpu
        self.python_s = after.python_cpu - self.before.python_cpu
        self.machine_busy = busy / total if total > 0 else math.nan
        family = after.family_cpu - self.before.family_cpu
        self.others_s = busy / total * psutil.cpu_count() * self.wall_s - family if total else 0.0
        written = after.family_written - self.before.family_written
        self.others_written = disk_written() - self.disk - written
        return self

    def per_record(self, records: int) -> dict[str, float]:
        count, wall = max(records, 1), max(self.wall_s, 1e-9)
        return {
            "client_cpu_us_per_record": self.client_s / count * 1e6,
            "jvm_cpu_us_per_record": self.jvm_s / count * 1e6,
            "python_cpu_us_per_record": self.python_s / count * 1e6,
            "bookies_cpu_us_per_record": self.bookies_s / count * 1e6,
            "client_cpu_percent": 100 * self.client_s / wall,  # of one core
            "bookies_cpu_percent": 100 * self.bookies_s / wall,
            "machine_cpu_busy_percent": 100 * self.machine_busy,
            "others_cpu_percent": 100 * self.others_s / wall,
            "others_disk_mb_per_s": self.others_written / wall / 1e6,
        }


def measured_runs(
    label: str, args: argparse.Namespace, one: Callable[[int], dict[str, Any]]
) -> tuple[list[dict[str, Any]], int]:
    """``args.runs`` runs of ``one``, and how many were discarded: with ``--max-others-cpu``,
    a run during which other processes used more CPU than that is run again, up to
    ``--max-discarded`` times in all, after a pause. (log_bench's runs its runs on an event
    loop; Spark's calls must stay on the thread of the active session, and a run has event
    loops of its own.)"""
    kept: list[dict[str, Any]] = []
    discarded = 0
    while len(kept) < args.runs:
        figures = one(len(kept) + discarded)
        others = figures["others_cpu_percent"]
        if args.max_others_cpu and others > args.max_others_cpu and discarded < args.max_discarded:
            discarded += 1
            say(
                f"  {label}: run discarded, others used {others:.0f} % of a core: " + brief(figures)
            )
            time.sleep(DISCARD_PAUSE_S)
            continue
        kept.append(figures)
        say(f"  {label}, run {len(kept)}: " + brief(figures))
    return kept, discarded


def throughput(args: argparse.Namespace, partitions: int, span: Any) -> dict[str, Any]:
    """A read or write run's figures: ``args.records`` records over ``span``."""
    return {
        "records": args.records,
        "partitions": partitions,
        "seconds": span.wall_s,
        "records_per_s": args.records / span.wall_s,
        "mb_per_s": args.records * args.record_size / span.wall_s / 1e6,
        **span.per_record(args.records),
    }


def rates_text(runs: list[dict[str, Any]], median: dict[str, Any]) -> str:
    return (
        f"{median['records_per_s']:,.0f} records/s ({median['mb_per_s']:,.1f} MB/s; runs "
        + " / ".join(f"{run['records_per_s']:,.0f}" for run in runs)
        + f"), {cpu_text(median)}"
    )


def cpu_text(median: dict[str, Any]) -> str:
    return (
        f"client CPU {median['client_cpu_us_per_record']:.2f} µs/record "
        f"({median['client_cpu_percent']:.0f} % of a core: JVM "
        f"{median['jvm_cpu_us_per_record']:.2f}, Python {median['python_cpu_us_per_record']:.2f}"
        f" µs/record), bookies' CPU {median['bookies_cpu_us_per_record']:.2f} µs/record; machine "
        f"{median['machine_cpu_busy_percent']:.0f} % busy, others "
        f"{median['others_cpu_percent']:.0f} % of a core"
    )


# -- Spark --------------------------------------------------------------------------------------


class Spark:
    """The one Spark session of this process, started when a mode first needs it."""

    session: SparkSession | None = None
    start_s = 0.0

    @classmethod
    def get(cls, args: argparse.Namespace) -> SparkSession:
        if cls.session is None:
            from bookkeeper_py.spark.session import spark_session

            # every micro-batch's progress is kept (for the durations of a batch's parts)
            conf = {"spark.sql.streaming.numRecentProgressUpdates": "10000"}
            conf.update(item.split("=", 1) for item in args.spark_conf)
            started = time.monotonic()
            cls.session = spark_session(MASTER, "bookkeeper-py-spark-bench", **conf)
            cls.session.sparkContext.setLogLevel("ERROR")
            cls.start_s = time.monotonic() - started
            say(f"  Spark {cls.session.version} {MASTER} session started in {cls.start_s:.1f} s")
        return cls.session

    @classmethod
    def stop(cls) -> None:
        if cls.session is not None:
            cls.session.stop()
            cls.session = None


def log_reader(spark: SparkSession, cluster: LocalCluster, name: str, **options: str) -> Any:
    reader = spark.read.format("bookkeeper").option("metadataServiceUri", cluster.metadata_uri)
    for key, value in {"log": f"{NAMESPACE}/{name}", **options}.items():
        reader = reader.option(key, value)
    return reader


async def next_sequence(uri: str, name: str) -> int:
    client = await connect(uri)
    try:
        return (await LogNamespace(client, NAMESPACE).describe(name)).next_sequence
    finally:
        await client.close()


# -- read ---------------------------------------------------------------------------------------


async def write_log(uri: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The log the read mode reads: ``--records`` records, the writer closed."""
    client = await connect(uri)
    try:
        namespace = await new_log(client, name, args.quorum)
        writer = await namespace.open_writer(
            name, batch_bytes=args.batch_bytes, flush_delay_ms=args.flush_delay_ms
        )
        started = time.monotonic()
        payload = os.urandom(args.record_size)
        records = await produce(writer, payload, args.yield_every, args.records, 0)
        await writer.close()
        seconds = time.monotonic() - started
        return {"records": records, "segments": len(writer.metadata.segments), "seconds": seconds}
    finally:
        await client.close()


async def planned_partitions(uri: str, name: str) -> int:
    """How many partitions Spark's read gets (the driver's plan, made here the same way)."""
    from bookkeeper_py.spark.options import source_options
    from bookkeeper_py.spark.source import plan_batch

    options = source_options(
        {"metadataServiceUri": uri, "log": f"{NAMESPACE}/{name}"}, streaming=False
    )
    return len(await plan_batch(options))


def read_mode(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    name = "read"
    written = run_loop(write_log(cluster.metadata_uri, name, args))
    say(
        f"  read: wrote {written['records']:,} records in {written['segments']} segments "
        f"({written['records'] / written['seconds']:,.0f} records/s, not timed)"
    )
    partitions = run_loop(planned_partitions(cluster.metadata_uri, name))
    spark = Spark.get(args)
    from pyspark.sql import Observation
    from pyspark.sql.functions import count, lit

    # the warm-up: the timed job with its rows counted, then the timed job itself (the JVM
    # compiles its code over the first runs of a plan)
    observation = Observation("warm-up")
    started = time.monotonic()
    frame = log_reader(spark, cluster, name).load()
    counting = frame.observe(observation, count(lit(1)).alias("records"))
    counting.write.format("noop").mode("overwrite").save()
    counted = observation.get["records"]
    if counted != args.records:
        raise RuntimeError(f"read: Spark counted {counted:,} records of {args.records:,}")
    log_reader(spark, cluster, name).load().write.format("noop").mode("overwrite").save()
    warmup_s = time.monotonic() - started
    say(f"  read: warm-up reads (one counted: {counted:,} records) in {warmup_s:.1f} s")

    def one(run: int) -> dict[str, Any]:
        frame = log_reader(spark, cluster, name).load()
        span = Span(cluster).start()
        frame.write.format("noop").mode("overwrite").save()
        span.stop()
        return throughput(args, partitions, span)

    runs, discarded = measured_runs("read", args, one)
    median = medians(runs)
    say(
        f"read, {args.records:,} records of {args.record_size} B in {partitions} partitions, "
        f"Spark {MASTER}, noop sink, median of {args.runs}: {rates_text(runs, median)}"
    )
    return {
        "median": median,
        "runs": runs,
        "discarded": discarded,
        "warmup_s": warmup_s,
        "log_written": written,
        "targets": {">= 2,000,000 records/s": median["records_per_s"] >= 2_000_000},
    }


# -- stream -------------------------------------------------------------------------------------


async def stream_writer(args: argparse.Namespace) -> dict[str, Any]:
    """The writer of ``stream``: prints its start, appends at ``--rate`` records/s on a 1 ms
    timer for warm-up + window + ``--tail-s``, then its figures (the measured window as record
    numbers)."""
    client = await connect(args.uri)
    try:
        writer = await LogNamespace(client, NAMESPACE).open_writer(
            args.log, batch_bytes=args.batch_bytes, flush_delay_ms=args.flush_delay_ms
        )
        rate, warmup, window = args.rate, args.warmup, args.window
        total_s = warmup + window + args.tail_s
        pad = bytes(max(0, args.record_size - STAMP.size))
        pack, append = STAMP.pack, writer.append
        delays = array("d")
        print(json.dumps({"started": time.time()}), flush=True)
        cpu0 = time.process_time()
        t0 = time.monotonic()
        sent = 0
        window_start = window_end = -1
        cpu_window = 0.0
        while True:
            elapsed = time.monotonic() - t0
            if elapsed >= total_s:
                break
            if window_start < 0 and elapsed >= warmup:
                window_start, cpu_window = sent, time.process_time()
            elif window_start >= 0 > window_end and elapsed >= warmup + window:
                window_end, cpu_window = sent, time.process_time() - cpu_window
            due = int(elapsed * rate) + 1
            if due > sent:
                if window_start >= 0 > window_end:
                    delays.append(elapsed - sent / rate)
                for number in range(sent, due):
                    append(pack(time.time(), number) + pad)
                sent = due
            await writer.drain()
            await asyncio.sleep(
                max(0.0, t0 + (math.floor(elapsed * 1000) + 1) / 1000 - time.monotonic())
            )
        await writer.flush()
        await writer.close()
    finally:
        await client.close()
    appended = window_end - window_start
    return {
        "appended": sent,
        "window_start": window_start,
        "window_end": window_end,
        "appended_per_s": appended / window,
        "kept_rate": appended >= 0.99 * rate * window,
        "schedule_delay_p99_ms": percentiles_ms(delays)["p99_ms"],
        "schedule_delay_max_ms": percentiles_ms(delays)["max_ms"],
        "writer_cpu_us_per_record": cpu_window / max(appended, 1) * 1e6,
        "writer_all_cpu_s": time.process_time() - cpu0,
    }


class LagSink:
    """The ``foreachBatch`` function: the batch's record headers to the driver, each record's
    lag = the time they are here - its append time; the last record (``expect``) sets
    ``done``."""

    def __init__(self) -> None:
        self.last = sys.maxsize
        self.highest = -1
        self.now = array("d")  # per batch
        self.rows = array("q")
        self.pull_s = array("d")  # the batch's toArrow(): its read, end to end
        self.stamps: list[np.ndarray] = []
        self.numbers: list[np.ndarray] = []
        self.done = threading.Event()

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        called = time.time()
        table = frame.selectExpr(f"substring(payload, 1, {STAMP.size}) AS head").toArrow()
        now = time.time()
        column = table.column("head").combine_chunks()
        heads = np.frombuffer(
            column.buffers()[2] or b"", dtype=np.dtype([("stamp", "<f8"), ("number", "<i8")])
        )[: len(column)]
        self.now.append(now)
        self.rows.append(len(heads))
        self.pull_s.append(now - called)
        if len(heads):
            self.stamps.append(heads["stamp"].copy())
            self.numbers.append(heads["number"].copy())
            self.highest = max(self.highest, int(heads["number"].max()))
            if self.highest >= self.last:
                self.done.set()

    def expect(self, last: int) -> None:
        """The last record's number, once the writer has told it."""
        self.last = last
        if self.highest >= last:
            self.done.set()

    def lags(self, low: int, high: int) -> tuple[np.ndarray, np.ndarray]:
        """Lags (s) and numbers of the records numbered [low, high), in arrival order."""
        lags = [now - stamps for now, stamps in zip(self.arrivals(), self.stamps, strict=True)]
        every_lag = np.concatenate(lags) if lags else np.zeros(0)
        numbers = np.concatenate(self.numbers) if self.numbers else np.zeros(0, np.int64)
        wanted = (numbers >= low) & (numbers < high)
        return every_lag[wanted], numbers[wanted]

    def pulls(self, start: float, window: float) -> dict[str, float]:
        """How long the batches that reached the sink in the window took to come (their
        ``toArrow()``: the read of the log and the transfer)."""
        pulls = array(
            "d",
            (
                s
                for now, s in zip(self.now, self.pull_s, strict=True)
                if start <= now < start + window
            ),
        )
        found = percentiles_ms(pulls)
        return {"pull_p50_ms": found["p50_ms"], "pull_p99_ms": found["p99_ms"]}

    def arrivals(self) -> list[float]:
        return [now for now, rows in zip(self.now, self.rows, strict=True) if rows]


def spawn_writer(cluster: LocalCluster, name: str, args: argparse.Namespace) -> subprocess.Popen:
    """This script as the stream writer, in a session of its own (killed by its PID)."""
    return subprocess.Popen(
        [
            sys.executable,
            SCRIPT,
            "--role=stream-writer",
            f"--uri={cluster.metadata_uri}",
            f"--log={name}",
            f"--rate={args.rate}",
            f"--warmup={args.warmup}",
            f"--window={args.window}",
            f"--tail-s={args.tail_s}",
            f"--record-size={args.record_size}",
            f"--batch-bytes={args.batch_bytes}",
            f"--flush-delay-ms={args.flush_delay_ms}",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def line_of(process: subprocess.Popen, timeout_s: float) -> dict[str, Any]:
    """The next JSON line of ``process`` within ``timeout_s`` (a thread reads it)."""
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not found or not found[0]:
        raise RuntimeError(f"the stream writer gave no line in {timeout_s:g} s")
    return json.loads(found[0])  # type: ignore[no-any-return]


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(30)


def wait_for_first_batch(query: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while query.lastProgress is None:
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the streaming query ran no batch in {timeout_s:g} s")
        time.sleep(0.05)


def batch_durations(progress: list[dict[str, Any]], start: float, window: float) -> dict[str, Any]:
    """The median of each part of the micro-batches that started in the measured window
    (Spark's ``durationMs``: latestOffset, queryPlanning, addBatch, walCommit, ...)."""
    parts: dict[str, list[float]] = {}
    for update in progress:
        began = datetime.datetime.fromisoformat(update["timestamp"]).timestamp()
        if start <= began < start + window:
            for part, ms in update.get("durationMs", {}).items():
                parts.setdefault(part, []).append(ms)
    return {
        f"batch_{part}_p50_ms": statistics.median(values) for part, values in sorted(parts.items())
    }


def stream_run(cluster: LocalCluster, run: int, args: argparse.Namespace) -> dict[str, Any]:
    name = f"stream-{run}"
    run_loop(make_log(cluster.metadata_uri, name, args))
    spark = Spark.get(args)
    checkpoint = tempfile.mkdtemp(prefix="checkpoint-", dir=cluster.base_directory)
    sink = LagSink()
    frame = (
        spark.readStream.format("bookkeeper")
        .option("metadataServiceUri", cluster.metadata_uri)
        .option("log", f"{NAMESPACE}/{name}")
        .option("startingOffsets", "latest")
        .load()
    )
    query = (
        frame.writeStream.foreachBatch(sink)
        .trigger(processingTime=f"{args.trigger_ms} milliseconds")
        .option("checkpointLocation", checkpoint)
        .start()
    )
    writer = None
    try:
        wait_for_first_batch(query, FIRST_BATCH_S)
        writer = spawn_writer(cluster, name, args)
        started = line_of(writer, SUBPROCESS_START_S)["started"]
        span = Span(cluster, frozenset({writer.pid}))
        time.sleep(max(0.0, started + args.warmup - time.time()))
        span.start()
        time.sleep(max(0.0, started + args.warmup + args.window - time.time()))
        span.stop()
        written = line_of(writer, args.tail_s + args.run_timeout)
        writer.wait(args.run_timeout)
        sink.expect(written["appended"] - 1)
        if not sink.done.wait(args.run_timeout):
            raise RuntimeError(
                f"stream: the last record did not reach the sink in {args.run_timeout:g} s"
            )
        progress = batch_durations(query.recentProgress, started + args.warmup, args.window)
    finally:
        if writer is not None:
            stop_process(writer)
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
    low, high = written["window_start"], written["window_end"]
    lags, numbers = sink.lags(low, high)
    missing = high - low - len(np.unique(numbers))
    arrivals = sink.arrivals()
    gaps = array("d", np.diff(arrivals)) if len(arrivals) > 1 else array("d")
    return {
        **percentiles_ms(array("d", lags)),
        "measured_records": len(lags),
        "missing": missing,
        "duplicates": len(numbers) - len(np.unique(numbers)),
        **written,
        "batches": len(sink.now),
        "records_per_batch": statistics.median(sink.rows) if sink.rows else 0,
        "batch_interval_p50_ms": percentiles_ms(gaps)["p50_ms"],
        "batch_interval_p99_ms": percentiles_ms(gaps)["p99_ms"],
        **progress,
        **sink.pulls(started + args.warmup, args.window),
        **span.per_record(high - low),
    }


async def make_log(uri: str, name: str, args: argparse.Namespace) -> None:
    client = await connect(uri)
    try:
        await new_log(client, name, args.quorum)
    finally:
        await client.close()


def stream_mode(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    runs, discarded = measured_runs("stream", args, lambda run: stream_run(cluster, run, args))
    median = medians(runs)
    say(
        f"stream, {args.record_size} B records at {args.rate:,.0f} records/s (writer in another "
        f"process), trigger {args.trigger_ms:g} ms, foreachBatch, {args.window:g} s after "
        f"{args.warmup:g} s of warm-up, median of {args.runs}: lag from append to the sink p50 "
        f"{median['p50_ms']:,.0f} ms, p99 {median['p99_ms']:,.0f} ms, max "
        f"{median['max_ms']:,.0f} ms (p99 of the runs "
        + " / ".join(f"{run['p99_ms']:,.0f}" for run in runs)
        + f"); {median['records_per_batch']:,.0f} records a batch, a batch every "
        f"{median['batch_interval_p50_ms']:,.0f} ms (p99 {median['batch_interval_p99_ms']:,.0f} "
        f"ms); writer appended {median['appended_per_s']:,.0f}/s (kept the rate in every run: "
        f"{median['kept_rate']}, schedule delay p99 {median['schedule_delay_p99_ms']:.2f} ms); "
        f"missing {median['missing']:g}, duplicates {median['duplicates']:g}; {cpu_text(median)}"
    )
    met = median["p99_ms"] < 1000 and median["kept_rate"] and median["missing"] == 0
    return {
        "median": median,
        "runs": runs,
        "discarded": discarded,
        "targets": {"p99 lag from append to the sink < 1 s, the rate kept": met},
    }


# -- write --------------------------------------------------------------------------------------


def write_frame(spark: SparkSession, records: int, args: argparse.Namespace) -> Any:
    partitions = args.write_partitions or spark.sparkContext.defaultParallelism
    constant = "2e" * (args.record_size - 8)
    return spark.range(0, records, 1, partitions).selectExpr(
        WRITE_PAYLOAD_SQL.format(constant=constant)
    )


def write_mode(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    name = "write"
    run_loop(make_log(cluster.metadata_uri, name, args))
    spark = Spark.get(args)

    def save(records: int) -> None:
        (
            write_frame(spark, records, args)
            .write.format("bookkeeper")
            .option("metadataServiceUri", cluster.metadata_uri)
            .option("log", f"{NAMESPACE}/{name}")
            .mode("append")
            .save()
        )

    started = time.monotonic()
    save(args.warmup_records)
    say(
        f"  write: warm-up write of {args.warmup_records:,} records in {time.monotonic() - started:.1f} s"
    )
    partitions = write_frame(spark, 1, args).rdd.getNumPartitions()

    def one(run: int) -> dict[str, Any]:
        before = run_loop(next_sequence(cluster.metadata_uri, name))
        span = Span(cluster).start()
        save(args.records)
        span.stop()
        added = run_loop(next_sequence(cluster.metadata_uri, name)) - before
        if added != args.records:
            raise RuntimeError(f"write: the log holds {added:,} more records, not {args.records:,}")
        return throughput(args, partitions, span)

    runs, discarded = measured_runs("write", args, one)
    median = medians(runs)
    say(
        f"write, {args.records:,} records of {args.record_size} B from {partitions} partitions "
        f"(spark.range), mode append, median of {args.runs}: {rates_text(runs, median)}"
    )
    return {
        "median": median,
        "runs": runs,
        "discarded": discarded,
        "targets": {">= 500,000 records/s": median["records_per_s"] >= 500_000},
    }


# -- the command --------------------------------------------------------------------------------


MODE_RUNNERS: dict[str, Callable[[LocalCluster, argparse.Namespace], dict[str, Any]]] = {
    "read": read_mode,
    "stream": stream_mode,
    "write": write_mode,
}
ROLES = {"stream-writer": stream_writer}


def run_mode(mode: str, args: argparse.Namespace) -> None:
    """One mode on a cluster of its own; its JSON line with ``--json``."""
    started = time.monotonic()
    with LocalCluster(3, bookie_args=shlex.split(args.bookie_args)) as cluster:
        result = MODE_RUNNERS[mode](cluster, args)
    for target, met in result["targets"].items():
        say(f"  target {target}: {'met' if met else 'MISSED'}")
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "role", "uri", "log")}
        line = {
            "mode": mode,
            "settings": {**settings, "master": MASTER},
            "spark_start_s": Spark.start_s,
            "elapsed_s": time.monotonic() - started,
        }
        print(json.dumps({**line, **result}), flush=True)


def arguments() -> argparse.Namespace:
    parser = new_parser(__doc__, MODES)
    parser.add_argument("--records", type=int, default=10_000_000, help="read, write: per run")
    parser.add_argument("--record-size", type=int, default=100, help="bytes (at least 16)")
    parser.add_argument(
        "--warmup-records", type=int, default=100_000, help="write: the warm-up write"
    )
    parser.add_argument(
        "--write-partitions", type=int, default=0, help="write: 0 = Spark's default parallelism"
    )
    parser.add_argument("--rate", type=float, default=10_000, help="stream: records/s")
    parser.add_argument("--trigger-ms", type=float, default=100, help="stream: processingTime")
    parser.add_argument("--warmup", type=float, default=10.0, help="stream: seconds left out")
    parser.add_argument("--window", type=float, default=10.0, help="stream: seconds measured")
    parser.add_argument("--tail-s", type=float, default=1.0, help="stream: appends after it")
    parser.add_argument(
        "--quorum",
        type=lambda text: tuple(int(x) for x in text.split(",")),
        default=(3, 2, 2),
        help="the logs' ledgers: ensemble,write quorum,ack quorum (3 bookies)",
    )
    parser.add_argument("--batch-bytes", type=int, default=256 * 1024, help="the log writers'")
    parser.add_argument("--flush-delay-ms", type=float, default=1.0, help="the log writers'")
    parser.add_argument("--yield-every", type=int, default=1000, help="read: the log's writer")
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting of the session (repeat the option for more)",
    )
    parser.add_argument(
        "--run-timeout", type=float, default=300.0, help="bound on each run's own waits (s)"
    )
    add_common_arguments(parser, tuple(ROLES))
    args = parser.parse_args()
    if args.record_size < STAMP.size:
        parser.error(f"--record-size is at least {STAMP.size} bytes (a stream record's header)")
    return args


def main() -> None:
    args = arguments()
    if args.role:
        result = run_loop(ROLES[args.role](args))
        print(json.dumps(result), flush=True)
        return
    log_bench.JSON_OUTPUT = args.json
    try:
        for mode in MODES if args.mode == "all" else (args.mode,):
            run_mode(mode, args)
    finally:
        Spark.stop()


if __name__ == "__main__":
    main()
