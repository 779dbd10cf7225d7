"""Storage engine alone (one process, no network): adds/s and MB/s with fsync before every ack.

For 100 B, 1 KiB and 64 KiB entries the engine takes adds spread over 100 ledgers (write cache +
journal with group commit) and counts them once their journal record is durable. Next to it, in
the same run and on the same disk: the raw fsync rate (4 KiB write + fdatasync) and sequential
write bandwidth (4 MiB writes, fdatasync after each), so each figure is also a ratio to the limit.

    python bench/storage_engine.py [--seconds 3] [--runs 3] [--dir /path/on/the/disk]

Prints medians of the runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import tempfile
import threading
import time
from typing import Any

from bookkeeper_py.admin import limits
from bookkeeper_py.storage.engine import StorageConfig, StorageEngine

HEADER = struct.Struct(">qqqq")
LEDGERS = 100


def make_entries(size: int, count: int) -> list[tuple[int, int, bytes]]:
    payload = os.urandom(size)
    entries = []
    for index in range(count):
        ledger_id, entry_id = index % LEDGERS, index // LEDGERS
        entries.append(
            (ledger_id, entry_id, HEADER.pack(ledger_id, entry_id, entry_id - 1, 0) + payload)
        )
    return entries


def run_engine(directory: str, entries: list[tuple[int, int, bytes]]) -> tuple[float, float]:
    """(adds/s, MB/s) from the first add to the last durable ack."""
    done = threading.Event()
    acked = [0]
    total = len(entries)

    def durable(tokens: list[Any], error: Exception | None) -> None:
        if error is not None:
            raise error
        acked[0] += len(tokens)
        if acked[0] >= total:
            done.set()

    config = StorageConfig(
        journal_directory=os.path.join(directory, "journal"),
        ledger_directory=os.path.join(directory, "ledgers"),
        write_cache_max_bytes=512 * 1024 * 1024,
        flush_interval_s=1.0,
    )
    engine = StorageEngine(config, durable)
    engine.start()
    for ledger_id in range(LEDGERS):
        engine.create_ledger(ledger_id, b"k" * 20)
    add = engine.add_entry
    start = time.perf_counter()
    for ledger_id, entry_id, entry in entries:
        add(ledger_id, entry_id, entry, True)
    assert done.wait(300), "the engine did not acknowledge every add"
    elapsed = time.perf_counter() - start
    engine.close()
    size = sum(len(entry) for _, _, entry in entries)
    return total / elapsed, size / elapsed / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="target length of each engine run"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--dir", default=None, help="directory on the disk to measure (default: a temp dir)"
    )
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="bench-storage-", dir=args.dir)
    try:
        fsyncs = statistics.median(limits.fsync_rate(base, 1.0) for _ in range(args.runs))
        sequential = statistics.median(limits.sequential_mb_s(base, 2.0) for _ in range(args.runs))
        print(
            f"disk: {fsyncs:,.0f} fsyncs/s (4 KiB write + fdatasync), "
            f"{sequential:,.0f} MB/s sequential (4 MiB + fdatasync)"
        )
        # Rough entry counts per size so that each run lasts about --seconds.
        for size, rate_guess in ((100, 150_000), (1024, 120_000), (65536, 5_000)):
            count = int(rate_guess * args.seconds)
            results = []
            for run in range(args.runs):
                directory = os.path.join(base, f"engine-{size}-{run}")
                results.append(run_engine(directory, make_entries(size, count)))
                shutil.rmtree(directory, ignore_errors=True)
            adds = statistics.median(r[0] for r in results)
            mb = statistics.median(r[1] for r in results)
            print(
                f"{size:>6} B entries: {adds:>10,.0f} adds/s  {mb:>7,.1f} MB/s  "
                f"({mb / sequential:.0%} of sequential bandwidth, {count:,} adds per run, {args.runs} runs)"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
