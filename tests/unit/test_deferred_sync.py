"""DEFERRED_SYNC: the add is answered before the journal sync; FORCE_LEDGER waits for it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from bookkeeper_py.server.bookie import Bookie
from bookkeeper_py.wire.digest import DigestManager, DigestType
from bookkeeper_py.wire.status import StatusCode

from .held_sync import run_with_held_sync, settle

KEY = b"d" * 20


def entry(entry_id: int) -> bytes:
    return DigestManager(9, DigestType.CRC32C, b"").package(entry_id, entry_id - 1, 0, b"payload")


def test_deferred_add_is_answered_before_the_sync_and_force_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
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

    run_with_held_sync(tmp_path, monkeypatch, scenario)
