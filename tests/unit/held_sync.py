"""A real bookie on its own loop with its journal syncs held until the test lets them go."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bookkeeper_py.server.bookie import Bookie, BookieConfig
from bookkeeper_py.storage import journal
from bookkeeper_py.storage.engine import StorageConfig


async def settle(condition: Callable[[], bool], limit: int = 300) -> None:
    """Waits (at most ``limit`` x 10 ms) for ``condition``."""
    for _ in range(limit):
        if condition():
            return
        await asyncio.sleep(0.01)


def run_with_held_sync(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    scenario: Callable[[Bookie, threading.Event], Awaitable[None]],
    **limits: Any,
) -> None:
    """Runs ``scenario(bookie, gate)``: every fdatasync waits until ``gate`` is set. The
    journal's syncs run on the Python syncer thread (``os.fdatasync``, which the test holds;
    the C one calls the system's), never on the loop."""
    gate = threading.Event()
    real_fdatasync = os.fdatasync

    def held_fdatasync(fd: int) -> None:
        assert gate.wait(30), "the test never released the sync"
        real_fdatasync(fd)

    monkeypatch.setattr(journal, "make_syncer", journal.ThreadSyncer)
    monkeypatch.setattr(journal, "INLINE_MAX_RECORDS", 0)

    async def main() -> None:
        storage = StorageConfig(str(tmp_path / "j"), str(tmp_path / "l"), flush_interval_s=3600)
        bookie = Bookie(BookieConfig(storage, **limits), asyncio.get_running_loop())
        bookie.start()
        monkeypatch.setattr(os, "fdatasync", held_fdatasync)
        try:
            await scenario(bookie, gate)
        finally:
            gate.set()
            monkeypatch.undo()
            bookie.close()

    asyncio.run(main())
