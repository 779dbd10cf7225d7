"""Bounded work per bookie and per connection: past a bookie's bound the answer is
ETOOMANYREQUESTS at once, past a connection's the connection is not read until it drains; nothing
already accepted is lost (issue 4)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest

from bookkeeper_py.server.bookie import Bookie, BookieConfig
from bookkeeper_py.storage.disk import DiskChecker
from bookkeeper_py.storage.engine import StorageConfig
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.digest import DigestManager, DigestType
from bookkeeper_py.wire.status import StatusCode

from .held_sync import run_with_held_sync, settle
from .test_bookie_runs import answers as written_answers
from .test_bookie_runs import serve

KEY = b"l" * 20


def entry(entry_id: int) -> bytes:
    return DigestManager(3, DigestType.CRC32C, b"").package(entry_id, entry_id - 1, 0, b"x")


def add_entries(
    bookie: Bookie, entry_ids: Iterable[int], answers: list[tuple[int, StatusCode]]
) -> None:
    """Adds the entries to ledger 3; each answer lands in ``answers`` as (entry id, status)."""
    for entry_id in entry_ids:
        bookie.add_entry(
            3, entry_id, KEY, entry(entry_id), False, lambda s, e=entry_id: answers.append((e, s))
        )


def test_pending_adds_are_bounded_per_bookie(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        answers: list[tuple[int, StatusCode]] = []
        add_entries(bookie, range(5), answers)
        await asyncio.sleep(0.1)
        assert answers == [(3, StatusCode.ETOOMANYREQUESTS), (4, StatusCode.ETOOMANYREQUESTS)]
        gate.set()
        await settle(lambda: len(answers) == 5)
        assert sorted(answers[2:]) == [
            (0, StatusCode.EOK),
            (1, StatusCode.EOK),
            (2, StatusCode.EOK),
        ]
        assert bookie.pending_adds == 0

    run_with_held_sync(tmp_path, monkeypatch, scenario, max_pending_adds=3)


def test_a_full_write_cache_holds_adds_back_in_order_until_it_has_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As DbLedgerStorage's throttle: adds that meet a full write cache wait (arrival order
    kept) while a checkpoint makes room, instead of an ETOOMANYREQUESTS that makes writers
    change ensembles; only those that waited the whole throttle time are refused."""
    full = [True]

    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        gate.set()
        monkeypatch.setattr(
            type(bookie.engine), "write_cache_full", property(lambda _engine: full[0])
        )
        answers: list[tuple[int, StatusCode]] = []
        add_entries(bookie, range(3), answers)
        await asyncio.sleep(0.1)
        assert answers == [] and bookie.pending_adds == 0  # held, not refused
        full[0] = False  # a checkpoint freed room
        await settle(lambda: len(answers) == 3)
        assert answers == [(0, StatusCode.EOK), (1, StatusCode.EOK), (2, StatusCode.EOK)]
        full[0] = True
        add_entries(bookie, [3], answers)
        await settle(lambda: len(answers) == 4)  # the cache never drains: refused in the end
        assert answers[3] == (3, StatusCode.ETOOMANYREQUESTS)

    run_with_held_sync(tmp_path, monkeypatch, scenario, max_throttle_time_s=0.5)


def test_a_connection_at_its_bound_is_not_read_until_half_its_requests_are_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Back-pressure, not refusal: past maxPendingRequestsPerConnection the requests already
    received wait, the socket is not read, and every request is answered EOK in the end."""

    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        connection, transport = serve(bookie)
        connection.data_received(b"".join(v2.encode_add_request(KEY, entry(i)) for i in range(4)))
        await asyncio.sleep(0.05)
        assert transport.written == b""  # nothing refused
        assert connection.pending == 4 and not transport.reading  # at the bound: held
        connection.data_received(v2.encode_add_request(KEY, entry(4)))  # already in flight
        await asyncio.sleep(0.05)
        assert connection.pending == 4 and not transport.reading
        gate.set()
        await settle(lambda: connection.pending == 0 and transport.reading)
        assert sorted(written_answers(transport)) == [(3, i, StatusCode.EOK) for i in range(5)]

    run_with_held_sync(tmp_path, monkeypatch, scenario, max_pending_per_connection=4)


def test_a_held_connection_is_read_again_only_once_its_peer_reads_its_answers_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two reasons to stop reading a connection (its bound of unanswered requests, a peer
    that does not read its answers) each keep it unread until they pass; one lost meanwhile
    leaves nothing to serve."""

    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        connection, transport = serve(bookie)
        connection.data_received(b"".join(v2.encode_add_request(KEY, entry(i)) for i in range(3)))
        await asyncio.sleep(0.05)
        assert connection.pending == 2 and not transport.reading  # the third waits
        connection.pause_writing()  # the peer stops reading its answers as well
        gate.set()
        await settle(lambda: connection.pending == 0)
        await asyncio.sleep(0.05)
        assert not transport.reading and connection.pending == 0  # the third still waits
        connection.resume_writing()
        await settle(lambda: transport.reading and connection.pending == 0)
        assert sorted(written_answers(transport)) == [(3, i, StatusCode.EOK) for i in range(3)]
        # Lost while held: the answers of what it sent still come, and nothing else is served.
        gate.clear()
        lost, lost_transport = serve(bookie)
        lost.data_received(b"".join(v2.encode_add_request(KEY, entry(i)) for i in range(3, 6)))
        await asyncio.sleep(0.05)
        assert lost.pending == 2 and not lost_transport.reading
        lost.connection_lost(None)
        gate.set()
        await settle(lambda: lost.pending == 0)
        await asyncio.sleep(0.05)
        assert not lost_transport.reading and bookie.pending_adds == 0

    run_with_held_sync(tmp_path, monkeypatch, scenario, max_pending_per_connection=2)


def test_parked_long_polls_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(bookie: Bookie, gate: threading.Event) -> None:
        gate.set()  # no held sync needed here
        answers: list[StatusCode] = []
        for _ in range(2):
            bookie.read_long_poll(3, 0, -1, 30.0, False, lambda s, body, lac: answers.append(s))
        assert answers == [StatusCode.ETOOMANYREQUESTS]  # the second; the first stays parked
        assert bookie.parked_long_polls == 1

    run_with_held_sync(tmp_path, monkeypatch, scenario, max_parked_long_polls=1)


def test_a_fast_writer_cannot_outrun_the_disk_check(tmp_path: Path) -> None:
    """Between two periodic disk checks, every MiB added triggers one: once the disk passes the
    threshold the next adds are refused EREADONLY, recovery adds still taken."""
    usage = {"used": 0.10}

    def fake_usage(directory: str) -> tuple[int, int]:
        total = 1000 * 1024 * 1024
        return total, int(total * (1 - usage["used"]))

    async def main() -> None:
        storage = StorageConfig(str(tmp_path / "j"), str(tmp_path / "l"), flush_interval_s=3600)
        bookie = Bookie(BookieConfig(storage), asyncio.get_running_loop())
        bookie.disk = DiskChecker(bookie.disk.directories, bookie.disk.thresholds, fake_usage)
        bookie.start()
        try:
            answers: dict[int, StatusCode] = {}
            big = b"y" * (256 * 1024)

            def add(entry_id: int, recovery: bool = False) -> None:
                body = DigestManager(3, DigestType.CRC32C, b"").package(entry_id, -1, 0, big)
                bookie.add_entry(
                    3,
                    entry_id,
                    KEY,
                    body,
                    recovery,
                    lambda status: answers.update({entry_id: status}),
                )

            for entry_id in range(4):  # 1 MiB: accepted, then checked at a 10 % usage
                add(entry_id)
            await settle(lambda: len(answers) == 4)
            assert list(answers.values()) == [StatusCode.EOK] * 4 and not bookie.read_only
            usage["used"] = 0.97  # the disk fills between two periodic checks
            for entry_id in range(4, 8):
                add(entry_id)
            add(8, recovery=True)
            await settle(lambda: len(answers) == 9)
            # (refusals are answered at once, acceptances once durable: compare by entry id)
            assert [answers[e] for e in range(4, 7)] == [StatusCode.EOK] * 3  # before the check
            assert answers[7] == StatusCode.EREADONLY and bookie.read_only
            assert answers[8] == StatusCode.EOK  # recovery adds are still taken
        finally:
            bookie.close()

    asyncio.run(main())
