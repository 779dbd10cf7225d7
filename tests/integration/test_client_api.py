"""The public client contract as a user meets it: the asyncio client opens as asyncio clients
do, handles are context managers, passwords are str or bytes, errors say what happened."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from bookkeeper_py import BookKeeper, aio
from bookkeeper_py.errors import (
    ClientClosedError,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerFencedError,
    UnauthorizedAccessError,
)
from bookkeeper_py.testing import LocalCluster
from tests.speedup_paths import take_path


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3) as local:
        yield local


def test_async_with_opens_connects_and_closes(cluster: LocalCluster) -> None:
    async def scenario() -> tuple[list[int], list[bytes], bool, bool]:
        async with aio.BookKeeper(cluster.metadata_uri) as bk:
            async with await bk.create_ledger(3, 2, 2, password="pw") as writer:
                ids = await asyncio.gather(
                    *(writer.add_entry_async(b"entry %d" % i) for i in range(100))
                )
            assert writer.is_closed
            async with await bk.open_ledger(writer.ledger_id, password=b"pw") as reader:
                read = await reader.read_entries(0, reader.last_add_confirmed)
        with pytest.raises(ClientClosedError, match="closed"):
            await bk.list_ledgers()
        return list(ids), [entry.data for entry in read], reader.is_closed, bk._closed

    ids, data, reader_closed, client_closed = asyncio.run(scenario())
    assert ids == list(range(100))
    assert data == [b"entry %d" % i for i in range(100)]
    assert reader_closed and client_closed


def test_connect_await_and_connect_on_first_use(cluster: LocalCluster) -> None:
    async def scenario() -> list[list[int]]:
        connected = await aio.BookKeeper.connect(cluster.metadata_uri)
        awaited = await aio.BookKeeper(cluster.metadata_uri)
        lazy = aio.BookKeeper(cluster.metadata_uri)  # nothing connected yet
        handle = await connected.create_ledger(3, 2, 2, password=b"pw")
        await handle.add_entry(b"x")
        await handle.close()
        # Two operations at once on the lazy client share one connection attempt.
        seen = await asyncio.gather(lazy.list_ledgers(), lazy.list_ledgers())
        seen.append(await awaited.list_ledgers())
        for client in (connected, awaited, lazy):
            await client.close()
            await client.close()  # again: nothing
        assert handle.ledger_id in seen[0]
        return seen

    seen = asyncio.run(scenario())
    assert seen[0] == seen[1] == seen[2]


def test_a_str_password_is_its_utf8_bytes(cluster: LocalCluster) -> None:
    with BookKeeper(cluster.metadata_uri) as bk:
        writer = bk.create_ledger(3, 2, 2, password="pässword")
        writer.add_entry(b"data")
        writer.close()
        reader = bk.open_ledger(writer.ledger_id, password="pässword".encode())
        assert [entry.data for entry in reader.read_entries(0, 0)] == [b"data"]
        assert reader.metadata.password == "pässword".encode()
        with pytest.raises(UnauthorizedAccessError, match="wrong password"):
            bk.open_ledger(writer.ledger_id, password="password")
        with pytest.raises(IncorrectParameterError, match="password is str or bytes, got int"):
            bk.create_ledger(3, 2, 2, password=1234)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "uri", ["localhost:2181", "zookeeper://h:2181/ledgers", "sqlite://relative.db", ""]
)
def test_a_malformed_uri_is_a_value_error_naming_the_schemes(uri: str) -> None:
    pattern = r"zk\+hierarchical://.*sqlite:///.*memory://"
    threads = set(threading.enumerate())
    with pytest.raises(ValueError, match=pattern):
        BookKeeper(uri)
    assert set(threading.enumerate()) <= threads  # the blocking client left no loop thread
    with pytest.raises(ValueError, match=pattern):
        aio.BookKeeper(uri)


def test_the_blocking_client_and_its_handles_after_close(cluster: LocalCluster) -> None:
    bk = BookKeeper(cluster.metadata_uri)
    writer = bk.create_ledger(3, 2, 2, password=b"pw")
    writer.add_entry(b"one")
    bk.close()
    bk.close()  # again: nothing
    for operation in (
        bk.list_ledgers,
        lambda: bk.create_ledger(3, 2, 2),
        lambda: bk.open_ledger(writer.ledger_id, password=b"pw"),
        lambda: writer.add_entry(b"two"),
        lambda: writer.add_entry_async(b"two"),
        lambda: writer.read_entries(0, 0),
    ):
        with pytest.raises(ClientClosedError, match="client is closed: make a new one"):
            operation()


def test_closing_a_writer_fails_the_adds_still_pending(cluster: LocalCluster) -> None:
    """As Apache BookKeeper's LedgerHandle.close: what was not acknowledged yet is not in the
    ledger, and its future says so; the ledger closes at what was acknowledged."""
    with BookKeeper(cluster.metadata_uri) as bk:
        writer = bk.create_ledger(3, 2, 2, password=b"pw")
        futures = [writer.add_entry_async(b"x" * 1000) for _ in range(2000)]
        writer.close()
        acked = [f.result() for f in futures if f.exception() is None]
        failed = [f.exception() for f in futures if f.exception() is not None]
        assert acked == list(range(len(acked)))  # a prefix, in order
        assert failed and all(isinstance(error, LedgerClosedError) for error in failed)
        metadata = bk.get_ledger_metadata(writer.ledger_id)
        assert metadata.last_entry_id == len(acked) - 1


@pytest.mark.parametrize("completion", ["c", "python"])
def test_callback_adds_are_answered_in_order_and_may_add_more(
    cluster: LocalCluster, completion: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``add_entry_callback`` (Java's asyncAddEntry with a callback): each callback gets its
    entry id and None, in id order; a callback may add the next entry; one that raises is
    reported to the loop's exception handler and the others are still called; closing the
    writer fails the adds still pending with their error. The same with the completions of
    the C speedups and of the pure-Python path."""
    from bookkeeper_py.client import ledger

    take_path(monkeypatch, ledger, "_complete_adds", completion)

    async def scenario() -> tuple[list[tuple[int, object]], list[int], list[str], list[object]]:
        loop = asyncio.get_running_loop()
        reported: list[str] = []
        loop.set_exception_handler(lambda _, context: reported.append(context["message"]))
        answered: list[tuple[int, object]] = []
        all_done = loop.create_future()

        def answer(entry_id: int, error: object) -> None:
            answered.append((entry_id, error))
            if entry_id < 40:  # chained: each answer adds the next
                writer.add_entry_callback(b"chained %d" % entry_id, answer)
            if len(answered) == 50 and not all_done.done():
                all_done.set_result(None)
            if entry_id == 7:
                raise RuntimeError("the caller's bug")

        async with aio.BookKeeper(cluster.metadata_uri) as bk:
            writer = await bk.create_ledger(3, 2, 2, password="pw")
            ids = [writer.add_entry_callback(b"first %d" % i, answer) for i in range(10)]
            await asyncio.wait_for(all_done, 30)
            pending: list[object] = []
            for _ in range(200):
                writer.add_entry_callback(b"x" * 1000, lambda _, error: pending.append(error))
            await writer.close()
            async with await bk.open_ledger(writer.ledger_id, password=b"pw") as reader:
                last = reader.last_add_confirmed
        return answered, [*ids, last], reported, pending

    answered, ids, reported, pending = asyncio.run(scenario())
    assert ids[:10] == list(range(10))
    assert [entry_id for entry_id, _ in answered] == list(range(50))
    assert all(error is None for _, error in answered)
    assert len(reported) == 1 and reported[0].endswith("the callback of entry 7 raised")
    assert ids[10] >= 49  # the ledger holds every acknowledged add
    failed = [error for error in pending if error is not None]
    assert len(pending) == 200 and all(isinstance(error, LedgerClosedError) for error in failed)
    assert ids[10] == 49 + len(pending) - len(failed)


def test_an_add_a_callback_calls_goes_out_at_once_with_few_outstanding_with_the_pass_else(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer with few adds outstanding sends the adds its callbacks called as they end (and
    schedules no send at the pass's end for them); one with many still sends a pass's adds
    together at its end (``SEND_AT_ONCE_MAX_PENDING``)."""
    from bookkeeper_py.client import ledger

    found: list[bool] = []  # whether the pass's send found adds still to send
    in_callbacks = False
    real_send, real_call_back = ledger.WriteHandle._send_pushed, ledger.WriteHandle._call_back

    def send(self: ledger.WriteHandle) -> None:
        if not in_callbacks:  # the pass's own send (the loop runs it), not the one at once
            found.append(self._pushed)
        real_send(self)

    def call_back(self: ledger.WriteHandle) -> None:
        nonlocal in_callbacks
        in_callbacks = True
        try:
            real_call_back(self)
        finally:
            in_callbacks = False

    monkeypatch.setattr(ledger.WriteHandle, "_send_pushed", send)
    monkeypatch.setattr(ledger.WriteHandle, "_call_back", call_back)

    async def chained(in_flight: int, total: int) -> list[int]:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        answered: list[int] = []
        async with aio.BookKeeper(cluster.metadata_uri) as bk:
            writer = await bk.create_ledger(3, 2, 2, password="pw")

            def answer(entry_id: int, error: object) -> None:
                assert error is None
                if not answered:  # the first adds went with a pass, as any called outside one
                    found.clear()
                answered.append(entry_id)
                if len(answered) + in_flight <= total:
                    writer.add_entry_callback(b"next", answer)
                elif len(answered) == total and not done.done():
                    done.set_result(None)

            for _ in range(in_flight):
                writer.add_entry_callback(b"first", answer)
            await asyncio.wait_for(done, 60)
            await writer.close()
        return answered

    assert asyncio.run(chained(1, 30)) == list(range(30))
    assert not found  # each went at once: no send at the pass's end was even scheduled
    assert asyncio.run(chained(200, 2000)) == list(range(2000))
    assert any(found)  # many outstanding: adds waited for the pass's end, together


def test_adds_of_a_slice_fail_with_the_writer_s_error_if_it_failed_before_they_went_out(
    cluster: LocalCluster,
) -> None:
    """A ``LedgerHandle``'s adds are numbered when called and taken by the writer when their
    slice is sent: if the writer failed in between (an answer in the same loop pass fenced it),
    they fail with its error, in order, and later adds are refused with it at once."""

    async def scenario() -> tuple[list[int], list[tuple[int, object]], BaseException | None]:
        async with aio.BookKeeper(cluster.metadata_uri) as bk:
            writer = await bk.create_ledger(3, 2, 2, password="pw")
            await writer.add_entry(b"zero")
            answered: list[tuple[int, object]] = []
            ids = [
                writer.add_entry_callback(b"a", lambda i, e: answered.append((i, e)))
                for _ in range(5)
            ]
            writer._writer.error = LedgerFencedError("fenced by a recovering reader")
            for _ in range(100):  # bounded: the slice goes out on the next loop pass
                await asyncio.sleep(0)
                if len(answered) == 5:
                    break
            refused: BaseException | None = None
            try:
                writer.add_entry_callback(b"b", lambda i, e: None)
            except LedgerFencedError as error:
                refused = error
            return ids, answered, refused

    ids, answered, refused = asyncio.run(scenario())
    assert ids == [1, 2, 3, 4, 5]
    assert [entry_id for entry_id, _ in answered] == ids
    assert all(isinstance(error, LedgerFencedError) for _, error in answered)
    assert isinstance(refused, LedgerFencedError)


def test_a_long_loop_pass_sends_its_adds_in_slices_as_they_come(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bookkeeper_py.client import connection, ledger

    sent: list[tuple[str, list[int]]] = []
    original = connection.BookieConnection.add_batch

    def add_batch(self: connection.BookieConnection, *args: object) -> None:
        sent.append((self.bookie_id, list(args[1])))  # type: ignore[call-overload]
        original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(connection.BookieConnection, "add_batch", add_batch)
    count = 2 * ledger.SEND_SLICE_ADDS + 88

    async def scenario() -> tuple[list[int], list[bytes]]:
        async with aio.BookKeeper(cluster.metadata_uri) as bk:
            async with await bk.create_ledger(3, 2, 2, password="pw") as writer:
                await writer.add_entry(b"first")  # connections made
                sent.clear()
                # one loop pass: no await between the adds
                futures = [writer.add_entry_async(b"entry %d" % i) for i in range(count)]
                ids = await asyncio.gather(*futures)
            async with await bk.open_ledger(writer.ledger_id, password=b"pw") as reader:
                read = await reader.read_entries(1, reader.last_add_confirmed)
        return list(ids), [entry.data for entry in read]

    ids, data = asyncio.run(scenario())
    assert ids == list(range(1, count + 1))
    assert data == [b"entry %d" % i for i in range(count)]
    # three slices (two of SEND_SLICE_ADDS, then the rest at the pass's end), each sent to the
    # three bookies of the ensemble, every entry to the two of its write set
    # three slices (two of SEND_SLICE_ADDS, then the rest at the pass's end): each bookie got
    # three batches, the k-th with the entries of the k-th slice whose write set holds it
    by_bookie: dict[str, list[list[int]]] = {}
    for bookie, entry_ids in sent:
        by_bookie.setdefault(bookie, []).append(entry_ids)
    assert len(by_bookie) == 3 and all(len(batches) == 3 for batches in by_bookie.values())
    firsts = range(1, count + 1, ledger.SEND_SLICE_ADDS)
    for k, first in enumerate(firsts):
        in_slice = range(first, min(first + ledger.SEND_SLICE_ADDS, count + 1))
        copies = sorted(i for batches in by_bookie.values() for i in batches[k])
        assert copies == sorted(2 * list(in_slice))
