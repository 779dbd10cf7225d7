"""The disk's own sync stalls, under the write pattern of three bookies' journals and checkpoints,
with no bookie code at all.

N journal-like processes each append ``--group-kb`` to a file allocated ahead (as a journal's
``journalPreAllocSizeMB``) and ``fdatasync`` it, once per ``--tick-ms`` (a bookie's group commit
at a moderate rate: at half the 3/2/2 full rate each journal syncs ~40 KB about every 1.4 ms);
with ``--bulk-mb-s`` above 0 as many entry-log-like processes write 1 MiB at a time at that rate
each, ``fdatasync`` after every MiB (``flushEntrylogBytes``) and drop the pages (as a checkpoint
does). Reported per journal: syncs, p50 / p99 / max, and syncs over ``--stall-ms``; and the
*stall moments*: spans in which every journal had a sync over ``--stall-ms`` at once.

A sync that takes T ms holds every add written before it for T ms. At 60,000 adds/s a 5 s run's
p99 is 1 % of its adds, 50 ms of them: one stall of the device over ~50 ms sets the p99 of an
open-loop run by itself, whatever the bookies' code does (``docs/performance.md``).

    python bench/disk_stalls.py [--seconds 8] [--journals 3] [--bulk-mb-s 40] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from array import array
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from log_bench import percentiles_ms  # bench/, beside this script

PREALLOCATED = 512 * 1024 * 1024


def journal(directory: str, seconds: float, group: int, tick_s: float, out: Connection) -> None:
    """Appends ``group`` bytes and syncs them once per tick; sends (start, duration) per sync."""
    fd = os.open(os.path.join(directory, f"journal-{os.getpid()}"), os.O_CREAT | os.O_WRONLY)
    try:
        os.posix_fallocate(fd, 0, PREALLOCATED)
        payload = os.urandom(group)
        syncs: list[tuple[float, float]] = []
        due = time.monotonic()
        end = due + seconds
        written = 0
        while time.monotonic() < end and written + group <= PREALLOCATED:
            os.write(fd, payload)
            written += group
            started = time.monotonic()
            os.fdatasync(fd)
            syncs.append((started, time.monotonic() - started))
            due += tick_s
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                due = time.monotonic()  # behind: the next group goes at once, as a journal's
        out.send(syncs)
    finally:
        os.close(fd)


def bulk(directory: str, seconds: float, mb_per_s: float) -> None:
    """Writes 1 MiB at a time at ``mb_per_s``, fdatasync after each, dropping the pages."""
    fd = os.open(os.path.join(directory, f"log-{os.getpid()}"), os.O_CREAT | os.O_WRONLY)
    try:
        chunk = os.urandom(1 << 20)
        start = time.monotonic()
        written = 0
        while time.monotonic() - start < seconds:
            os.write(fd, chunk)
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            written += 1
            delay = start + written * (1 << 20) / (mb_per_s * 1e6) - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    finally:
        os.close(fd)


def stall_moments(
    per_journal: list[list[tuple[float, float]]], stall_s: float
) -> list[dict[str, float]]:
    """Spans in which every journal was inside a sync longer than ``stall_s`` (a sweep over the
    stalls' starts and ends; one journal's syncs never overlap)."""
    edges = sorted(
        (edge, step)
        for syncs in per_journal
        for start, duration in syncs
        if duration > stall_s
        for edge, step in ((start, 1), (start + duration, -1))
    )
    moments: list[dict[str, float]] = []
    inside = 0
    began = 0.0
    for at, step in edges:  # at equal times the ends (-1) come first: touching is not at once
        inside += step
        if step > 0 and inside == len(per_journal):
            began = at
        elif step < 0 and inside == len(per_journal) - 1 and at > began:
            moments.append({"at_s": began, "ms": (at - began) * 1e3})
    return moments


def run_writers(
    processes: Sequence[BaseProcess], pipes: Sequence[tuple[Connection, Connection]], seconds: float
) -> list[Any]:
    """Starts the writer ``processes``, takes what each of the first ``len(pipes)`` sends on
    its pipe, and waits for every one (killing any still alive a minute after its ``seconds``);
    exits with the failed ones' codes if any failed (one that died before sending ends the
    wait for its answer: this process keeps no end of the pipe it sends on)."""
    for process in processes:
        process.start()
    for _, sender in pipes:
        sender.close()
    try:
        results = [receiver.recv() for receiver, _ in pipes]
    except EOFError:
        results = []  # a writer died before it sent: its exit code says so below
    finally:
        for process in processes:
            process.join(seconds + 60)
            if process.is_alive():
                process.kill()
                process.join()
    failed = [process.exitcode for process in processes if process.exitcode != 0]
    if failed or len(results) < len(pipes):
        raise SystemExit(f"a writer process failed (exit codes {failed}): see its error above")
    return results


def measure(args: argparse.Namespace, directory: str) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    pipes = [context.Pipe(duplex=False) for _ in range(args.journals)]
    processes = [
        context.Process(
            target=journal,
            args=(directory, args.seconds, args.group_kb * 1024, args.tick_ms / 1000, sender),
        )
        for _, sender in pipes
    ]
    if args.bulk_mb_s > 0:
        processes += [
            context.Process(target=bulk, args=(directory, args.seconds, args.bulk_mb_s))
            for _ in range(args.journals)
        ]
    per_journal: list[list[tuple[float, float]]] = run_writers(processes, pipes, args.seconds)
    stall_s = args.stall_ms / 1000
    first = min((syncs[0][0] for syncs in per_journal if syncs), default=0.0)
    journals = []
    for syncs in per_journal:
        durations = array("d", (d for _, d in syncs))
        figures = percentiles_ms(durations)
        journals.append(
            {
                "syncs": len(durations),
                "p50_ms": figures["p50_ms"],
                "p99_ms": figures["p99_ms"],
                "max_ms": figures["max_ms"],
                "over_stall": sum(d > stall_s for d in durations),
            }
        )
    moments = [
        {"at_s": m["at_s"] - first, "ms": m["ms"]} for m in stall_moments(per_journal, stall_s)
    ]
    return {"journals": journals, "stall_moments": moments}


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's arguments (``argv``, or the process's)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--journals", type=int, default=3)
    parser.add_argument("--group-kb", type=int, default=40, help="bytes appended per sync (KiB)")
    parser.add_argument("--tick-ms", type=float, default=1.4, help="one group per tick")
    parser.add_argument(
        "--bulk-mb-s", type=float, default=40.0, help="each entry-log-like writer (0: none)"
    )
    parser.add_argument("--stall-ms", type=float, default=20.0)
    parser.add_argument("--directory", help="where to write (default: a temporary directory)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.journals < 1 or args.seconds <= 0 or args.group_kb < 1 or args.tick_ms <= 0:
        parser.error("--journals, --seconds, --group-kb and --tick-ms must be positive")
    return args


def main() -> None:
    args = arguments()
    with tempfile.TemporaryDirectory(prefix="disk-stalls-", dir=args.directory) as directory:
        report = measure(args, directory)
    if args.json:
        print(json.dumps(report))
        return
    for i, figures in enumerate(report["journals"]):
        print(
            f"journal {i}: {figures['syncs']:,} syncs, p50 {figures['p50_ms']:.2f}  "
            f"p99 {figures['p99_ms']:.2f}  max {figures['max_ms']:.1f} ms, "
            f"{figures['over_stall']} over {args.stall_ms:g} ms"
        )
    moments = report["stall_moments"]
    listed = ", ".join(f"{m['ms']:.0f} ms at {m['at_s']:.1f} s" for m in moments)
    print(
        f"every journal stalled at once (over {args.stall_ms:g} ms): "
        + (f"{len(moments)} times: {listed}" if moments else "never")
    )


if __name__ == "__main__":
    main()
