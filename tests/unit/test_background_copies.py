"""Re-replication copies (RECOVERY_ADD without HIGH_PRIORITY, as BookKeeper's replicator sends
them) are background work in a bookie: served a slice a pass of its loop, after what arrived
meanwhile, so that a live writer's add waits for a slice of copies, not a burst (issue 20). A ledger's
recovery (RECOVERY_ADD with HIGH_PRIORITY) and plain adds are served at once."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from bookkeeper_py.server import bookie as bookie_module
from bookkeeper_py.server.bookie import Bookie
from bookkeeper_py.server.connection import BookieConnection
from bookkeeper_py.wire import v2, v3
from bookkeeper_py.wire.digest import DigestManager, DigestType
from bookkeeper_py.wire.framing import FrameDecoder
from bookkeeper_py.wire.proto import bookkeeper_protocol_pb2 as pb
from bookkeeper_py.wire.status import StatusCode

from .held_sync import run_with_held_sync, settle
from .test_decoders_fuzz import FakeTransport

KEY = b"k" * 20
COPIES = 20


def entry(ledger_id: int, entry_id: int) -> bytes:
    return DigestManager(ledger_id, DigestType.CRC32C, b"").package(entry_id, -1, 0, b"x" * 100)


def connect(bookie: Bookie) -> tuple[BookieConnection, FakeTransport]:
    connection = BookieConnection(bookie, set())
    transport = FakeTransport()
    connection.connection_made(transport)
    return connection, transport


def stored_order(bookie: Bookie, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(ledger, entry) of each add as the storage engine takes it, in order."""
    order: list[tuple[int, int]] = []
    engine = bookie.engine
    real_add = engine.add_entry

    def add_entry(ledger_id: int, entry_id: int, data: bytes, token: Any, *rest: Any) -> None:
        order.append((ledger_id, entry_id))
        real_add(ledger_id, entry_id, data, token, *rest)

    real_add_many = engine.add_entries

    def add_entries(ledger_id: int, entry_ids: list[int], entries: list[bytes], token: Any) -> None:
        order.extend((ledger_id, entry_id) for entry_id in entry_ids)
        real_add_many(ledger_id, entry_ids, entries, token)

    monkeypatch.setattr(engine, "add_entry", add_entry)
    monkeypatch.setattr(engine, "add_entries", add_entries)
    return order


def answers(transport: FakeTransport) -> list[v2.Response]:
    return [v2.decode_response(frame) for frame in FrameDecoder().feed(bytes(transport.written))]


def test_a_writer_s_add_is_served_before_a_burst_of_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        gate.set()
        order = stored_order(bookie, monkeypatch)
        copier, copies = connect(bookie)
        writer, writes = connect(bookie)
        burst = b"".join(
            v2.encode_add_request(KEY, entry(7, e), v2.FLAG_RECOVERY_ADD) for e in range(COPIES)
        )
        # The burst arrives, then the writer's add a pass later: the copies wait for passes of
        # the loop (a slice of background work each; here one copy a pass).
        copier.data_received(burst)
        await asyncio.sleep(0)
        writer.data_received(v2.encode_add_request(KEY, entry(8, 0)))
        await settle(lambda: copier.pending == 0 and writer.pending == 0)
        assert order.index((8, 0)) <= 2  # one or two copies before it, not the burst
        assert sorted(order) == [*((7, e) for e in range(COPIES)), (8, 0)]
        assert [(r.entry_id, r.status) for r in answers(writes)] == [(0, StatusCode.EOK)]
        assert sorted((r.entry_id, r.status) for r in answers(copies)) == [
            (e, StatusCode.EOK) for e in range(COPIES)
        ]

    monkeypatch.setattr(bookie_module, "BACKGROUND_SLICE_S", 0.0)
    run_with_held_sync(tmp_path, monkeypatch, scenario)


def test_a_ledger_recovery_s_adds_and_plain_adds_are_not_deferred(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HIGH_PRIORITY recovery adds (v2 flag, v3 header priority) and plain adds are stored in
    the pass that received them; copies over v3 (priority 0) wait for the next passes."""

    def v3_add(ledger_id: int, entry_id: int, txn_id: int, priority: int) -> bytes:
        request = pb.Request()
        request.header.CopyFrom(v3.header(pb.ADD_ENTRY, txn_id, priority))
        add = request.addRequest
        add.ledgerId, add.entryId, add.masterKey = ledger_id, entry_id, KEY
        add.body = entry(ledger_id, entry_id)
        add.flag = pb.AddRequest.RECOVERY_ADD
        return v3.encode(request)

    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        gate.set()
        order = stored_order(bookie, monkeypatch)
        v2_client, _ = connect(bookie)
        v3_client, _ = connect(bookie)
        v2_client.data_received(
            v2.encode_add_request(KEY, entry(1, 0), v2.FLAG_RECOVERY_ADD | v2.FLAG_HIGH_PRIORITY)
            + v2.encode_add_request(KEY, entry(2, 0))
            + v2.encode_add_request(KEY, entry(3, 0), v2.FLAG_RECOVERY_ADD)
        )
        v3_client.data_received(v3_add(4, 0, 1, priority=1) + v3_add(5, 0, 2, priority=0))
        assert order == [(1, 0), (2, 0), (4, 0)]  # stored at once, in this pass
        await settle(lambda: len(order) == 5)
        assert order[3:] == [(3, 0), (5, 0)]  # the copies, one a pass
        await settle(lambda: v2_client.pending == 0 and v3_client.pending == 0)
        assert v2_client.pending == 0 and v3_client.pending == 0

    run_with_held_sync(tmp_path, monkeypatch, scenario)
