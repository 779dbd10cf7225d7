"""The targets of AutoRecovery (issue 20), measured on local clusters of bookie processes that run
AutoRecovery themselves (``--autorecovery true``; embedded SQLite metadata), ledgers 3/2/2,
CRC32C. Every run has a cluster of its own; ``--runs`` runs, the medians printed.

    python bench/autorecovery_bench.py rereplicate [--runs 3] [--scale 1] [--entry-size 65536]
    python bench/autorecovery_bench.py mark        [--runs 3] [--delays 0,2] [--victims other,auditor]
    python bench/autorecovery_bench.py all         [--json]

rereplicate: four bookies, lostBookieRecoveryDelay 0. With the fourth bookie stopped,
``1000 * --scale`` closed ledgers of ~1.5 MiB (``--entry-size`` entries) are written to the
other three, so that each of them holds ~``--scale`` GiB (2/3 of every ledger's entries); then
the fourth starts again ("3 -> 4 bookies": the data on three, a fourth to copy to). A live
writer in another process (its own loop and GIL) adds ``--writer-entry-size`` entries to a
3/2/2 ledger at ``--writer-rate`` adds/s, open loop: each latency counts from the moment the add
was due, so a stall counts in every add it delays. Its ledger is made again until its ensemble
leaves out one of the three data bookies that is not the auditor: that one is the victim (the
writer's adds never wait for an ensemble change, and the auditor's election is not part of the
figures; ``mark`` measures that case). After ``--warmup`` and ``--baseline`` seconds the victim
is SIGKILLed. Measured: when its registration vanished (its metadata session's lease ran out),
when the first ledger was marked under-replicated (the marker's ctime, written by the auditor),
and when no ledger was marked any more (polled every ``--done-poll-ms``); then every ledger's
metadata is checked not to name the victim, and sampled copies are read back from the bookies
that replaced it. Re-replication rate = the victim's copies (its entries' payload bytes, from
the ledgers' metadata before the kill) / (all whole - first mark). Target: >= 50 MB/s. The live
writer's adds due during that window against the baseline window before the kill: target,
slowed by less than 30 % (the median and the p99 latency are judged apart; the rate is kept).
The control, once the copies are over: as many cores as the copies added to the machine's busy
time are burnt at SCHED_IDLE for as long (at most ``--control-s``), no copy running, and the
live writer's latency in that window is reported too: what spending that much CPU costs it on
this machine, whatever the code that spends it.

mark: three bookies, ``--mark-ledgers`` small ledgers, no bookie to copy to (the markers stay);
the time from a bookie's SIGKILL to the first ledger marked, for each lostBookieRecoveryDelay of
``--delays`` (seconds) and each victim of ``--victims``: ``other`` (a bookie that is not the
auditor) or ``auditor`` (the auditor's own bookie: a new auditor is elected first). Target:
lostBookieRecoveryDelay + under 2 s, judged from the kill and from the moment the registration
vanished.

The session part: a bookie's registration (and its AutoRecovery vote) is an ephemeral node of
its SQLite metadata session, whose lease (zkTimeout, default 5 s on SQLite) is renewed every
lease/3, so it vanishes 3.3 to 5 s after a SIGKILL. The auditor does not wait for it: a killed
bookie's address refuses connections at once, and the auditor (and the candidates behind a
killed auditor's vote) take that for its death. The bench reports the time from the kill and
from the registration's end apart; the first mark now comes before the registration's end.

CPU: the bookies' CPU (user + system, psutil) over the re-replication window, per MB copied,
as measured and net of the bookies' CPU rate during the baseline window (the live writer's
share); their disk writes per MB copied. As ``log_bench.py``, every run reports the CPU used by
processes outside the benchmark's (``others_cpu_percent``, in % of one core) and
``--max-others-cpu 30`` runs a disturbed run again (``--max-discarded`` times at most). Unlike
log_bench's, that figure leaves out the kernel's threads and interrupt handling
(``kernel_cpu_percent``): re-replication writes ~2 bytes to disk per byte copied, and the kernel's
work for it (block I/O, page writeback, loopback) is the bench's own, not a disturbance.

With ``--json`` the summary goes to stderr and one JSON line per mode to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import random
import shlex
import signal
import sys
import time
import urllib.request
from array import array
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

# the measuring helpers of the log benchmark, next to this script (its directory is on the path)
import log_bench
import psutil
from log_bench import (
    SUBPROCESS_START_S,
    Span,
    add_common_arguments,
    connect,
    family_usage,
    first_line,
    kill,
    measured_runs,
    medians,
    new_parser,
    percentiles_ms,
    read_receipts,
    run_loop,
    say,
    spawn,
    write_receipts,
)

from bookkeeper_py import aio
from bookkeeper_py.autorecovery.replication import short_fragments
from bookkeeper_py.metadata.port import MetadataPort
from bookkeeper_py.metadata.underreplication import UnderReplication, marker_parent
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.wire.digest import DigestManager
from bookkeeper_py.wire.status import StatusCode

SCRIPT = os.path.abspath(__file__)
MODES = ("rereplicate", "mark")
PASSWORD = b"autorecovery-bench"
QUORUM = (3, 2, 2)
GIB = 1 << 30
LEDGERS_PER_GIB = 1000
# A bookie of the three holds 2/3 of every ledger's entries (write quorum 2 of ensemble 3).
LEDGER_BYTES = GIB * 3 // 2 // LEDGERS_PER_GIB
MARK_ENTRIES = 10  # mark: entries of each small ledger (1 KiB)
WRITER_ATTEMPTS = 50  # ledgers the live writer may make before its ensemble leaves a victim out
TICK_S = 0.001  # the live writer's timer
SAMPLED_COPIES = 32  # copies read back from the replacing bookies after a run
AUDITOR_WAIT_S = 30.0
HIDDEN_SETTINGS = ("json", "role", "uri", "log", "candidates", "samples", "hog_duty", "hog_seconds")


# -- measuring ---------------------------------------------------------------------------------


def kernel_cpu_s() -> float:
    """CPU seconds the kernel's threads (kthreadd's children) and its interrupt handlers used
    so far, all cores."""
    total = 0.0
    for process in psutil.process_iter(["ppid", "cpu_times"]):
        if process.pid == 2 or process.info["ppid"] == 2:
            times = process.info["cpu_times"]
            if times is not None:
                total += times.user + times.system
    machine = psutil.cpu_times()
    return total + getattr(machine, "irq", 0.0) + getattr(machine, "softirq", 0.0)


@dataclass
class Usage:
    """A ``log_bench.Span`` whose others' CPU leaves out the kernel's (``kernel_cpu_s``)."""

    span: Span
    kernel: float = 0.0

    @classmethod
    def start(cls) -> Usage:
        kernel = kernel_cpu_s()
        return cls(Span(None).start(), kernel)

    def stop(self, uncounted_s: float = 0.0) -> dict[str, float]:
        """Machine, others' and kernel CPU, in % of a core (others: less ``uncounted_s``, CPU
        of the bench's processes that ended during the span)."""
        self.span.stop()
        kernel = kernel_cpu_s() - self.kernel
        self.span.others_s -= kernel + uncounted_s
        figures = self.span.per_record(1)
        return {
            "machine_cpu_busy_percent": figures["machine_cpu_busy_percent"],
            "others_cpu_percent": figures["others_cpu_percent"],
            "kernel_cpu_percent": 100 * kernel / max(self.span.wall_s, 1e-9),
        }


# -- the cluster --------------------------------------------------------------------------------


async def open_cluster(bookies: int, bookie_args: list[str]) -> LocalCluster:
    """A started cluster (started off the loop: ``LocalCluster`` waits for its bookies)."""
    cluster = LocalCluster(bookies, bookie_args=bookie_args)
    await asyncio.to_thread(cluster.start)
    return cluster


def autorecovery_args(delay_s: int, args: argparse.Namespace) -> list[str]:
    return [
        "--autorecovery",
        "true",
        "--lost-bookie-recovery-delay",
        str(delay_s),
        # the live writer's ledger is never fenced by a worker (its ensemble has no lost bookie)
        "--open-ledger-grace-ms",
        "3600000",
        *shlex.split(args.bookie_args),
    ]


async def registered(port: MetadataPort) -> set[str]:
    writable, readonly = await port.bookies_now()
    return set(writable) | set(readonly)


async def wait_until(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting {timeout_s:.0f} s for {what}")
        await asyncio.sleep(0.05)


async def elected_auditor(markers: UnderReplication) -> str:
    """The bookie whose AutoRecovery audits, once one was elected."""
    found: list[str] = []

    async def elected() -> bool:
        auditor = await markers.auditor()
        found[:] = [auditor] if auditor else []
        return bool(found)

    await wait_until("an auditor to be elected", elected, AUDITOR_WAIT_S)
    return found[0]


async def write_ledgers(
    client: aio.BookKeeper, count: int, entries: int, payload: bytes, parallel: int
) -> list[int]:
    """``count`` closed ledgers of ``entries`` entries of ``payload``, ``parallel`` at a time."""
    numbers = iter(range(count))  # shared by the lanes
    ledgers: list[int] = []

    async def lane() -> None:
        for _ in numbers:
            handle = await client.create_ledger(*QUORUM, password=PASSWORD)
            await asyncio.gather(*(handle.add_entry_async(payload) for _ in range(entries)))
            await handle.close()
            ledgers.append(handle.ledger_id)

    await asyncio.gather(*(lane() for _ in range(parallel)))
    return sorted(ledgers)


async def victim_copies(
    client: aio.BookKeeper, ledgers: list[int], victim: str
) -> list[tuple[int, int, int]]:
    """(ledger, entry, the victim's index in the entry's ensemble) of every copy the victim
    holds, from the ledgers' metadata."""
    copies = []
    for ledger_id in ledgers:
        metadata = await client.get_ledger_metadata(ledger_id)
        short, _ = short_fragments(metadata, lambda bookie: bookie == victim)
        for fragment in short:
            (index,) = fragment.missing
            entries = fragment.entries(metadata.write_quorum_size)
            copies += [(ledger_id, entry_id, index) for entry_id in entries]
    return copies


# -- watching the markers -----------------------------------------------------------------------


class MarkerWatch:
    """Which of ``ledgers`` are marked under-replicated, in a listing or two: a marker lives in a
    directory of its own id's bits (``marker_parent``), which the worker removes with it, so the
    listing of those directories' parents tells the marked ones (``UnderReplication.marked``
    walks every directory: ~1,000 reads for 1,000 markers, too many to poll)."""

    def __init__(self, markers: UnderReplication, ledgers: list[int]) -> None:
        self.markers = markers
        self.directories: dict[str, dict[str, int]] = {}  # parent -> directory name -> ledger
        for ledger_id in ledgers:
            parent, _, name = marker_parent(markers.ledgers, ledger_id).rpartition("/")
            self.directories.setdefault(parent, {})[name] = ledger_id

    async def marked(self) -> list[int]:
        found = []
        for parent, names in self.directories.items():
            # (the tree's paged listing; a missing parent lists as empty)
            for name in await self.markers._children(parent):
                if name in names:
                    found.append(names[name])
        return sorted(found)

    async def first_ctime(self, marked: list[int]) -> float | None:
        """The earliest ctime (time.time()) of the markers of the lowest ``marked`` ledgers: the
        auditor marks in increasing ledger id, so the first one it marked, unless cleared."""
        times = []
        for ledger_id in marked[:8]:
            found = await self.markers.marker(ledger_id)
            if found is not None:
                times.append(found[1] / 1000)
        return min(times) if times else None


@dataclass
class Detection:
    """When the victim's registration vanished (monotonic, as the bench saw it) and when the
    first ledger was marked (time.time(), the marker's ctime; the bench's sighting if the
    marker was cleared before it was read)."""

    vanished: float
    first_mark_wall: float
    mark_seen: float  # monotonic


async def detect(
    port: MetadataPort, watch: MarkerWatch, victim: str, poll_s: float, timeout_s: float
) -> Detection:
    vanished: float | None = None
    mark_seen: float | None = None
    first_wall = math.nan
    deadline = time.monotonic() + timeout_s
    while vanished is None or mark_seen is None:
        if vanished is None and victim not in await registered(port):
            vanished = time.monotonic()
        if mark_seen is None and (marked := await watch.marked()):
            mark_seen, seen_wall = time.monotonic(), time.time()
            first_wall = min(await watch.first_ctime(marked) or seen_wall, seen_wall)
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{victim} killed {timeout_s:.0f} s ago: registration vanished "
                f"{vanished is not None}, a ledger marked {mark_seen is not None}"
            )
        await asyncio.sleep(poll_s)
    return Detection(vanished, first_wall, mark_seen)


async def wait_whole(watch: MarkerWatch, poll_s: float, timeout_s: float) -> float:
    """Monotonic time at which no ledger was marked any more; a progress line every 10 s."""
    started = last_line = time.monotonic()
    while marked := await watch.marked():
        now = time.monotonic()
        if now - started > timeout_s:
            raise RuntimeError(f"{len(marked)} ledgers still marked after {timeout_s:.0f} s")
        if now - last_line >= 10:
            say(f"    {len(marked):,} ledgers marked, {now - started:.0f} s after the first mark")
            last_line = now
        await asyncio.sleep(poll_s)
    return time.monotonic()


async def check_whole(
    client: aio.BookKeeper,
    ledgers: list[int],
    victim: str,
    samples: list[tuple[int, int, int]],
    payload: bytes,
) -> int:
    """Checks that no ledger names the victim and none is marked, and reads the ``samples``
    (ledger, entry) back from the bookie now in the victim's place: the copies read."""
    for ledger_id in ledgers:
        metadata = await client.get_ledger_metadata(ledger_id)
        if victim in metadata.bookies():
            raise RuntimeError(f"no marker left but ledger {ledger_id} names {victim} still")
    left = set(await UnderReplication(client.metadata_port).marked()) & set(ledgers)
    if left:
        raise RuntimeError(f"ledgers {sorted(left)[:10]} are marked still")
    for ledger_id, entry_id, index in samples:
        metadata = await client.get_ledger_metadata(ledger_id)
        bookie = metadata.ensemble_at(entry_id)[index]
        status, body = await client.bookie_client.read_entry(bookie, ledger_id, entry_id)
        digest = DigestManager(ledger_id, metadata.digest_type, PASSWORD)
        if status != StatusCode.EOK or digest.verify(body, entry_id).payload != payload:
            raise RuntimeError(f"ledger {ledger_id} entry {entry_id} on {bookie}: {status.name}")
    return len(samples)


# -- the live writer ----------------------------------------------------------------------------


async def live_writer(args: argparse.Namespace) -> dict[str, Any]:
    """Adds at ``--writer-rate`` to a ledger whose ensemble leaves out one of ``--candidates``
    (its first line: the ensemble) until SIGTERM. Open loop on a 1 ms timer: each tick issues
    the adds due by then (add number i is due at start + i / rate). Then writes each add's issue
    time (µs, monotonic) and acknowledgement time (monotonic; NaN: none) to ``--samples``."""
    client = await connect(args.uri)
    candidates = set(args.candidates.split(","))
    attempts = 0
    while True:
        attempts += 1
        handle = await client.create_ledger(*QUORUM, password=PASSWORD)
        ensemble = handle.metadata.last_ensemble[1]
        if candidates - set(ensemble):
            break
        await handle.close()
        await client.delete_ledger(handle.ledger_id)  # else its open ledger would be marked
        if attempts == WRITER_ATTEMPTS:
            raise RuntimeError(f"no ensemble of {attempts} left out one of {candidates}")
    print(json.dumps({"ensemble": list(ensemble), "attempts": attempts}), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    payload = os.urandom(args.writer_entry_size)
    issued, acked = array("q"), array("d")
    outstanding: set[asyncio.Future[int]] = set()

    def acknowledged(index: int, future: asyncio.Future[int]) -> None:
        outstanding.discard(future)
        if not future.cancelled() and future.exception() is None:
            acked[index] = time.monotonic()

    started = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        for _ in range(len(issued), int((now - started) * args.writer_rate) + 1):
            future = handle.add_entry_async(payload)
            future.add_done_callback(functools.partial(acknowledged, len(issued)))
            outstanding.add(future)
            issued.append(int(time.monotonic() * 1e6))
            acked.append(math.nan)
        await asyncio.sleep(TICK_S - (time.monotonic() - started) % TICK_S)
    if outstanding:
        await asyncio.wait(outstanding, timeout=args.run_timeout)
    await handle.close()
    await client.close()
    write_receipts(args.samples, issued, acked)
    return {"started": started, "adds": len(issued), "ensemble_changes": handle.ensemble_changes}


def writer_window(
    adds: tuple[array[int], array[float]], started: float, rate: float, start: float, end: float
) -> dict[str, float]:
    """The live writer's adds issued in [start, end) (monotonic): the rate acknowledged, the
    latency from issue to acknowledgement, and how late they were issued (the writer's process
    kept its schedule when that stays under a tick or two)."""
    low, high = int(start * 1e6), int(end * 1e6)
    latencies, delays = array("d"), array("d")
    for number, (issued_us, ack) in enumerate(zip(*adds, strict=True)):
        if low <= issued_us < high:
            delays.append(issued_us / 1e6 - (started + number / rate))
            latencies.append(ack - issued_us / 1e6)  # NaN: not acknowledged
    acknowledged = array("d", (latency for latency in latencies if not math.isnan(latency)))
    found = percentiles_ms(acknowledged)
    return {
        "adds_per_s": len(acknowledged) / max(end - start, 1e-9),
        "p50_ms": found["p50_ms"],
        "p99_ms": found["p99_ms"],
        "max_ms": found["max_ms"],
        "mean_ms": sum(acknowledged) / max(len(acknowledged), 1) * 1000,
        "unacknowledged": len(latencies) - len(acknowledged),
        "schedule_delay_p99_ms": percentiles_ms(delays)["p99_ms"],
    }


# -- rereplicate --------------------------------------------------------------------------------


async def rereplicate_run(run: int, args: argparse.Namespace) -> dict[str, Any]:
    ledgers_count = max(1, round(LEDGERS_PER_GIB * args.scale))
    entries = max(1, round(LEDGER_BYTES / args.entry_size))
    cluster = await open_cluster(4, autorecovery_args(0, args))
    client: aio.BookKeeper | None = None
    writer = None
    try:
        # The data on three bookies: the fourth stopped (unregistered at once) while it is written.
        await asyncio.to_thread(cluster.stop_bookie, 3)
        client = await connect(cluster.metadata_uri)
        port = client.metadata_port
        three = set(cluster.bookie_ids[:3])
        await wait_until("three bookies", lambda: registered_is(port, three), AUDITOR_WAIT_S)
        payload = os.urandom(args.entry_size)
        started = time.monotonic()
        ledgers = await write_ledgers(client, ledgers_count, entries, payload, args.parallel)
        write_s = time.monotonic() - started
        say(
            f"    wrote {ledgers_count:,} ledgers of {entries} x {args.entry_size:,} B in "
            f"{write_s:.1f} s ({ledgers_count * entries * args.entry_size / write_s / 1e6:.0f} MB/s)"
        )
        await asyncio.to_thread(cluster.start_bookie, 3)
        await settle(cluster, args.settle_cpu, args.run_timeout)
        markers = UnderReplication(port)
        auditor = await elected_auditor(markers)
        candidates = [bookie for bookie in cluster.bookie_ids[:3] if bookie != auditor]
        samples_path = os.path.join(cluster.base_directory, f"writer-samples-{run}")
        writer = await spawn(
            "live-writer",
            f"--uri={cluster.metadata_uri}",
            f"--candidates={','.join(candidates)}",
            f"--writer-rate={args.writer_rate}",
            f"--writer-entry-size={args.writer_entry_size}",
            f"--run-timeout={args.run_timeout}",
            f"--samples={samples_path}",
        )
        chosen = json.loads(await first_line(writer, SUBPROCESS_START_S))
        victim = next(bookie for bookie in candidates if bookie not in chosen["ensemble"])
        copies = await victim_copies(client, ledgers, victim)
        watch = MarkerWatch(markers, ledgers)
        figures = await measure_rereplication(
            cluster, client, watch, victim, psutil.Process(writer.pid), args
        )
        os.kill(writer.pid, signal.SIGTERM)
        written = json.loads(await first_line(writer, args.run_timeout))
        await writer.wait()
        samples = random.sample(copies, min(SAMPLED_COPIES, len(copies)))
        verified = await check_whole(client, ledgers, victim, samples, payload)
        adds = read_receipts(samples_path)
    finally:
        if writer is not None:
            await kill(writer)
        if client is not None:
            await client.close()
        await asyncio.to_thread(cluster.close)
    copied_bytes = len(copies) * args.entry_size
    return summarize_rereplication(figures, adds, copied_bytes, written, verified, args) | {
        "ledgers": len(ledgers),
        "write_s": write_s,
        "victim_copies": len(copies),
    }


SETTLED_DISK_BYTES_PER_S = 2e6


async def settle(
    cluster: LocalCluster,
    busy_percent: float,
    timeout_s: float,
    disk_bytes_per_s: float = SETTLED_DISK_BYTES_PER_S,
) -> None:
    """Waits until, over a second, the bookies used less than ``busy_percent`` of a core (all
    together) and the machine's disks took less than ``disk_bytes_per_s`` of writes: the
    checkpoints of the data just written, and the kernel's writeback of them, are over, not in
    a measured window (their fsyncs stall a journal's for tens of ms)."""
    processes = [psutil.Process(b.process.pid) for b in cluster.bookies if b.process and b.running]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cpu, disk = family_usage(processes)[0], disk_writes()
        await asyncio.sleep(1.0)
        busy = 100 * (family_usage(processes)[0] - cpu)
        if busy < busy_percent and disk_writes() - disk < disk_bytes_per_s:
            return
    raise RuntimeError(
        f"the bookies stayed busier than {busy_percent:g} % of a core, or the disks took more "
        f"than {disk_bytes_per_s / 1e6:g} MB/s of writes, for {timeout_s:g} s"
    )


def disk_writes() -> int:
    """Bytes written to the machine's disks so far (their devices' counters)."""
    counters = psutil.disk_io_counters()
    return counters.write_bytes if counters is not None else 0


async def registered_is(port: MetadataPort, bookies: set[str]) -> bool:
    return await registered(port) == bookies


# The bookies' latency histograms read at each snapshot: (series, success label) -> name here.
SERVER_LATENCIES = {
    ("bookkeeper_server_ADD_ENTRY_REQUEST", "true"): "server_add",  # the live writer's adds
    ("bookkeeper_server_RECOVERY_ADD_ENTRY_REQUEST", "true"): "server_copy",  # the copies
    ("bookie_journal_JOURNAL_SYNC", "true"): "journal_sync",
}


def server_latencies(http_ports: list[int]) -> dict[str, tuple[float, float]]:
    """(sum of seconds, count) of each of ``SERVER_LATENCIES``, added over the bookies whose
    HTTP ports are given (their /metrics pages)."""
    totals = {name: (0.0, 0.0) for name in SERVER_LATENCIES.values()}
    for port in http_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            text = page.read().decode()
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            for suffix, slot in (("_sum{", 0), ("_count{", 1)):
                base, found, labels = series.partition(suffix)
                if not found:
                    continue
                success = "true" if 'success="true"' in labels else "false"
                name = SERVER_LATENCIES.get((base, success))
                if name is not None:
                    pair = list(totals[name])
                    pair[slot] += float(value)
                    totals[name] = (pair[0], pair[1])
    return totals


@dataclass(frozen=True)
class Snapshot:
    """The surviving bookies' CPU seconds, bytes written and latency sums, and the live writer's
    CPU seconds, at a moment (monotonic)."""

    at: float
    bookies_cpu_s: float
    bookies_written: int
    writer_cpu_s: float
    latencies: dict[str, tuple[float, float]]
    machine_busy_s: float  # every core's, the kernel's included
    disk_written: int  # the machine's disks'

    @classmethod
    def take(
        cls, bookies: list[psutil.Process], writer: psutil.Process, http_ports: list[int]
    ) -> Snapshot:
        cpu, written = family_usage(bookies)
        latencies = server_latencies(http_ports)
        machine = psutil.cpu_times()
        busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
        return cls(
            time.monotonic(),
            cpu,
            written,
            family_usage([writer])[0],
            latencies,
            busy,
            disk_writes(),
        )

    def mean_ms(self, later: Snapshot, name: str) -> float:
        """The mean of ``name``'s latencies observed between this snapshot and ``later``."""
        (sum_before, count_before), (sum_after, count_after) = (
            self.latencies[name],
            later.latencies[name],
        )
        count = count_after - count_before
        return 1000 * (sum_after - sum_before) / count if count else math.nan


async def measure_rereplication(
    cluster: LocalCluster,
    client: aio.BookKeeper,
    watch: MarkerWatch,
    victim: str,
    writer: psutil.Process,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Baseline window, the kill, detection, and the wait for every ledger to be whole: the
    times and snapshots of the usage at the baseline's start, the kill, the first mark seen
    and the end."""
    index = cluster.bookie_ids.index(victim)
    processes = {b.bookie_id: psutil.Process(b.process.pid) for b in cluster.bookies if b.process}
    survivors = [process for bookie, process in processes.items() if bookie != victim]
    ports = [b.http_port for b in cluster.bookies if b.bookie_id != victim and b.process]
    await asyncio.sleep(args.warmup)
    usage = Usage.start()
    baseline = Snapshot.take(survivors, writer, ports)
    victim_cpu = family_usage([processes[victim]])[0]
    await asyncio.sleep(args.baseline)
    # (its CPU until the kill would count as others': reaped, it is no longer in the family)
    victim_cpu = family_usage([processes[victim]])[0] - victim_cpu
    killed_wall = time.time()
    killed = Snapshot.take(survivors, writer, ports)
    await asyncio.to_thread(cluster.kill_bookie, index)
    detection = await detect(
        client.metadata_port, watch, victim, args.poll_ms / 1000, args.run_timeout
    )
    marked = Snapshot.take(survivors, writer, ports)
    profilers = await start_profilers(processes, victim, writer, args)
    await wait_whole(watch, args.done_poll_ms / 1000, args.run_timeout)
    for profiler in profilers:
        await profiler.wait()
    done = Snapshot.take(survivors, writer, ports)
    machine = usage.stop(victim_cpu)
    control = await control_window(cluster, baseline, killed, marked, done, args)
    retries = sum(count_in_log(b.log_file, "retrying in") for b in cluster.bookies)
    return {
        "snapshots": (baseline, killed, marked, done),
        "killed_wall": killed_wall,
        "detection": detection,
        "machine": machine,
        "worker_retries": retries,
        "control": control,
    }


async def start_profilers(
    processes: dict[str, psutil.Process],
    victim: str,
    writer: psutil.Process,
    args: argparse.Namespace,
) -> list[asyncio.subprocess.Process]:
    """With ``--profile DIR``: py-spy records each surviving bookie and the live writer for
    ``--profile-s`` from the first mark (collapsed stacks, DIR/<role>.folded; idle time left
    out)."""
    if not args.profile:
        return []
    os.makedirs(args.profile, exist_ok=True)
    targets = {
        bookie.replace(":", "_"): p.pid for bookie, p in processes.items() if bookie != victim
    }
    targets["writer"] = writer.pid
    return [
        await asyncio.create_subprocess_exec(
            os.path.join(os.path.dirname(sys.executable), "py-spy"),
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(args.profile_s),
            "--rate",
            "200",
            "--format",
            "raw",
            "--output",
            os.path.join(args.profile, f"{name}.folded"),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for name, pid in targets.items()
    ]


async def control_window(
    cluster: LocalCluster,
    baseline: Snapshot,
    killed: Snapshot,
    marked: Snapshot,
    done: Snapshot,
    args: argparse.Namespace,
) -> dict[str, float]:
    """The control: once the copies are over, as many cores as they added to the machine's busy
    time (everything: bookies, kernel) are burnt by processes at the lowest priority there is
    (SCHED_IDLE: they run only on a core nobody else wants), for as long as the copies took (at
    most ``--control-s``), while the live writer goes on. What that does to its latency is what
    spending the copies' CPU on this machine costs it, whatever the code: the floor under the
    slowdown figures. Its window, and the cores burnt."""
    baseline_cores = (killed.machine_busy_s - baseline.machine_busy_s) / (killed.at - baseline.at)
    copy_cores = (done.machine_busy_s - marked.machine_busy_s) / max(done.at - marked.at, 1e-9)
    cores = max(0.0, copy_cores - baseline_cores)
    seconds = min(done.at - marked.at, args.control_s)
    # The copies' last checkpoints over: back to the baseline's CPU and disk writes.
    window = killed.at - baseline.at
    await settle(
        cluster,
        args.settle_cpu + 100 * (killed.bookies_cpu_s - baseline.bookies_cpu_s) / window,
        args.run_timeout,
        SETTLED_DISK_BYTES_PER_S + (killed.disk_written - baseline.disk_written) / window,
    )
    started = time.monotonic()
    if cores > 0 and seconds > 0:
        count = math.ceil(cores)
        hogs = [
            await spawn("hog", f"--hog-duty={cores / count}", f"--hog-seconds={seconds}")
            for _ in range(count)
        ]
        for hog in hogs:
            await hog.wait()
    return {"start": started, "end": time.monotonic(), "cores": cores}


def count_in_log(path: str, text: str) -> int:
    """How often ``text`` occurs in a bookie's log (its replication worker's retries)."""
    with open(path, encoding="utf-8", errors="replace") as log:
        return log.read().count(text)


def summarize_rereplication(
    measured: dict[str, Any],
    samples: tuple[array[int], array[float]],
    copied_bytes: int,
    written: dict[str, Any],
    verified: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    baseline, killed, marked, done = measured["snapshots"]
    detection: Detection = measured["detection"]
    first_mark = killed.at + (detection.first_mark_wall - measured["killed_wall"])
    seconds = done.at - first_mark
    mb = copied_bytes / 1e6
    # CPU over the window from the bench's sighting of the first mark; net: less the bookies'
    # CPU rate in the baseline window (the live writer's adds)
    window_s = done.at - marked.at
    window_cpu = done.bookies_cpu_s - marked.bookies_cpu_s
    baseline_s = killed.at - baseline.at
    baseline_rate = (killed.bookies_cpu_s - baseline.bookies_cpu_s) / baseline_s
    rate, started = args.writer_rate, written["started"]
    base = writer_window(samples, started, rate, baseline.at, killed.at)
    during = writer_window(samples, started, rate, first_mark, done.at)
    control = measured["control"]
    burnt = writer_window(samples, started, rate, control["start"], control["end"])
    return {
        "mb_per_s": mb / seconds,
        "copied_mb": mb,
        "seconds": seconds,
        "mb_per_s_from_kill": mb / (done.at - killed.at),
        "kill_to_vanish_s": detection.vanished - killed.at,
        "vanish_to_first_mark_s": first_mark - detection.vanished,
        "kill_to_first_mark_s": first_mark - killed.at,
        "bookies_cpu_s_per_mb": window_cpu / mb,
        "bookies_net_cpu_s_per_mb": (window_cpu - baseline_rate * window_s) / mb,
        "baseline_bookies_cpu_percent": 100 * baseline_rate,
        "bookies_cpu_percent": 100 * window_cpu / max(window_s, 1e-9),
        "bookies_disk_mb_per_mb": (done.bookies_written - marked.bookies_written) / 1e6 / mb,
        "baseline_writer_cpu_percent": 100
        * (killed.writer_cpu_s - baseline.writer_cpu_s)
        / baseline_s,
        "writer_cpu_percent": 100 * (done.writer_cpu_s - marked.writer_cpu_s) / window_s,
        # the bookies' own view (arrival to answer; fdatasync): where the live writer waits
        "baseline_server_add_mean_ms": baseline.mean_ms(killed, "server_add"),
        "during_server_add_mean_ms": marked.mean_ms(done, "server_add"),
        "during_server_copy_mean_ms": marked.mean_ms(done, "server_copy"),
        "baseline_journal_sync_mean_ms": baseline.mean_ms(killed, "journal_sync"),
        "during_journal_sync_mean_ms": marked.mean_ms(done, "journal_sync"),
        "worker_retries": measured["worker_retries"],
        "verified_copies": verified,
        **{f"baseline_{k}": v for k, v in base.items()},
        **{f"during_{k}": v for k, v in during.items()},
        "p50_slowdown_percent": 100 * (during["p50_ms"] / base["p50_ms"] - 1),
        "p99_slowdown_percent": 100 * (during["p99_ms"] / base["p99_ms"] - 1),
        "copies_cores": control["cores"],
        "control_p50_ms": burnt["p50_ms"],
        "control_p99_ms": burnt["p99_ms"],
        "control_p50_slowdown_percent": 100 * (burnt["p50_ms"] / base["p50_ms"] - 1),
        "control_p99_slowdown_percent": 100 * (burnt["p99_ms"] / base["p99_ms"] - 1),
        "rate_kept": during["adds_per_s"] >= 0.99 * args.writer_rate
        and during["unacknowledged"] == 0,
        "writer_ensemble_changes": written["ensemble_changes"],
        **measured["machine"],
    }


async def rereplicate_mode(args: argparse.Namespace) -> dict[str, Any]:
    entries = max(1, round(LEDGER_BYTES / args.entry_size))
    runs, discarded = await measured_runs(
        "rereplicate", args, lambda run: rereplicate_run(run, args)
    )
    median = medians(runs)
    say(
        f"rereplicate, {median['ledgers']:,.0f} ledgers of {entries} x {args.entry_size:,} B "
        f"entries on 3 bookies, a 4th added, one killed, median of {args.runs}: "
        f"{median['copied_mb']:,.0f} MB copied in {median['seconds']:.1f} s = "
        f"{median['mb_per_s']:.1f} MB/s from the first mark ({median['mb_per_s_from_kill']:.1f} "
        f"MB/s from the kill); kill -> registration gone {median['kill_to_vanish_s']:.2f} s, -> "
        f"first mark {median['vanish_to_first_mark_s']:.2f} s more; bookies' CPU "
        f"{median['bookies_cpu_s_per_mb'] * 1000:.1f} ms/MB "
        f"({median['bookies_net_cpu_s_per_mb'] * 1000:.1f} ms/MB net of the live writer's, "
        f"{median['bookies_cpu_percent']:.0f} % of a core against "
        f"{median['baseline_bookies_cpu_percent']:.0f} % before the kill), disk writes "
        f"{median['bookies_disk_mb_per_mb']:.2f} MB/MB; live writer at {args.writer_rate:,.0f}/s "
        f"of {args.writer_entry_size} B: p50 {median['baseline_p50_ms']:.2f} -> "
        f"{median['during_p50_ms']:.2f} ms ({median['p50_slowdown_percent']:+.0f} %), p99 "
        f"{median['baseline_p99_ms']:.2f} -> {median['during_p99_ms']:.2f} ms "
        f"({median['p99_slowdown_percent']:+.0f} %) from issue to acknowledgement, rate kept in "
        f"every run: {median['rate_kept']}, schedule delay p99 "
        f"{median['during_schedule_delay_p99_ms']:.2f} ms, its CPU "
        f"{median['baseline_writer_cpu_percent']:.0f} -> {median['writer_cpu_percent']:.0f} % of "
        f"a core; in the bookies, the writer's adds took {median['baseline_server_add_mean_ms']:.2f}"
        f" -> {median['during_server_add_mean_ms']:.2f} ms on average from arrival to answer "
        f"(the copies {median['during_server_copy_mean_ms']:.2f} ms), fdatasync "
        f"{median['baseline_journal_sync_mean_ms']:.2f} -> "
        f"{median['during_journal_sync_mean_ms']:.2f} ms; control: the same "
        f"{median['copies_cores']:.2f} cores burnt at SCHED_IDLE, no copies: p50 "
        f"{median['control_p50_ms']:.2f} ms ({median['control_p50_slowdown_percent']:+.0f} %), p99 "
        f"{median['control_p99_ms']:.2f} ms ({median['control_p99_slowdown_percent']:+.0f} %); machine "
        f"{median['machine_cpu_busy_percent']:.0f} % busy, "
        f"others {median['others_cpu_percent']:.0f} % of a core, kernel "
        f"{median['kernel_cpu_percent']:.0f} %"
    )
    targets = {
        ">= 50 MB/s (from the first mark)": median["mb_per_s"] >= 50,
        "live writer's p50 add latency slowed < 30 %": median["p50_slowdown_percent"] < 30,
        "live writer's p99 add latency slowed < 30 %": median["p99_slowdown_percent"] < 30,
        "live writer kept its rate": median["rate_kept"],
    }
    return {"median": median, "runs": runs, "discarded": discarded, "targets": targets}


# -- mark ---------------------------------------------------------------------------------------


async def mark_run(delay_s: int, victim_kind: str, args: argparse.Namespace) -> dict[str, Any]:
    cluster = await open_cluster(3, autorecovery_args(delay_s, args))
    client: aio.BookKeeper | None = None
    try:
        client = await connect(cluster.metadata_uri)
        ledgers = await write_ledgers(
            client, args.mark_ledgers, MARK_ENTRIES, os.urandom(1024), args.parallel
        )
        markers = UnderReplication(client.metadata_port)
        auditor = await elected_auditor(markers)
        others = [bookie for bookie in cluster.bookie_ids if bookie != auditor]
        victim = auditor if victim_kind == "auditor" else random.choice(others)
        await asyncio.sleep(1.0)  # the auditor has seen every bookie registered (it polls)
        usage = Usage.start()
        killed_wall, killed = time.time(), time.monotonic()
        await asyncio.to_thread(cluster.kill_bookie, cluster.bookie_ids.index(victim))
        detection = await detect(
            client.metadata_port,
            MarkerWatch(markers, ledgers),
            victim,
            args.poll_ms / 1000,
            args.run_timeout,
        )
        machine = usage.stop()
    finally:
        if client is not None:
            await client.close()
        await asyncio.to_thread(cluster.close)
    first_mark = killed + (detection.first_mark_wall - killed_wall)
    return {
        "kill_to_vanish_s": detection.vanished - killed,
        "vanish_to_first_mark_s": first_mark - detection.vanished,
        "kill_to_first_mark_s": first_mark - killed,
        "over_delay_from_kill_s": first_mark - killed - delay_s,
        "over_delay_from_vanish_s": first_mark - detection.vanished - delay_s,
        **machine,
    }


async def mark_mode(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {}
    discarded = 0
    targets = {}
    for delay_s in args.delays:
        for victim_kind in args.victims:
            case = f"delay {delay_s} s, {victim_kind}"

            def one(
                run: int, delay_s: int = delay_s, kind: str = victim_kind
            ) -> Awaitable[dict[str, Any]]:
                return mark_run(delay_s, kind, args)

            runs[case], dropped = await measured_runs(f"mark, {case}", args, one)
            discarded += dropped
            median = medians(runs[case])
            say(
                f"mark, {args.mark_ledgers} ledgers, lostBookieRecoveryDelay {delay_s} s, victim "
                f"{victim_kind}, median of {args.runs}: kill -> first mark "
                f"{median['kill_to_first_mark_s']:.2f} s (registration gone after "
                f"{median['kill_to_vanish_s']:.2f} s, first mark "
                f"{median['vanish_to_first_mark_s']:.2f} s later); over the delay: "
                f"{median['over_delay_from_kill_s']:.2f} s from the kill, "
                f"{median['over_delay_from_vanish_s']:.2f} s from the registration's end"
            )
            targets[f"{case}: kill -> first mark < delay + 2 s"] = (
                median["over_delay_from_kill_s"] < 2
            )
            targets[f"{case}: registration gone -> first mark < delay + 2 s"] = (
                median["over_delay_from_vanish_s"] < 2
            )
    median_by_case = {case: medians(values) for case, values in runs.items()}
    return {"median": median_by_case, "runs": runs, "discarded": discarded, "targets": targets}


# -- the command --------------------------------------------------------------------------------

MODE_RUNNERS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]]] = {
    "rereplicate": rereplicate_mode,
    "mark": mark_mode,
}


async def hog(args: argparse.Namespace) -> dict[str, Any]:
    """Burns ``--hog-duty`` of a core for ``--hog-seconds`` at SCHED_IDLE (the control)."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    end = time.monotonic() + args.hog_seconds
    period = 0.01
    while (now := time.monotonic()) < end:
        busy_until = now + period * args.hog_duty
        while time.monotonic() < busy_until:
            pass
        await asyncio.sleep(period * (1 - args.hog_duty))
    return {}


ROLES: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]]] = {
    "live-writer": live_writer,
    "hog": hog,
}


def run_mode(mode: str, args: argparse.Namespace) -> None:
    """One mode; its JSON line with ``--json`` (the settings without the subprocesses' own)."""
    started = time.monotonic()
    result = run_loop(MODE_RUNNERS[mode](args))
    verdicts = (
        f"  target {name}: {'met' if met else 'MISSED'}" for name, met in result["targets"].items()
    )
    say("\n".join(verdicts))
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in HIDDEN_SETTINGS}
        elapsed_s = time.monotonic() - started
        print(json.dumps({"mode": mode, "settings": settings, "elapsed_s": elapsed_s, **result}))


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def arguments() -> argparse.Namespace:
    parser = new_parser(__doc__, MODES)
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="rereplicate: GiB the victim holds (1,000 ledgers of ~1.5 MiB per GiB)",
    )
    parser.add_argument("--entry-size", type=int, default=64 * 1024, help="rereplicate: bytes")
    parser.add_argument("--parallel", type=int, default=8, help="ledgers written at once")
    parser.add_argument("--writer-rate", type=float, default=2000, help="live writer: adds/s")
    parser.add_argument("--writer-entry-size", type=int, default=1024, help="live writer: bytes")
    parser.add_argument("--warmup", type=float, default=2.0, help="rereplicate: live writer, s")
    parser.add_argument("--baseline", type=float, default=15.0, help="rereplicate: s before kill")
    parser.add_argument(
        "--settle-cpu",
        type=float,
        default=15.0,
        help="rereplicate: the bookies' CPU (%% of a core) under which they count as idle after "
        "the data was written",
    )
    parser.add_argument(
        "--control-s", type=float, default=10.0, help="rereplicate: the control window, at most"
    )
    parser.add_argument("--poll-ms", type=float, default=5.0, help="registration and markers")
    parser.add_argument("--done-poll-ms", type=float, default=100.0, help="rereplicate: markers")
    parser.add_argument("--mark-ledgers", type=int, default=100, help="mark: ledgers")
    parser.add_argument("--delays", type=numbers, default=[0, 2], help="mark: seconds")
    parser.add_argument(
        "--victims",
        type=lambda text: text.split(","),
        default=["other", "auditor"],
        help="mark: other (not the auditor), auditor",
    )
    parser.add_argument(
        "--run-timeout", type=float, default=3600.0, help="bound on each run's own waits (s)"
    )
    parser.add_argument(
        "--profile",
        help="rereplicate: py-spy profiles of the survivors and the writer, to this directory",
    )
    parser.add_argument("--profile-s", type=int, default=8, help="rereplicate: --profile's span")
    add_common_arguments(parser, tuple(ROLES))
    parser.add_argument("--candidates", help=argparse.SUPPRESS)
    parser.add_argument("--hog-duty", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--hog-seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--samples", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not set(args.victims) <= {"other", "auditor"}:
        parser.error("--victims takes other and auditor")
    return args


def main() -> None:
    args = arguments()
    # log_bench's spawn and first_line run and name the script of log_bench.SCRIPT: this one
    log_bench.SCRIPT = SCRIPT
    if args.role:
        result = run_loop(ROLES[args.role](args))
        print(json.dumps(result), flush=True)
        return
    log_bench.JSON_OUTPUT = args.json
    for mode in MODES if args.mode == "all" else (args.mode,):
        run_mode(mode, args)


if __name__ == "__main__":
    main()
