"""The journal and the index rebuilt from it: durability, replay, torn tails, corruption, fsync failure."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import crc32c
import pytest

from bookkeeper_py.storage.journal import (
    BACKGROUND_WITH_FOREGROUND,
    ZERO_AHEAD_MAX_SYNC_BYTES,
    CorruptJournalError,
    Journal,
    JournalError,
    RecordType,
    journal_name,
    replay,
)
from bookkeeper_py.wire.digest import DigestManager, DigestType

from .fadvise import FadviseRecorder


class Collector:
    """Gathers journal completions and lets a test wait for a number of them."""

    def __init__(self) -> None:
        self.results: list[tuple[Any, Exception | None]] = []
        self._condition = threading.Condition()

    def __call__(self, tokens: list[Any], error: Exception | None) -> None:
        with self._condition:
            self.results.extend((token, error) for token in tokens)
            self._condition.notify_all()

    def wait_for(self, count: int) -> None:
        with self._condition:
            assert self._condition.wait_for(lambda: len(self.results) >= count, timeout=30)


def entry(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    return DigestManager(ledger_id, DigestType.CRC32C, b"").package(
        entry_id, entry_id - 1, 0, payload
    )


def write_journal(
    directory: Path,
    records: list[tuple[RecordType, bytes]],
    file_id: int = 0,
    *,
    one_group_each: bool = False,
) -> Collector:
    """Writes ``records`` to a new journal file; with ``one_group_each`` every record is its own
    group commit (the next is appended only once the previous is durable)."""
    collector = Collector()
    journal = Journal(str(directory), collector)
    journal.open(file_id)
    for index, (record_type, body) in enumerate(records):
        journal.append(record_type, body, index)
        if one_group_each:
            collector.wait_for(index + 1)
    collector.wait_for(len(records))
    journal.close()
    return collector


def replayed(
    directory: Path, mark: tuple[int, int] | None = None
) -> list[tuple[RecordType, bytes]]:
    return [(record_type, body) for record_type, body, _, _ in replay(str(directory), mark)]


def test_records_survive_and_are_replayed_in_order(tmp_path: Path) -> None:
    key = b"k" * 20
    records = [
        (RecordType.MASTER_KEY, (7).to_bytes(8, "big") + key),
        (RecordType.ENTRY, entry(7, 0, b"zero")),
        (RecordType.ENTRY, entry(7, 1, b"one")),
        (RecordType.EXPLICIT_LAC, (7).to_bytes(8, "big") + b"lac-body"),
        (RecordType.FENCE, (7).to_bytes(8, "big")),
    ]
    collector = write_journal(tmp_path, records)
    assert [token for token, _ in collector.results] == list(range(5))
    assert all(error is None for _, error in collector.results)
    assert replayed(tmp_path) == records


def test_replay_starts_at_the_mark(tmp_path: Path) -> None:
    records = [(RecordType.ENTRY, entry(1, i, b"x" * i)) for i in range(4)]
    write_journal(tmp_path, records[:2], file_id=0, one_group_each=True)
    positions = [group_end for _, _, _, group_end in replay(str(tmp_path), None)]
    assert positions[0] < positions[1]
    write_journal(tmp_path, records[2:], file_id=1, one_group_each=True)
    assert replayed(tmp_path, (0, positions[0])) == records[1:]
    assert replayed(tmp_path, (1, 16)) == records[2:]
    assert replayed(tmp_path, (0, positions[1])) == records[2:]


def test_torn_tail_is_cut_and_earlier_records_kept(tmp_path: Path) -> None:
    records = [(RecordType.ENTRY, entry(1, i, b"x" * 100)) for i in range(3)]
    write_journal(tmp_path, records, one_group_each=True)
    path = tmp_path / journal_name(0)
    size = path.stat().st_size
    os.truncate(path, size - 50)  # the last group loses its end, as in a crash mid-write
    assert replayed(tmp_path) == records[:2]
    assert path.stat().st_size < size - 50  # the partial record was cut off
    assert replayed(tmp_path) == records[:2]  # and a second replay is clean


def test_corruption_in_the_middle_is_reported_with_file_and_offset(tmp_path: Path) -> None:
    write_journal(
        tmp_path,
        [(RecordType.ENTRY, entry(1, i, b"y" * 100)) for i in range(3)],
        one_group_each=True,
    )
    path = tmp_path / journal_name(0)
    data = bytearray(path.read_bytes())
    data[16 + 8 + 4 + 1 + 4 + 40] ^= 0xFF  # inside the first group's only record body
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptJournalError) as failure:
        replayed(tmp_path)
    assert failure.value.offset == 16
    assert str(path) in str(failure.value)


def test_corruption_in_an_older_file_is_not_taken_for_a_torn_tail(tmp_path: Path) -> None:
    write_journal(tmp_path, [(RecordType.ENTRY, entry(1, 0, b"a" * 10))], file_id=0)
    write_journal(tmp_path, [(RecordType.ENTRY, entry(1, 1, b"b" * 10))], file_id=1)
    path = tmp_path / journal_name(0)
    os.truncate(path, path.stat().st_size - 3)
    with pytest.raises(CorruptJournalError, match="truncated group"):
        replayed(tmp_path)


def test_failed_fsync_fails_the_records_and_every_later_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    collector = Collector()
    journal = Journal(str(tmp_path), collector)
    journal.open(0)

    def broken_fdatasync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken_fdatasync)
    journal.append(RecordType.ENTRY, entry(1, 0, b"lost?"), "first")
    collector.wait_for(1)
    monkeypatch.undo()
    journal.append(RecordType.ENTRY, entry(1, 1, b"later"), "second")
    collector.wait_for(2)
    journal.close()
    assert [token for token, _ in collector.results] == ["first", "second"]
    assert all(isinstance(error, JournalError) for _, error in collector.results)
    assert journal.failure is not None


def test_preallocated_zeros_after_a_crash_end_the_data_in_any_file(tmp_path: Path) -> None:
    records = [(RecordType.ENTRY, entry(1, i, b"z" * 50)) for i in range(3)]
    write_journal(tmp_path, records[:2], file_id=0, one_group_each=True)
    write_journal(tmp_path, records[2:], file_id=1, one_group_each=True)
    for file_id in (0, 1):  # a crash leaves the preallocated space of both files in place
        with open(tmp_path / journal_name(file_id), "ab") as handle:
            handle.write(bytes(1 << 20))
    assert replayed(tmp_path) == records
    # a torn group followed by preallocated zeros, in the newest file, is a torn tail
    path = tmp_path / journal_name(1)
    data = bytearray(path.read_bytes())
    data[16 + 8 + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    assert replayed(tmp_path) == records[:2]


def test_max_group_wait_gathers_records_that_arrive_within_it(tmp_path: Path) -> None:
    collector = Collector()
    journal = Journal(
        str(tmp_path), collector, max_group_wait_s=5.0, buffered_writes_threshold=3 * 136
    )
    journal.open(0)
    for index in range(3):  # the third record fills the group: it is written without waiting 5 s
        journal.append(RecordType.ENTRY, entry(1, index, b"w" * 100), index)
    collector.wait_for(3)
    journal.close()
    group_ends = {group_end for _, _, _, group_end in replay(str(tmp_path), None)}
    assert len(group_ends) == 1  # one group, one fsync


def documented_group(records: list[tuple[RecordType, bytes]]) -> bytes:
    """One group exactly as docs/formats/journal.md lays it out, built here independently."""
    payload = b"".join(
        [
            len(records).to_bytes(4, "big"),
            bytes(int(record_type) for record_type, _ in records),
            b"".join(len(body).to_bytes(4, "big") for _, body in records),
            *(body for _, body in records),
        ]
    )
    return len(payload).to_bytes(4, "big") + crc32c.crc32c(payload).to_bytes(4, "big") + payload


def write_one_group(directory: Path, records: list[tuple[RecordType, bytes]]) -> bytes:
    """Writes ``records`` as one group (the group waits until they are all queued) and returns the
    journal file's bytes."""
    collector = Collector()
    size = sum(len(body) for _, body in records)
    journal = Journal(
        str(directory), collector, max_group_wait_s=30.0, buffered_writes_threshold=size
    )
    journal.open(0)
    for index, (record_type, body) in enumerate(records):
        journal.append(record_type, body, index)
    collector.wait_for(len(records))
    journal.close()
    assert all(error is None for _, error in collector.results)
    return (directory / journal_name(0)).read_bytes()


@pytest.mark.parametrize(
    "sizes",
    [
        [100, 7, 300],  # small records: joined, then written
        [64 * 1024, 5000, 200 * 1024],  # large records: written from their own bodies
        [20, 50 * 1024, 8],  # large on average
    ],
)
def test_a_group_is_written_byte_for_byte_as_documented(tmp_path: Path, sizes: list[int]) -> None:
    records = [(RecordType.ENTRY, entry(3, i, os.urandom(size))) for i, size in enumerate(sizes)]
    records.insert(1, (RecordType.FENCE, (3).to_bytes(8, "big")))
    data = write_one_group(tmp_path, records)
    header = b"PBKJ" + (2).to_bytes(4, "big") + (0).to_bytes(8, "big")
    assert data == header + documented_group(records)
    assert replayed(tmp_path) == records


@pytest.mark.parametrize("count", [100, 1100])  # a group one writev could take; one it cannot
def test_short_writes_and_more_pieces_than_one_writev_takes_are_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    """The first writev of a group falls short (or the group has more pieces than one takes):
    the rest is written from where it stopped."""
    real_writev = os.writev
    calls: list[int] = []

    def short_writev(fd: int, buffers: list[bytes]) -> int:
        assert len(buffers) <= 1024  # IOV_MAX
        calls.append(len(buffers))
        return real_writev(fd, [bytes(b"".join(buffers)[:10_000])])

    monkeypatch.setattr(os, "writev", short_writev)
    records = [(RecordType.ENTRY, entry(1, i, bytes([i % 256]) * 5000)) for i in range(count)]
    data = write_one_group(tmp_path, records)
    monkeypatch.undo()
    assert len(calls) > 1
    assert data[16:] == documented_group(records)
    assert replayed(tmp_path) == records


def test_synced_pages_are_dropped_from_the_page_cache_a_megabyte_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = FadviseRecorder()
    monkeypatch.setattr(os, "posix_fadvise", recorder)
    records = [(RecordType.ENTRY, entry(1, i, bytes([i]) * 300_000)) for i in range(12)]
    write_journal(tmp_path, records, one_group_each=True)
    size = (tmp_path / journal_name(0)).stat().st_size
    assert 1 < len(recorder.calls) < len(records)  # a megabyte or more at a time, not every group
    position = 0
    for offset, length, advice in recorder.calls:
        assert advice == os.POSIX_FADV_DONTNEED
        assert offset == position and length >= 1024 * 1024  # each range follows the last one
        position = offset + length
        assert position % 4096 == 0  # whole pages only: the next group continues the last one
    assert size - 4096 - 1024 * 1024 < position <= size
    assert replayed(tmp_path) == records


@pytest.mark.parametrize("options", [{"sync_data": False}, {"remove_from_page_cache": False}])
def test_pages_stay_in_the_page_cache_without_fsync_or_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, bool]
) -> None:
    recorder = FadviseRecorder()
    monkeypatch.setattr(os, "posix_fadvise", recorder)
    collector = Collector()
    journal = Journal(str(tmp_path), collector, **options)
    journal.open(0)
    for index in range(4):
        journal.append(RecordType.ENTRY, entry(1, index, b"q" * 5000), index)
        collector.wait_for(index + 1)
    journal.close()
    assert recorder.calls == []


def test_background_records_give_way_to_foreground_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a group is being synced, 20 background records (re-replication copies of 64 KiB)
    and then one foreground record are queued: the next group holds the foreground record and at
    most BACKGROUND_WITH_FOREGROUND bytes of copies, not the megabyte of copies queued first.
    Every record is written, and a closing journal writes what is still queued."""
    gate = threading.Event()
    syncing = threading.Event()
    real_fdatasync = os.fdatasync

    def held_fdatasync(fd: int) -> None:
        syncing.set()
        assert gate.wait(30)
        real_fdatasync(fd)

    collector = Collector()
    journal = Journal(str(tmp_path), collector)
    journal.open(0)
    monkeypatch.setattr(os, "fdatasync", held_fdatasync)
    copies = [entry(7, e, b"c" * (64 * 1024)) for e in range(21)]
    journal.append(RecordType.ENTRY, copies[0], "copy-0", background=True)
    assert syncing.wait(30)  # the first copy's group is being synced
    for number, body in enumerate(copies[1:], 1):
        journal.append(RecordType.ENTRY, body, f"copy-{number}", background=True)
    write = entry(8, 0, b"live writer")
    journal.append(RecordType.ENTRY, write, "write")
    gate.set()
    collector.wait_for(2)
    journal.close()
    monkeypatch.undo()
    assert sorted(str(token) for token, _ in collector.results) == sorted(
        ["write", *(f"copy-{number}" for number in range(21))]
    )
    assert all(error is None for _, error in collector.results)
    groups: dict[int, list[bytes]] = {}
    for _, body, _, group_end in replay(str(tmp_path), None):
        groups.setdefault(group_end, []).append(body)
    first, second, *rest = (groups[end] for end in sorted(groups))
    assert first == [copies[0]]
    assert second[0] == write  # the foreground record first, then copies up to the budget
    assert sum(map(len, second[1:])) <= BACKGROUND_WITH_FOREGROUND + len(copies[1])
    assert [body for group in (second, *rest) for body in group if body != write] == copies[1:]


def test_idle_time_writes_zeros_ahead_of_the_records_and_never_over_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While no record waits, the journal writes zeros over the preallocated space just past the
    records (a chunk at a time, up to a margin): each such write starts at or after the end of
    the records of that moment, the bytes past the records read as zeros, and every record is
    replayed as written."""
    payload = 3000
    collector = Collector()
    journal = Journal(str(tmp_path), collector, preallocate_bytes=4 * 1024 * 1024)
    zero_writes: list[tuple[int, int, int]] = []  # (offset, length, end of the records then)
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        zero_writes.append((offset, len(data), journal._size))
        assert not any(bytes(data))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    journal.open(0)
    records = [(RecordType.ENTRY, entry(1, i, bytes([i + 1]) * payload)) for i in range(8)]
    for index, (record_type, body) in enumerate(records):
        journal.append(record_type, body, index)
        collector.wait_for(index + 1)
    records_end = journal._size
    journal.close()
    assert zero_writes
    assert all(offset >= end for offset, _, end in zero_writes)
    furthest = max(offset + length for offset, length, _ in zero_writes)
    assert furthest > records_end  # zeros lie ahead of the last record
    data = (tmp_path / journal_name(0)).read_bytes()
    assert len(data) == records_end  # closing gives the space ahead back
    assert replayed(tmp_path) == records


@pytest.mark.parametrize("roll", [False, True])
def test_zeros_ahead_stop_while_syncs_are_large_and_resume_once_they_are_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, roll: bool
) -> None:
    """Zeros ahead write the journal's bytes twice: they are written only while a sync covers
    at most ZERO_AHEAD_MAX_SYNC_BYTES of records on average. Records of 9 times that each,
    synced one by one, outrun the zeros; once small records follow (``roll``: in a new file),
    the zeros come back. Every zero write lands past the records, and every record replays as
    written."""
    collector = Collector()
    journal = Journal(str(tmp_path), collector, preallocate_bytes=16 * 1024 * 1024)
    zero_writes: list[tuple[int, int]] = []  # (offset, end of the records then)
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        zero_writes.append((offset, journal._size))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    journal.open(0)
    large_size = 9 * ZERO_AHEAD_MAX_SYNC_BYTES  # past the average from the first sync
    large = [(RecordType.ENTRY, entry(1, i, bytes([i + 1]) * large_size)) for i in range(8)]
    small = [(RecordType.ENTRY, entry(1, 8 + i, b"s" * 100)) for i in range(40)]
    for index, (record_type, body) in enumerate(large):
        journal.append(record_type, body, index)
        collector.wait_for(index + 1)
    while_large = len(zero_writes)
    assert journal._sync_bytes > ZERO_AHEAD_MAX_SYNC_BYTES
    if roll:
        journal.request_roll()
    for index, (record_type, body) in enumerate(small, start=len(large)):
        journal.append(record_type, body, index)
        collector.wait_for(index + 1)
    assert journal._file_id == (1 if roll else 0)
    journal.close()
    # at most after the first record, before the average had seen a large sync (without the
    # rule: one after each of the eight)
    assert while_large <= 1
    assert len(zero_writes) > while_large  # back with the small records
    assert all(offset >= end for offset, end in zero_writes)
    assert replayed(tmp_path) == large + small


def test_no_zeros_are_written_ahead_without_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        calls.append(offset)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    collector = Collector()
    journal = Journal(str(tmp_path), collector, sync_data=False)
    journal.open(0)
    for index in range(4):
        journal.append(RecordType.ENTRY, entry(1, index, b"n" * 5000), index)
        collector.wait_for(index + 1)
    journal.close()
    assert calls == []


def test_entries_appended_together_are_one_group_with_one_token(tmp_path: Path) -> None:
    gate = threading.Event()
    collector = Collector()
    journal = Journal(str(tmp_path), collector)
    journal.open(0)
    real_commit = journal._commit

    def held_commit(batch: Any) -> None:
        gate.wait(30)
        real_commit(batch)

    journal._commit = held_commit  # type: ignore[method-assign]
    journal.append(RecordType.ENTRY, entry(1, 0, b"first"), "first")
    bodies = [entry(1, i, b"b" * i) for i in range(1, 6)]
    journal.append_entries(bodies, "batch")
    assert journal.queued >= 5  # the batch waits behind the held group, counted by records
    gate.set()
    collector.wait_for(2)
    journal.close()
    assert [token for token, _ in collector.results] == ["first", "batch"]
    assert journal.queued == 0
    groups = [group_end for _, _, _, group_end in replay(str(tmp_path), None)]
    assert len(set(groups[1:])) == 1  # the five entries went in one group
    assert replayed(tmp_path)[1:] == [(RecordType.ENTRY, body) for body in bodies]


def test_the_queue_length_counts_records_not_roll_requests(tmp_path: Path) -> None:
    collector = Collector()
    journal = Journal(str(tmp_path), collector)
    journal.open(0)
    journal.append(RecordType.ENTRY, entry(1, 0, b"a"), 0)
    collector.wait_for(1)
    journal.request_roll()
    journal.append(RecordType.ENTRY, entry(1, 1, b"b"), 1)
    collector.wait_for(2)
    gate, holding = threading.Event(), threading.Event()
    real_commit = journal._commit

    def held_commit(batch: Any) -> None:
        holding.set()
        gate.wait(30)
        real_commit(batch)

    journal._commit = held_commit  # type: ignore[method-assign]
    journal.append(RecordType.ENTRY, entry(1, 2, b"c"), 2)
    assert holding.wait(30)  # the journal thread holds that record in its commit
    journal.append(RecordType.ENTRY, entry(1, 3, b"d"), 3)
    journal.append(RecordType.ENTRY, entry(1, 4, b"e"), 4)
    assert journal.queued == 2
    gate.set()
    collector.wait_for(5)
    journal.close()
    assert journal.queued == 0
