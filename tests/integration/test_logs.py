"""Logs built from ledgers (issue 18) against a real cluster, through the asyncio API: appends
and reads across rolls, tailing across a writer change, seeks, idempotent writers,
subscriptions, truncation, retention, end of stream and deletion."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Iterator

import pytest

from bookkeeper_py import DigestType, errors
from bookkeeper_py.aio import BookKeeper
from bookkeeper_py.log import (
    DUPLICATE,
    EndOfStreamError,
    LogConfig,
    LogExistsError,
    LogFencedError,
    LogNamespace,
    LogNotFoundError,
    LogReader,
    LogRecord,
    Position,
    RecordTooLargeError,
    SegmentState,
)
from bookkeeper_py.log.format import EntryFlags, WrittenLedger, encode_columns
from bookkeeper_py.testing import LocalCluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3) as local:
        yield local


def on_cluster(
    body: Callable[[LogNamespace], Awaitable[None]],
) -> Callable[[LocalCluster], None]:
    """A test of ``body`` run on its own event loop with a client and a namespace of its own."""

    def test(cluster: LocalCluster) -> None:
        async def run() -> None:
            async with BookKeeper(cluster.metadata_uri) as bk:
                await body(LogNamespace(bk, body.__name__[5:60]))

        asyncio.run(run())

    test.__name__ = body.__name__
    test.__doc__ = body.__doc__
    return test


async def read_all(reader: LogReader) -> list[LogRecord]:
    records = []
    async for record in reader:
        records.append(record)
    await reader.close()
    return records


@on_cluster
async def test_records_come_back_in_order_across_rolls(logs: LogNamespace) -> None:
    await logs.create_log("a", LogConfig(3, 2, 2, roll_records=700))
    writer = await logs.open_writer("a", batch_bytes=4096)
    pending = []
    for i in range(3000):
        pending.append(writer.append(b"r%d" % i, txid=10 + 2 * i))
        if i % 500 == 0:
            await writer.drain()
            await asyncio.sleep(0.01)  # rolls happen while appends go on
    positions = [await p for p in pending]
    await writer.close()
    assert positions == sorted(positions) and len(set(positions)) == 3000
    records = await read_all(await logs.open_reader("a", follow=False))
    assert [r.data for r in records] == [b"r%d" % i for i in range(3000)]
    assert [r.position for r in records] == positions
    assert [r.sequence for r in records] == list(range(3000))
    assert [r.txid for r in records] == [10 + 2 * i for i in range(3000)]
    timestamps = [r.timestamp for r in records]
    assert timestamps == sorted(timestamps)
    description = await logs.describe("a")
    segments = description.metadata.segments
    assert len(segments) >= 3 and all(s.state == SegmentState.CLOSED for s in segments)
    assert sum(s.record_count for s in segments) == 3000 == description.record_count
    assert [s.start_sequence for s in segments[1:]] == [s.end_sequence for s in segments[:-1]]
    assert [s.ledger_id for s in segments] == sorted(s.ledger_id for s in segments)
    # a new writer goes on numbering where the log ended
    writer = await logs.open_writer("a")
    assert writer.next_sequence == 3000
    with pytest.raises(errors.IncorrectParameterError, match=r"transaction ids of log .* increase"):
        writer.append(b"late", txid=10)
    await writer.close()


@on_cluster
async def test_a_tailing_reader_reads_through_rolls_and_a_writer_change(
    logs: LogNamespace,
) -> None:
    await logs.create_log("t", LogConfig(3, 2, 2, roll_records=500))
    reader = await logs.open_reader("t", "earliest", poll_timeout_ms=300)
    got: list[LogRecord] = []

    async def tail(count: int) -> None:
        while len(got) < count:
            got.extend(await reader.read_batch())

    tailing = asyncio.ensure_future(tail(2500))
    first = await logs.open_writer("t")
    for i in range(1500):
        first.append(b"one-%d" % i)
        if i % 100 == 0:
            await asyncio.sleep(0.002)
    await first.flush()
    late = first.append(b"one-late")  # in flight when the second writer takes over
    second = await logs.open_writer("t")
    with pytest.raises(LogFencedError, match="another writer took the log over"):
        await late
        await first.write(b"one-after")  # if the late one made it before the fence
    with pytest.raises(LogFencedError):
        first.append(b"one-refused")
    for i in range(1000):
        second.append(b"two-%d" % i)
    await second.close()
    await asyncio.wait_for(tailing, 60)
    await reader.close()
    data = [r.data for r in got]
    ones = [d for d in data if d.startswith(b"one-")]
    assert ones[:1500] == [b"one-%d" % i for i in range(1500)]
    assert ones[1500:] in ([], [b"one-late"])  # recovered if it reached Qa bookies
    assert [d for d in data if d.startswith(b"two-")] == [b"two-%d" % i for i in range(1000)]
    assert [r.position for r in got] == sorted({r.position for r in got})


@on_cluster
async def test_readers_start_at_a_position_a_txid_a_timestamp_or_the_tail(
    logs: LogNamespace,
) -> None:
    await logs.create_log("s", LogConfig(3, 2, 2, roll_records=300))
    writer = await logs.open_writer("s", batch_bytes=512)
    positions = []
    for i in range(1000):
        positions.append(writer.append(b"%d" % i, txid=1000 + i))
        if i == 600:
            await writer.flush()
            await asyncio.sleep(0.05)  # a later millisecond for what follows
    positions = [await p for p in positions]
    end = positions[-1]  # the writer is open: read up to there (it may not be confirmed yet)
    first = await read_all(await logs.open_reader("s", positions[457], end=end))
    assert first[0].data == b"457" and len(first) == 543
    by_txid = await read_all(await logs.open_reader("s", txid=1777, end=end))
    assert by_txid[0].txid == 1777 and len(by_txid) == 223
    later = (await read_all(await logs.open_reader("s", positions[601], end=end)))[0]
    by_time = await read_all(await logs.open_reader("s", timestamp=later.timestamp, end=end))
    assert by_time[0].timestamp >= later.timestamp and by_time[0].sequence <= later.sequence
    assert all(r.timestamp < later.timestamp for r in first[: by_time[0].sequence - 457])
    latest = await logs.open_reader("s", "latest")
    writer.append(b"new")
    assert [r.data for r in await latest.read_batch()] == [b"new"]
    await latest.close()
    await writer.close()
    beyond = await read_all(await logs.open_reader("s", txid=10**9, follow=False))
    assert beyond == []


@on_cluster
async def test_an_idempotent_writer_drops_what_it_sent_before(logs: LogNamespace) -> None:
    await logs.create_log("i")
    writer = await logs.open_writer("i", writer_id="app")
    assert writer.last_writer_sequence == -1
    for i in range(100):
        writer.append(b"%d" % i)  # sequences 0..99 by default
    await writer.flush()
    assert await writer.append(b"again", sequence=50) == DUPLICATE
    unsent = [writer.append(b"%d" % i, sequence=i) for i in range(100, 150)]
    # the process "dies" here: its last appends may or may not be in the log
    takeover = await logs.open_writer("i", writer_id="app")
    durable = takeover.last_writer_sequence
    assert 99 <= durable <= 149
    for pending in unsent:
        try:
            await pending
        except LogFencedError:
            pass
    answers = [await takeover.append(b"%d" % i, sequence=i) for i in range(90, 160)]
    assert answers[: durable - 89] == [DUPLICATE] * (durable - 89)
    assert DUPLICATE not in answers[durable - 89 :]
    with pytest.raises(errors.IncorrectParameterError, match="need an idempotent writer"):
        other = await logs.open_writer("i")
        other.append(b"x", sequence=1)
    records = await read_all(await logs.open_reader("i", follow=False))
    assert [r.data for r in records] == [b"%d" % i for i in range(160)]


@on_cluster
async def test_an_append_calls_back_once_acknowledged(logs: LogNamespace) -> None:
    await logs.create_log("cb")
    writer = await logs.open_writer("cb", writer_id="app")
    seen: list[tuple[str, Position]] = []
    first = writer.append(b"first", sequence=1)
    again = writer.append(b"again", sequence=1)  # a duplicate: done at once
    for name, pending in (("first", first), ("again", again)):
        pending.add_done_callback(lambda done, name=name: seen.append((name, done.result())))
    assert seen == []  # called from the loop, not from add_done_callback
    await writer.flush()
    await asyncio.sleep(0)
    assert sorted(seen) == [("again", DUPLICATE), ("first", await first)]
    await writer.close()


@on_cluster
async def test_committed_ledgers_of_relative_entries_read_as_any_segment(
    logs: LogNamespace,
) -> None:
    """commit_ledgers (a Spark job's commit): ledgers written before their place in the log
    was known, read by a LogReader, sought by txid and timestamp; committed once only."""
    await logs.create_log("c")
    writer = await logs.open_writer("c")
    for i in range(3):
        writer.append(b"live %d" % i)
    await writer.flush()  # the writer stays open: the commit fences it
    written = []
    for task in range(2):
        handle = await logs.client.create_ledger(3, 2, 2, DigestType.CRC32C, b"")
        rows = [b"t%d-%d" % (task, i) for i in range(5)]
        for first in (0, 3):  # two entries: records 0-2 and 3-4
            part = rows[first : first + 3]
            await handle.add_entry(
                encode_columns(
                    first,
                    len(part),
                    _i64([first + i for i in range(len(part))]),
                    _i64([0] * len(part)),
                    struct.pack(f"<{len(part)}I", *(len(p) for p in part)),
                    part,
                    flags=EntryFlags.RELATIVE,
                )
            )
        await handle.close()
        written.append(WrittenLedger(handle.ledger_id, 5, handle.length, 1, 1))
    assert await logs.commit_ledgers("c", written, writer_id="job-1", writer_sequence=0)
    assert not await logs.commit_ledgers("c", written, writer_id="job-1", writer_sequence=0)
    with pytest.raises(LogFencedError):
        await writer.write(b"late")
    records = await read_all(await logs.open_reader("c", follow=False))
    assert [r.data for r in records] == [b"live 0", b"live 1", b"live 2"] + [
        b"t%d-%d" % (task, i) for task in range(2) for i in range(5)
    ]
    assert [r.sequence for r in records] == list(range(13))
    assert [r.txid for r in records] == list(range(13))
    assert len({r.timestamp for r in records[3:]}) == 1  # the commit's time
    from_txid = await logs.open_reader("c", txid=9, follow=False)
    assert [r.data for r in await read_all(from_txid)][:2] == [b"t1-1", b"t1-2"]
    from_time = await logs.open_reader("c", timestamp=records[3].timestamp, follow=False)
    assert (await read_all(from_time))[0].data == b"t0-0"
    segments = (await logs.read_log("c"))[0].segments
    assert [s.writer_id for s in segments[-2:]] == ["job-1", "job-1"]


def _i64(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)


@on_cluster
async def test_subscriptions_hold_truncation_and_retention(logs: LogNamespace) -> None:
    config = LogConfig(3, 2, 2, roll_records=200, retention_bytes=1)
    await logs.create_log("sub", config)
    subscription = await logs.subscribe("sub", "job")
    assert subscription.sequence == -1
    writer = await logs.open_writer("sub", batch_bytes=1024)
    for i in range(1000):
        writer.append(b"%d" % i)
        if i % 200 == 0:
            await writer.flush()
            await asyncio.sleep(0.02)
    await writer.flush()
    reader = await logs.open_reader("sub", subscription="job", follow=False)
    consumed = []
    while len(consumed) < 450:
        consumed += await reader.read_batch()
    consumed = consumed[:450]
    # commit what was consumed: the reader's last position is its batch's last record
    await logs.commit("sub", "job", consumed[-1].position, consumed[-1].sequence)
    await reader.close()
    [info] = await logs.subscriptions("sub")
    assert info.subscription.position == consumed[-1].position and info.lag == 1000 - 450
    ledgers_before = set(await logs.client.list_ledgers())
    with pytest.raises(errors.IncorrectParameterError, match="subscription 'job' has not"):
        await logs.truncate("sub", Position(10**9, 0, 0))
    # retention wants everything gone (1 byte): held at the subscription
    deleted = await logs.apply_retention("sub")
    assert deleted >= 1
    rest = await read_all(await logs.open_reader("sub", "earliest", follow=False))
    assert rest[0].sequence <= 450 and rest[-1].data == b"999"
    gone = ledgers_before - set(await logs.client.list_ledgers())
    assert gone and all(ledger < consumed[-1].ledger_id for ledger in gone)
    resumed = await read_all(await logs.open_reader("sub", subscription="job", follow=False))
    assert [r.data for r in resumed] == [b"%d" % i for i in range(450, 1000)]
    # a truncation inside a segment marks it: readers start at the mark
    await logs.truncate("sub", consumed[-1].position)
    assert (await read_all(await logs.open_reader("sub", follow=False)))[0] == consumed[-1]
    await logs.delete_subscription("sub", "job")
    await writer.close()
    assert await logs.apply_retention("sub", force=True) >= 1
    description = await logs.describe("sub")
    assert all(s.state != SegmentState.TRUNCATED for s in description.metadata.segments)
    writer = await logs.open_writer("sub")
    assert writer.next_sequence == 1000  # numbering survives truncation
    await writer.close()


@on_cluster
async def test_end_of_stream_ends_readers_and_writers(logs: LogNamespace) -> None:
    await logs.create_log("e")
    writer = await logs.open_writer("e")
    reader = await logs.open_reader("e")
    for i in range(10):
        writer.append(b"%d" % i)
    await writer.mark_end_of_stream()
    records = await asyncio.wait_for(read_all(reader), 30)  # a follower ends there
    assert [r.data for r in records] == [b"%d" % i for i in range(10)]
    with pytest.raises(EndOfStreamError, match="was ended"):
        await logs.open_writer("e")
    assert (await logs.describe("e")).metadata.end_of_stream


@on_cluster
async def test_logs_are_listed_described_and_deleted_with_their_ledgers(
    logs: LogNamespace,
) -> None:
    for name in ("x1", "x2", "x3"):
        await logs.create_log(name, LogConfig(3, 2, 2, roll_records=50))
    with pytest.raises(LogExistsError, match="exists already"):
        await logs.create_log("x1")
    assert await logs.list_logs() == ["x1", "x2", "x3"]
    assert await logs.list_logs(after="x1", limit=1) == ["x2"]
    writer = await logs.open_writer("x2")
    for i in range(300):
        writer.append(b"%d" % i)
        if i % 60 == 0:
            await writer.flush()
            await asyncio.sleep(0.02)
    await writer.close()
    ledgers = {s.ledger_id for s in (await logs.describe("x2")).metadata.segments}
    await logs.delete_log("x2")
    assert not ledgers & set(await logs.client.list_ledgers())
    assert await logs.list_logs() == ["x1", "x3"]
    with pytest.raises(LogNotFoundError, match="no log 'x2'"):
        await logs.describe("x2")
    with pytest.raises(LogNotFoundError, match="create it first"):
        await logs.open_writer("x2")


@on_cluster
async def test_a_log_that_needs_another_placement_policy_refuses_the_writer(
    logs: LogNamespace,
) -> None:
    await logs.create_log("racks", LogConfig(placement="rackaware"))
    with pytest.raises(errors.IncorrectParameterError, match="placement='rackaware'"):
        await logs.open_writer("racks")
    async with BookKeeper(logs.client.metadata_uri, placement="rackaware") as racked:
        writer = await LogNamespace(racked, logs.name).open_writer("racks")
        assert await writer.write(b"x") == Position(writer.ledger_id, 0, 0)
        await writer.close()


@on_cluster
async def test_edges_of_truncation_subscriptions_deletion_and_reads(logs: LogNamespace) -> None:
    await logs.create_log("edges", LogConfig(3, 2, 2))
    writer = await logs.open_writer("edges", batch_bytes=64)
    positions = [await writer.write(b"r%d" % i) for i in range(6)]  # an entry each
    # a subscription at the last record of an entry: cutting before the next entry is fine
    await logs.subscribe("edges", "s")
    await logs.commit("edges", "s", positions[1], 1)
    await logs.truncate("edges", positions[2])
    with pytest.raises(errors.IncorrectParameterError, match="has not consumed"):
        await logs.truncate("edges", positions[3])
    # a truncation inside the open segment survives the writer's close
    await writer.close()
    records = await read_all(await logs.open_reader("edges", follow=False))
    assert [r.data for r in records] == [b"r%d" % i for i in range(2, 6)]
    # a subscription made at the latest record right after a roll
    writer = await logs.open_writer("edges")
    await writer.roll()
    latest = await logs.subscribe("edges", "late", at_latest=True)
    assert latest.sequence == 5
    assert {i.subscription.name: i.lag for i in await logs.subscriptions("edges")}["late"] == 0
    # a read given up by its caller does not end the reader
    reader = await logs.open_reader("edges", "latest")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(reader.read_next(), 0.3)
    writer.append(b"after")
    record = await asyncio.wait_for(reader.read_next(), 30)
    assert record is not None and record.data == b"after"
    await reader.close()
    # deleting the log fences its live writer
    await logs.delete_log("edges")
    with pytest.raises(LogFencedError):
        await writer.write(b"lost")
        await writer.write(b"lost again")


@on_cluster
async def test_a_tailing_reader_of_a_striped_log_gets_an_idle_writers_last_record(
    logs: LogNamespace,
) -> None:
    """3/1/1: the LAC that confirms an entry travels on the next, stored by another bookie."""
    await logs.create_log("striped", LogConfig(3, 1, 1))
    writer = await logs.open_writer("striped")
    reader = await logs.open_reader("striped", poll_timeout_ms=200)
    await writer.write(b"only")
    record = await asyncio.wait_for(reader.read_next(), 30)
    assert record is not None and record.data == b"only"
    await reader.close()
    await writer.close()


@on_cluster
async def test_a_record_larger_than_an_entry_is_refused(logs: LogNamespace) -> None:
    await logs.create_log("big", LogConfig(max_entry_bytes=8192))
    writer = await logs.open_writer("big")
    with pytest.raises(RecordTooLargeError, match="does not fit in an entry"):
        writer.append(b"x" * 9000)
    assert await writer.write(b"x" * 7000) == Position(writer.ledger_id, 0, 0)
    await writer.close()


def test_the_blocking_api(cluster: LocalCluster) -> None:
    from bookkeeper_py import BookKeeper as BlockingBookKeeper
    from bookkeeper_py.log.facade import LogNamespace as BlockingNamespace

    with BlockingBookKeeper(cluster.metadata_uri) as bk:
        logs = BlockingNamespace(bk, "blocking")
        logs.create_log("b")
        with logs.open_writer("b") as writer:
            futures = [writer.append(b"%d" % i) for i in range(500)]
            last = writer.flush()
        assert [f.result() for f in futures][-1] == last
        with logs.open_reader("b", follow=False) as reader:
            assert [r.data for r in reader] == [b"%d" % i for i in range(500)]
        with logs.open_reader("b") as follower:
            got = 0
            for _ in range(500):  # the records may come in several entries
                got += len(follower.read_batch(timeout=30))
                if got == 500:
                    break
            assert got == 500
            with pytest.raises(TimeoutError):
                follower.read_batch(timeout=0.2)  # nothing more yet
