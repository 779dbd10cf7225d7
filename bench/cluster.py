"""The figures of docs/performance.md: every target of issue 7 measured on local clusters of
separate bookie processes (embedded SQLite metadata), next to this machine's raw limits measured
in the same run. 1 KiB entries, CRC32C, fsync before every ack.

    python bench/cluster.py [--runs 3] [--seconds 5] [--json]

Rows (median of --runs; each is a ``bookkeeper bench`` measurement, the command is printed,
with the median CPU per entry of the client and of each bookie, and of a tailing reader):
one bookie E=Qw=Qa=1 adds/s; three bookies at 3/2/2 and 3/3/2 adds/s (1,000 in flight), and at
3/2/2 with 100-byte entries (its ratio to the 1 KiB rate), each of these rows on a cluster of its
own; p99 add latency at 3/2/2 at half the rate reached (open loop, on a cluster of its own, 1 s
of warm-up); on one more cluster, p50 with one add in flight, a tailing reader's p99 lag at
10,000 adds/s, and recovery of a ledger whose 100,000 entries all lie beyond the LAC its bookies
know (a DEFERRED_SYNC writer that never forced, abandoned), in seconds; last, catch-up reads of
closed ledgers at 3/2/2 (entry by entry) and 3/3/2 (E = Qw: batch reads) in MB/s, each run on
a cluster of its own whose bookies keep a 32 MiB write cache (so that the reads come from the
entry logs).

Beside the raw limits, the disk alone under three journals' write pattern (``disk_stalls.py``,
``--stall-seconds``; 0 skips it): the worst sync and how many times every journal's sync stalled
over 20 ms at once. A latency row's p99 cannot be under the stalls of the disk it syncs on.

Beside the half-rate row, what the disk alone allows at that rate (``commit_floor.py``): the p50
and p99 add latency of three processes doing only the journals' group commits at that rate,
measured just before that row's cluster starts. The row's p99 cannot be under it. Beside that
row and the one-add-in-flight row, the same figure of the ideal C cluster (``ideal_cluster.py``:
three C bookies and a C client doing only what an add needs, on the row's schedule; each bookie
journals each entry it stores and writes it to an entry log) and its CPU per entry, measured just
before the row's cluster starts: the latency of the disk, the wake-ups and loopback TCP, which no
bookie or client code on this machine avoids. After the half-rate row,
the ideal C cluster once more, its processes spending the row's median CPU per entry
(``ideal_cluster.py --cpu-per-entry``): the latency that much CPU alone costs on two cores, with
a design that adds nothing else; and under the row, how late the client issued its adds (the
part of their latency that is the client's own loop, busy or waiting for a CPU).

Before each cluster starts, the disk settles (``--settle-seconds``, at most; 0 skips it): the
script waits until it syncs 4 KiB appends at two thirds of the rate measured at the start again.
The gigabytes a row writes keep this virtual machine's disk slow for seconds after its cluster
stopped, and the next row would measure that; the time waited is printed under each row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, cast

import commit_floor  # bench/, beside this script
import disk_stalls
import ideal_cluster

from bookkeeper_py import aio
from bookkeeper_py import loop as event_loop
from bookkeeper_py.admin import bench, limits
from bookkeeper_py.testing import LocalCluster


def measure(cluster: LocalCluster, argv: list[str]) -> bench.Report:
    """``bookkeeper bench ARGV`` against ``cluster``, the CPU of its bookies measured too, on
    the loop that command runs on (uvloop where installed)."""
    arguments = bench.build_arguments([*argv, "--quiet"])
    return event_loop.run(
        bench.measure(
            cluster.metadata_uri,
            arguments,
            bench.bookie_pids(cluster),
            bench.bookie_metrics_urls(cluster),
        )
    )


def settle(fsyncs_per_s: float, limit_s: float) -> float:
    """Waits, at most ``limit_s``, until the disk syncs 4 KiB appends at two thirds of
    ``fsyncs_per_s`` (the rate measured at the start) again; returns the seconds waited. Right
    after the 3/3/2 row (3 runs, ~3 GB written), a 100-byte row's bookies synced in 0.67-1.76
    ms on average and it reached 139,000-194,000 adds/s; 3 s later, 0.56-0.88 ms and
    180,000-242,000 adds/s (3 pairs). The writes are the host's to finish, out of the guest's
    sight (its own dirty pages and disk queue were empty at once): only the syncs show it."""
    started = time.monotonic()
    os.sync()
    with tempfile.TemporaryDirectory(prefix="bench-settle-") as directory:
        while time.monotonic() - started < limit_s:
            if limits.fsync_rate(directory, 0.25) >= fsyncs_per_s * 2 / 3:
                break
            time.sleep(0.25)
    return time.monotonic() - started


def ideal(
    runs: int,
    seconds: float,
    rate: float = 0.0,
    in_flight: int = 0,
    cpu_per_entry: tuple[float, float] = (0.0, 0.0),
) -> list[dict[str, Any]] | None:
    """``runs`` runs of the ideal C cluster (``ideal_cluster.py``) at ``rate`` or with
    ``in_flight`` adds outstanding, spending at least ``cpu_per_entry`` (client, each bookie; µs
    per add); None (and why, on stderr) where it cannot be built."""
    try:
        return ideal_cluster.measure(
            rate, seconds, 1.0, runs, in_flight=in_flight, cpu_per_entry=cpu_per_entry
        )
    except SystemExit as error:
        print(f"the ideal C cluster was not run: {error}", file=sys.stderr)
        return None


def ideal_line(
    results: list[dict[str, Any]],
    quantile: str,
    what: str = "the same schedule (bench/ideal_cluster.py, just before)",
) -> str:
    """The ideal C cluster's figure for a row: the median of its runs' ``quantile``."""
    values = [result[quantile] for result in results]
    cpu = [result["cpu_per_entry_us"] for result in results]
    return (
        f"the ideal C cluster, {what}: "
        f"{quantile.removesuffix('_ms')} {statistics.median(values):.3f} ms (runs "
        f"{[round(v, 3) for v in values]}); CPU per entry (us): client "
        f"{statistics.median(c['client'] for c in cpu):.1f}, bookie "
        f"{statistics.median(c['bookie'] for c in cpu):.1f}"
    )


def latency(report: bench.Report, quantile: str) -> float:
    """A latency row's figure of one run: infinite where the run measured no add at all (its
    writer failed at once: the row's FAILED ADDS line says how many)."""
    return report.latency.get(quantile, math.inf)


def cpu_line(reports: list[bench.Report]) -> str:
    """The median over ``reports`` of each process's CPU per entry (µs): the client, the
    bookies (each, in id order within a run: runs on clusters of their own have bookies of
    other ids), a tailing reader."""
    per_process: dict[str, list[float]] = {}
    for report in reports:
        cpu = dict(report.cpu_per_entry_us)
        named: dict[str, float] = {n: cpu.pop(n) for n in ("client", "reader") if n in cpu}
        named.update({f"bookie {i}": cpu[name] for i, name in enumerate(sorted(cpu))})
        for name, us in named.items():
            per_process.setdefault(name, []).append(us)
    medians = {name: statistics.median(values) for name, values in per_process.items()}
    client = medians.pop("client", math.nan)
    reader = medians.pop("reader", None)
    bookies = " / ".join(f"{medians[name]:.1f}" for name in sorted(medians))
    return f"CPU per entry: client {client:.1f} µs, bookies {bookies} µs" + (
        f", reader {reader:.1f} µs" if reader is not None else ""
    )


def send_delay_line(reports: list[bench.Report]) -> str:
    """The median over open-loop ``reports`` of how late the client issued its adds (part of
    their latency: the client's own loop, busy or waiting for a CPU, not the bookies)."""
    p50s = [report.send_delay["p50_ms"] for report in reports if report.send_delay]
    p99s = [report.send_delay["p99_ms"] for report in reports if report.send_delay]
    return (
        f"of which issued late (due time to the client's issue): p50 "
        f"{statistics.median(p50s):.2f}  p99 {statistics.median(p99s):.2f} ms (runs "
        f"{[round(v, 2) for v in p99s]})"
    )


def bookies_line(reports: list[bench.Report]) -> str:
    """The median over ``reports`` of each figure of the bookies' own metrics (adds and journal
    syncs: ``bench.BookieScrapes``), where every run has it."""
    keys = set.intersection(*(set(report.bookies) for report in reports)) if reports else set()
    if not {"add_p99_ms", "journal_sync_p99_ms"} & keys:
        return ""  # no adds in the window (catch-up reads)
    medians = {key: statistics.median(report.bookies[key] for report in reports) for key in keys}
    line = bench.BookieScrapes.text(medians)
    if "journal_stalls_per_bookie" in keys:  # which runs met the disk's stalls
        runs = [round(report.bookies["journal_stalls_per_bookie"], 1) for report in reports]
        line += f" (runs {runs})"
    return line


async def recovery_seconds(uri: str, entries: int) -> float:
    writer = await aio.BookKeeper.connect(uri, throttle=10_000)
    reader = await aio.BookKeeper.connect(uri)
    try:
        handle = await writer.create_ledger(3, 2, 2, password=b"rec", deferred_sync=True)
        payload = os.urandom(1024)
        await asyncio.gather(*(handle.add_entry_async(payload) for _ in range(entries)))
        started = time.monotonic()
        recovered = await reader.open_ledger(handle.ledger_id, b"rec")  # fences and recovers
        seconds = time.monotonic() - started
        if recovered.last_add_confirmed != entries - 1:
            raise RuntimeError(
                f"recovery ended at {recovered.last_add_confirmed}, not {entries - 1}"
            )
        return seconds
    finally:
        await reader.close()
        await writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--recovery-entries", type=int, default=100_000)
    parser.add_argument("--read-entries", type=int, default=600_000, help="catch-up reads")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=8.0,
        help="seconds of bench/disk_stalls.py beside the raw limits (0: skip)",
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=30.0,
        help="the longest wait for the disk to settle before each cluster (0: no wait)",
    )
    args = parser.parse_args()
    seconds = f"--seconds={args.seconds}"
    rows: dict[str, dict[str, object]] = {}
    settled: list[float] = []  # the waits before the clusters of the row being measured

    def quiet_disk() -> None:
        """Before a cluster starts (see ``settle``)."""
        if args.settle_seconds > 0:
            settled.append(settle(raw["fsyncs_per_s"], args.settle_seconds))

    def row(
        name: str,
        unit: str,
        command: str,
        one: Callable[[], bench.Report | float],
        value: Callable[[bench.Report], float] = lambda report: report.entries_per_s,
    ) -> float:
        results = [one() for _ in range(args.runs)]
        reports = [result for result in results if isinstance(result, bench.Report)]
        values = [value(r) if isinstance(r, bench.Report) else r for r in results]
        median = statistics.median(values)
        rows[name] = {"median": median, "unit": unit, "runs": values, "command": command}
        if settled:
            rows[name]["settled_s"] = list(settled)
        if reports:
            rows[name]["cpu_per_entry_us"] = [report.cpu_per_entry_us for report in reports]
            rows[name]["bookies"] = [report.bookies for report in reports]
            # A run whose writer failed (e.g. a bookie answering ETOOMANYREQUESTS) measured
            # only the adds before the failure: its figure is not the row's, and says so.
            rows[name]["failures"] = failed = [report.failures for report in reports]
            delays = [report.send_delay for report in reports if report.send_delay]
            if delays:
                rows[name]["send_delay"] = delays
        if not args.json:
            print(f"{name:<46} {median:>12,.2f} {unit:<8} runs {[round(v, 2) for v in values]}")
            print(f"    {command}")
            if reports:
                print(f"    {cpu_line(reports)}")
            bookies = bookies_line(reports)
            if bookies:
                print(f"    {bookies}")
            if reports and rows[name].get("send_delay"):
                print(f"    {send_delay_line(reports)}")
            if reports and any(failed):
                counts = " / ".join(f"{count:,}" for count in failed)
                print(
                    f"    FAILED ADDS per run: {counts} (such a run's figure is not a measurement)"
                )
            if settled:
                waits = " / ".join(f"{wait:.1f}" for wait in settled)
                print(f"    the disk settled for {waits} s before the cluster(s) started")
        settled.clear()
        return median

    with tempfile.TemporaryDirectory(prefix="bench-limits-") as directory:
        probes = [limits.measure(directory) for _ in range(args.runs)]
        raw = {key: statistics.median(p[key] for p in probes) for key in probes[0]}
        if args.stall_seconds > 0:
            stalls = disk_stalls.measure(
                disk_stalls.arguments(["--seconds", str(args.stall_seconds)]), directory
            )
            raw["disk_sync_max_ms"] = max(j["max_ms"] for j in stalls["journals"])
            raw["disk_sync_p99_ms"] = statistics.median(j["p99_ms"] for j in stalls["journals"])
            raw["disk_stall_moments"] = len(stalls["stall_moments"])
    if not args.json:
        print(
            f"raw limits: {raw['fsyncs_per_s']:,.0f} fsyncs/s, {raw['sequential_mb_s']:,.0f} MB/s "
            f"sequential, loopback round trip {raw['loopback_rtt_us']:.0f} us, interpreter "
            f"{raw['interpreter_ns']:.0f} ns a loop (admin/limits.py: the CPU per entry of the "
            "same code moves with it)"
        )
        if "disk_stall_moments" in raw:
            print(
                f"the disk alone under three journals' syncs ({args.stall_seconds:g} s, "
                f"bench/disk_stalls.py): sync p99 {raw['disk_sync_p99_ms']:.2f} ms, worst "
                f"{raw['disk_sync_max_ms']:.1f} ms, every journal stalled over 20 ms at once "
                f"{raw['disk_stall_moments']:.0f} times"
            )
    quiet_disk()
    with LocalCluster(1) as one:
        argv = ["writes", "-e", "1", "-w", "1", "-a", "1", seconds]
        row(
            "one bookie 1/1/1, 1000 in flight",
            "adds/s",
            "bookkeeper bench " + " ".join(argv) + " --local 1",
            lambda: measure(one, argv),
        )
    # Each write-throughput row on a cluster of its own: a row run after others would meet
    # their write caches full and their checkpoints running (after the 1 KiB rows, ~1.6 GB
    # written to each bookie, the 100-byte row's bookies spent 2.7 instead of 1.7 us per add).
    reached = 0.0
    for quorum in ("3,2,2", "3,3,2"):
        e, w, a = quorum.split(",")
        argv = ["writes", "-e", e, "-w", w, "-a", a, seconds]
        quiet_disk()
        with LocalCluster(3) as three:

            def adds_per_s(argv: list[str] = argv, three: LocalCluster = three) -> bench.Report:
                return measure(three, argv)

            value = row(
                f"three bookies {quorum.replace(',', '/')}, 1000 in flight",
                "adds/s",
                "bookkeeper bench " + " ".join(argv) + " --local 3",
                adds_per_s,
            )
        if quorum == "3,2,2":
            reached = value
    argv = ["writes", "--entry-size=100", seconds]
    quiet_disk()
    with LocalCluster(3) as three:
        small = row(
            "three bookies 3/2/2, 100-byte entries",
            "adds/s",
            "bookkeeper bench " + " ".join(argv) + " --local 3",
            lambda: measure(three, argv),
        )
    rows["100-byte / 1 KiB entry rate (3/2/2)"] = {
        "median": small / reached,
        "unit": "x",
        "command": "the two rows above",
    }
    if not args.json:
        print(f"{'100-byte / 1 KiB entry rate (3/2/2)':<46} {small / reached:>12,.2f} x")
    quiet_disk()
    # What C code doing only what an add needs reaches here, just before (ideal_cluster.py).
    alone = ideal(args.runs, args.seconds, in_flight=1)
    with LocalCluster(3) as three:
        uri = three.metadata_uri
        argv = ["writes", "--in-flight=1", seconds]
        name = "3/2/2 p50 add latency, one add in flight"
        row(
            name,
            "ms",
            "bookkeeper bench " + " ".join(argv) + " --local 3",
            lambda: measure(three, argv),
            lambda report: latency(report, "p50_ms"),
        )
        if alone is not None:
            rows[name]["ideal_c_cluster"] = alone
            if not args.json:
                print(f"    {ideal_line(alone, 'p50_ms')}")
        argv = ["reads", "--tail", "--rate=10000", seconds]
        row(
            "tailing reader p99 lag at 10,000 adds/s (3/2/2)",
            "ms",
            "bookkeeper bench " + " ".join(argv) + " --local 3",
            lambda: measure(three, argv),
            lambda report: latency(report, "p99_ms"),
        )
        row(
            f"recovery of {args.recovery_entries:,} entries beyond the LAC (3/2/2)",
            "s",
            "python bench/cluster.py (recovery_seconds)",
            lambda: event_loop.run(recovery_seconds(uri, args.recovery_entries)),
        )
    # On a cluster of its own (the others stopped), after a second of warm-up: the throughput
    # rows leave write caches full, and their checkpoints would land in this row's runs.
    half = f"--rate={reached / 2:.0f}"
    argv = ["writes", half, seconds, "--warmup=1"]
    quiet_disk()
    # What the disk alone allows at that rate (no bookie code: three processes doing the
    # journals' group commits), measured just before the cluster starts: a p99 over the target
    # here leaves no room for any code (bench/commit_floor.py).
    floors = []
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as directory:
        for _ in range(args.runs):
            floors.append(commit_floor.measure(directory, reached / 2, args.seconds))
    paced = ideal(args.runs, args.seconds, rate=reached / 2)
    with LocalCluster(3) as fresh:
        name = f"3/2/2 p99 add latency at half that rate ({reached / 2:,.0f}/s)"
        row(
            name,
            "ms",
            "bookkeeper bench " + " ".join(argv) + " --local 3",
            lambda: measure(fresh, argv),
            lambda report: latency(report, "p99_ms"),
        )
    rows[name]["disk_alone"] = floors
    if paced is not None:
        rows[name]["ideal_c_cluster"] = paced
    # The ideal C cluster again, spending the row's CPU per entry (its medians): the latency
    # that much CPU costs on this machine with a design that adds nothing else.
    kept = cast(list[dict[str, float]], rows[name].get("cpu_per_entry_us", []))
    cpu = [figures for figures in kept if figures]
    burning = None
    if paced is not None and cpu:
        client_us = statistics.median(c["client"] for c in cpu)
        bookie_us = statistics.median(
            statistics.mean(us for process, us in c.items() if process != "client") for c in cpu
        )
        quiet_disk()
        settled.clear()
        burning = ideal(
            args.runs, args.seconds, rate=reached / 2, cpu_per_entry=(client_us, bookie_us)
        )
        if burning is not None:
            rows[name]["ideal_c_cluster_same_cpu"] = burning
    if not args.json:
        p99s = [floor["add_p99_ms"] for floor in floors]
        print(
            f"    the disk alone at this rate (bench/commit_floor.py, just before): add p99 "
            f"{statistics.median(p99s):.2f} ms (runs {[round(v, 2) for v in p99s]}), p50 "
            f"{statistics.median(floor['add_p50_ms'] for floor in floors):.2f} ms"
        )
        if paced is not None:
            print(f"    {ideal_line(paced, 'p99_ms')}")
        if burning is not None:
            what = "spending this row's CPU per entry (just after)"
            print(f"    {ideal_line(burning, 'p99_ms', what)}")
    # Catch-up reads, each run on a cluster of its own whose bookies keep a 32 MiB write cache:
    # with the default 256 MiB, much of what each bookie takes of the bench's writes would
    # still be in the write cache when the reads start (its checkpoint is paced), and the rows
    # would measure reads from memory, not from the entry logs that a reader catching up meets.
    # 600,000 entries (by default) give a read phase of seconds, not a fraction of one. A run
    # on the bookies of the run before read slower here (474 -> 285 -> 258 MB/s at 3/3/2) as the
    # page cache grew past ~4-5 GB; with the caches dropped between runs it did not (479 ->
    # 470 -> 459): a cost of this virtual machine's fresh memory, not of the reads. Last:
    # the gigabytes these rows write are deleted when their clusters stop, and on a file system
    # mounted with online discard that keeps the disk busy for a while after.
    small_cache = ["--write-cache-mb", "32"]
    for quorum in ("3,2,2", "3,3,2"):
        e, w, a = quorum.split(",")
        argv = [
            "reads",
            f"--entries={args.read_entries}",
            "--ledgers-per-writer=3",
            "-e",
            e,
            "-w",
            w,
            "-a",
            a,
        ]
        how = "batch reads" if e == w else "entry by entry"

        def reads(argv: list[str] = argv) -> bench.Report:
            quiet_disk()
            with LocalCluster(3, bookie_args=small_cache) as three:
                return measure(three, argv)

        row(
            f"catch-up reads of closed ledgers ({quorum.replace(',', '/')}, {how})",
            "MB/s",
            "bookkeeper bench "
            + " ".join(argv)
            + " (3 bookies started with "
            + " ".join(small_cache)
            + ")",
            reads,
            lambda report: report.mb_per_s,
        )
    if args.json:
        print(json.dumps({"limits": raw, "rows": rows}))


if __name__ == "__main__":
    main()
