"""The bookie's LAC: known as an entry or an explicit LAC arrives, not after its journal sync."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from bookkeeper_py.server.bookie import Bookie
from bookkeeper_py.wire.digest import DigestManager, DigestType
from bookkeeper_py.wire.status import StatusCode

from .held_sync import run_with_held_sync, settle

KEY = b"l" * 20


def entry(entry_id: int) -> bytes:
    return DigestManager(7, DigestType.CRC32C, b"").package(entry_id, entry_id - 1, 0, b"payload")


def test_a_long_poll_is_answered_by_an_arriving_entry_before_its_journal_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        added: list[tuple[int, StatusCode]] = []
        polls: list[tuple[StatusCode, int]] = []
        bookie.add_entry(7, 0, KEY, entry(0), False, lambda status: added.append((0, status)))
        bookie.read_long_poll(
            7, 1, 0, 30.0, False, lambda status, _body, lac: polls.append((status, lac))
        )
        # Entry 2 carries LAC 1: entries 0-1 have their acks (the writer's word), whether or
        # not entry 2 ever becomes durable here.
        bookie.add_entry(7, 1, KEY, entry(1), False, lambda status: added.append((1, status)))
        bookie.add_entry(7, 2, KEY, entry(2), False, lambda status: added.append((2, status)))
        await settle(lambda: bool(polls))
        assert polls == [(StatusCode.EOK, 1)]
        assert added == []  # every journal sync is still held
        assert bookie.last_add_confirmed(7) == 1
        gate.set()
        await settle(lambda: len(added) == 3)
        assert sorted(added) == [(0, StatusCode.EOK), (1, StatusCode.EOK), (2, StatusCode.EOK)]

    run_with_held_sync(tmp_path, monkeypatch, scenario)


def test_a_long_poll_is_answered_by_an_explicit_lac_before_its_journal_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        written: list[StatusCode] = []
        polls: list[tuple[StatusCode, int]] = []
        for entry_id in range(3):
            bookie.add_entry(7, entry_id, KEY, entry(entry_id), False, lambda status: None)
        bookie.read_long_poll(
            7, 2, 1, 30.0, False, lambda status, _body, lac: polls.append((status, lac))
        )
        lac = DigestManager(7, DigestType.CRC32C, b"").package_lac(2)
        bookie.write_lac(7, KEY, lac, written.append)
        await settle(lambda: bool(polls))
        assert polls == [(StatusCode.EOK, 2)]  # woken on arrival
        assert written == []  # its journal record is not synced yet
        gate.set()
        await settle(lambda: bool(written))
        assert written == [StatusCode.EOK]
        assert bookie.read_lac(7)[1] == lac  # kept for READ_LAC

    run_with_held_sync(tmp_path, monkeypatch, scenario)
