"""Garbage collection and compaction: deleted ledgers go, disk usage falls, live entries stay,
and a failed or partial metadata listing never deletes anything."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bookkeeper_py.errors import MetadataStoreError
from bookkeeper_py.storage import entry_log, files
from bookkeeper_py.storage.engine import StorageEngine
from bookkeeper_py.storage.gc import GarbageCollector, GcConfig
from bookkeeper_py.storage.index import IndexWrite
from bookkeeper_py.storage.ledger_storage import LedgerStorage, NoLedgerError

from .test_engine import KEY, entry, open_engine

LEDGERS = 20
ENTRIES = 200


class FakeMetadata:
    """The ledgers that exist in 'metadata', with switches to make the listing misbehave."""

    def __init__(self, ledgers: set[int]) -> None:
        self.ledgers = set(ledgers)
        self.fail_listing = False
        self.stop_listing_after: int | None = None
        self.hidden_from_listing: set[int] = set()

    def list_ledgers(self) -> Iterator[int]:
        if self.fail_listing:
            raise MetadataStoreError("metadata store unreachable")
        for count, ledger_id in enumerate(sorted(self.ledgers - self.hidden_from_listing)):
            if self.stop_listing_after is not None and count >= self.stop_listing_after:
                raise MetadataStoreError("connection lost while listing")
            yield ledger_id

    def exists(self, ledger_id: int) -> bool:
        return ledger_id in self.ledgers


def log_bytes(tmp_path: Path) -> int:
    directory = tmp_path / "ledgers"
    return sum(
        os.path.getsize(directory / name) for name in os.listdir(directory) if name.endswith(".log")
    )


def filled(tmp_path: Path) -> StorageEngine:
    """20 ledgers x 200 entries of ~136 bytes, interleaved over many 16 KiB entry logs, then
    rolled so that no log holding them is active."""
    engine, durable = open_engine(tmp_path, log_size_limit=16 * 1024)
    for ledger_id in range(LEDGERS):
        engine.create_ledger(ledger_id, KEY)
    for entry_id in range(ENTRIES):
        for ledger_id in range(LEDGERS):
            engine.add_entry(ledger_id, entry_id, entry(ledger_id, entry_id), True)
    durable.wait_for(LEDGERS * ENTRIES)
    engine.checkpoint()
    engine.storage.entry_logger.roll()
    engine.checkpoint()  # settles the log just closed: GC may judge it
    return engine


def collector(engine: StorageEngine, metadata: FakeMetadata, **config: float) -> GarbageCollector:
    return collector_for(engine.storage, metadata, **config)


def collector_for(
    storage: LedgerStorage, metadata: FakeMetadata, **config: float
) -> GarbageCollector:
    settings: dict[str, float] = {"compaction_rate_bytes": 0}
    settings.update(config)
    return GarbageCollector(storage, metadata.list_ledgers, metadata.exists, GcConfig(**settings))  # type: ignore[arg-type]


def test_deleting_half_the_ledgers_reclaims_space_and_keeps_the_rest(tmp_path: Path) -> None:
    engine = filled(tmp_path)
    before = log_bytes(tmp_path)
    metadata = FakeMetadata(set(range(LEDGERS)))
    metadata.ledgers -= set(range(0, LEDGERS, 2))  # delete the even ledgers
    gc = collector(engine, metadata)
    stats = gc.run_round(force_major=True)
    assert stats.ledgers_deleted == LEDGERS // 2
    assert stats.entry_logs_compacted > 0
    assert stats.reclaimed_compaction_bytes > 0
    after = log_bytes(tmp_path)
    assert after < before * 0.65, (before, after)  # about half the data was dead
    for ledger_id in range(LEDGERS):
        if ledger_id % 2 == 0:
            with pytest.raises(NoLedgerError):
                engine.read(ledger_id, 0)
        else:
            assert all(engine.read(ledger_id, e) == entry(ledger_id, e) for e in range(ENTRIES))
    engine.close()
    engine, _ = open_engine(tmp_path, log_size_limit=16 * 1024)  # and after a restart
    assert all(
        engine.read(lid, e) == entry(lid, e) for lid in range(1, LEDGERS, 2) for e in range(ENTRIES)
    )
    engine.close()


def test_logs_with_only_deleted_ledgers_are_deleted_without_compaction(tmp_path: Path) -> None:
    engine = filled(tmp_path)
    metadata = FakeMetadata(set())  # every ledger deleted
    gc = collector(engine, metadata, minor_compaction_threshold=0, major_compaction_threshold=0)
    stats = gc.run_round(force_major=True, force_minor=True)
    assert stats.ledgers_deleted == LEDGERS
    assert stats.entry_logs_compacted == 0 and stats.major_compactions == 0
    assert stats.reclaimed_deletion_bytes > 0
    assert log_bytes(tmp_path) < 16 * 1024 * 2  # only the (small) active log is left
    engine.close()


@pytest.mark.parametrize("failure", ["fails", "stops part way"])
def test_a_failed_or_partial_listing_deletes_nothing(tmp_path: Path, failure: str) -> None:
    engine = filled(tmp_path)
    before = log_bytes(tmp_path)
    metadata = FakeMetadata(set(range(LEDGERS)))
    if failure == "fails":
        metadata.fail_listing = True
    else:
        metadata.stop_listing_after = 5
    gc = collector(engine, metadata)
    stats = gc.run_round(force_major=True)
    assert (
        stats.aborted_rounds == 1 and stats.ledgers_deleted == 0 and stats.entry_logs_deleted == 0
    )
    assert log_bytes(tmp_path) == before
    assert all(engine.read(lid, ENTRIES - 1) == entry(lid, ENTRIES - 1) for lid in range(LEDGERS))
    engine.close()


def test_a_ledger_missing_from_the_listing_but_existing_is_kept(tmp_path: Path) -> None:
    engine = filled(tmp_path)
    metadata = FakeMetadata(set(range(LEDGERS)))
    metadata.hidden_from_listing = {3, 4}  # e.g. created while the listing ran
    stats = collector(engine, metadata).run_round(force_major=True)
    assert stats.ledgers_deleted == 0
    assert engine.read(3, 0) == entry(3, 0) and engine.read(4, ENTRIES - 1) == entry(4, ENTRIES - 1)
    engine.close()


def test_compaction_off_when_threshold_or_interval_is_not_positive(tmp_path: Path) -> None:
    engine = filled(tmp_path)
    metadata = FakeMetadata(set(range(1, LEDGERS)))
    gc = collector(engine, metadata, major_compaction_interval_s=0, minor_compaction_threshold=-1)
    stats = gc.run_round(force_major=True, force_minor=True)
    assert stats.ledgers_deleted == 1
    assert (
        stats.entry_logs_compacted == 0
        and stats.major_compactions == 0
        and stats.minor_compactions == 0
    )
    engine.close()


def test_a_suspended_compaction_is_skipped_when_due_and_runs_when_named(tmp_path: Path) -> None:
    """Suspended kinds do not run when their interval says they are due; a round that names a
    kind runs it anyway; resumed, they run when due again. ``force`` with no names respects the
    suspension."""
    engine = filled(tmp_path)
    metadata = FakeMetadata(set(range(LEDGERS)))
    clock = [0.0]
    gc = GarbageCollector(
        engine.storage,
        metadata.list_ledgers,
        metadata.exists,
        GcConfig(compaction_rate_bytes=0, minor_compaction_interval_s=10),
        clock=lambda: clock[0],
    )
    gc.suspend(major=True, minor=True)
    clock[0] = 100_000.0  # both kinds long due
    stats = gc.run_round()
    assert (stats.major_compactions, stats.minor_compactions) == (0, 0)
    gc.run_round(force_major=True)  # named: runs though suspended
    assert (stats.major_compactions, stats.minor_compactions) == (1, 0)
    assert gc.status().last_major_compaction_ms > 0
    gc.resume(minor=True)
    clock[0] += 20
    gc.run_round()
    assert (stats.major_compactions, stats.minor_compactions) == (1, 1)
    assert gc.force() and gc.in_force and not gc.force()  # one forced round at a time
    assert gc._forced == (False, True)  # major still suspended: a minor compaction only
    engine.close()


def test_a_read_that_races_compaction_follows_the_moved_entry(tmp_path: Path) -> None:
    engine = filled(tmp_path)
    metadata = FakeMetadata(set(range(1, LEDGERS)))
    stale = engine.storage.index.location(1, 0)  # looked up before compaction
    assert stale is not None
    collector(engine, metadata).run_round(force_major=True)
    assert engine.storage.index.location(1, 0) != stale  # moved, old log deleted
    # the first lookup answers as it would have before the move
    assert read_with_stale_lookups(engine, [stale]) == entry(1, 0)
    engine.close()


def read_with_stale_lookups(engine: StorageEngine, stale: list[int | None]) -> bytes:
    """Reads ledger 1 entry 0 while the index's first lookups answer ``stale``, as they did for
    a slow reader before compaction moved the entry."""
    real_location = engine.storage.index.location
    answers = iter(stale)

    def lookup(ledger_id: int, entry_id: int) -> int | None:
        return next(answers, None) or real_location(ledger_id, entry_id)

    engine.storage.index.location = lookup  # type: ignore[method-assign]
    try:
        return engine.read(1, 0)
    finally:
        engine.storage.index.location = real_location  # type: ignore[method-assign]


class GcDuringCheckpoint:
    """Runs one GC round in its own thread from inside a running checkpoint (at a hook), and lets
    the checkpoint go on once the round finished or blocks on the storage's exclusive lock (which
    the checkpoint holds), as the bookie's GC thread would interleave on a busy machine."""

    def __init__(self, storage: LedgerStorage, gc: GarbageCollector) -> None:
        self.storage = storage
        self.gc = gc
        self.thread: threading.Thread | None = None
        self.waiting_for_lock = threading.Event()
        real = storage.exclusive

        outer = self

        class Watched:
            def __enter__(self) -> None:
                if threading.current_thread() is outer.thread:
                    outer.waiting_for_lock.set()
                real().acquire()

            def __exit__(self, *exc: object) -> None:
                real().release()

        storage.exclusive = Watched  # type: ignore[assignment,method-assign]

    def fire(self) -> None:
        if self.thread is not None:
            return  # once
        self.thread = threading.Thread(target=self.gc.run_round, kwargs={"force_major": True})
        self.thread.start()
        for _ in range(1000):  # at most 10 s
            if self.waiting_for_lock.wait(0.01) or not self.thread.is_alive():
                return

    def join(self) -> None:
        assert self.thread is not None, "the hook never ran"
        self.thread.join(30)
        assert not self.thread.is_alive()


def read_all(storage: LedgerStorage, ledger_id: int, entries: int) -> None:
    for entry_id in range(entries):
        assert storage.read(ledger_id, entry_id) == entry(ledger_id, entry_id), entry_id


def test_a_log_created_during_a_checkpoint_is_not_deleted_as_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new log's file exists a moment before it becomes the active one. A GC round listing the
    logs then must not take it for a closed log holding nothing (and delete it once the checkpoint
    that goes on writing into it released the lock): its entries would be indexed in a deleted
    file. Seen in CI as EIO on every replica of entries written while GC ran."""
    storage = LedgerStorage(str(tmp_path), log_size_limit=16 * 1024)
    storage.add_ledger(1, KEY)
    for entry_id in range(300):  # ~40 KiB: the checkpoint rolls into new logs twice
        storage.add_entry(1, entry_id, entry(1, entry_id))
    race = GcDuringCheckpoint(storage, collector_for(storage, FakeMetadata({1})))
    real_sync = files.fsync_directory

    def sync_then_gc(directory: str) -> None:
        real_sync(directory)
        if storage.entry_logger.active_log_id >= 0:  # a second log is being started
            race.fire()

    monkeypatch.setattr(entry_log, "fsync_directory", sync_then_gc)
    storage.checkpoint()
    race.join()
    read_all(storage, 1, 300)
    storage.close()


def test_a_log_rolled_by_a_running_checkpoint_is_not_compacted_before_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log the checkpoint rolled holds entries the index does not know yet. A ledger deleted in
    metadata whose writer still adds makes that log look mostly dead; compacting it before the
    commit would skip the unindexed entries and delete the log under them."""
    storage = LedgerStorage(str(tmp_path), log_size_limit=16 * 1024)
    metadata = FakeMetadata({1, 2})
    gc = collector_for(storage, metadata)
    for ledger_id in (1, 2):
        storage.add_ledger(ledger_id, KEY)
        storage.add_entry(ledger_id, 0, entry(ledger_id, 0))
    storage.checkpoint()
    metadata.ledgers.discard(1)
    assert gc.run_round().ledgers_deleted == 1
    storage.add_ledger(1, KEY)  # its writer goes on adding
    for entry_id in range(1, 90):  # ~13 KiB: the first log rolls during ledger 2's entries
        storage.add_entry(1, entry_id, entry(1, entry_id))
    for entry_id in range(1, 40):
        storage.add_entry(2, entry_id, entry(2, entry_id))
    race = GcDuringCheckpoint(storage, gc)
    real_commit = IndexWrite.commit

    def gc_then_commit(*args: Any) -> None:
        race.fire()
        real_commit(*args)

    monkeypatch.setattr(IndexWrite, "commit", gc_then_commit)
    storage.checkpoint()
    race.join()
    rolled = storage.entry_logger.active_log_id - 1
    assert set(storage.entry_logger.ledgers_map(rolled)) == {1, 2}
    read_all(storage, 2, 40)
    storage.close()


def test_a_read_follows_an_entry_compaction_moved_twice(tmp_path: Path) -> None:
    engine = filled(tmp_path)
    stale = engine.storage.index.location(1, 0)
    metadata = FakeMetadata(set(range(1, LEDGERS)))
    gc = collector(engine, metadata)
    gc.run_round(force_major=True)
    middle = engine.storage.index.location(1, 0)
    engine.storage.entry_logger.roll()
    engine.checkpoint()  # settles the log just closed
    metadata.ledgers -= set(range(2, LEDGERS))  # now ledger 1 is nearly alone: compact again
    gc.run_round(force_major=True)
    assert len({stale, middle, engine.storage.index.location(1, 0)}) == 3
    assert read_with_stale_lookups(engine, [stale, middle]) == entry(1, 0)
    engine.close()


def test_a_read_during_a_ledger_deletion_does_not_bring_the_ledger_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader (a reader thread, or the loop) that read a ledger's state from the index just
    before garbage collection deleted it must not cache that state after the deletion: the
    bookie answered ENOENTRY instead of ENOLEDGER for the deleted ledger until a restart."""
    storage = LedgerStorage(str(tmp_path))
    for ledger_id in (1, 2):
        storage.add_ledger(ledger_id, KEY)
        storage.add_entry(ledger_id, 0, entry(ledger_id, 0))
    storage.checkpoint()
    storage._infos.clear()  # evicted: the next read takes the state from the index
    real_ledger = storage.index.ledger

    def read_then_deleted(ledger_id: int) -> Any:
        data = real_ledger(ledger_id)
        if ledger_id == 1:
            storage.delete_ledger(1)  # garbage collection, between the read and the caching
        return data

    monkeypatch.setattr(storage.index, "ledger", read_then_deleted)
    assert storage.ledger(1) is not None  # the reader saw it, as it was
    monkeypatch.undo()
    assert storage.ledger(1) is None  # gone for good, not back in the cache
    with pytest.raises(NoLedgerError):
        storage.read(1, 0)
    assert storage.read(2, 0) == entry(2, 0)
    storage.close()


class RecordedRuntime:
    """An ``OpStats`` that keeps what it is told."""

    def __init__(self) -> None:
        self.successes_s: list[float] = []
        self.failures_s: list[float] = []

    def success(self, seconds: float) -> None:
        self.successes_s.append(seconds)

    def failure(self, seconds: float) -> None:
        self.failures_s.append(seconds)

    def successes(self, seconds: float, count: int) -> None:
        self.successes_s.extend([seconds] * count)


def test_each_round_is_timed_and_one_that_changed_something_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = filled(tmp_path)
    metadata = FakeMetadata(set(range(LEDGERS)))
    runtime = RecordedRuntime()
    gc = GarbageCollector(
        engine.storage,
        metadata.list_ledgers,  # type: ignore[arg-type]
        metadata.exists,
        GcConfig(compaction_rate_bytes=0),
        runtime=runtime,
    )
    with caplog.at_level(logging.DEBUG, logger="bookkeeper_py.storage.gc"):
        gc.run_round()  # nothing to do: a DEBUG line
        metadata.ledgers -= set(range(0, LEDGERS, 2))
        stats = gc.run_round(force_major=True)
    rounds = [r for r in caplog.records if r.getMessage().startswith("GC round")]
    assert [r.levelno for r in rounds] == [logging.DEBUG, logging.INFO]
    assert re.fullmatch(
        rf"GC round 2 of .* done in [\d.]+ s: {LEDGERS // 2} ledgers and \d+ entry logs deleted "
        rf"\([\d.]+ MB\), major compaction: {stats.entry_logs_compacted} entry logs compacted "
        r"\([\d.]+ MB reclaimed\)",
        rounds[1].getMessage(),
    )
    assert len(runtime.successes_s) == 2 and runtime.failures_s == []
    assert stats.last_round_seconds == runtime.successes_s[-1]
    engine.close()
