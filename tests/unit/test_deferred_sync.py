"""DEFERRED_SYNC: the add is answered before the journal sync; FORCE_LEDGER waits for it."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from bookkeeper.server.bookie import Bookie, BookieConfig
from bookkeeper.storage.engine import StorageConfig
from bookkeeper.wire.digest import DigestManager, DigestType
from bookkeeper.wire.status import StatusCode

KEY = b"d" * 20


def entry(entry_id: int) -> bytes:
    return DigestManager(9, DigestType.CRC32C, b"").package(entry_id, entry_id - 1, 0, b"payload")


async def settle(condition, limit: int = 300) -> None:  # type: ignore[no-untyped-def]
    for _ in range(limit):
        if condition():
            return
        await asyncio.sleep(0.01)


def test_deferred_add_is_answered_before_the_sync_and_force_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    real_fdatasync = os.fdatasync

    def held_fdatasync(fd: int) -> None:
        assert gate.wait(30), "the test never released the sync"
        real_fdatasync(fd)

    async def scenario() -> None:
        config = BookieConfig(
            StorageConfig(str(tmp_path / "j"), str(tmp_path / "l"), flush_interval_s=3600)
        )
        bookie = Bookie(config, asyncio.get_running_loop())
        bookie.start()
        monkeypatch.setattr(os, "fdatasync", held_fdatasync)
        answers: list[tuple[str, StatusCode]] = []
        bookie.add_entry(
            9, 0, KEY, entry(0), False, lambda status: answers.append(("normal", status))
        )
        bookie.add_entry(
            9,
            1,
            KEY,
            entry(1),
            False,
            lambda status: answers.append(("deferred", status)),
            deferred_sync=True,
        )
        bookie.force_ledger(9, lambda status: answers.append(("force", status)))
        await asyncio.sleep(0.2)
        assert answers == [("deferred", StatusCode.EOK)]  # the sync is still held
        gate.set()
        await settle(lambda: len(answers) == 3)
        assert answers == [
            ("deferred", StatusCode.EOK),
            ("normal", StatusCode.EOK),
            ("force", StatusCode.EOK),
        ]
        monkeypatch.undo()
        bookie.close()

    asyncio.run(scenario())
