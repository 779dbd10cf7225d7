"""A bookie whose journal is idle syncs a lone add's group on its loop (two thread hops fewer),
and leaves syncs to the journal's syncer thread while readers are about (a sync on the loop
would hold up their answers)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from bookkeeper_py.server.bookie import READERS_QUIET_S, Bookie, BookieConfig
from bookkeeper_py.storage.engine import StorageConfig, StorageEngine
from bookkeeper_py.wire.digest import DigestManager, DigestType
from bookkeeper_py.wire.status import StatusCode

from .held_sync import settle

KEY = b"l" * 20


def entry(entry_id: int) -> bytes:
    return DigestManager(7, DigestType.CRC32C, b"").package(entry_id, entry_id - 1, 0, b"payload")


async def until_idle(bookie: Bookie) -> None:
    """Until the journal has been idle longer than its last sync took (bounded)."""
    assert isinstance(bookie.engine, StorageEngine)
    journal = bookie.engine.journals[0]
    for _ in range(1000):
        if journal.idle_past_a_sync:
            return
        await asyncio.sleep(0.001)


def test_a_lone_add_is_synced_on_the_loop_unless_readers_are_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced_on: list[int] = []
    real_fdatasync = os.fdatasync

    def recording_fdatasync(fd: int) -> None:
        synced_on.append(threading.get_ident())
        real_fdatasync(fd)

    async def main() -> None:
        storage = StorageConfig(str(tmp_path / "j"), str(tmp_path / "l"), flush_interval_s=3600)
        bookie = Bookie(BookieConfig(storage), asyncio.get_running_loop())
        bookie.start()
        monkeypatch.setattr(os, "fdatasync", recording_fdatasync)
        loop_thread = threading.get_ident()
        answers: list[tuple[StatusCode, list[int]]] = []

        def done(status: StatusCode, entry_ids: list[int]) -> None:
            answers.append((status, entry_ids))

        try:
            # The ledger's first records (its key, the file's first space).
            bookie.add_entries(7, KEY, [0], [entry(0)], done)
            await settle(lambda: len(answers) == 1)
            await until_idle(bookie)
            synced_on.clear()
            bookie.add_entries(7, KEY, [1, 2], [entry(1), entry(2)], done)
            await settle(lambda: len(answers) == 2)
            assert answers[1] == (StatusCode.EOK, [1, 2])
            assert synced_on[0] == loop_thread  # the group's sync, before any zeros ahead

            # A reader is about now, by any of the read requests: the syncs stay off the loop
            # (on the syncer thread: the C one calls the system's fdatasync, not os.fdatasync).
            reads = [
                lambda: bookie.read_entries(7, [1], lambda *_: None),
                lambda: bookie.batch_read(7, 1, 2, 1 << 20),
                lambda: bookie.read_lac(7),
            ]
            for number, read in enumerate(reads, start=3):
                bookie._read_at = -READERS_QUIET_S  # as if no read came for a while
                read()
                await until_idle(bookie)
                synced_on.clear()
                bookie.add_entries(7, KEY, [number], [entry(number)], done)
                await settle(lambda number=number: len(answers) == number)
                assert answers[-1] == (StatusCode.EOK, [number])
                assert loop_thread not in synced_on
        finally:
            monkeypatch.undo()
            bookie.close()

    asyncio.run(main())
