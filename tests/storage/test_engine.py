"""The storage engine: write cache, entry logs, index, LastLogMark checkpoints, replay."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bookkeeper_py import progress
from bookkeeper_py.storage.engine import StorageConfig, StorageEngine
from bookkeeper_py.storage.entry_log import log_name
from bookkeeper_py.storage.journal import list_journal_ids, replay
from bookkeeper_py.storage.last_log_mark import FILE_NAME, read_mark
from bookkeeper_py.storage.ledger_storage import NoEntryError, NoLedgerError, StorageIOError
from bookkeeper_py.wire.digest import DigestManager, DigestType

KEY = b"m" * 20


class Durable:
    """Journal completions, waited on by count."""

    def __init__(self) -> None:
        self.tokens: list[Any] = []
        self.errors: list[Exception] = []
        self._condition = threading.Condition()

    def __call__(self, tokens: list[Any], error: Exception | None) -> None:
        with self._condition:
            self.tokens.extend(tokens)
            if error is not None:
                self.errors.append(error)
            self._condition.notify_all()

    def wait_for(self, count: int) -> None:
        with self._condition:
            assert self._condition.wait_for(lambda: len(self.tokens) >= count, timeout=30)


def entry(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    payload = bytes([entry_id % 251]) * size
    return DigestManager(ledger_id, DigestType.CRC32C, b"").package(
        entry_id, entry_id - 1, 0, payload
    )


def config(tmp_path: Path, **changes: Any) -> StorageConfig:
    settings: dict[str, Any] = dict(
        journal_directory=str(tmp_path / "journal"),
        ledger_directory=str(tmp_path / "ledgers"),
        flush_interval_s=3600.0,  # checkpoints only when a test asks
    )
    settings.update(changes)
    return StorageConfig(**settings)


def open_engine(tmp_path: Path, **changes: Any) -> tuple[StorageEngine, Durable]:
    durable = Durable()
    engine = StorageEngine(config(tmp_path, **changes), durable)
    engine.start()
    return engine, durable


def fill(engine: StorageEngine, durable: Durable, ledgers: range, entries: int) -> None:
    count = 0
    for ledger_id in ledgers:
        engine.create_ledger(ledger_id, KEY)
        for entry_id in range(entries):
            engine.add_entry(ledger_id, entry_id, entry(ledger_id, entry_id), (ledger_id, entry_id))
            count += 1
    durable.wait_for(count)


def crash(engine: StorageEngine) -> None:
    """Stops the engine's threads without the final checkpoint, as a kill -9 would leave it:
    the journal is synced (its records were acknowledged) but nothing else is flushed."""
    engine._stopping.set()
    engine._checkpoint_requested.set()
    assert engine._sync_thread is not None
    engine._sync_thread.join()
    for journal in engine.journals:
        journal.close()
    for storage in engine.storages:
        storage.index.close()
        storage.entry_logger._buffer.clear()  # buffered, unflushed log bytes die with the process
        storage.entry_logger.close()


def test_entries_are_read_from_cache_then_from_entry_log_after_checkpoint(tmp_path: Path) -> None:
    engine, durable = open_engine(tmp_path)
    fill(engine, durable, range(1, 4), 50)
    assert engine.read(2, 7) == entry(2, 7)
    (mark,) = engine.checkpoint()
    assert read_mark(str(tmp_path / "ledgers")) == mark
    assert engine.storage.write_cache_bytes == 0
    assert engine.read(2, 7) == entry(2, 7)  # now from the entry log
    assert engine.read(3, -1) == entry(3, 49)
    with pytest.raises(NoEntryError):
        engine.read(3, 50)
    with pytest.raises(NoLedgerError):
        engine.read(99, 0)
    engine.close()


def test_a_range_read_takes_the_entry_logs_then_the_write_cache_and_stops_at_a_gap(
    tmp_path: Path,
) -> None:
    """A batch read's entries: those checkpointed (one ledger's entries one after another in a
    log, the other ledgers' around them) and those still in the write cache, in order, within
    the count and the byte budget (the first entry in any case); it stops before a missing
    entry and raises for a missing first one."""
    engine, durable = open_engine(tmp_path)
    fill(engine, durable, range(1, 4), 50)
    engine.checkpoint()
    for entry_id in (50, 51, 52, 54):
        engine.add_entry(2, entry_id, entry(2, entry_id), entry_id)
    durable.wait_for(154)
    wanted = [entry(2, i) for i in range(40, 53)]
    assert engine.read_range(2, 40, 100, 2**30) == wanted  # 53 is missing
    assert engine.read_range(2, 0, 50, 2**30) == [entry(2, i) for i in range(50)]
    assert engine.read_range(2, 45, 3, 2**30) == wanted[5:8]
    budget = sum(4 + len(e) for e in wanted[:4])
    assert engine.read_range(2, 40, 100, budget) == wanted[:4]
    assert engine.read_range(2, 40, 100, 1) == wanted[:1]
    assert engine.read_range(2, 54, 100, 2**30) == [entry(2, 54)]
    with pytest.raises(NoEntryError):
        engine.read_range(2, 53, 100, 2**30)
    with pytest.raises(NoLedgerError):
        engine.read_range(99, 0, 100, 2**30)
    engine.close()


def test_many_reads_take_the_write_cache_and_walks_over_the_logs_until_an_entry_is_missing(
    tmp_path: Path,
) -> None:
    """A bookie's share of a striped read: entries of the write cache and of the entry logs
    in one call, as many from the start as it serves together; it stops before a missing
    entry (the one-entry read then says what is wrong) and serves nothing of a missing ledger."""
    engine, durable = open_engine(tmp_path)
    fill(engine, durable, range(1, 4), 50)
    engine.checkpoint()
    for entry_id in (50, 53):
        engine.add_entry(2, entry_id, entry(2, entry_id), entry_id)
    durable.wait_for(152)
    wanted = [1, 4, 7, 44, 47, 50, 53, 56, 59]
    assert engine.read_many(2, wanted, 0) == [entry(2, i) for i in wanted[:7]]
    assert engine.read_many(2, wanted, 3) == [entry(2, i) for i in wanted[3:7]]
    assert engine.read_many(2, wanted, 7) == []
    assert engine.read_many(99, [0, 1], 0) == []
    engine.close()


def test_many_reads_far_apart_walk_the_log_twice_and_not_over_what_lies_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bookie's share of a striped read that asks for a part of the range (every entry) and
    for every third entry of a part further on: two walks over the entry log, the records
    between the parts not read."""
    engine, durable = open_engine(tmp_path)
    fill(engine, durable, range(2, 3), 1200)
    engine.checkpoint()
    reads: list[int] = []
    real_pread, real_preadv = os.pread, os.preadv

    def counted(fd: int, size: int, offset: int) -> bytes:
        reads.append(size)
        return real_pread(fd, size, offset)

    def counted_v(fd: int, buffers: list[memoryview], offset: int, *flags: int) -> int:
        reads.append(sum(map(len, buffers)))
        return real_preadv(fd, buffers, offset, *flags)

    monkeypatch.setattr(os, "pread", counted)
    monkeypatch.setattr(os, "preadv", counted_v)
    wanted = [*range(100, 200), *range(1000, 1100, 3)]
    for nowait in (False, True):
        reads.clear()
        assert engine.read_many(2, wanted, 0, nowait) == [entry(2, i) for i in wanted]
        record = len(entry(2, 0)) + 8
        assert sum(reads) < (100 + 100 + 10) * record  # the 800 between: not read
    engine.close()


def test_entry_ids_merge_the_write_cache_and_the_index(tmp_path: Path) -> None:
    engine, durable = open_engine(tmp_path)
    engine.create_ledger(1, KEY)
    for entry_id in (0, 1, 2, 7):
        engine.add_entry(1, entry_id, entry(1, entry_id), entry_id)
    durable.wait_for(4)
    engine.checkpoint()  # 0, 1, 2, 7 now in the index
    for entry_id in (3, 9):
        engine.add_entry(1, entry_id, entry(1, entry_id), entry_id)
    durable.wait_for(6)
    assert list(engine.storage.entry_ids(1)) == [0, 1, 2, 3, 7, 9]
    with pytest.raises(NoLedgerError):
        engine.storage.entry_ids(2)
    engine.close()


def test_restart_after_clean_close_replays_nothing(tmp_path: Path) -> None:
    engine, durable = open_engine(tmp_path)
    fill(engine, durable, range(5), 20)
    engine.close()
    engine, _ = open_engine(tmp_path)
    assert engine.replayed_records == 0
    assert all(engine.read(ledger, e) == entry(ledger, e) for ledger in range(5) for e in range(20))
    engine.close()


def test_crash_before_checkpoint_replays_entries_keys_fence_and_lac(tmp_path: Path) -> None:
    engine, durable = open_engine(tmp_path)
    fill(engine, durable, range(1, 3), 30)
    engine.checkpoint()  # ledgers 1 and 2 reach the entry log; later records only the journal
    engine.create_ledger(3, b"k" * 20)
    engine.add_entry(3, 0, entry(3, 0), "e")
    engine.fence(1, "f")
    engine.set_explicit_lac(2, b"explicit-lac", "l")
    durable.wait_for(60 + 3)
    crash(engine)

    engine, _ = open_engine(tmp_path)
    assert engine.replayed_records == 4  # master key of 3, its entry, the fence, the explicit LAC
    assert engine.read(3, 0) == entry(3, 0)
    info1, info2, info3 = engine.ledger(1), engine.ledger(2), engine.ledger(3)
    assert info1 is not None and info1.fenced and info1.master_key == KEY
    assert info2 is not None and info2.explicit_lac == b"explicit-lac" and not info2.fenced
    assert info3 is not None and info3.master_key == b"k" * 20
    assert all(engine.read(1, e) == entry(1, e) for e in range(30))
    engine.checkpoint()
    engine.close()
    engine, _ = open_engine(tmp_path)  # and the replayed state survives its own checkpoint
    assert engine.ledger(1).fenced  # type: ignore[union-attr]
    assert engine.read(3, 0) == entry(3, 0)
    engine.close()


class RecordedTask(progress.Task):
    def __init__(self, description: str, total: int | None, unit: str) -> None:
        self.description, self.total, self.unit = description, total, unit
        self.done = 0
        self.closed = False

    def advance(self, count: int = 1) -> None:
        assert count >= 0 and not self.closed
        self.done += count

    def close(self) -> None:
        self.closed = True


class RecordedDisplay(progress.Display):
    def __init__(self) -> None:
        self.tasks: list[RecordedTask] = []

    def task(self, description: str, total: int | None = None, unit: str = "") -> progress.Task:
        self.tasks.append(RecordedTask(description, total, unit))
        return self.tasks[-1]


def test_replay_shows_the_journal_bytes_replayed_and_logs_by_default(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine, durable = open_engine(tmp_path)
    fill(engine, durable, range(1, 3), 200)
    crash(engine)

    shown = RecordedDisplay()
    engine = StorageEngine(config(tmp_path), Durable())
    assert engine.start(shown) == 2 + 400  # master keys and entries
    engine.close()
    (task,) = shown.tasks
    assert task.description == f"replaying journal {tmp_path / 'journal'}"
    assert task.unit == "bytes" and task.closed
    assert task.total is not None and 400 * 100 < task.done <= task.total

    engine, durable = open_engine(tmp_path)
    fill(engine, durable, range(3, 4), 10)
    crash(engine)
    with caplog.at_level(logging.INFO, logger="bookkeeper_py.storage.engine"):
        engine, _ = open_engine(tmp_path)  # no display given: log lines
    engine.close()
    lines = [r.getMessage() for r in caplog.records if "replaying journal" in r.getMessage()]
    # A replay nobody waited for (well under a second) logs nothing; a long one logs a line
    # every few seconds and its end (tests/unit/test_progress.py).
    assert lines == []


def test_checkpoint_deletes_journals_older_than_the_mark(tmp_path: Path) -> None:
    engine, durable = open_engine(
        tmp_path, journal_max_size_bytes=64 * 1024, journal_buffered_writes_threshold=8 * 1024
    )
    fill(engine, durable, range(3), 400)  # ~55 KiB per ledger in groups of 8 KiB: several files
    journals = list_journal_ids(str(tmp_path / "journal"))
    assert journals[-1] >= 2  # several files were made (each roll asks for a checkpoint too)
    (mark,) = engine.checkpoint()
    assert mark[0] == journals[-1]
    assert list_journal_ids(str(tmp_path / "journal")) == [mark[0]]
    engine.close()
    engine, _ = open_engine(tmp_path)
    assert engine.read(2, 399) == entry(2, 399)
    engine.close()


def test_write_cache_over_half_full_triggers_a_checkpoint(tmp_path: Path) -> None:
    engine, durable = open_engine(tmp_path, write_cache_max_bytes=200_000)
    fill(engine, durable, range(2), 1000)  # 2 x 1000 x ~136 bytes > 100 KB
    for _ in range(100):
        if engine.checkpoints:
            break
        threading.Event().wait(0.1)
    assert engine.checkpoints >= 1
    engine.close()


def test_a_requested_checkpoint_is_paced_by_the_time_the_cache_took_to_fill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write cache half full asks for a checkpoint paced over half the time since the last
    one began (not at full speed: three bookies flushing a cache at once stalled every add), and
    never slower than a periodic one; journal disks filling up ask for one at full speed."""
    started = time.monotonic()
    engine, durable = open_engine(tmp_path, write_cache_max_bytes=200_000, flush_interval_s=60.0)
    asked: list[tuple[float, bool]] = []  # (pace, hurried) of each checkpoint the thread runs
    real_checkpoint = engine.checkpoint

    def recording_checkpoint(pace_s: float = 0.0) -> list[tuple[int, int]]:
        asked.append((pace_s, engine.storage._hurry.is_set()))
        return real_checkpoint(0.0)

    monkeypatch.setattr(engine, "checkpoint", recording_checkpoint)

    def wait_for_checkpoints(count: int) -> None:
        for _ in range(300):
            if len(asked) >= count:
                return
            threading.Event().wait(0.01)
        raise AssertionError(f"{count} checkpoints did not run in 3 s")

    threading.Event().wait(0.4)
    engine.create_ledger(1, KEY)
    ids = list(range(800))  # ~110 KB in one batch: over half the cache, asked for once
    engine.add_entries(1, ids, [entry(1, i) for i in ids], "batch")
    durable.wait_for(1)
    wait_for_checkpoints(1)
    elapsed = time.monotonic() - started
    pace, hurried = asked[0]
    assert 0.2 <= pace <= elapsed / 2 and not hurried
    engine.add_entry(1, 800, entry(1, 800), "one more")  # the journal's file holds a record
    durable.wait_for(2)
    engine.reclaim_journal_space([str(tmp_path / "journal")])
    wait_for_checkpoints(2)
    assert asked[1][1]  # hurried: the journal's space comes back as soon as it can
    engine.close()


def test_entry_logs_roll_and_write_a_ledgers_map(tmp_path: Path) -> None:
    engine, durable = open_engine(tmp_path, log_size_limit=64 * 1024)
    fill(engine, durable, range(4), 300)
    engine.checkpoint()
    logger = engine.storage.entry_logger
    logs = logger.log_ids()
    assert len(logs) > 2
    rolled = logs[0]
    assert sum(logger.ledgers_map(rolled).values()) > 0
    assert logger.ledgers_map(rolled) == logger.scan_ledgers(rolled)  # the map agrees with the data
    assert all(engine.read(lid, e) == entry(lid, e) for lid in range(4) for e in range(300))
    engine.close()


@pytest.mark.parametrize("flush_every", [0, 64 * 1024])
def test_entry_logs_are_flushed_every_flush_entrylog_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flush_every: int
) -> None:
    engine, durable = open_engine(tmp_path, flush_entrylog_bytes=flush_every)
    fill(engine, durable, range(2), 2000)  # ~2 x 270 KB of records, in batches of 512 entries
    logger = engine.storage.entry_logger
    syncs: list[int] = []
    real_fdatasync = os.fdatasync

    def counting_fdatasync(fd: int) -> None:
        if fd == logger._active_fd:
            syncs.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    engine.checkpoint()
    monkeypatch.undo()
    if flush_every:
        assert len(syncs) >= 540_000 // flush_every  # along the way, then the checkpoint's own
    else:
        assert len(syncs) == 1  # the checkpoint's own
    assert all(engine.read(lid, e) == entry(lid, e) for lid in range(2) for e in range(2000))
    engine.close()


def test_a_paced_checkpoint_pauses_after_its_flushes_until_hurried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, durable = open_engine(tmp_path, flush_entrylog_bytes=16 * 1024)
    fill(engine, durable, range(2), 500)  # ~130 KB: several flushes along the way
    storage = engine.storage
    pauses: list[float | None] = []
    real_wait = storage._hurry.wait

    def recording_wait(timeout: float | None = None) -> bool:
        pauses.append(timeout)
        return real_wait(timeout)

    monkeypatch.setattr(storage._hurry, "wait", recording_wait)
    done: list[list[tuple[int, int]]] = []
    worker = threading.Thread(target=lambda: done.append(engine.checkpoint(pace_s=3600.0)))
    worker.start()
    for _ in range(300):  # the first pause comes after the first 16 KiB flush
        if pauses:
            break
        threading.Event().wait(0.01)
    assert pauses and pauses[0] is not None and pauses[0] > 0
    assert storage.flushing_bytes > 0 and not done  # paused in the middle of the checkpoint
    storage.hurry()
    worker.join(timeout=30)
    assert not worker.is_alive() and done
    assert storage.flushing_bytes == 0
    assert all(engine.read(lid, e) == entry(lid, e) for lid in range(2) for e in range(500))
    engine.close()


def test_a_corrupt_entry_is_an_io_error_not_a_missing_entry(tmp_path: Path) -> None:
    engine, durable = open_engine(tmp_path)
    fill(engine, durable, range(1), 10)
    engine.checkpoint()
    location = engine.storage.index.location(0, 5)
    assert location is not None
    log_id, offset = location >> 32, location & 0xFFFFFFFF
    path = tmp_path / "ledgers" / log_name(log_id)
    with open(path, "r+b") as handle:
        handle.seek(offset + 8 + 40)
        byte = handle.read(1)
        handle.seek(offset + 8 + 40)
        handle.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(StorageIOError, match=f"{log_name(log_id)}.*offset {offset}"):
        engine.read(0, 5)
    assert engine.read(0, 4) == entry(0, 4)
    engine.close()


def test_a_damaged_mark_replays_every_journal_present(tmp_path: Path) -> None:
    engine, durable = open_engine(tmp_path)
    fill(engine, durable, range(2), 10)
    engine.checkpoint()
    engine.add_entry(1, 10, entry(1, 10), "late")
    durable.wait_for(21)
    crash(engine)
    mark_path = tmp_path / "ledgers" / FILE_NAME
    mark_path.write_bytes(mark_path.read_bytes()[:-1] + b"\0")
    engine, _ = open_engine(tmp_path)
    assert engine.read(1, 10) == entry(1, 10)
    engine.close()


def test_a_failed_checkpoint_stops_writes_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, durable = open_engine(tmp_path)
    fill(engine, durable, range(1), 10)

    def broken(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(engine.storage.entry_logger, "flush", broken)
    engine.request_checkpoint()
    for _ in range(100):
        if engine.failure is not None:
            break
        threading.Event().wait(0.1)
    assert isinstance(engine.failure, OSError)
    assert engine.read(0, 9) == entry(0, 9)  # still served from the write cache
    monkeypatch.undo()
    engine.close()  # no final checkpoint after a failure: the journal keeps everything
    engine, _ = open_engine(tmp_path)
    assert all(engine.read(0, e) == entry(0, e) for e in range(10))
    assert os.path.exists(tmp_path / "journal")
    engine.close()


def test_ledger_state_cache_stays_bounded_and_states_survive_eviction(tmp_path: Path) -> None:
    engine, _ = open_engine(tmp_path, ledger_cache_size=100)
    for ledger_id in range(1000):
        engine.create_ledger(ledger_id, KEY)
    engine.checkpoint()  # states persisted: now clean and evictable
    for ledger_id in range(1000, 1300):
        engine.create_ledger(ledger_id, bytes([ledger_id % 256]) * 20)
    assert len(engine.storage._infos) <= 100 + 10 + 300  # size, one growth margin, the dirty ones
    engine.checkpoint()
    for ledger_id in range(1300, 1400):
        engine.create_ledger(ledger_id, KEY)
    assert len(engine.storage._infos) <= 110
    assert engine.ledger(5) is not None and engine.ledger(5).master_key == KEY  # type: ignore[union-attr]
    assert engine.ledger(1200).master_key == bytes([1200 % 256]) * 20  # type: ignore[union-attr]
    engine.close()


def test_several_journal_directories(tmp_path: Path) -> None:
    second = str(tmp_path / "journal2")
    engine, durable = open_engine(tmp_path, extra_journal_directories=(second,))
    fill(engine, durable, range(6), 10)  # even ledgers in the first journal, odd in the second
    records = [
        sum(1 for _ in replay(directory, None)) for directory in (str(tmp_path / "journal"), second)
    ]
    assert records == [3 * 11, 3 * 11]  # each ledger's master key and 10 entries, in its journal
    engine.checkpoint()
    assert sorted(os.listdir(tmp_path / "ledgers")).count("lastMark.1") == 1
    engine.add_entry(3, 10, entry(3, 10), "odd")
    engine.add_entry(4, 10, entry(4, 10), "even")
    durable.wait_for(62)
    crash(engine)
    engine, _ = open_engine(tmp_path, extra_journal_directories=(second,))
    assert engine.replayed_records == 2  # one record after each journal's mark
    assert engine.read(3, 10) == entry(3, 10) and engine.read(4, 10) == entry(4, 10)
    assert all(engine.read(lid, e) == entry(lid, e) for lid in range(6) for e in range(10))
    engine.close()


def test_a_paced_checkpoint_rests_between_the_slices_of_its_long_steps_unless_hurried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A paced checkpoint's index puts and release rest three times as long as each slice took
    (at most 2 ms), so three bookies ending a checkpoint at once do not take both cores; hurried,
    they only hand the GIL over."""
    from bookkeeper_py.storage import ledger_storage

    clock = [100.0]
    slept: list[float] = []
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(time, "sleep", slept.append)
    hurry = threading.Event()
    pause = ledger_storage._resting_pause(hurry)
    for work in (0.0002, 0.0005, 0.01):  # slices of 0.2 ms, 0.5 ms, 10 ms
        clock[0] += work
        pause()
    hurry.set()
    clock[0] += 0.001
    pause()
    assert slept == pytest.approx([0.0006, 0.0015, 0.002, ledger_storage._GIL_PAUSE_S])


def test_a_checkpoint_writes_each_ledger_in_entry_order_whatever_order_the_adds_came_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries that came in increasing order are written in that order a slice at a time, the
    others sorted first (out of order, or a batch that is not increasing): in the entry log every
    ledger's entries lie in entry order, and all are read back after the checkpoint."""
    from bookkeeper_py.storage import ledger_storage

    monkeypatch.setattr(ledger_storage, "_GATHER_SLICE", 7)
    engine, durable = open_engine(tmp_path)
    for ledger_id in (1, 2, 3):
        engine.create_ledger(ledger_id, KEY)
    for start in range(0, 50, 10):  # in order, in batches
        ids = list(range(start, start + 10))
        engine.add_entries(1, ids, [entry(1, i) for i in ids], ("one", start))
    for entry_id in reversed(range(30)):  # one at a time, backwards
        engine.add_entry(2, entry_id, entry(2, entry_id), ("two", entry_id))
    engine.add_entries(3, [0, 1, 2], [entry(3, i) for i in (0, 1, 2)], "three")
    engine.add_entries(3, [5, 3, 4], [entry(3, i) for i in (5, 3, 4)], "three, not increasing")
    durable.wait_for(5 + 30 + 2)
    assert engine.storage._current.unordered == {2, 3}
    engine.checkpoint()
    for ledger_id, count in ((1, 50), (2, 30), (3, 6)):
        places = [engine.storage.index.location(ledger_id, i) for i in range(count)]
        assert None not in places and places == sorted(places)  # type: ignore[type-var]
        assert [engine.read(ledger_id, i) for i in range(count)] == [
            entry(ledger_id, i) for i in range(count)
        ]
    engine.close()


def test_a_checkpoint_commits_its_locations_and_frees_its_entries_in_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ``_INDEX_PART_BYTES`` of records a checkpoint syncs the log, commits the locations
    put so far and frees those entries from the write cache: each part's entries then read
    back from the log (through the index) while the checkpoint goes on, the later ones still
    from the cache. A checkpoint that fails after some parts loses nothing: the parts stay
    committed, the rest goes back to the write cache, and the next checkpoint writes it."""
    from bookkeeper_py.storage import index as index_module
    from bookkeeper_py.storage import ledger_storage

    monkeypatch.setattr(ledger_storage, "_CHUNK_BITS", 3)  # runs of two chunks of 8
    monkeypatch.setattr(ledger_storage, "_GATHER_SLICE", 16)
    monkeypatch.setattr(ledger_storage, "_INDEX_PART_BYTES", 40 * 1024)
    engine, durable = open_engine(tmp_path)
    storage = engine.storage
    for ledger_id in (1, 2):
        engine.create_ledger(ledger_id, KEY)
    for start in range(0, 200, 20):
        for ledger_id in (1, 2):
            ids = list(range(start, start + 20))
            engine.add_entries(ledger_id, ids, [entry(ledger_id, i, 1000) for i in ids], start)
    durable.wait_for(20)
    seen: list[tuple[int, int, int]] = []  # (part, entries cached in the flushing generation, read)
    real_commit_part = index_module.IndexWrite.commit_part

    def commit_part(write: index_module.IndexWrite) -> None:
        real_commit_part(write)
        flushing = storage._flushing
        assert flushing is not None
        readable = sum(
            engine.read(ledger_id, i) == entry(ledger_id, i, 1000)
            for ledger_id in (1, 2)
            for i in range(200)
        )
        seen.append((write.parts, sum(map(len, flushing.ledgers.values())), readable))
        assert set(storage.entry_ids(2)) == set(range(200))  # in the cache, the index or both

    monkeypatch.setattr(index_module.IndexWrite, "commit_part", commit_part)
    engine.checkpoint()
    assert len(seen) >= 5 and [part for part, _, _ in seen] == list(range(1, len(seen) + 1))
    # every entry readable at every part; the flushing generation shrinks part after part (the
    # entries of a part are freed right after the commit that the next part's record shows)
    assert all(readable == 400 for _, _, readable in seen)
    cached = [count for _, count, _ in seen]
    assert cached[0] == 400 and cached == sorted(cached, reverse=True) and cached[-1] < 100
    assert [engine.read(1, i) for i in range(200)] == [entry(1, i, 1000) for i in range(200)]
    assert storage._current.count == 0

    # A checkpoint that fails after its second part.
    for start in range(200, 400, 20):
        ids = list(range(start, start + 20))
        engine.add_entries(1, ids, [entry(1, i, 1000) for i in ids], start)
    durable.wait_for(30)
    parts: list[int] = []

    def failing_part(write: index_module.IndexWrite) -> None:
        real_commit_part(write)
        parts.append(write.parts)
        if write.parts == 2:
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(index_module.IndexWrite, "commit_part", failing_part)
    with pytest.raises(OSError):
        storage.checkpoint()
    assert parts == [1, 2]
    assert storage._flushing is None and 0 < storage._current.count < 200
    assert [engine.read(1, i) for i in range(400)] == [entry(1, i, 1000) for i in range(400)]
    monkeypatch.setattr(index_module.IndexWrite, "commit_part", real_commit_part)
    engine.checkpoint()
    assert storage._current.count == 0
    assert all(storage.index.location(1, i) is not None for i in range(400))
    assert [engine.read(1, i) for i in range(400)] == [entry(1, i, 1000) for i in range(400)]
    engine.close()
    engine, _ = open_engine(tmp_path)
    assert [engine.read(1, i) for i in range(400)] == [entry(1, i, 1000) for i in range(400)]
    engine.close()


@pytest.mark.parametrize(
    "batches",
    [
        [[0, 1, 2], [3, 4]],  # each new, increasing: the cache's one-call path
        [[0, 1, 2], [2, 3]],  # one already cached (a copy): replaced
        [[0, 1, 1, 2]],  # the same id twice in one batch
        [[4, 2], [3, 2]],  # not increasing
    ],
)
def test_the_write_cache_counts_each_entry_it_holds_once(
    tmp_path: Path, batches: list[list[int]]
) -> None:
    """Batches of adds to the write cache: its entry count and bytes are those of the entries
    it holds, a replaced entry (or one twice in a batch) counted once, at its last size."""
    engine, durable = open_engine(tmp_path)
    engine.create_ledger(1, KEY)
    held: dict[int, bytes] = {}
    for number, ids in enumerate(batches):
        entries = [entry(1, i) + b"." * (number + position) for position, i in enumerate(ids)]
        engine.add_entries(1, ids, entries, number)
        held.update(zip(ids, entries, strict=True))
    durable.wait_for(len(batches))
    current = engine.storage._current
    assert current.count == len(held)
    assert current.size_bytes == sum(map(len, held.values()))
    assert [engine.read(1, i) for i in sorted(held)] == [held[i] for i in sorted(held)]
    engine.close()


def test_a_half_full_write_cache_asks_for_a_paced_checkpoint_hurried_at_three_quarters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write cache over half full asks for a checkpoint, which stays paced; only over three
    quarters (what the running checkpoint still flushes counts) is it hurried. Hurried at half,
    every checkpoint the cache asked for ran at full speed at once (its own bytes keep the cache
    over half until it ends), and took the disk and the cores from the adds."""
    engine, _ = open_engine(tmp_path, write_cache_max_bytes=1000)
    engine._stopping.set()  # no checkpoint takes the request or the hurry meanwhile
    engine._checkpoint_requested.set()
    assert engine._sync_thread is not None
    engine._sync_thread.join()
    engine._checkpoint_requested.clear()
    storage = engine.storages[0]
    storage.hurry(False)
    cached = 0
    monkeypatch.setattr(StorageEngine, "write_cache_bytes", property(lambda _: cached))
    for cached, requested, hurried in ((400, False, False), (600, True, False), (800, True, True)):
        engine._mind_write_cache()
        assert engine._checkpoint_requested.is_set() == requested, cached
        assert storage._hurry.is_set() == hurried, cached
    monkeypatch.undo()
    crash(engine)


def test_a_flushed_generation_is_freed_a_chunk_at_a_time() -> None:
    """A checkpoint frees the generation it flushed one chunk of a ledger's entries at a time,
    handing the GIL over after each: every ledger's entries are freed, and no slice is larger
    than a chunk (one C-level free of a write cache's worth held the GIL for milliseconds)."""
    from bookkeeper_py.storage import ledger_storage

    chunk = 1 << ledger_storage._CHUNK_BITS
    generation = ledger_storage._Generation()
    big = ledger_storage._LedgerEntries()
    assert big.add_new(list(range(2 * chunk + 7)), [b"e%d" % i for i in range(2 * chunk + 7)]) > 0
    small = ledger_storage._LedgerEntries()
    assert small.add_new([0, 1, 2], [b"s0", b"s1", b"s2"]) == 6
    generation.ledgers = {1: big, 2: small}
    big_chunks = list(big.chunks.values())
    small_chunks = list(small.chunks.values())
    held_at_pause: list[tuple[int, int]] = []

    def pause() -> None:
        held_at_pause.append((sum(map(len, big_chunks)), sum(map(len, small_chunks))))

    ledger_storage._release(generation, pause)

    assert generation.ledgers == {}
    assert big.chunks == {} and small.chunks == {}
    assert all(not entries for entries in big_chunks + small_chunks)
    # The small ledger goes at once (a pause after it); the big one loses a chunk per pause,
    # in the order of its ids.
    assert held_at_pause == [
        (2 * chunk + 7, 0),
        (chunk + 7, 0),
        (7, 0),
        (0, 0),
    ]


def test_a_ledgers_cached_entries_are_kept_in_bounded_chunks_and_read_back_in_order() -> None:
    """A ledger's entries in the write cache live in dicts of at most a chunk each (one dict
    grown to 87,381 entries rehashed for ~5 ms in every bookie at once), whatever the order they
    come in: each is found, a batch that repeats one changes nothing, a replacement returns the
    entry it replaced, and a checkpoint gets them back in increasing id order."""
    from bookkeeper_py.storage import ledger_storage

    chunk = 1 << ledger_storage._CHUNK_BITS
    entries = ledger_storage._LedgerEntries()
    # A striped bookie's share (two of every three ids), in batches that cross chunk bounds.
    ids = [i for i in range(5 * chunk) if i % 3 != 2]
    for start in range(0, len(ids), 700):
        batch = ids[start : start + 700]
        assert entries.add_new(batch, [b"%d" % i for i in batch]) > 0
    assert len(entries) == len(ids) and list(entries) == ids
    assert all(len(part) <= chunk for part in entries.chunks.values())
    assert [entries.get(i) for i in (0, 1, 2, chunk, 5 * chunk)] == [
        b"0",
        b"1",
        None,
        b"%d" % chunk if chunk % 3 != 2 else None,
        None,
    ]
    # A batch one of whose ids is held already (on the far side of a chunk bound) adds nothing.
    hole = next(i for i in range(4 * chunk - 3, 4 * chunk) if i % 3 == 2)
    held = next(i for i in range(4 * chunk, 4 * chunk + 3) if i % 3 != 2)
    assert entries.add_new([hole, held], [b"new", b"again"]) == ledger_storage.HELD
    assert entries.get(hole) is None and entries.get(held) == b"%d" % held
    assert len(entries) == len(ids)
    assert entries.put(ids[-1], b"replaced") == b"%d" % ids[-1]
    assert entries.put(2, b"2") is None  # a hole filled late
    assert len(entries) == len(ids) + 1

    runs = list(entries.runs(False, 2 * chunk))
    got = [i for run_ids, _, _ in runs for i in run_ids]
    assert got == sorted([*ids, 2])
    assert all(len(run_ids) >= 2 * chunk for run_ids, _, _ in runs[:-1])
    values = dict(zip(got, [v for _, run_values, _ in runs for v in run_values], strict=True))
    assert values[ids[-1]] == b"replaced" and values[2] == b"2" and values[0] == b"0"
    # Each run names the chunks it took whole, in order.
    assert [key for _, _, keys in runs for key in keys] == sorted(entries.chunks)
    assert all({i >> 10 for i in run_ids} == set(keys) for run_ids, _, keys in runs)
    # In the order of arrival for a ledger whose entries all came in increasing order; the
    # chunks of runs taken may be freed while the later runs are taken.
    plain = ledger_storage._LedgerEntries()
    assert plain.add_new(list(range(3 * chunk)), [b"x"] * (3 * chunk)) == 3 * chunk
    taken = []
    for run_ids, _, keys in plain.runs(True, chunk):
        taken += run_ids
        plain.release(keys, lambda: None)
    assert taken == list(range(3 * chunk))
    assert plain.chunks == {} and len(plain) == 0
