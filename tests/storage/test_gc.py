"""Garbage collection and compaction: deleted ledgers go, disk usage falls, live entries stay,
and a failed or partial metadata listing never deletes anything."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookkeeper.errors import MetadataStoreError
from bookkeeper.storage.engine import StorageEngine
from bookkeeper.storage.gc import GarbageCollector, GcConfig
from bookkeeper.storage.ledger_storage import NoLedgerError

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
    return engine


def collector(engine: StorageEngine, metadata: FakeMetadata, **config: float) -> GarbageCollector:
    settings: dict[str, float] = {"compaction_rate_bytes": 0}
    settings.update(config)
    return GarbageCollector(
        engine.storage, metadata.list_ledgers, metadata.exists, GcConfig(**settings)
    )  # type: ignore[arg-type]


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


def test_a_read_that_races_compaction_follows_the_moved_entry(tmp_path: Path) -> None:
    engine = filled(tmp_path)
    metadata = FakeMetadata(set(range(1, LEDGERS)))
    stale = engine.storage.index.location(1, 0)  # looked up before compaction
    assert stale is not None
    collector(engine, metadata).run_round(force_major=True)
    assert engine.storage.index.location(1, 0) != stale  # moved, old log deleted
    real_location = engine.storage.index.location
    calls = iter([stale])  # the first lookup answers as it would have before the move

    def lookup(ledger_id: int, entry_id: int) -> int | None:
        return next(calls, None) or real_location(ledger_id, entry_id)

    engine.storage.index.location = lookup  # type: ignore[method-assign]
    assert engine.read(1, 0) == entry(1, 0)
    engine.storage.index.location = real_location  # type: ignore[method-assign]
    engine.close()
