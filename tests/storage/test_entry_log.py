"""The entry logger's write path: batches of large and small entries, their locations and
checksums, and the pages it drops from the page cache once they are synced."""

from __future__ import annotations

import concurrent.futures
import errno
import fcntl
import logging
import os
import struct
from pathlib import Path

import pytest

from bookkeeper_py.storage import entry_log
from bookkeeper_py.storage.entry_log import EntryLogger, ReadWouldBlockError, split_location
from tests.speedup_paths import take_path

from .fadvise import FadviseRecorder


def entry(ledger_id: int, entry_id: int, size: int) -> bytes:
    return struct.pack(">qq", ledger_id, entry_id) + bytes([entry_id % 251]) * size


def flip_byte(logger: EntryLogger, location: int, at: int) -> None:
    """Flips the byte ``at`` bytes into the record at ``location`` (its header is 8 bytes)."""
    log_id, offset = split_location(location)
    with open(logger.path(log_id), "r+b") as handle:
        handle.seek(offset + at)
        byte = handle.read(1)
        handle.seek(offset + at)
        handle.write(bytes([byte[0] ^ 0xFF]))


def log_with_a_flipped_byte(tmp_path: Path) -> tuple[EntryLogger, list[bytes], list[int]]:
    """A log of ledger 7's entries 0-19 (200 bytes each), a byte of entry 10 flipped."""
    logger = EntryLogger(str(tmp_path))
    entries = [entry(7, i, 200) for i in range(20)]
    locations = logger.add_many(7, entries)
    logger.flush()
    flip_byte(logger, locations[10], 8 + 100)
    return logger, entries, locations


def count_preads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, the size of every ``os.pread`` made, in a list."""
    reads: list[int] = []
    real = os.pread

    def counted(fd: int, size: int, offset: int) -> bytes:
        reads.append(size)
        return real(fd, size, offset)

    monkeypatch.setattr(os, "pread", counted)
    return reads


_SIZES = [
    [300 * 1024] * 3,  # few entries, many bytes: written in one batch
    [100] * 5,  # few small entries: through the write buffer
    [200 * 1024] * 12 + [10] * 700,  # more than one batch's worth of either
]


def direct_logger(directory: Path, **options: int) -> EntryLogger:
    """A logger writing with O_DIRECT (the C framing in use); the test is skipped where the file
    system refuses direct I/O (the logger then writes through the page cache)."""
    if entry_log._c_frame is None:
        pytest.skip("C speedups not built here")
    logger = EntryLogger(str(directory), direct_writes=True, **options)
    logger.add(1, entry(1, 0, 10))  # starts the first log: direct or not
    if logger._direct is None:
        logger.close()
        pytest.skip(f"{directory} takes no direct writes")
    return logger


@pytest.mark.parametrize("path", ["c", "python", "direct"])
@pytest.mark.parametrize("sizes", [*_SIZES, [3 * 1024 * 1024, 100, 2 * 1024 * 1024]])
def test_add_many_places_every_entry_where_it_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sizes: list[int], path: str
) -> None:
    """(The last sizes: entries larger than the direct writes' buffer, which grows for them.)"""
    if path == "direct":
        logger = direct_logger(tmp_path, flush_every_bytes=1024 * 1024)
    else:
        take_path(monkeypatch, entry_log, "_c_frame", path)
        logger = EntryLogger(str(tmp_path), flush_every_bytes=1024 * 1024)
        logger.add(1, entry(1, 0, 10))
    entries = [entry(7, index, size) for index, size in enumerate(sizes)]
    locations = logger.add_many(7, entries)
    logger.flush()
    assert [logger.read(location, 7, index) for index, location in enumerate(locations)] == entries
    log_id = split_location(locations[0])[0]
    assert [body for _, _, _, body in logger.records(log_id)] == [entry(1, 0, 10), *entries]
    assert logger.scan_ledgers(log_id) == {1: 34, 7: sum(len(e) + 8 for e in entries)}
    logger.close()


@pytest.mark.parametrize("sizes", _SIZES)
def test_the_c_and_python_framings_write_the_same_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sizes: list[int]
) -> None:
    """A checkpoint's batches framed in C (one buffer, one write) and in Python (two pieces per
    record, one writev) give the same locations and the same bytes on disk."""
    take_path(monkeypatch, entry_log, "_c_frame", "c")
    logs: list[tuple[list[int], bytes]] = []
    for path in ("c", "python"):
        if path == "python":
            monkeypatch.setattr(entry_log, "_c_frame", None)
        directory = tmp_path / path
        directory.mkdir()
        logger = EntryLogger(str(directory))
        locations = logger.add_many(5, [entry(5, 0, 100)])  # starts the log (the buffer's way)
        locations += logger.add_many(7, [entry(7, i, size) for i, size in enumerate(sizes)])
        locations += logger.add_many(9, [entry(9, i, 500) for i in range(40)])
        logger.flush()
        logs.append((locations, Path(logger.path(split_location(locations[0])[0])).read_bytes()))
        logger.close()
    assert logs[0] == logs[1]


def write_logs(logger: EntryLogger) -> list[int]:
    """Batches large and small, entries one at a time (as compaction adds them), and rolls."""
    locations = logger.add_many(5, [entry(5, i, 100) for i in range(3)])
    locations += logger.add_many(7, [entry(7, i, 3000 + i) for i in range(300)])
    locations += [logger.add(9, entry(9, i, 777)) for i in range(50)]
    logger.roll()
    locations += logger.add_many(7, [entry(7, 300 + i, 50_000) for i in range(30)])
    locations += logger.add_many(11, [entry(11, i, 1) for i in range(5)])
    return locations


def test_direct_writes_leave_the_same_logs_as_writes_through_the_page_cache(
    tmp_path: Path,
) -> None:
    """The same adds, written with O_DIRECT and through the page cache, over rolls (a closed log
    cut back to its last record): the same locations, and byte for byte the same files once
    closed. Before, the active log written directly ends in zeros up to a 4 KiB bound, which
    every reader takes for the end of the log."""
    (tmp_path / "direct").mkdir()
    (tmp_path / "cached").mkdir()
    direct = direct_logger(tmp_path / "direct", log_size_limit=400_000)
    cached = EntryLogger(str(tmp_path / "cached"), log_size_limit=400_000)
    cached.add(1, entry(1, 0, 10))
    assert write_logs(direct) == write_logs(cached)
    direct.flush()
    cached.flush()
    assert direct.log_ids() == cached.log_ids() and len(direct.log_ids()) > 2
    active = direct.active_log_id
    for log_id in direct.log_ids():
        direct_bytes = Path(direct.path(log_id)).read_bytes()
        cached_bytes = Path(cached.path(log_id)).read_bytes()
        if log_id == active:
            assert len(direct_bytes) % 4096 == 0 and len(direct_bytes) > len(cached_bytes)
            assert direct_bytes == cached_bytes.ljust(len(direct_bytes), b"\0")
        else:
            assert direct_bytes == cached_bytes
        assert list(direct.records(log_id)) == list(cached.records(log_id))
        assert direct.scan_ledgers(log_id) == cached.scan_ledgers(log_id)
    direct.close()
    cached.close()
    for log_id in direct.log_ids():
        assert Path(direct.path(log_id)).read_bytes() == Path(cached.path(log_id)).read_bytes()


def test_a_log_written_directly_and_left_by_a_crash_reads_to_its_last_record(
    tmp_path: Path,
) -> None:
    """A bookie that stops without closing its log leaves it ending in zeros: a new logger starts
    a log of its own, and the old one's records (and its ledgers, scanned) read back whole."""
    logger = direct_logger(tmp_path, flush_every_bytes=64 * 1024)
    entries = [entry(3, i, 5000 + i) for i in range(100)]
    locations = logger.add_many(3, entries)
    logger.flush()
    log_id = logger.active_log_id
    assert logger.file_size(log_id) % 4096 == 0
    logger._close_direct()  # the process gone: its descriptors closed, nothing else done
    os.close(logger._active_fd)
    again = EntryLogger(str(tmp_path), direct_writes=True)
    assert [body for _, _, _, body in again.records(log_id)] == [entry(1, 0, 10), *entries]
    assert again.scan_ledgers(log_id) == {1: 34, 3: sum(len(e) + 8 for e in entries)}
    assert [again.read(place, 3, i) for i, place in enumerate(locations)] == entries
    newer = again.add(4, entry(4, 0, 10))
    assert split_location(newer)[0] == log_id + 1
    again.close()


@pytest.mark.parametrize("errno_name", ["EINVAL", "EOPNOTSUPP"])
def test_a_file_system_that_refuses_direct_writes_gets_them_through_the_page_cache(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    errno_name: str,
) -> None:
    """Some file systems take ``O_DIRECT`` at the open and refuse the first write: the header is
    that first write, and the logger then writes through the page cache, said once."""
    if entry_log._c_frame is None:
        pytest.skip("C speedups not built here")
    real = os.pwrite
    refused: list[int] = []

    def pwrite(fd: int, data: bytes | memoryview, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & entry_log._O_DIRECT:
            refused.append(offset)
            raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    caplog.set_level(logging.INFO, logger=entry_log.__name__)
    logger = EntryLogger(str(tmp_path), direct_writes=True, log_size_limit=100_000)
    entries = [entry(7, i, 3000) for i in range(100)]  # rolls the log a few times
    locations = logger.add_many(7, entries)
    logger.flush()
    assert refused == [0] and logger._direct is None
    assert [logger.read(place, 7, i) for i, place in enumerate(locations)] == entries
    assert len(logger.log_ids()) > 2
    said = [r.getMessage() for r in caplog.records if "through the page cache" in r.getMessage()]
    assert len(said) == 1 and "does not take direct writes" in said[0]
    logger.close()


def test_a_direct_write_that_fails_leaves_the_log_at_what_was_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A direct write refused (a full disk) or cut short raises; the log is cut back to what was
    synced (what the index may point at) and the next write starts a new log."""
    logger = direct_logger(tmp_path)
    kept = logger.add_many(3, [entry(3, i, 2000) for i in range(50)])
    logger.flush()
    log_id = logger.active_log_id
    synced = logger.file_size(log_id)
    real = os.pwrite
    for failure in ("refused", "short"):

        def failing(fd: int, data: memoryview, offset: int, failure: str = failure) -> int:
            if failure == "refused":
                raise OSError(28, "No space left on device")
            return real(fd, data[:4096], offset)

        monkeypatch.setattr(os, "pwrite", failing)
        with pytest.raises(OSError, match=r"No space|short direct write"):
            logger.add_many(3, [entry(3, 50 + i, 2000) for i in range(50)])
            logger.flush()  # written (and refused) here at the latest
        monkeypatch.undo()
        logger.abandon_active()
        assert os.path.getsize(logger.path(log_id)) <= synced
        assert [logger.read(place, 3, i) for i, place in enumerate(kept)] == [
            entry(3, i, 2000) for i in range(50)
        ]
        again = logger.add_many(3, [entry(3, 50, 2000)])
        logger.flush()
        assert split_location(again[0])[0] == log_id + 1
        assert logger.read(again[0], 3, 50) == entry(3, 50, 2000)
        log_id = logger.active_log_id
        synced = logger.file_size(log_id)
    logger.close()


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_short_write_of_a_batch_is_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A write (or writev) of a batch that the system takes only part of: the rest is written
    after it, and every entry reads back from where it was placed."""
    take_path(monkeypatch, entry_log, "_c_frame", path)
    real_write, real_writev = os.write, os.writev
    cut: list[int] = []
    logger = EntryLogger(str(tmp_path))

    def short_write(fd: int, data: bytes | bytearray) -> int:
        if data is logger._frame and not cut:  # the C path's batch
            cut.append(len(data))
            return real_write(fd, bytes(data[:10_000]))
        return real_write(fd, data)

    def short_writev(fd: int, buffers: list[bytes]) -> int:  # the Python path's batch
        if not cut:
            data = b"".join(buffers)
            cut.append(len(data))
            return real_write(fd, data[:10_000])
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "write", short_write)
    monkeypatch.setattr(os, "writev", short_writev)
    first = logger.add_many(5, [entry(5, 0, 100)])  # starts the log (through the buffer)
    entries = [entry(7, i, 1000) for i in range(200)]
    locations = logger.add_many(7, entries)
    logger.flush()
    assert cut == [200 * (8 + 1016)]  # the batch went through the short write
    assert logger.read(first[0], 5, 0) == entry(5, 0, 100)
    assert [logger.read(location, 7, i) for i, location in enumerate(locations)] == entries
    logger.close()


@pytest.mark.parametrize("nowait", [False, True])
def test_reads_of_entries_longer_and_shorter_than_the_last_one_read(
    tmp_path: Path, nowait: bool
) -> None:
    """A read takes the record header and an entry as long as the last one read in one go:
    a longer entry's rest comes in a second read, a shorter one is cut out of the first, the
    last record of the log (nothing after it to read) included."""
    logger = EntryLogger(str(tmp_path))
    sizes = [1000, 20, 70_000, 5, 1000, 3000]
    entries = [entry(7, index, size) for index, size in enumerate(sizes)]
    locations = logger.add_many(7, entries)
    logger.flush()
    order = [0, 2, 1, 3, 5, 4, 5, 2, 2, 1]
    read = [logger.read(locations[i], 7, i, nowait=nowait) for i in order]
    assert read == [entries[i] for i in order]
    logger.close()


@pytest.mark.skipif(not entry_log._NOWAIT, reason="no RWF_NOWAIT on this system")
def test_a_header_only_partly_in_the_page_cache_is_a_read_that_would_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record header that crosses a page boundary with only the first page cached: the
    read without waiting gets 4 bytes. That is a read to make from the disk, not a record
    "beyond the end of the file" (the chaos campaign found a bookie answering such reads as
    corrupt); the waiting read returns the entry."""
    logger = EntryLogger(str(tmp_path))
    stored = entry(7, 0, 1000)
    (location,) = logger.add_many(7, [stored])
    logger.flush()
    real = os.preadv

    def cached_up_to_4_bytes(fd: int, buffers: list[bytearray], offset: int, flags: int) -> int:
        got = real(fd, buffers, offset, flags)
        return min(got, 4)

    monkeypatch.setattr(os, "preadv", cached_up_to_4_bytes)
    with pytest.raises(ReadWouldBlockError):
        logger.read(location, 7, 0, nowait=True)
    assert logger.read(location, 7, 0) == stored
    logger.close()


@pytest.mark.parametrize("stride", [1, 3])
def test_sequential_reads_come_from_read_ahead_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stride: int
) -> None:
    """Reads of one ledger's entries in order (every one, or every third as an E > Qw reader
    asks a bookie) are served from blocks read ahead: a few preads, not one per entry, and
    every entry as stored, records that cross a block's end included. Entries written after a
    block was read (past the log's synced end then) read as written."""
    logger = EntryLogger(str(tmp_path))
    sizes = [(i * 37) % 3000 + 10 for i in range(600)]
    entries = [entry(7, i, size) for i, size in enumerate(sizes)]
    locations = logger.add_many(7, entries)
    logger.flush()
    reads = count_preads(monkeypatch)
    wanted = list(range(0, 600, stride))
    assert [logger.read(locations[i], 7, i) for i in wanted] == [entries[i] for i in wanted]
    assert len(reads) < len(wanted) / 10
    later = [entry(7, 600 + i, 100) for i in range(50)]
    later_locations = logger.add_many(7, later)
    logger.flush()
    assert [logger.read(loc, 7, 600 + i) for i, loc in enumerate(later_locations)] == later
    logger.close()


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_damaged_record_in_a_read_ahead_block_is_refused_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A record read ahead is checked as one read from the file, by the C speedups or in
    Python: a flipped byte is a checksum mismatch naming the log and offset, a record asked for
    as another entry is refused; its neighbours in the block read as stored."""
    take_path(monkeypatch, entry_log, "_c_record", path)
    logger, entries, locations = log_with_a_flipped_byte(tmp_path)
    offset = split_location(locations[10])[1]
    for i in range(10):
        assert logger.read(locations[i], 7, i) == entries[i]
    with pytest.raises(entry_log.CorruptEntryError, match=f"at offset {offset}: checksum mismatch"):
        logger.read(locations[10], 7, 10)
    with pytest.raises(entry_log.CorruptEntryError, match="is not ledger 7 entry 12"):
        logger.read(locations[11], 7, 12)
    assert [logger.read(locations[i], 7, i) for i in range(12, 20)] == entries[12:]
    logger.close()


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_run_of_a_ledgers_entries_comes_from_few_reads_and_ends_at_another_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A batch read's entries that follow one another in a log come from reads of whole spans
    (cut anywhere: a record across two spans, one longer than a span), checked by the C pass
    or in Python, up to the count and the byte budget (4 bytes counted per entry), and not
    past the ledger's last record there: another ledger's record ends the run."""
    take_path(monkeypatch, entry_log, "_c_pick", path)
    monkeypatch.setattr(entry_log, "READ_RUN_BYTES", 16 * 1024)
    logger = EntryLogger(str(tmp_path))
    sizes = [(i * 37) % 3000 + 10 for i in range(300)]
    sizes[100] = 40 * 1024  # longer than a span
    entries = [entry(7, i, size) for i, size in enumerate(sizes)]
    locations = logger.add_many(7, entries)
    logger.add_many(8, [entry(8, 0, 100)])
    later = logger.add_many(7, [entry(7, 300, 100)])
    logger.flush()
    reads = count_preads(monkeypatch)
    assert logger.read_run(locations[0], 7, 0, 1000, 2**30) == entries
    assert len(reads) < 100
    assert logger.read_run(locations[5], 7, 5, 10, 2**30) == entries[5:15]
    budget = sum(4 + len(e) for e in entries[20:27])
    assert logger.read_run(locations[20], 7, 20, 100, budget) == entries[20:27]
    assert logger.read_run(locations[20], 7, 20, 100, budget - 1) == entries[20:26]
    assert logger.read_run(later[0], 7, 300, 10, 2**30) == [entry(7, 300, 100)]
    assert logger.read_run(locations[3], 7, 4, 10, 2**30) == []  # not the entry asked for
    logger.close()


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_run_stops_before_a_damaged_record_and_before_what_is_not_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A flipped byte ends a run before its record (the one-entry read then names it); in the
    active log a run ends at the synced end, though later records of the ledger are written."""
    take_path(monkeypatch, entry_log, "_c_pick", path)
    logger, entries, locations = log_with_a_flipped_byte(tmp_path)
    assert logger.read_run(locations[0], 7, 0, 100, 2**30) == entries[:10]
    assert logger.read_run(locations[10], 7, 10, 100, 2**30) == []
    assert logger.read_run(locations[11], 7, 11, 100, 2**30) == entries[11:]
    unsynced = [entry(7, 20 + i, 200) for i in range(5)]
    logger.add_many(7, unsynced)
    logger._write_buffer()  # in the file, not synced
    assert logger.read_run(locations[11], 7, 11, 100, 2**30) == entries[11:]
    logger.flush()
    assert logger.read_run(locations[11], 7, 11, 100, 2**30) == entries[11:] + unsynced
    logger.close()


@pytest.mark.parametrize("path", ["c", "python"])
def test_picked_entries_come_from_a_walk_over_the_ledgers_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A bookie's share of a striped read (every third entry of those it holds) comes from a
    walk over the ledger's records in spans, stepping over the entries not asked for, checked
    by the C pass or in Python; the walk ends before a wanted entry it does not meet (not held
    there, or after another ledger's record), before a damaged one, and, without waiting, where
    the page cache ends."""
    take_path(monkeypatch, entry_log, "_c_pick", path)
    monkeypatch.setattr(entry_log, "READ_RUN_BYTES", 16 * 1024)
    logger = EntryLogger(str(tmp_path))
    held = [i for i in range(900) if i % 3 != 1]  # a 3/2/2 bookie's entries
    sizes = {i: (i * 37) % 3000 + 10 for i in held}
    stored = {i: entry(7, i, sizes[i]) for i in held}
    locations = dict(zip(held, logger.add_many(7, [stored[i] for i in held]), strict=True))
    logger.add_many(8, [entry(8, 0, 100)])
    logger.flush()
    reads = count_preads(monkeypatch)
    wanted = list(range(0, 900, 3))
    assert logger.read_picked(locations[0], 7, wanted, 0) == [stored[i] for i in wanted]
    assert len(reads) < len(wanted) / 4  # spans, not a read per entry
    assert logger.read_picked(locations[30], 7, wanted, 10) == [stored[i] for i in wanted[10:]]
    # a wanted entry not held here ends the walk before it
    assert logger.read_picked(locations[0], 7, [0, 2, 4, 6], 0) == [stored[0], stored[2]]
    # nothing past the ledger's records: another ledger's comes next
    assert logger.read_picked(locations[897], 7, [897, 899, 900], 0) == [stored[897], stored[899]]
    flip_byte(logger, locations[300], 8 + 20)
    got = logger.read_picked(locations[0], 7, wanted, 0)
    assert got == [stored[i] for i in wanted if i < 300]
    assert logger.read_picked(locations[299], 7, [299, 302], 0) == [stored[299], stored[302]]
    if entry_log._NOWAIT:

        def not_cached(fd: int, buffers: list[bytearray], offset: int, flags: int) -> int:
            raise BlockingIOError()

        monkeypatch.setattr(os, "preadv", not_cached)
        assert logger.read_picked(locations[0], 7, wanted, 0, nowait=True) == []
    logger.close()


@pytest.mark.parametrize("path", ["c", "python"])
@pytest.mark.parametrize("nowait", [False, True])
def test_walks_read_their_spans_into_buffers_used_again_and_hand_out_entries_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, nowait: bool
) -> None:
    """The spans of a walk on the loop (``nowait``, served by the page cache) are read into a
    buffer that the next walk reads into again: the entries a walk hands out are bytes of their
    own, unchanged by later walks, walks at once on several threads each get a buffer, and a
    record longer than a span is read whole. A walk that may wait reads bytes of its own."""
    take_path(monkeypatch, entry_log, "_c_pick", path)
    monkeypatch.setattr(entry_log, "READ_RUN_BYTES", 16 * 1024)
    logger = EntryLogger(str(tmp_path))
    sizes = [(i * 53) % 2000 + 10 if i != 40 else 40_000 for i in range(300)]
    stored = [entry(7, i, size) for i, size in enumerate(sizes)]
    locations = logger.add_many(7, stored)
    logger.flush()

    def walk(first: int) -> list[bytes]:
        wanted = list(range(first, 300, 2))
        return logger.read_picked(locations[first], 7, wanted, 0, nowait=nowait)

    evens = walk(0)
    odds = walk(1)
    assert evens == stored[0::2] and odds == stored[1::2]
    assert all(type(got) is bytes for got in evens + odds)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        walks = list(pool.map(walk, [0, 1] * 4))
    assert walks == [stored[0::2], stored[1::2]] * 4
    assert evens == stored[0::2]  # as handed out before the buffer was read into again
    # only the walks on the loop (``nowait``) take buffers kept for the next walk
    assert 1 <= len(logger._span_buffers) <= 4 if nowait else not logger._span_buffers
    logger.close()


def test_a_walk_told_where_the_last_wanted_record_is_reads_no_further(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3/2/2 bookie's share of a run of a striped read: told where the last wanted entry's
    record is, the walk's spans end about there, not where they would end if every id up to it
    had a record in this log (a third further). A ``last`` in another log, or before the first
    record, changes nothing but the spans."""
    logger = EntryLogger(str(tmp_path))
    held = [i for i in range(1500) if i % 3 != 1]
    stored = {i: entry(7, i, 1024) for i in held}
    locations = dict(zip(held, logger.add_many(7, [stored[i] for i in held]), strict=True))
    logger.flush()
    reads = count_preads(monkeypatch)
    wanted = list(range(0, 600, 3))
    expected = [stored[i] for i in wanted]
    walked = split_location(locations[597])[1] - split_location(locations[0])[1]
    assert logger.read_picked(locations[0], 7, wanted, 0) == expected
    assert sum(reads) > walked * 1.3  # sized by ids: the share's records are 2/3 of them
    for last, bound in (
        (locations[597], walked + 2 * (1024 + 8)),
        (locations[0] - 1, None),  # before the first record: not a bound
        (entry_log.location_of(split_location(locations[0])[0] + 1, 0), None),  # another log
    ):
        reads.clear()
        assert logger.read_picked(locations[0], 7, wanted, 0, last=last) == expected
        if bound is not None:
            assert sum(reads) <= bound
    logger.close()


def test_synced_pages_of_the_active_log_are_dropped_from_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = FadviseRecorder()
    monkeypatch.setattr(os, "posix_fadvise", recorder)
    logger = EntryLogger(str(tmp_path), flush_every_bytes=1024 * 1024, remove_from_page_cache=True)
    entries = [entry(1, index, 100 * 1024 + index) for index in range(40)]
    locations = logger.add_many(1, entries)
    logger.flush()
    size = logger.file_size(logger.active_log_id)
    assert len(recorder.calls) > 1  # after the flushes along the way, not only at the end
    position = 0
    for offset, length, advice in recorder.calls:
        assert advice == os.POSIX_FADV_DONTNEED
        assert offset == position and length > 0
        position = offset + length
        assert position % 4096 == 0  # whole pages: the next record continues the last one
    assert size - 4096 < position <= size
    monkeypatch.undo()
    assert [logger.read(location, 1, index) for index, location in enumerate(locations)] == entries
    logger.close()


def test_pages_stay_in_the_page_cache_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = FadviseRecorder()
    monkeypatch.setattr(os, "posix_fadvise", recorder)
    logger = EntryLogger(str(tmp_path), flush_every_bytes=1024 * 1024)
    logger.add_many(1, [entry(1, index, 100 * 1024) for index in range(20)])
    logger.flush()
    logger.close()
    assert recorder.calls == []


def test_walks_going_on_forward_keep_the_log_read_ahead_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first walk at a place asks the kernel to read only its own bytes (WILLNEED); walks
    going on forward from it (also skipping a stretch, as a striped reader's do) keep
    WALK_ADVICE_BYTES asked for ahead of them, asking for more only once less than half is
    left; a walk that jumps back asks again for its own bytes only. The entries read are the
    same."""
    monkeypatch.setattr(entry_log, "WALK_ADVICE_BYTES", 64 * 1024)
    logger = EntryLogger(str(tmp_path))
    stored = [entry(7, i, 1000) for i in range(400)]  # 1,024-byte entries: 1,032-byte records
    locations = logger.add_many(7, stored)
    others = [entry(8, i, 1000) for i in range(20)]
    other_locations = logger.add_many(8, others)  # another ledger's, further on in the log
    logger.flush()
    recorder = FadviseRecorder()
    monkeypatch.setattr(os, "posix_fadvise", recorder)
    willneed = os.POSIX_FADV_WILLNEED

    def walk(first: int) -> None:
        wanted = list(range(first, first + 9, 3))
        assert logger.read_picked(locations[first], 7, wanted, 0) == [stored[i] for i in wanted]

    def offset(entry_id: int) -> int:
        return split_location(locations[entry_id])[1]

    def own_bytes(call: tuple[int, int, int], first: int) -> bool:
        """The advice covers the walk's records (entries first to first + 6), not much more."""
        at, length, advice = call
        walked = offset(first + 7) - offset(first)
        return at == offset(first) and walked <= length < 2 * walked and advice == willneed

    walk(100)  # a first walk: its own bytes
    assert len(recorder.calls) == 1 and own_bytes(recorder.calls[0], 100)
    walk(110)  # on forward, past what was asked: 64 KiB ahead of it
    assert recorder.calls[1] == (offset(110), 64 * 1024, willneed)
    # A reader of another ledger of the log, at another place: its own bytes, and the first
    # ledger's stretch is left as it was.
    assert logger.read_picked(other_locations[0], 8, [0, 1, 2], 0) == others[:3]
    assert recorder.calls[2][0] == split_location(other_locations[0])[1]
    del recorder.calls[2]
    walk(125)  # ~15 KB on: more than half still ahead, nothing asked
    assert len(recorder.calls) == 2
    walk(150)  # ~41 KB on: less than half ahead, what follows is asked for
    assert recorder.calls[2] == (offset(110) + 64 * 1024, offset(150) - offset(110), willneed)
    walk(210)  # the same again
    assert recorder.calls[3] == (offset(150) + 64 * 1024, offset(210) - offset(150), willneed)
    walk(290)  # a skip past what was asked for, by less than 64 KiB: on forward, from there
    assert offset(210) + 64 * 1024 < offset(290)
    assert recorder.calls[4] == (offset(290), 64 * 1024, willneed)
    walk(20)  # back: its own bytes only
    assert own_bytes(recorder.calls[5], 20)
    assert len(recorder.calls) == 6
    logger.close()
