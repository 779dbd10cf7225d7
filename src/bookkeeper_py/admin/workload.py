"""Workloads run by ``bookkeeper shell simpletest`` and the ``localbookie --demo`` job."""

from __future__ import annotations

import collections
import concurrent.futures
import random
import time
from dataclasses import dataclass

from bookkeeper_py.client.facade import BookKeeper
from bookkeeper_py.client.ledger import LedgerEntry
from bookkeeper_py.progress import SILENT, Display
from bookkeeper_py.wire.digest import DigestType

# Entries read back per request: the reading progress moves at least this often.
READ_CHUNK = 500


@dataclass(frozen=True)
class SimpleTestResult:
    ledger_id: int
    entries: int
    bytes: int
    write_seconds: float
    read_seconds: float


def simple_test(
    bk: BookKeeper,
    *,
    entries: int,
    entry_size: int,
    ensemble_size: int,
    write_quorum_size: int,
    ack_quorum_size: int,
    digest_type: DigestType = DigestType.CRC32C,
    in_flight: int = 1000,
    seed: int | None = None,
    progress: Display = SILENT,
) -> SimpleTestResult:
    """Creates a ledger, writes ``entries`` entries (pipelined), closes it, reopens it, reads
    every entry back and checks the bytes. Raises ``AssertionError`` on any difference.
    ``progress`` shows the entries written (acknowledged) and read."""
    rng = random.Random(seed)
    password = b"simpletest"
    payloads = [rng.randbytes(entry_size) for _ in range(entries)]
    handle = bk.create_ledger(
        ensemble_size, write_quorum_size, ack_quorum_size, digest_type, password
    )
    start = time.perf_counter()
    window: collections.deque[concurrent.futures.Future[int]] = collections.deque()
    ids: list[int] = []
    with progress.task("writing entries", total=entries, unit="entries") as written:
        for payload in payloads:
            if len(window) >= in_flight:
                ids.append(window.popleft().result())
                written.advance()
            window.append(handle.add_entry_async(payload))
        for future in window:
            ids.append(future.result())
            written.advance()
    write_seconds = time.perf_counter() - start
    if ids != list(range(entries)):
        raise AssertionError(f"ledger {handle.ledger_id}: entry ids came back out of order")
    handle.close()
    start = time.perf_counter()
    reader = bk.open_ledger(handle.ledger_id, password)
    if reader.last_add_confirmed != entries - 1:
        raise AssertionError(
            f"ledger {handle.ledger_id}: closed at {reader.last_add_confirmed}, expected {entries - 1}"
        )
    read: list[LedgerEntry] = []
    with progress.task("reading entries", total=entries, unit="entries") as reading:
        for first in range(0, entries, READ_CHUNK):
            chunk = reader.read_entries(first, min(first + READ_CHUNK, entries) - 1)
            read.extend(chunk)
            reading.advance(len(chunk))
    read_seconds = time.perf_counter() - start
    for entry, payload in zip(read, payloads, strict=True):
        if entry.data != payload:
            raise AssertionError(
                f"ledger {handle.ledger_id} entry {entry.entry_id}: read bytes differ"
            )
    return SimpleTestResult(
        handle.ledger_id, entries, entries * entry_size, write_seconds, read_seconds
    )
