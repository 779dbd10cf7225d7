"""Reads over real bookies (issue 6): a tailing reader opened without recovery follows a live
writer through an ensemble change and to its close; reads go around a frozen bookie with
speculative reads and learn to ask it last; the long poll itself."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator

import crc32c
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bookkeeper_py import BookKeeper, DigestType, LedgerEntry, LedgerHandle, LedgerState, aio
from bookkeeper_py import loop as event_loop
from bookkeeper_py.client import ledger as ledger_module
from bookkeeper_py.core.reader import BATCH_REGION_ENTRIES, READ_WINDOW
from bookkeeper_py.storage.entry_log import EntryLogger
from bookkeeper_py.testing import LocalCluster

from .workloads import payload

ENTRIES = 3000


def test_a_tailing_reader_follows_a_live_writer_through_an_ensemble_change_to_its_close() -> None:
    with (
        LocalCluster(4) as cluster,
        BookKeeper(cluster.metadata_uri, throttle=200) as writer_client,
        BookKeeper(cluster.metadata_uri) as reader_client,
    ):
        writer = writer_client.create_ledger(3, 2, 2, DigestType.CRC32C, b"tail")
        reader = reader_client.open_ledger_no_recovery(writer.ledger_id, b"tail")
        seen: list[LedgerEntry] = []
        failure: list[BaseException] = []

        def follow() -> None:
            try:
                seen.extend(reader.follow(0, timeout_ms=500))
            except BaseException as error:  # reported by the test thread
                failure.append(error)

        tail = threading.Thread(target=follow, daemon=True)
        tail.start()
        futures = [writer.add_entry_async(payload(i, 100)) for i in range(ENTRIES // 2)]
        futures[-1].result(60)
        ((_, ensemble),) = writer_client.get_ledger_metadata(writer.ledger_id).ensembles
        cluster.kill_bookie(cluster.bookie_ids.index(ensemble[0]))
        futures += [writer.add_entry_async(payload(i, 100)) for i in range(ENTRIES // 2, ENTRIES)]
        assert [f.result(60) for f in futures] == list(range(ENTRIES))
        assert writer.ensemble_changes >= 1
        writer.close()
        tail.join(60)
        assert not tail.is_alive() and not failure, failure
        assert [e.entry_id for e in seen] == list(range(ENTRIES))
        assert all(e.data == payload(e.entry_id, 100) for e in seen)
        # The reader never fenced: the writer closed the ledger itself.
        assert reader.metadata.state == LedgerState.CLOSED
        assert reader.last_add_confirmed == ENTRIES - 1


def test_the_long_poll_returns_the_next_entry_or_times_out_with_the_lac_unchanged() -> None:
    with LocalCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as client:
        writer = client.create_ledger(3, 3, 2, DigestType.CRC32C, b"lp")
        for i in range(3):
            writer.add_entry(payload(i, 10))  # the bookies' LAC is now 1
        reader = client.open_ledger_no_recovery(writer.ledger_id, b"lp")
        assert reader.read_last_add_confirmed() == 1
        lac, entry = reader.read_last_add_confirmed_and_entry(2, timeout_ms=200)
        assert (lac, entry) == (1, None)  # entry 2 is acked but no bookie knows it yet
        for parallel in (False, True):
            reader = client.open_ledger_no_recovery(writer.ledger_id, b"lp")
            known = reader.read_last_add_confirmed()
            assert known == writer.last_add_confirmed - 1  # the last entry is acked, not known
            next_id = writer.add_entry(payload(known + 2, 10))  # carries LAC known+1: wakes it
            assert next_id == known + 2
            lac, entry = reader.read_last_add_confirmed_and_entry(known + 1, 5000, parallel)
            assert lac == known + 1 and entry is not None
            assert (entry.entry_id, entry.data) == (known + 1, payload(known + 1, 10))


@pytest.mark.parametrize("quorum", [(3, 2, 2), (3, 3, 2)], ids=["striped", "batched"])
def test_reads_go_around_a_frozen_bookie(quorum: tuple[int, int, int]) -> None:
    """3/2/2 (E > Qw) reads each entry from the first replica of its write set, pipelined per
    bookie: the stripe to the frozen bookie is given up after the speculative timeout, its
    entries read one by one (speculative reads), and the frozen bookie is asked last.
    3/3/2 (E = Qw) reads in BATCH_READ_ENTRY requests spread over the replicas: a batch to the
    frozen bookie is given up after the speculative timeout and its entries read one by one."""
    count = 2000
    with LocalCluster(3) as cluster:
        writer = write_closed_ledger(cluster, quorum, b"spec", count)
        frozen = cluster.bookie_ids.index(writer.metadata.ensembles[0][1][0])
        cluster.pause_bookie(frozen)
        try:
            with BookKeeper(
                cluster.metadata_uri,
                request_timeout_s=60,  # a timeout would not end before the reads: speculation must
                speculative_read_timeout_ms=50,
                read_reorder_threshold_pending=5,
            ) as reader_client:
                reader = reader_client.open_ledger(writer.ledger_id, b"spec")
                entries = reader.read_entries(0, count - 1)
                assert [e.data for e in entries] == [payload(i, 64) for i in range(count)]
                assert reader_client.client.speculative_reads > 0
                if quorum[0] != quorum[1]:
                    # The frozen bookie piled up pending reads: later reads go around it.
                    assert reader_client.client.replica_health.reordered > 0
        finally:
            cluster.resume_bookie(frozen)


@pytest.mark.parametrize("quorum", [(3, 3, 2), (3, 2, 2)], ids=["batched", "striped"])
@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_a_range_read_past_its_window_ends_with_a_bookie_down(
    fault: str, quorum: tuple[int, int, int]
) -> None:
    """Issue 15, item 1: a 3/3/2 read of more batches than are in flight at once, one bookie
    killed or frozen. Each batch sent to it fails (or is given up as slow) and its entries are
    read one by one; the next batch must take its place, or the read waits for ever. The same
    for a 3/2/2 read's stripes, over many times its window."""
    count = 8000  # 16 batches of 512 (four times BATCHES_IN_FLIGHT); 12 stripe windows
    with LocalCluster(3) as cluster:
        writer = write_closed_ledger(cluster, quorum, b"batch", count)
        (cluster.kill_bookie if fault == "killed" else cluster.pause_bookie)(0)

        async def read_all() -> list[bytes]:
            async with aio.BookKeeper(
                cluster.metadata_uri, speculative_read_timeout_ms=50, request_timeout_s=60
            ) as reader_client:
                reader = await reader_client.open_ledger(writer.ledger_id, b"batch")
                entries = await asyncio.wait_for(reader.read_entries(0, count - 1), 120)
                return [entry.data for entry in entries]

        try:
            assert asyncio.run(read_all()) == [payload(i, 64) for i in range(count)]
        finally:
            if fault == "frozen":
                cluster.resume_bookie(0)


@pytest.mark.parametrize("stripe_pass", ["c", "python"])
def test_a_striped_read_takes_entries_that_fail_their_digest_on_one_replica_from_the_other(
    stripe_pass: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3/2/2 reads (each entry from the first replica of its write set, pipelined): one bookie
    serves copies with a flipped payload byte (its own record checksum made good, so it serves
    them as stored). The client's digest check fails those answers, and each of those entries is
    read from its other replica; with the C pass over the answers and without it."""
    if stripe_pass == "python":
        monkeypatch.setattr(ledger_module, "_stripe_answers", None)
    elif ledger_module._stripe_answers is None:
        pytest.skip("the C speedups are not built")
    count = 600
    with LocalCluster(3) as cluster:
        writer = write_closed_ledger(cluster, (3, 2, 2), b"flip", count)
        victim = cluster.bookie_ids.index(writer.metadata.ensembles[0][1][0])
        cluster.stop_bookie(victim)  # a graceful stop: its entries are in its entry logs
        flipped = flip_payload_bytes(
            os.path.join(cluster.bookies[victim].directory, "ledgers"), writer.ledger_id
        )
        assert flipped > count // 2  # it holds 2/3 of them, the first replica of 1/3
        cluster.start_bookie(victim)
        with BookKeeper(cluster.metadata_uri) as reader_client:
            reader = reader_client.open_ledger(writer.ledger_id, b"flip")
            entries = reader.read_entries(0, count - 1)
            assert [e.data for e in entries] == [payload(i, 64) for i in range(count)]


@pytest.mark.parametrize("batch_pass", ["c", "python"])
def test_batch_reads_take_entries_that_fail_their_digest_on_one_replica_from_the_others(
    batch_pass: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3/3/2 reads (v2 batch reads, E = Qw, a replica per region of the ledger): one bookie
    serves every copy with a flipped payload byte. Its batch answers fail their digest at their
    first record, and those entries are read from the other replicas; with the C pass that
    checks a batch answer and makes its entries, and without it."""
    if batch_pass == "python":
        monkeypatch.setattr(ledger_module, "_batch_entries", None)
    elif ledger_module._batch_entries is None:
        pytest.skip("the C speedups are not built")
    count = 3 * BATCH_REGION_ENTRIES
    with LocalCluster(3) as cluster:
        writer = write_closed_ledger(cluster, (3, 3, 2), b"flip", count)
        victim = 0
        wait_until_stored(cluster, victim, count)  # Qw 3 > Qa 2: its last copies may lag
        cluster.stop_bookie(victim)
        flipped = flip_payload_bytes(
            os.path.join(cluster.bookies[victim].directory, "ledgers"), writer.ledger_id
        )
        assert flipped == count
        cluster.start_bookie(victim)
        with BookKeeper(cluster.metadata_uri) as reader_client:
            reader = reader_client.open_ledger(writer.ledger_id, b"flip")
            entries = reader.read_entries(0, count - 1)
            assert [e.data for e in entries] == [payload(i, 64) for i in range(count)]
            assert [e.entry_id for e in entries] == list(range(count))


@contextlib.contextmanager
def cyclic_garbage() -> Iterator[list[str]]:
    """The types of this project's objects (and entries) that what runs in the block left in
    reference cycles, for the cyclic garbage collector to free: filled as the block ends."""
    found: list[str] = []
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found += [
            type(thing).__qualname__
            for thing in gc.garbage
            if isinstance(thing, LedgerEntry)
            or type(thing).__module__.startswith("bookkeeper_py")
            or str(getattr(thing, "__module__", "")).startswith("bookkeeper_py")  # functions
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize(
    ("quorum", "use_v3"), [((3, 2, 2), False), ((3, 3, 2), False), ((3, 2, 2), True)]
)
def test_a_range_read_leaves_nothing_for_the_garbage_collector(
    quorum: tuple[int, int, int], use_v3: bool
) -> None:
    """A range read's state (its sinks, plan, timer and results) is freed by reference counting
    as it returns: left in a reference cycle, it and every entry in it waited for the cyclic
    garbage collector, whose passes were a third of a striped catch-up reader's CPU. And the
    entries that the C passes make are not watched by the collector at all."""
    count = 600
    with LocalCluster(3) as cluster:
        writer = write_closed_ledger(cluster, quorum, b"gc", count)
        with BookKeeper(cluster.metadata_uri, use_v3=use_v3) as reader_client:
            reader = reader_client.open_ledger(writer.ledger_id, b"gc")
            reader.read_entries(0, count - 1)  # connections made, caches filled
            with cyclic_garbage() as ours:
                entries = reader.read_entries(0, count - 1)
            assert ours == []
            assert [e.data for e in entries] == [payload(i, 64) for i in range(count)]
            if not use_v3 and ledger_module._stripe_answers is not None:
                assert not any(gc.is_tracked(entry) for entry in entries)


def test_a_tailing_reader_s_long_polls_leave_nothing_for_the_garbage_collector() -> None:
    """Each long poll's state (its closures and speculative timer once, the connection's
    request and its callback) is freed by reference counting as the poll ends: a tailing
    reader polls hundreds of times a second, and what waited for the cyclic collector made
    its passes longer."""

    async def follow_and_collect(uri: str) -> list[str]:
        writer = await aio.BookKeeper.connect(uri)
        reader = await aio.BookKeeper.connect(uri, use_v3=True)
        try:
            handle = await writer.create_ledger(3, 2, 2, password=b"gc")
            await asyncio.gather(*(handle.add_entry_async(payload(i, 64)) for i in range(50)))
            tail = await reader.open_ledger_no_recovery(handle.ledger_id, b"gc")
            seen: list[int] = []

            async def follow() -> None:  # to the end of the ledger, once it is closed
                async for entry in tail.follow(0, timeout_ms=300):
                    seen.append(entry.entry_id)

            following = asyncio.ensure_future(follow())
            await asyncio.sleep(0.3)
            with cyclic_garbage() as ours:
                for start in range(50, 550, 50):  # the reader waits on long polls between
                    await asyncio.gather(
                        *(handle.add_entry_async(payload(i, 64)) for i in range(start, start + 50))
                    )
                    await asyncio.sleep(0.02)
                await handle.close()
                await asyncio.wait_for(following, 60)
            assert seen == list(range(550))
            return ours
        finally:
            await reader.close()
            await writer.close()

    with LocalCluster(3) as cluster:
        assert event_loop.run(follow_and_collect(cluster.metadata_uri)) == []


def flip_payload_bytes(ledger_directory: str, ledger_id: int) -> int:
    """Flips the last byte of every entry of ``ledger_id`` in the entry logs of a stopped
    bookie, rewriting each record's checksum; returns how many."""
    logger = EntryLogger(ledger_directory)
    flipped = 0
    try:
        for log_id in logger.log_ids():
            path = logger.path(log_id)
            records = [r for r in logger.records(log_id) if r[0] == ledger_id]
            with open(path, "r+b") as handle:
                for _, _, offset, body in records:
                    changed = body[:-1] + bytes([body[-1] ^ 0xFF])
                    handle.seek(offset)
                    handle.write(struct.pack(">II", len(changed), crc32c.crc32c(changed)) + changed)
                    flipped += 1
    finally:
        logger.close()
    return flipped


@pytest.mark.parametrize("use_v3", [True, False])
def test_reads_stop_waiting_on_a_frozen_replica(use_v3: bool) -> None:
    """Issue 15, item 7: with one bookie frozen, every entry whose read started on it used to
    wait out the speculative timeout (8,000 entries over v3: 42 s instead of 0.3 s). A replica
    given up on as slow is now marked slow for later reads until it answers, so they start
    elsewhere (a busy healthy replica's late answer takes its mark back: under CPU contention
    busy replicas used to gather more marks than the frozen one, which then led again): a handful
    of speculative reads (the first window's), not one per entry. Batch reads (v2, E = Qw)
    take one replica per region of the ledger: three regions, so that one is the frozen one's
    whichever the ensemble's order."""
    count = 3 * BATCH_REGION_ENTRIES
    with LocalCluster(3) as cluster:
        writer = write_closed_ledger(cluster, (3, 3, 2), b"slow", count)
        cluster.pause_bookie(0)
        try:
            with BookKeeper(
                cluster.metadata_uri,
                use_v3=use_v3,
                speculative_read_timeout_ms=200,
                request_timeout_s=120,  # no timeout ends a read to the frozen bookie meanwhile
            ) as reader_client:
                reader = reader_client.open_ledger_no_recovery(writer.ledger_id, b"slow")
                entries = reader.read_entries(0, count - 1)
                assert [e.data for e in entries] == [payload(i, 64) for i in range(count)]
                speculative = reader_client.client.speculative_reads
                assert 0 < speculative <= 2 * READ_WINDOW, speculative
        finally:
            cluster.resume_bookie(0)


def wait_until_stored(cluster: LocalCluster, index: int, count: int) -> None:
    """Until bookie ``index`` answered ``count`` adds with success (its metrics): the writer
    closes its ledger once Qa bookies have each add, and a wider write quorum's last copies
    may still be on their way."""
    url = f"http://127.0.0.1:{cluster.bookies[index].http_port}/metrics"
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        stored = sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "bookkeeper_server_ADD_ENTRY_REQUEST_count"
            and sample.labels.get("success") == "true"
        )
        if stored >= count:
            return
        assert time.monotonic() < deadline, f"bookie {index} stored {stored} of {count} adds"
        time.sleep(0.05)


def write_closed_ledger(
    cluster: LocalCluster, quorum: tuple[int, int, int], password: bytes, count: int
) -> LedgerHandle:
    """A closed ledger of ``count`` entries (``payload(i, 64)``)."""
    with BookKeeper(cluster.metadata_uri) as client:
        writer = client.create_ledger(*quorum, DigestType.CRC32C, password)
        for future in [writer.add_entry_async(payload(i, 64)) for i in range(count)]:
            future.result(60)
        writer.close()
    return writer


def test_opening_an_open_ledger_without_recovery_reads_its_lac_from_the_bookies() -> None:
    """Issue 16, item 4: Apache BookKeeper's openLedgerNoRecovery reads the LAC from the bookies
    (48 on a 50-entry open ledger: the last entry carries its predecessor's LAC); ours started
    at -1 until read_last_add_confirmed() was called. A closed ledger's comes from its metadata."""
    with (
        LocalCluster(3) as cluster,
        BookKeeper(cluster.metadata_uri) as writer_client,
        BookKeeper(cluster.metadata_uri) as reader_client,
    ):
        writer = writer_client.create_ledger(3, 2, 2, DigestType.CRC32C, b"lac")
        for i in range(50):
            writer.add_entry(payload(i, 32))
        reader = reader_client.open_ledger_no_recovery(writer.ledger_id, b"lac")
        assert reader.last_add_confirmed == 48
        assert [e.data for e in reader.read_entries(0, 48)][-1] == payload(48, 32)
        assert not writer.is_closed  # no recovery: the writer goes on
        assert writer.add_entry(payload(50, 32)) == 50
        writer.close()
        closed = reader_client.open_ledger_no_recovery(writer.ledger_id, b"lac")
        assert closed.last_add_confirmed == 50
