"""Workloads run by ``bookkeeper shell simpletest`` and the ``localbookie --demo`` job."""

from __future__ import annotations

import collections
import concurrent.futures
import random
import time
from dataclasses import dataclass

from bookkeeper_py.client.facade import BookKeeper
from bookkeeper_py.wire.digest import DigestType


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
) -> SimpleTestResult:
    """Creates a ledger, writes ``entries`` entries (pipelined), closes it, reopens it, reads
    every entry back and checks the bytes. Raises ``AssertionError`` on any difference."""
    rng = random.Random(seed)
    password = b"simpletest"
    payloads = [rng.randbytes(entry_size) for _ in range(entries)]
    handle = bk.create_ledger(
        ensemble_size, write_quorum_size, ack_quorum_size, digest_type, password
    )
    start = time.perf_counter()
    window: collections.deque[concurrent.futures.Future[int]] = collections.deque()
    ids: list[int] = []
    for payload in payloads:
        if len(window) >= in_flight:
            ids.append(window.popleft().result())
        window.append(handle.add_entry_async(payload))
    ids.extend(future.result() for future in window)
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
    read = reader.read_entries(0, entries - 1) if entries else []
    read_seconds = time.perf_counter() - start
    for entry, payload in zip(read, payloads, strict=True):
        if entry.data != payload:
            raise AssertionError(
                f"ledger {handle.ledger_id} entry {entry.entry_id}: read bytes differ"
            )
    return SimpleTestResult(
        handle.ledger_id, entries, entries * entry_size, write_seconds, read_seconds
    )
