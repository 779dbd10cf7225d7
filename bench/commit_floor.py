"""The add latency that the disk alone allows at a given rate: three bookies' journals doing
open-loop group commit, with no bookie, client or network code at all.

Adds fall due at ``--rate`` a second, evenly spaced, and are striped as a 3/2/2 ledger stripes
them (entry ``i`` to journals ``i mod 3`` and ``i + 1 mod 3``; ``--write-quorum``). Each journal
is a process that does what a bookie's journal does with the entries it gets, and nothing else:
it takes every entry due by now that it has not written, appends them as one group (``--entry-size``
bytes each) and ``fdatasync``s it, or sleeps until its next entry is due when none is. It
overwrites a file written once at the start, so its syncs never meet unwritten space nor a
growing file (the best case of a journal: recycled, or zeroed ahead). An add's latency is from
its due time to the end of the sync of its last copy (the write quorum is the ack quorum, as at
3/2/2).

The report is the percentiles of those latencies and of the syncs: what ``bench writes
--rate=R --local 3`` could at best show on this disk at this moment, were every other cost nil.
``bench/cluster.py`` measures it beside its half-rate row, at that row's rate.

    python bench/commit_floor.py --rate 45000 [--seconds 5] [--entry-size 1024] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from array import array
from multiprocessing.connection import Connection
from typing import Any

from disk_stalls import run_writers  # bench/, beside this script
from log_bench import percentiles_ms

RING = 16 * 1024 * 1024  # bytes of each journal's file, written once and then overwritten


def served(journal: int, journals: int, write_quorum: int, index: int) -> bool:
    """Whether entry ``index`` has a copy on ``journal`` (a ledger's striping)."""
    return (journal - index) % journals < write_quorum


def served_between(journal: int, journals: int, write_quorum: int, first: int, last: int) -> int:
    """How many of the entries ``first`` to ``last`` have a copy on ``journal``."""
    return sum(
        (last - residue) // journals - (first - 1 - residue) // journals
        for residue in range(journals)
        if served(journal, journals, write_quorum, residue)
    )


def journal(
    directory: str,
    journal_id: int,
    settings: tuple[int, int, float, int, int],
    together: Any,
    start_at: Any,
    out: Connection,
) -> None:
    """One journal's group commits, from a start common to every journal once each has written
    its file (``together``: a barrier of the journals; ``start_at``: a shared double); sends the
    start and (first index, last index, end of sync, sync seconds) per group: every entry of this
    journal due from the first to the last index became durable at the end of that sync."""
    journals, write_quorum, rate, total, entry_size = settings
    path = os.path.join(directory, f"journal-{journal_id}")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        block = os.urandom(1024 * 1024)
        for offset in range(0, RING, len(block)):
            os.pwrite(fd, block, offset)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        payload = memoryview(os.urandom(RING // 4))
        groups: list[tuple[int, int, float, float]] = []
        position = 0
        first = 0  # the next entry index not yet written (of any journal: skipped if not ours)
        if together.wait(timeout=120) == 0:
            start_at.value = time.monotonic() + 0.05
        together.wait(timeout=120)
        start = start_at.value
        time.sleep(max(start - time.monotonic(), 0.0))
        while first < total:
            now = time.monotonic()
            last = min(int((now - start) * rate), total - 1)
            if last < first:
                time.sleep(max(start + first / rate - now, 0.0))
                continue
            count = served_between(journal_id, journals, write_quorum, first, last)
            size = count * entry_size
            if size:
                if position + size > RING:
                    position = 0
                written = 0
                while written < size:  # a group larger than the payload goes in pieces
                    piece = min(size - written, len(payload))
                    written += os.pwrite(fd, payload[:piece], position + written)
                began = time.monotonic()
                os.fdatasync(fd)
                ended = time.monotonic()
                position += size
                groups.append((first, last, ended, ended - began))
            first = last + 1
        out.send((start, groups))
    finally:
        os.close(fd)
        os.unlink(path)


def measure(
    directory: str,
    rate: float,
    seconds: float = 5.0,
    entry_size: int = 1024,
    journals: int = 3,
    write_quorum: int = 2,
) -> dict[str, Any]:
    """Runs the journals for ``seconds`` at ``rate`` adds/s; the adds' and syncs' percentiles."""
    total = int(rate * seconds)
    context = multiprocessing.get_context("spawn")
    pipes = [context.Pipe(duplex=False) for _ in range(journals)]
    settings = (journals, write_quorum, rate, total, entry_size)
    # The journals start together once each has written its file (16 MiB).
    together, start_at = context.Barrier(journals), context.Value("d", 0.0)
    processes = [
        context.Process(target=journal, args=(directory, j, settings, together, start_at, sender))
        for j, (_, sender) in enumerate(pipes)
    ]
    reports = run_writers(processes, pipes, seconds)
    start = reports[0][0]
    per_journal = [groups for _, groups in reports]
    durable = array("d", bytes(8 * total))  # the latest copy's end of sync, per entry
    syncs = array("d")
    for journal_id, groups in enumerate(per_journal):
        for first, last, ended, took in groups:
            syncs.append(took)
            for index in range(first, last + 1):
                if served(journal_id, journals, write_quorum, index) and durable[index] < ended:
                    durable[index] = ended
    latencies = array("d", (durable[i] - (start + i / rate) for i in range(total)))
    adds = percentiles_ms(latencies)
    sync = percentiles_ms(syncs)
    return {
        "rate": rate,
        "adds": total,
        "add_p50_ms": adds["p50_ms"],
        "add_p99_ms": adds["p99_ms"],
        "add_max_ms": adds["max_ms"],
        "syncs_per_s": len(syncs) / seconds / journals,
        "sync_p50_ms": sync["p50_ms"],
        "sync_p99_ms": sync["p99_ms"],
        "sync_max_ms": sync["max_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, required=True, help="adds/s of the whole cluster")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--entry-size", type=int, default=1024)
    parser.add_argument("--journals", type=int, default=3, help="bookies (the ensemble)")
    parser.add_argument("--write-quorum", type=int, default=2)
    parser.add_argument("--directory", help="where to write (default: a temporary directory)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.rate <= 0 or args.seconds <= 0 or args.entry_size < 1:
        parser.error("--rate, --seconds and --entry-size must be positive")
    if not 1 <= args.write_quorum <= args.journals:
        parser.error("--write-quorum must be between 1 and --journals")
    with tempfile.TemporaryDirectory(prefix="commit-floor-", dir=args.directory) as directory:
        report = measure(
            directory, args.rate, args.seconds, args.entry_size, args.journals, args.write_quorum
        )
    if args.json:
        print(json.dumps(report))
        return
    print(
        f"{report['adds']:,} adds at {args.rate:,.0f}/s, the disk alone: add p50 "
        f"{report['add_p50_ms']:.3f}  p99 {report['add_p99_ms']:.3f}  max "
        f"{report['add_max_ms']:.1f} ms; {report['syncs_per_s']:,.0f} syncs/s a journal, p50 "
        f"{report['sync_p50_ms']:.3f}  p99 {report['sync_p99_ms']:.3f}  max "
        f"{report['sync_max_ms']:.1f} ms"
    )


if __name__ == "__main__":
    main()
