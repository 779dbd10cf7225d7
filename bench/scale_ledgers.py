"""Scale of the bookie storage engine in ledgers (issue 3).

1. Active ledgers: durable 1 KiB adds/s when the adds are spread over 100 ledgers and over
   100,000 ledgers (engine alone, fsync on), median of --runs, and the ratio of the two.
2. A million ledgers: fill one bookie's storage with --ledgers ledgers of --entries entries each
   (engine alone), then start a real bookie process on it, time its start, read random entries of
   random ledgers and add entries to random ledgers over the network (v2 protocol), stop it,
   start it again, and check what was added and read is still there.

    python bench/scale_ledgers.py [--ledgers 1000000] [--entries 3] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any

from bookkeeper_py.storage.cookie import Cookie, write_local
from bookkeeper_py.storage.engine import StorageConfig, StorageEngine
from bookkeeper_py.testing.local_cluster import free_port
from bookkeeper_py.testing.raw import recv_exactly
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.status import StatusCode

HEADER = struct.Struct(">qqqq")
KEY = b"k" * 20


def entry_bytes(ledger_id: int, entry_id: int, size: int) -> bytes:
    return HEADER.pack(ledger_id, entry_id, entry_id - 1, 0) + (
        b"%d:%d|" % (ledger_id, entry_id)
    ).ljust(size, b".")


def storage_config(directory: str, **changes: Any) -> StorageConfig:
    settings: dict[str, Any] = dict(
        journal_directory=os.path.join(directory, "journal"),
        ledger_directory=os.path.join(directory, "ledgers"),
        write_cache_max_bytes=512 * 1024 * 1024,
        flush_interval_s=1.0,
    )
    settings.update(changes)
    return StorageConfig(**settings)


class Acks:
    """Counts durable adds; ``done`` is set once ``total`` were acknowledged."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.count = 0
        self.done = threading.Event()

    def __call__(self, tokens: list[Any], error: Exception | None) -> None:
        assert error is None, error
        self.count += len(tokens)
        if self.count >= self.total:
            self.done.set()


def counting_engine(directory: str, total: int) -> tuple[StorageEngine, Acks]:
    acks = Acks(total)
    engine = StorageEngine(storage_config(directory), acks)
    engine.start()
    return engine, acks


def engine_adds_per_second(directory: str, ledgers: int, total: int, size: int) -> float:
    engine, acks = counting_engine(directory, total)
    for ledger_id in range(ledgers):
        engine.create_ledger(ledger_id, KEY)
    work = [(i % ledgers, i // ledgers) for i in range(total)]
    payloads = [entry_bytes(lid, eid, size) for lid, eid in work]
    add = engine.add_entry
    start = time.perf_counter()
    for (ledger_id, entry_id), entry in zip(work, payloads, strict=True):
        add(ledger_id, entry_id, entry, True)
    assert acks.done.wait(600)
    elapsed = time.perf_counter() - start
    engine.close()
    return total / elapsed


def fill(directory: str, ledgers: int, entries: int, size: int) -> float:
    total = ledgers * entries
    engine, acks = counting_engine(directory, total)
    start = time.perf_counter()
    for first in range(0, ledgers, 10_000):
        for ledger_id in range(first, min(first + 10_000, ledgers)):
            engine.create_ledger(ledger_id, KEY)
            for entry_id in range(entries):
                engine.add_entry(ledger_id, entry_id, entry_bytes(ledger_id, entry_id, size), True)
        while acks.count < min(total, (first + 10_000) * entries) - 200_000:
            time.sleep(0.01)  # keep the journal queue bounded
    assert acks.done.wait(600)
    engine.close()
    return time.perf_counter() - start


class Bookie:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        ready = os.path.join(self.directory, "ready")
        if os.path.exists(ready):
            os.unlink(ready)
        start = time.perf_counter()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bookkeeper_py",
                "bookie",
                "--port",
                str(self.port),
                "--journal-dir",
                os.path.join(self.directory, "journal"),
                "--ledger-dir",
                os.path.join(self.directory, "ledgers"),
                "--ready-file",
                ready,
                "--standalone",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 600
        while not os.path.exists(ready):
            assert self.process.poll() is None, "the bookie exited at start"
            assert time.monotonic() < deadline, "the bookie did not start in 10 minutes"
            time.sleep(0.02)
        return time.perf_counter() - start

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(120)


def pipelined(port: int, frames: list[bytes]) -> list[v2.Response]:
    """Sends every frame, then reads as many responses (v2, one connection; a bookie answers
    reads in any order, as BookKeeper's read threads do: ``verify_reads`` matches them)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
        sender = threading.Thread(target=connection.sendall, args=(b"".join(frames),))
        sender.start()
        responses = []
        for _ in frames:
            length = int.from_bytes(recv_exactly(connection, 4), "big")
            responses.append(v2.decode_response(recv_exactly(connection, length)))
        sender.join()
    return responses


def verify_reads(asked: list[tuple[int, int]], answers: list[v2.Response]) -> None:
    """Every entry asked for was answered, with its bytes (answers matched by ledger and entry)."""
    got = Counter((answer.ledger_id, answer.entry_id) for answer in answers)
    assert got == Counter(asked), "the answers are not those of the reads sent"
    for answer in answers:
        lid, eid = answer.ledger_id, answer.entry_id
        assert answer.status == StatusCode.EOK and answer.body == entry_bytes(lid, eid, 100), (
            lid,
            eid,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ledgers", type=int, default=1_000_000)
    parser.add_argument("--entries", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="bench-scale-", dir=args.dir)
    rng = random.Random(7)
    try:
        total = 400_000
        rates: dict[int, float] = {}
        for ledgers in (100, 100_000):
            runs = []
            for run in range(args.runs):
                directory = os.path.join(base, f"active-{ledgers}-{run}")
                runs.append(engine_adds_per_second(directory, ledgers, total, 1024))
                shutil.rmtree(directory, ignore_errors=True)
            rates[ledgers] = statistics.median(runs)
            print(
                f"1 KiB adds over {ledgers:>7,} active ledgers: {rates[ledgers]:>9,.0f} adds/s (median of {args.runs})"
            )
        print(f"100,000 / 100 active ledgers: {rates[100_000] / rates[100]:.0%}")

        directory = os.path.join(base, "million")
        seconds = fill(directory, args.ledgers, args.entries, 100)
        size = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(directory) for f in fs
        )
        print(
            f"filled {args.ledgers:,} ledgers x {args.entries} entries in {seconds:.1f} s "
            f"({size / 1e6:,.0f} MB on disk)"
        )
        bookie = Bookie(directory)
        # The fill ran the engine alone; stamp the cookies the bookie would have written.
        cookie = Cookie(
            f"127.0.0.1:{bookie.port}",
            (os.path.join(directory, "journal"),),
            (os.path.join(directory, "ledgers"),),
            None,
        )
        for sub in ("journal", "ledgers"):
            write_local(os.path.join(directory, sub), cookie)
        print(f"bookie start with {args.ledgers:,} ledgers: {bookie.start():.2f} s")
        probes = [
            (rng.randrange(args.ledgers), rng.randrange(args.entries)) for _ in range(args.requests)
        ]
        start = time.perf_counter()
        answers = pipelined(bookie.port, [v2.encode_read_request(lid, eid) for lid, eid in probes])
        elapsed = time.perf_counter() - start
        verify_reads(probes, answers)
        print(
            f"random reads over the network: {len(probes) / elapsed:,.0f} reads/s ({len(probes):,} reads, all verified)"
        )
        added = [(rng.randrange(args.ledgers), args.entries + i) for i in range(args.requests)]
        start = time.perf_counter()
        answers = pipelined(
            bookie.port,
            [v2.encode_add_request(KEY, entry_bytes(lid, eid, 100)) for lid, eid in added],
        )
        elapsed = time.perf_counter() - start
        assert all(answer.status == StatusCode.EOK for answer in answers)
        print(
            f"adds to random ledgers over the network: {len(added) / elapsed:,.0f} adds/s ({len(added):,} adds)"
        )
        bookie.stop()
        print(f"bookie restart: {bookie.start():.2f} s")
        answers = pipelined(
            bookie.port, [v2.encode_read_request(lid, eid) for lid, eid in added + probes[:1000]]
        )
        verify_reads(added + probes[:1000], answers)
        print(
            f"after the restart: all {len(added):,} added entries and 1,000 old ones read back and verified"
        )
        bookie.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
