"""A read whose entry is not in memory is read by a reader thread, not by the bookie's event
loop: while the disk works, the loop serves other requests (a live writer's adds next to a
re-replication's reads of old entries, issue 20). Entries in the page cache are read on the loop
as before."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from bookkeeper_py.prometheus import PrometheusMetrics
from bookkeeper_py.server.bookie import Bookie, BookieConfig
from bookkeeper_py.storage import entry_log
from bookkeeper_py.storage.engine import StorageConfig, StorageEngine
from bookkeeper_py.storage.entry_log import EntryLogger, ReadWouldBlockError
from bookkeeper_py.wire import v2

from ..storage.test_entry_log import entry as raw_entry
from .held_sync import settle
from .test_background_copies import KEY, answers, connect, entry

ENTRIES = 5
FROM_DISK = "bookkeeper_server_READ_ENTRY_FROM_DISK_total"


def read_from_disk(metrics: PrometheusMetrics) -> float:
    """The bookie's count of reads handed to a reader thread."""
    for line in metrics.render().decode().splitlines():
        if line.startswith(FROM_DISK + " "):
            return float(line.split()[1])
    raise AssertionError(f"{FROM_DISK} is not among the bookie's metrics")


def run_bookie(
    tmp_path: Path, scenario: Callable[[Bookie, PrometheusMetrics], Awaitable[None]]
) -> None:
    """Runs ``scenario(bookie, its metrics)`` on a real bookie of its own loop."""

    async def main() -> None:
        storage = StorageConfig(str(tmp_path / "j"), str(tmp_path / "l"), flush_interval_s=3600)
        metrics = PrometheusMetrics()
        bookie = Bookie(BookieConfig(storage), asyncio.get_running_loop(), metrics)
        bookie.start()
        try:
            await scenario(bookie, metrics)
        finally:
            bookie.close()

    asyncio.run(main())


def test_an_entry_on_disk_is_read_off_the_loop_while_adds_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The disk, as the kernel would describe it: nothing is cached (preadv with RWF_NOWAIT
    # says EAGAIN), and a waiting read of ledger 9 waits until the test lets it go.
    released = threading.Event()
    readers: list[str] = []
    real_pread = os.pread

    def not_cached(fd: int, buffers: list[bytearray], offset: int, flags: int) -> int:
        raise BlockingIOError("not in the page cache")

    def disk_read(fd: int, size: int, offset: int) -> bytes:
        readers.append(threading.current_thread().name)
        assert released.wait(30), "the test never released the disk"
        return real_pread(fd, size, offset)

    async def scenario(bookie: Bookie, metrics: PrometheusMetrics) -> None:
        try:
            writer, writes = connect(bookie)
            for entry_id in range(ENTRIES):
                writer.data_received(v2.encode_add_request(KEY, entry(9, entry_id)))
            await settle(lambda: len(answers(writes)) == ENTRIES)
            engine = bookie.engine
            assert isinstance(engine, StorageEngine)
            await asyncio.to_thread(engine.checkpoint)  # into the entry log
            monkeypatch.setattr(entry_log, "_NOWAIT", 8)
            monkeypatch.setattr(os, "preadv", not_cached)
            monkeypatch.setattr(os, "pread", disk_read)
            reader, reads = connect(bookie)
            for entry_id in range(ENTRIES):
                reader.data_received(v2.encode_read_request(9, entry_id))
            # The reads wait for the disk; an add arriving meanwhile is answered.
            await settle(lambda: len(readers) >= 1)
            writer.data_received(v2.encode_add_request(KEY, entry(10, 0)))
            await settle(lambda: len(answers(writes)) == ENTRIES + 1)
            assert [(r.ledger_id, r.entry_id) for r in answers(writes)][-1] == (10, 0)
            assert answers(reads) == []
            released.set()
            await settle(lambda: len(answers(reads)) == ENTRIES)
            got = {r.entry_id: r.body for r in answers(reads)}
            assert got == {entry_id: entry(9, entry_id) for entry_id in range(ENTRIES)}
            assert threading.main_thread().name not in readers
            assert read_from_disk(metrics) == ENTRIES
        finally:
            released.set()
            monkeypatch.undo()

    run_bookie(tmp_path, scenario)


def test_a_cached_entry_is_read_on_the_loop(tmp_path: Path) -> None:
    async def scenario(bookie: Bookie, metrics: PrometheusMetrics) -> None:
        writer, writes = connect(bookie)
        writer.data_received(v2.encode_add_request(KEY, entry(9, 0)))
        await settle(lambda: len(answers(writes)) == 1)
        reader, reads = connect(bookie)
        reader.data_received(v2.encode_read_request(9, 0))
        await settle(lambda: len(answers(reads)) == 1)
        assert [r.body for r in answers(reads)] == [entry(9, 0)]
        assert read_from_disk(metrics) == 0

    run_bookie(tmp_path, scenario)


def test_a_read_that_would_wait_for_the_disk_says_so(tmp_path: Path) -> None:
    """On this kernel and file system: once an entry log's pages are dropped from the page
    cache, a read asked not to wait raises ``ReadWouldBlockError``; the waiting read returns
    the entry."""
    if not entry_log._NOWAIT:
        pytest.skip("no preadv(RWF_NOWAIT) here: every read waits")
    logger = EntryLogger(str(tmp_path), flush_every_bytes=1024 * 1024, remove_from_page_cache=True)
    entries = [raw_entry(3, index, 64 * 1024) for index in range(8)]
    locations = logger.add_many(3, entries)
    logger.flush()
    try:
        logger.read(locations[1], 3, 1, nowait=True)
    except ReadWouldBlockError:
        pass
    else:
        pytest.skip("this file system kept the dropped pages (or cannot tell): nothing to see")
    assert [logger.read(location, 3, i) for i, location in enumerate(locations)] == entries
    # read once, the pages are cached: the read that must not wait gets them
    assert logger.read(locations[1], 3, 1, nowait=True) == entries[1]
    logger.close()
