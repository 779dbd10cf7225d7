"""A bookie takes runs of plain v2 adds and reads in bulk (issue 21): per ledger one call to the
bookie, one journal callback (adds), one write of the answers; every add's answer still comes
after its journal sync, and whatever is unusual (a fenced ledger, a wrong key, a recovery add, a
bad id, an entry that must come from a disk) gets the same answer as a request taken alone."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from bookkeeper_py.server.bookie import Bookie
from bookkeeper_py.server.connection import BookieConnection
from bookkeeper_py.storage.entry_log import ReadWouldBlockError
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.digest import DigestManager, DigestType
from bookkeeper_py.wire.framing import FrameDecoder
from bookkeeper_py.wire.status import StatusCode

from .held_sync import run_with_held_sync, settle
from .test_decoders_fuzz import FakeTransport

KEY = b"k" * 20


def entry(ledger_id: int, entry_id: int) -> bytes:
    digest = DigestManager(ledger_id, DigestType.CRC32C, b"")
    return digest.package(entry_id, entry_id - 1, 0, b"payload %d" % entry_id)


def answers(transport: FakeTransport) -> list[tuple[int, int, StatusCode]]:
    return [
        (r.ledger_id, r.entry_id, r.status)
        for r in map(v2.decode_response, FrameDecoder().feed(bytes(transport.written)))
    ]


def serve(bookie: Bookie) -> tuple[BookieConnection, FakeTransport]:
    connection = BookieConnection(bookie, set())
    transport = FakeTransport()
    connection.connection_made(transport)
    return connection, transport


def test_a_run_of_adds_is_answered_after_its_sync_per_ledger_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        connection, transport = serve(bookie)
        frames = [v2.encode_add_request(KEY, entry(1, i)) for i in range(3)]
        frames += [v2.encode_add_request(KEY, entry(2, i)) for i in range(2)]
        frames.append(v2.encode_add_request(KEY, entry(1, 3)))
        connection.data_received(b"".join(frames))
        assert connection.pending == 6
        await asyncio.sleep(0.1)
        assert answers(transport) == []  # nothing answered before the journal sync
        gate.set()
        await settle(lambda: connection.pending == 0)
        got = answers(transport)
        assert sorted(got) == [(1, e, StatusCode.EOK) for e in range(4)] + [
            (2, e, StatusCode.EOK) for e in range(2)
        ]
        assert [e for lid, e, _ in got if lid == 1] == [0, 1, 2, 3]  # a ledger's in order
        for ledger_id, entry_id in [(1, 0), (1, 3), (2, 1)]:
            assert bookie.engine.read(ledger_id, entry_id) == entry(ledger_id, entry_id)
        assert bookie.last_add_confirmed(1) == 2  # the LAC entry 3 carried
        assert bookie.pending_adds == 0

    run_with_held_sync(tmp_path, monkeypatch, scenario)


def test_unusual_adds_in_a_run_get_the_answers_they_get_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        gate.set()
        connection, transport = serve(bookie)
        connection.data_received(v2.encode_add_request(KEY, entry(5, 0)))  # ledger 5's key
        await settle(lambda: connection.pending == 0)
        fenced: list[StatusCode] = []
        bookie.read_entry(6, 0, True, KEY, lambda status, body: fenced.append(status))
        await settle(lambda: bool(fenced))
        transport.written.clear()
        frames = [
            v2.encode_add_request(KEY, entry(4, 0)),
            v2.encode_add_request(b"w" * 20, entry(5, 1)),  # wrong key: EUA
            v2.encode_add_request(KEY, entry(6, 0)),  # fenced ledger: EFENCED
            v2.encode_add_request(KEY, entry(6, 1), v2.FLAG_RECOVERY_ADD),  # goes through
            v2.encode_add_request(KEY, entry(4, 1)),
            v2.encode_add_request(KEY, entry(4, -1)[:16] + b"short"),  # too short for a LAC
        ]
        connection.data_received(b"".join(frames))
        await settle(lambda: connection.pending == 0)
        assert sorted(answers(transport)) == [
            (4, -1, StatusCode.EBADREQ),
            (4, 0, StatusCode.EOK),
            (4, 1, StatusCode.EOK),
            (5, 1, StatusCode.EUA),
            (6, 0, StatusCode.EFENCED),
            (6, 1, StatusCode.EOK),
        ]
        assert bookie.pending_adds == 0

    run_with_held_sync(tmp_path, monkeypatch, scenario)


def test_a_run_past_the_bookies_bound_is_answered_add_by_add(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        connection, transport = serve(bookie)
        connection.data_received(
            b"".join(v2.encode_add_request(KEY, entry(3, i)) for i in range(5))
        )
        await asyncio.sleep(0.1)
        assert answers(transport) == [
            (3, 3, StatusCode.ETOOMANYREQUESTS),
            (3, 4, StatusCode.ETOOMANYREQUESTS),
        ]
        gate.set()
        await settle(lambda: connection.pending == 0)
        assert sorted(answers(transport)[2:]) == [(3, e, StatusCode.EOK) for e in range(3)]

    run_with_held_sync(tmp_path, monkeypatch, scenario, max_pending_adds=3)


def test_a_run_of_reads_is_answered_at_once_and_from_a_disk_read_on_when_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        gate.set()
        connection, transport = serve(bookie)
        connection.data_received(
            b"".join(v2.encode_add_request(KEY, entry(lid, e)) for lid in (1, 2) for e in range(3))
        )
        await settle(lambda: connection.pending == 0)
        transport.written.clear()
        real_read = bookie.engine.read
        held = threading.Event()

        def read(ledger_id: int, entry_id: int, nowait: bool = False) -> bytes:
            if (ledger_id, entry_id) == (2, 1):  # this one "is on a disk": a reader thread waits
                if nowait:
                    raise ReadWouldBlockError()
                assert held.wait(10)
            return real_read(ledger_id, entry_id, nowait)

        real_read_many = bookie.engine.read_many

        def read_many(
            ledger_id: int, entry_ids: list[int], start: int, nowait: bool = False
        ) -> list[bytes]:
            if ledger_id == 2 and 1 in entry_ids[start:]:  # it goes the one-entry way
                entry_ids = entry_ids[: entry_ids.index(1, start)]
            return real_read_many(ledger_id, entry_ids, start, nowait)

        monkeypatch.setattr(bookie.engine, "read", read)
        monkeypatch.setattr(bookie.engine, "read_many", read_many)
        requests = [(1, 2), (1, 0), (2, 1), (2, 7), (9, 0), (1, -1), (2, -5)]
        connection.data_received(b"".join(v2.encode_read_request(lid, e) for lid, e in requests))
        await asyncio.sleep(0.05)
        got = {(r.ledger_id, r.entry_id): (r.status, r.body) for r in decoded(transport)}
        assert got == {
            (1, 2): (StatusCode.EOK, entry(1, 2)),
            (1, 0): (StatusCode.EOK, entry(1, 0)),
            (9, 0): (StatusCode.ENOLEDGER, b""),
            (1, -1): (StatusCode.EOK, entry(1, 2)),  # the last entry
            (2, -5): (StatusCode.EBADREQ, b""),
        }
        # the disk read, and the read of its run after it: on a reader thread, in order
        assert connection.pending == 2
        held.set()
        await settle(lambda: connection.pending == 0)
        rest = [(r.ledger_id, r.entry_id, r.status, r.body) for r in decoded(transport)[-2:]]
        assert rest == [(2, 1, StatusCode.EOK, entry(2, 1)), (2, 7, StatusCode.ENOENTRY, b"")]

    run_with_held_sync(tmp_path, monkeypatch, scenario)


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_a_run_of_reads_is_served_within_the_connections_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    """Reads behind a pending add: a run takes what the connection's bound of unanswered
    requests leaves room for (answered at once, they leave the room to the next run); with no
    room left the reads wait, the connection unread, until the add is answered."""

    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        connection, transport = serve(bookie)
        connection.data_received(v2.encode_add_request(KEY, entry(4, 0)))  # held: one pending
        await asyncio.sleep(0.05)
        assert connection.pending == 1
        connection.data_received(b"".join(v2.encode_read_request(4, e) for e in range(5)))
        await asyncio.sleep(0.05)
        # the add is not synced yet, but readable from the write cache
        served = [(4, 0, StatusCode.EOK)] + [(4, e, StatusCode.ENOENTRY) for e in range(1, 5)]
        assert answers(transport) == ([] if limit == 1 else served)
        assert transport.reading == (limit > 1)
        assert connection.pending == 1
        gate.set()
        await settle(lambda: connection.pending == 0 and transport.reading)
        added = [(4, 0, StatusCode.EOK)]  # the add's own answer
        # at the bound, the reads are served once the add is answered (and see its entry)
        assert answers(transport) == (added + served if limit == 1 else served + added)

    run_with_held_sync(tmp_path, monkeypatch, scenario, max_pending_per_connection=limit)


def decoded(transport: FakeTransport) -> list[v2.Response]:
    return [v2.decode_response(frame) for frame in FrameDecoder().feed(bytes(transport.written))]


@pytest.mark.parametrize("piece", [7, 300, 1 << 20])
def test_adds_cut_out_of_the_bytes_received_are_answered_as_frames_taken_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    """Once a connection speaks v2, its plain adds are cut straight out of the bytes received
    (no frame object each). Fed in pieces of any size, with a frame cut by a piece's end, a read
    and a plain add of another ledger between them, and more adds than the connection's bound
    lets in at once: every request gets the answer it gets when taken alone, adds after their
    sync and in order per ledger, and every entry is stored."""

    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        connection, transport = serve(bookie)
        connection.data_received(v2.encode_add_request(KEY, entry(7, 0)))  # now v2
        stream = [v2.encode_add_request(KEY, entry(7, i)) for i in range(1, 6)]
        stream.append(v2.encode_read_request(7, 0))  # the write cache has it
        stream += [v2.encode_add_request(KEY, entry(8, i)) for i in range(3)]
        stream += [v2.encode_add_request(KEY, entry(7, i)) for i in range(6, 12)]
        data = b"".join(stream)
        for start in range(0, len(data), piece):
            connection.data_received(data[start : start + piece])
        await asyncio.sleep(0.05)
        # the read is answered at once; within the bound of 8, no add yet (no sync)
        assert answers(transport) == [(7, 0, StatusCode.EOK)]
        assert connection.pending == 8
        assert not transport.reading  # held at the bound, the rest waits unread
        gate.set()
        await settle(lambda: connection.pending == 0 and transport.reading)
        await settle(lambda: len(answers(transport)) == 1 + 12 + 3)
        got = answers(transport)
        assert sorted(got[1:]) == sorted(
            [(7, e, StatusCode.EOK) for e in range(12)] + [(8, e, StatusCode.EOK) for e in range(3)]
        )
        assert [e for lid, e, _ in got[1:] if lid == 7] == list(range(12))
        for entry_id in range(12):
            assert bookie.engine.read(7, entry_id) == entry(7, entry_id)
        assert bookie.engine.read(8, 2) == entry(8, 2)
        assert bookie.pending_adds == 0

    run_with_held_sync(tmp_path, monkeypatch, scenario, max_pending_per_connection=8)
