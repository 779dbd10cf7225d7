"""The bookie journal: append records, group-commit them with one write + fsync, replay them.

Format (docs/formats/journal.md): files ``<16 hex digit id>.txn`` that start with a 16-byte
header (magic ``PBKJ``, u32 format version 2, u64 file id) followed by *groups*, one per group
commit::

    u32 length              bytes of the group after this 8-byte header
    u32 crc32c              CRC32C of those bytes
    u32 count               records in the group
    u8  type[count]         1 entry, 2 master key, 3 fence, 4 explicit LAC, 5 force
    u32 length[count]       body length of each record
    ...                     the bodies, back to back

All integers are big-endian. A record is durable once the fsync of its group returned and is
acknowledged only then, so a group is the unit of loss: at replay a short or failing group at the
tail of the newest file is a torn write and is cut off whole; any other damage is corruption and
replay stops with the file and offset. Framing a group once (one checksum, one header) instead of
every record keeps the journal's per-entry work to a list append.

Group commit, in a bookie (``Journal.write_on``): the records of one pass of the bookie's loop
are one group, written there with one ``writev``; a syncer thread (``_speedups.JournalSyncer``,
or ``ThreadSyncer``) runs one ``fdatasync`` after another, each covering every group written
before it began, and signals an eventfd the loop watches, which then answers those groups. Without
a loop, a journal thread takes every record queued while the previous fsync ran (up to
``buffered_writes_threshold`` bytes, waiting up to ``max_group_wait_s`` for more when the queue
runs empty), writes them with one ``writev`` and makes them durable with one ``fdatasync``. A
failed fsync fails every waiting record and every later one: the journal does not pretend the
data reached the disk. A write that runs out of space fails only its own group.

Preallocated space (``preallocate_bytes`` at a time, fallocated) is turned into written zeros a
little ahead of the records while the journal is idle and its syncs are small: a group synced over
zeros already on disk costs a third less time in fdatasync than one over fallocated space, and
a loaded journal's large syncs are not worth writing every byte twice.

The bodies of large records go to ``writev`` as they are, with the CRC computed piece by piece,
so a group costs no copy in this process; small ones are joined first (one copy, one CRC call,
instead of a call per record). Whole pages that are durable are dropped from the page cache a
megabyte at a time (BookKeeper's ``journalRemoveFromPageCache``): the journal is never read back
while the bookie runs, and a journal that keeps its pages makes the kernel find a fresh page for
every 4 KiB written, which costs more than the copy itself where memory is handed back to a
hypervisor (the append profile of a bookie spent a third of its CPU there).
"""

from __future__ import annotations

import collections
import enum
import errno
import logging
import os
import queue
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import crc32c

from bookkeeper_py.errors import BKError
from bookkeeper_py.metrics import Labels, Metrics, OpStats
from bookkeeper_py.speedups import native
from bookkeeper_py.storage.files import fsync_directory

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger(__name__)

MAGIC = b"PBKJ"
FORMAT_VERSION = 2
FILE_HEADER = struct.Struct(">4sIQ")
GROUP_HEADER = struct.Struct(">II")  # length, crc
_COUNT = struct.Struct(">I")
MAX_GROUP_SIZE = 1024 * 1024 * 1024
# A queue item that asks the journal thread for something and is never written (a record type
# below zero): start a new file.
_ROLL = -1
# A run of ENTRY records appended together (``append_entries``), queued as one item: (_ENTRIES,
# [bodies], token, False); written as one ENTRY record per body. No tuple per entry.
_ENTRIES = 1 << 8
_IOV_MAX = 1024  # pieces one writev takes (Linux's IOV_MAX)
# Groups whose records average at least this many bytes are written straight from the records'
# bodies; smaller ones are joined first, since a CRC call and an iovec per record cost more than
# copying a few hundred bytes.
_GATHER_MIN_RECORD = 4096
# Preallocated space is made of written zeros ahead of the records, a stretch at a time while the
# journal is idle: an fdatasync of records written over zeros already on disk (and in the
# page cache) costs ~105 us here, over fallocated (unwritten) space ~175 us, since every sync then
# also converts extents in the file system's journal. Zeros are kept up to _ZERO_AHEAD bytes past
# the records, _ZERO_CHUNK at a time (one write and one fdatasync of ~0.3 ms, taken only when no
# record waits).
_ZERO_CHUNK = 256 * 1024
_ZERO_AHEAD = 1024 * 1024
# ... but only while the syncs are not large: zeros ahead write every byte of the journal twice.
# What a sync over unwritten space costs more grows with the load: on ext4 its fdatasync also
# writes the extent tree's block and the inode, each a round trip of the disk after the data's
# (two more waits of the syncer thread), ~70 us on an idle disk but a third of a sync at half the
# 3/2/2 rate (~60 KiB a sync there: sync mean 0.62-0.82 -> 0.38-0.54 ms with the zeros, no more
# CPU). With syncs of more than this many bytes of records on average (a journal at full speed,
# ~300 KiB a sync) the zeros were a quarter of the disk's writes (3/2/2: ~4.6 against ~3.4 KB
# written per add) and ~7 % of the bookies' CPU, for syncs that each cover hundreds of records.
ZERO_AHEAD_MAX_SYNC_BYTES = 128 * 1024
_ZEROS = memoryview(bytes(_ZERO_CHUNK))
_PAGE = 4096  # page cache granularity for dropping written pages (a multiple of any page size)
# Synced pages are dropped once this many have gathered: one posix_fadvise costs ~10 µs (it may
# drain every CPU's LRU cache), too much to pay for every small group.
_DROP_EVERY = 1024 * 1024
# A journal written by the bookie's loop (``write_on``) syncs a group on the loop itself, rather
# than asking its syncer thread, when the journal is idle: that saves the two thread wake-ups of
# the hand-off and the answer's hop back (~25 us each here) on a lone writer's every add. Only
# when the journal has been idle longer than its last sync took (so a new group would not have
# overlapped a sync in progress: at full speed the loop keeps writing groups while the syncer
# syncs), while syncs take at most this long (a slow disk never blocks the loop), and only for a
# few records: many records arriving together mean a busy loop, whose work on the next ones
# should overlap the sync rather than wait for it.
INLINE_SYNC_LIMIT_S = 0.002
INLINE_MAX_RECORDS = 16


class RecordType(enum.IntEnum):
    ENTRY = 1
    MASTER_KEY = 2
    FENCE = 3
    EXPLICIT_LAC = 4
    FORCE = 5


_VALID_TYPES = frozenset(int(t) for t in RecordType)


@dataclass(frozen=True)
class JournalStats:
    """A journal's latencies, in BookKeeper's names (``bookie_journal_`` scope, labelled with
    its ``journalIndex``)."""

    sync: OpStats  # JOURNAL_SYNC: one fdatasync of the file
    add: OpStats  # JOURNAL_ADD_ENTRY: a record, from its append to its durability
    # JOURNAL_QUEUE_LATENCY: a record's wait before its group is written. Here the records of
    # a loop pass wait for the pass's end: each is counted with the wait of the pass's first
    # record. Not recorded by a journal thread (an engine without a bookie's loop).
    queue_latency: OpStats
    # JOURNAL_SYNC_TAKEN (ours): from a sync's end on the syncer thread to the loop taking its
    # answers: how late the bookie's loop is to the syncs it waits for (a busy loop, the GIL
    # held by another thread, a CPU taken). Recorded where a syncer hands syncs to the loop.
    sync_taken: OpStats

    @classmethod
    def of(cls, metrics: Metrics, labels: Labels = None) -> JournalStats:
        def stats(name: str, help_text: str) -> OpStats:
            return metrics.op_stats(f"bookie_journal_{name}", help_text, labels=labels)

        return cls(
            sync=stats("JOURNAL_SYNC", "journal fdatasync latency (s)"),
            add=stats("JOURNAL_ADD_ENTRY", "journal records, appended to durable (s)"),
            queue_latency=stats(
                "JOURNAL_QUEUE_LATENCY", "journal records, appended to written (the pass's first)"
            ),
            sync_taken=stats(
                "JOURNAL_SYNC_TAKEN", "journal syncs, ended to taken by the bookie's loop (s)"
            ),
        )


class JournalError(BKError):
    """The journal could not make records durable; the bookie must stop taking writes."""


class CorruptJournalError(JournalError):
    """A group in the middle of the journal is damaged."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(
            f"journal {path} is corrupt at offset {offset}: {reason}; the records after it "
            "cannot be trusted, so the bookie does not start. Move that file out of the journal "
            "directory (keep it for inspection) and start again: the bookie then treats its "
            "ledgers as unknown until it has repaired them from the other replicas"
        )
        self.path = path
        self.offset = offset


def journal_name(file_id: int) -> str:
    return f"{file_id:016x}.txn"


def list_journal_ids(directory: str) -> list[int]:
    ids = []
    for name in os.listdir(directory):
        stem, _, ext = name.partition(".")
        if ext == "txn" and len(stem) == 16:
            try:
                ids.append(int(stem, 16))
            except ValueError:
                continue
    return sorted(ids)


# -- reading ---------------------------------------------------------------------------------


def _parse_group(
    data: bytes, offset: int
) -> tuple[list[tuple[RecordType, bytes]], str | None, int]:
    """(records, problem, end of the group) of the group at ``offset``."""
    end = len(data)
    if end - offset < GROUP_HEADER.size:
        return [], "truncated group header", end
    length, crc = GROUP_HEADER.unpack_from(data, offset)
    start = offset + GROUP_HEADER.size
    group_end = start + length
    if length < _COUNT.size or length > MAX_GROUP_SIZE:
        return [], f"impossible group length {length}", end
    if group_end > end:
        return [], "truncated group", end
    payload = memoryview(data)[start:group_end]
    if crc32c.crc32c(payload) != crc:
        return [], "group checksum mismatch", group_end
    (count,) = _COUNT.unpack_from(payload, 0)
    lengths_at = _COUNT.size + count
    bodies_at = lengths_at + 4 * count
    if bodies_at > length:
        return [], f"a group of {length} bytes cannot hold {count} records", group_end
    lengths = struct.unpack_from(f">{count}I", payload, lengths_at)
    if bodies_at + sum(lengths) != length:
        return [], "record lengths do not add up to the group length", group_end
    records: list[tuple[RecordType, bytes]] = []
    position = start + bodies_at
    for record_type, body_length in zip(payload[_COUNT.size : lengths_at], lengths, strict=True):
        if record_type not in _VALID_TYPES:
            return [], f"unknown record type {record_type}", group_end
        records.append((RecordType(record_type), data[position : position + body_length]))
        position += body_length
    return records, None, group_end


def _torn_tail(data: bytes, offset: int, problem: str) -> bool:
    # Groups are written one after another, so a torn write leaves a damaged group with nothing
    # but zeros (preallocated space) or the end of the file after it. A damaged group followed by
    # more data is corruption.
    if problem in ("truncated group header", "truncated group"):
        return True
    length = struct.unpack_from(">I", data, offset)[0]
    end = offset + GROUP_HEADER.size + length
    return end >= len(data) or not data[end:].strip(b"\0")


TailCut = Callable[[str, int, str], None]  # (path, offset, problem) of a tail cut off


def scan(
    path: str, *, is_last: bool, on_cut: TailCut | None = None
) -> Iterator[tuple[RecordType, bytes, int]]:
    """Yields (type, body, offset just past its group) of every record of every valid group; cuts
    a torn tail off the newest file (telling ``on_cut``) and raises ``CorruptJournalError`` for
    any other damage."""
    with open(path, "r+b" if is_last else "rb") as handle:
        data = handle.read()
        if len(data) < FILE_HEADER.size:
            if is_last:
                handle.truncate(0)
                return
            raise CorruptJournalError(path, 0, "file shorter than its header")
        magic, version, _ = FILE_HEADER.unpack_from(data, 0)
        if magic != MAGIC or version != FORMAT_VERSION:
            raise CorruptJournalError(path, 0, f"bad magic {magic!r} or version {version}")
        offset = FILE_HEADER.size
        while offset < len(data):
            if not data[offset : offset + GROUP_HEADER.size].strip(b"\0") and not data[
                offset:
            ].strip(b"\0"):
                return  # preallocated space: the end of the data in this file
            records, problem, group_end = _parse_group(data, offset)
            if problem is not None:
                if is_last and _torn_tail(data, offset, problem):
                    log.warning(
                        "journal %s: cutting torn tail at offset %d (%s)", path, offset, problem
                    )
                    handle.truncate(offset)
                    handle.flush()
                    os.fsync(handle.fileno())
                    if on_cut is not None:
                        on_cut(path, offset, problem)
                    return
                raise CorruptJournalError(path, offset, problem)
            for record_type, body in records:
                yield record_type, body, group_end
            offset = group_end


def replay(
    directory: str, mark: tuple[int, int] | None, on_cut: TailCut | None = None
) -> Iterator[tuple[RecordType, bytes, int, int]]:
    """Yields (type, body, file id, offset just past its group) of every record in the groups at
    or after ``mark`` (every record when there is none), in order. Marks fall on group ends.
    ``on_cut`` hears of a damaged tail cut off, and of journal files missing after the mark
    (offset -1): either way, records this bookie may have acknowledged are gone."""
    ids = list_journal_ids(directory)
    start_file, start_offset = mark if mark is not None else (-1, 0)
    if on_cut is not None and mark is not None:
        # A checkpoint never deletes the mark's file, nor any later one.
        wanted = set(range(start_file, max(ids[-1] if ids else start_file, start_file) + 1))
        for missing in sorted(wanted - set(ids)):
            on_cut(os.path.join(directory, journal_name(missing)), -1, "file missing")
    for position, file_id in enumerate(ids):
        if file_id < start_file:
            continue
        path = os.path.join(directory, journal_name(file_id))
        last = position == len(ids) - 1
        for record_type, body, group_end in scan(path, is_last=last, on_cut=on_cut):
            if file_id == start_file and group_end <= start_offset:
                continue
            yield record_type, body, file_id, group_end


# -- writing ---------------------------------------------------------------------------------


def _group_pieces(batch: list[_Record], gather_min: int) -> tuple[list[bytes], list[Any]]:
    """The bytes of one group (header included), as pieces to write in order (the bodies
    joined when they average under ``gather_min`` bytes), and the records' tokens that are not
    None; ``native.journal_group`` gives the same bytes."""
    types: list[int] = []
    bodies: list[bytes] = []
    for record in batch:
        if record[0] == _ENTRIES:
            types += [RecordType.ENTRY] * len(record[1])
            bodies += record[1]
        else:
            types.append(record[0])
            bodies.append(record[1])
    count = len(bodies)
    lengths = list(map(len, bodies))
    size = sum(lengths)
    tokens = [record[2] for record in batch if record[2] is not None]
    prefix = b"".join((_COUNT.pack(count), bytes(types), struct.pack(f">{count}I", *lengths)))
    if size < gather_min * count:
        payload = b"".join([prefix, *bodies])
        return [GROUP_HEADER.pack(len(payload), crc32c.crc32c(payload)), payload], tokens
    crc = crc32c.crc32c(prefix)
    for body in bodies:
        crc = crc32c.crc32c(body, crc)
    return [GROUP_HEADER.pack(len(prefix) + size, crc), prefix, *bodies], tokens


def _write_all(fd: int, pieces: list[bytes], written: int = 0) -> None:
    """Writes ``pieces`` in order with as few ``writev`` calls as IOV_MAX allows, going on after
    a short write from where it stopped; ``written``: the bytes of them written already (by a
    first ``writev`` that fell short)."""
    views: list[bytes | memoryview] = list(pieces)
    start = 0
    while written:
        if written < len(views[start]):
            views[start] = memoryview(views[start])[written:]
            break
        written -= len(views[start])
        start += 1
    while start < len(views):
        batch = views[start : start + _IOV_MAX]
        written = os.writev(fd, batch)
        if written <= 0:
            raise OSError(errno.EIO, "writev wrote nothing")
        for piece in batch:
            if written < len(piece):
                views[start] = memoryview(piece)[written:]
                break
            written -= len(piece)
            start += 1


# Called (on the loop that writes the journal, or on its journal thread) with the tokens of a
# durable group, or with the tokens of failed records and the error. Records appended with token
# None are not reported.
# Background bytes (re-replication copies) a group may carry beside foreground records.
BACKGROUND_WITH_FOREGROUND = 128 * 1024
# A queued record: (record type, body, token, background); or a run of ENTRY records (type
# _ENTRIES, a list of bodies).
_Record = tuple[int, Any, Any, bool]


def _records(batch: list[_Record]) -> int:
    """How many records ``batch`` holds (a run counts its entries)."""
    return sum(len(record[1]) if record[0] == _ENTRIES else 1 for record in batch)


def _record_bytes(record: _Record) -> int:
    return sum(map(len, record[1])) if record[0] == _ENTRIES else len(record[1])


Callback = Callable[[list[Any], Exception | None], None]


class ThreadSyncer:
    """The pure-Python ``JournalSyncer`` (the C one is ``_speedups.JournalSyncer``): a thread
    that ``fdatasync``s a journal file on request and then writes to an eventfd that the loop
    writing the file watches. It takes the GIL around each sync, which the C one never does."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._cond = threading.Condition()
        self._requested = self._synced = 0
        self._busy = self._stop = False
        self._error = 0
        self._times: list[float] = []
        self._last_end = 0.0
        self.eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._thread: threading.Thread | None = threading.Thread(
            target=self._run, name="journal-sync", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        cond = self._cond
        with cond:
            while True:
                while not self._stop and self._requested == self._synced:
                    cond.wait()
                if self._requested == self._synced:
                    return  # stopping with nothing asked for
                target, fd, failed = self._requested, self._fd, self._error != 0
                self._busy = True
                cond.release()
                error = 0
                started = time.monotonic()
                try:
                    if not failed:
                        os.fdatasync(fd)
                except OSError as failure:
                    error = failure.errno or errno.EIO
                ended = time.monotonic()
                cond.acquire()
                self._busy = False
                if error and not self._error:
                    self._error = error
                self._synced = target
                self._times.append(ended - started)
                self._last_end = ended
                cond.notify_all()
                os.eventfd_write(self.eventfd, 1)

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self._busy and self._requested == self._synced

    def request(self, seq: int) -> None:
        with self._cond:
            if self._thread is None:
                raise ValueError("the journal syncer is closed")
            if seq <= self._requested:
                raise ValueError("sync requests must have increasing numbers")
            self._requested = seq
            self._cond.notify_all()

    def take(self) -> tuple[int, int, tuple[float, ...], float]:
        try:
            os.eventfd_read(self.eventfd)
        except BlockingIOError:
            pass
        with self._cond:
            times, self._times = tuple(self._times), []
            return self._synced, self._error, times, self._last_end

    def _wait_idle(self) -> None:
        while self._busy or self._requested != self._synced:
            self._cond.wait()

    def _check_open(self) -> None:
        if self._thread is None:
            raise ValueError("the journal syncer is closed")

    def drain(self) -> None:
        self._check_open()
        with self._cond:
            self._wait_idle()

    def set_fd(self, fd: int) -> None:
        self._check_open()
        with self._cond:
            self._wait_idle()
            self._fd = fd

    def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        thread.join()
        os.close(self.eventfd)
        self.eventfd = -1


def make_syncer(fd: int) -> Any:
    """The C syncer where the speedups are built, the pure-Python one otherwise."""
    if native is not None:
        return native.JournalSyncer(fd)
    return ThreadSyncer(fd)


class Journal:
    """Group-committing journal in one directory.

    Written by its own thread, or (``write_on``) by the bookie's loop, with a syncer thread that
    only syncs: the loop writes each loop pass's records as one group into the page cache and
    asks the syncer to make them durable; records written while a sync runs are covered by the
    next one. The loop never waits for a sync (except an idle journal's, see
    ``INLINE_SYNC_LIMIT_S``), and the syncer (in C) never waits for the GIL: a group costs one
    wake-up of each thread, where a Python journal thread took and gave the GIL back three
    times."""

    def __init__(
        self,
        directory: str,
        on_synced: Callback,
        *,
        max_file_size: int = 2 * 1024**3,
        buffered_writes_threshold: int = 512 * 1024,
        sync_data: bool = True,
        preallocate_bytes: int = 16 * 1024 * 1024,
        max_group_wait_s: float = 0.0,
        on_rolled: Callable[[], None] | None = None,
        remove_from_page_cache: bool = True,
        stats: JournalStats | None = None,
    ) -> None:
        self.directory = directory
        self._on_synced = on_synced
        self._max_file_size = max_file_size
        self._on_rolled = on_rolled  # told (on the writing thread) after a roll by size
        self._threshold = buffered_writes_threshold
        self._sync_data = sync_data
        self._preallocate = preallocate_bytes
        # journalMaxGroupWaitMSec: how long a group may wait for more records once the queue is
        # empty. 0 (our default) writes as soon as the queue is empty: records that arrive while
        # an fsync runs are grouped anyway, and waiting would only add latency to a lone writer.
        self._max_group_wait_s = max_group_wait_s
        self._sync_stats = stats.sync if stats is not None else None
        # JOURNAL_ADD_ENTRY: each record's time from its append to its durability
        self._add_stats = stats.add if stats is not None else None
        self._queue_stats = stats.queue_latency if stats is not None else None
        self._taken_stats = stats.sync_taken if stats is not None else None
        self._allocated = 0  # bytes of the current file that are allocated (journalPreAllocSizeMB)
        # Bytes of the current file that hold records or written zeros (below _allocated).
        self._zeroed = 0
        self._zero_ahead = sync_data  # without fsyncs there is nothing for the zeros to save
        # journalRemoveFromPageCache: drop durable pages of the file; only with fsyncs (the pages
        # are clean then) and where the system has posix_fadvise.
        self._drop_pages = remove_from_page_cache and sync_data and hasattr(os, "posix_fadvise")
        self._dropped = 0  # bytes at the start of the current file dropped from the page cache
        self._last_sync_s = 0.0  # how long the last group's sync took
        # Bytes of records a sync covers, on average (moving, over the last ~8 syncs), and the
        # offset of the current file up to which syncs have covered them: zeros ahead are
        # written only while syncs are small (ZERO_AHEAD_MAX_SYNC_BYTES).
        self._sync_bytes = 0.0
        self._synced_end = 0
        self._idle_since = 0.0  # time.monotonic() when the last sync ended
        # Why the journal takes no more records (a write or sync failed), if it does not.
        self.failure: Exception | None = None
        self._fd = -1
        self._file_id = -1
        self._size = 0
        # (file id, offset) just past the last group written: a LastLogMark candidate.
        self.position: tuple[int, int] = (-1, 0)
        # Set while the last write ran out of space; cleared by the next write that fits.
        self.out_of_space = False
        # Background records not written yet (taken off the queue by the journal thread, or
        # appended on the loop).
        self._background: collections.deque[_Record] = collections.deque()
        # -- written by the journal thread --
        # Records appended together (one item, so one wake-up of the journal thread for a batch
        # of adds), or None: stop.
        self._queue: queue.SimpleQueue[list[_Record] | None] = queue.SimpleQueue()
        # Records appended and records taken off the queue, each written by one thread (the
        # appending one, the journal thread): their difference is the queue's length.
        self._appended = 0
        self._taken = 0
        self._thread: threading.Thread | None = None
        # -- written by the loop (write_on) --
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inline_ok: Callable[[], bool] = lambda: True
        self._call_on_loop: Callable[[Callable[[], Any]], Any] = lambda call: call()
        self._syncer: Any = None  # JournalSyncer or ThreadSyncer, once open
        self._writing = False  # open and written by the loop
        self._gather: list[_Record] = []  # foreground records of this loop pass
        self._gathered_records = 0  # the records they hold (a run of entries counts each)
        self._gathered_bytes = 0  # their bytes, counted only with journalMaxGroupWaitMSec
        self._flush_handle: asyncio.Handle | asyncio.TimerHandle | None = None
        self._gathered_at = 0.0  # time.monotonic() when this pass's first record came
        self._flush_timed = False  # the flush waits for journalMaxGroupWaitMSec
        # Groups written and not yet known durable: (sync number, tokens, records, end offset,
        # time.monotonic() their first record was appended).
        self._unsynced: collections.deque[tuple[int, list[Any], int, int, float]] = (
            collections.deque()
        )
        self._unsynced_records = 0
        self._sync_seq = 0  # the last sync number asked for
        self._background_seq = 0  # the sync that covers the last background records written

    def write_on(
        self,
        loop: asyncio.AbstractEventLoop,
        inline_ok: Callable[[], bool],
        call_on_loop: Callable[[Callable[[], Any]], Any],
    ) -> None:
        """Before ``open``: the journal is written by ``loop``'s thread, the only one that
        appends from then on (see the class). ``inline_ok()`` says whether an idle journal's
        group may also be synced there (see ``INLINE_SYNC_LIMIT_S``); ``call_on_loop(call)``
        runs ``call`` there from any thread and waits for it (``loop.call_on``); ``on_synced``
        is then called on the loop."""
        self._loop = loop
        self._inline_ok = inline_ok
        self._call_on_loop = call_on_loop

    def open(self, next_file_id: int) -> None:
        """Starts a new journal file and the writer (or syncer) thread; from any thread.

        A file never takes more than 30 % of its disk (journalMaxSizeMB, whichever is smaller):
        on a small journal disk, a file as large as the disk could never be deleted, since a
        checkpoint frees only the files before the current one."""
        stats = os.statvfs(self.directory)
        share = max(stats.f_blocks * stats.f_frsize * 3 // 10, 1024 * 1024)
        self._max_file_size = min(self._max_file_size, share)
        self._roll(next_file_id)
        loop = self._loop
        if loop is None:
            self._thread = threading.Thread(target=self._run, name="journal", daemon=True)
            self._thread.start()
            return
        if self._sync_data:
            self._syncer = make_syncer(self._fd)
            self._call_on_loop(lambda: loop.add_reader(self._syncer.eventfd, self._take_synced))
        self._writing = True

    def _roll(self, file_id: int) -> None:
        """Starts file ``file_id``; the current file stays in use if the new one cannot be made.
        Every group asked to be synced is synced first."""
        path = os.path.join(self.directory, journal_name(file_id))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, FILE_HEADER.pack(MAGIC, FORMAT_VERSION, file_id))
            os.fsync(fd)
            fsync_directory(self.directory)
        except OSError:
            os.close(fd)
            os.unlink(path)
            raise
        if self._syncer is not None:
            self._syncer.set_fd(fd)  # after the syncs asked for (of the old file)
            self._take_synced(idle_work=False)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._file_id = file_id
        self._size = self._allocated = self._zeroed = self._synced_end = FILE_HEADER.size
        self._dropped = 0
        self.position = (file_id, FILE_HEADER.size)

    @property
    def queued(self) -> int:
        """Records waiting to be written or synced (read from any thread)."""
        return (
            max(self._appended - self._taken, 0)
            + len(self._background)
            + self._gathered_records
            + self._unsynced_records
        )

    @property
    def unsynced_records(self) -> int:
        """Records written and waiting for their sync (BookKeeper's force-write queue)."""
        return self._unsynced_records

    @property
    def idle_past_a_sync(self) -> bool:
        """Whether the journal has been idle longer than its last sync took: a group written
        now would not have overlapped a sync in progress (see ``INLINE_SYNC_LIMIT_S``)."""
        return time.monotonic() - self._idle_since >= self._last_sync_s

    def append(
        self, record_type: RecordType, body: bytes, token: Any, background: bool = False
    ) -> None:
        """Queues a record; ``on_synced`` reports ``token`` once the record is durable (or
        failed). A ``background`` record (a re-replication copy) gives way to the others: a
        group holds every waiting foreground record and at most ``BACKGROUND_WITH_FOREGROUND``
        bytes of background ones (one record at least), so that a live writer's fsync does not
        wait for megabytes of copies queued before it."""
        record = (record_type, body, token, background)
        if self._writing:
            if background:
                self._background.append(record)
            else:
                self._gather.append(record)
                self._gathered_records += 1
                if self._max_group_wait_s > 0:
                    self._gathered_bytes += len(body)
            self._flush_soon()
            return
        self._appended += 1
        self._queue.put([record])

    def append_entries(self, bodies: list[bytes], token: Any) -> None:
        """Queues foreground ENTRY records that arrived together as one item: the journal thread
        is woken once for them, not once per record (each wake-up makes it contend for the GIL
        with the thread still appending). ``token`` is reported with the last record, which is
        durable only once every record before it is."""
        if not bodies:
            return
        run: _Record = (_ENTRIES, bodies, token, False)  # one item, however many records
        if self._writing:
            self._gather.append(run)
            self._gathered_records += len(bodies)
            if self._max_group_wait_s > 0:
                self._gathered_bytes += sum(map(len, bodies))
            self._flush_soon()
            return
        self._appended += len(bodies)
        self._queue.put([run])

    # -- written by the loop -------------------------------------------------------------------

    def _flush_soon(self) -> None:
        """The records of this loop pass are written at its end, as one group (with
        journalMaxGroupWaitMSec, once that long has passed or the threshold is reached)."""
        loop = self._loop
        assert loop is not None
        waits = self._max_group_wait_s > 0 and self._gathered_bytes < self._threshold
        if self._flush_handle is not None:
            if waits or not self._flush_timed:
                return  # due already
            self._flush_handle.cancel()  # the threshold is reached: now
        if self._flush_handle is None:
            self._gathered_at = time.monotonic()
        if waits:
            self._flush_handle = loop.call_later(self._max_group_wait_s, self._flush)
        else:
            self._flush_handle = loop.call_soon(self._flush)
        self._flush_timed = waits

    def _flush(self, everything: bool = False) -> None:
        """Writes the gathered records as one group and has it synced; background records go
        along up to ``BACKGROUND_WITH_FOREGROUND`` bytes once the last ones written are durable
        (``everything``: all of them, at close)."""
        self._flush_handle = None
        since = self._gathered_at
        records = self._gathered_records
        if self._queue_stats is not None and records:
            self._queue_stats.successes(time.monotonic() - since, records)
        if self.failure is not None:
            everything = True  # nothing more is written: every record waiting fails now
        batch, self._gather = self._gather, []
        self._gathered_bytes = self._gathered_records = 0
        carries = bool(self._background) and (
            everything or self._background_seq <= self._synced_seq()
        )
        if carries:
            size = sum(map(_record_bytes, batch))
            limit = size + BACKGROUND_WITH_FOREGROUND if batch else self._threshold
            foreground = len(batch)
            batch = self._with_background(batch, size, 1 << 62 if everything else limit)
            records += len(batch) - foreground  # background records are single
        if not batch:
            return
        tokens = self._write_group(batch, records)
        if tokens is None:
            return  # failed, and said so
        if self._syncer is None:  # journalSyncData=false: written is as far as it goes
            self._done(tokens, records, since=since)
            if self._background and self._writing:
                self._flush_soon()
            return
        if (
            not carries
            and not self._unsynced
            and records <= INLINE_MAX_RECORDS
            and self._last_sync_s <= INLINE_SYNC_LIMIT_S
            and self.idle_past_a_sync
            and self._inline_ok()
        ):
            self._sync_here(tokens, records, since)
            return
        self._ask_sync(tokens, records, since)
        if carries:  # the next background records wait for these to be durable
            self._background_seq = self._sync_seq

    def _synced_seq(self) -> int:
        """The last sync number whose groups are known durable."""
        return self._unsynced[0][0] - 1 if self._unsynced else self._sync_seq

    def _ask_sync(self, tokens: list[Any], records: int, since: float) -> None:
        self._sync_seq += 1
        self._unsynced.append((self._sync_seq, tokens, records, self._size, since))
        self._unsynced_records += records
        self._syncer.request(self._sync_seq)

    def _sync_here(self, tokens: list[Any], records: int, since: float) -> None:
        """An idle journal's group, synced on the loop (see ``INLINE_SYNC_LIMIT_S``)."""
        started = time.monotonic()
        try:
            os.fdatasync(self._fd)
        except OSError as error:
            self._fail(error)
            self._on_synced(tokens, self.failure)
            return
        self._idle_since = time.monotonic()
        self._last_sync_s = self._idle_since - started
        if self._sync_stats is not None:
            self._sync_stats.success(self._last_sync_s)
        self._count_synced(self._size, 1)
        self._done(tokens, records, self._size, since)

    def _count_synced(self, end: int, syncs: int) -> None:
        """``syncs`` fdatasyncs made the records of the current file durable up to ``end``:
        the moving average of bytes per sync takes them in."""
        if end > self._synced_end and syncs > 0:
            per_sync = (end - self._synced_end) / syncs
            self._sync_bytes += (per_sync - self._sync_bytes) / 8
        self._synced_end = max(self._synced_end, end)

    def _done(
        self, tokens: list[Any], records: int, synced_end: int = 0, since: float | None = None
    ) -> None:
        """A group's records are durable (appended ``since``, when known): reported."""
        if self._drop_pages and synced_end:
            self._drop_durable_pages(synced_end)
        if self._add_stats is not None and since is not None:
            self._add_stats.successes(time.monotonic() - since, records)
        self._on_synced(tokens, None)

    def _take_synced(self, idle_work: bool = True) -> None:
        """The syncer finished syncs (its eventfd is readable, or it was drained): the groups
        they cover are durable (or failed); then (``idle_work``) waiting background records are
        written, or, if nothing waits, zeros ahead."""
        synced, error, times, last_end = self._syncer.take()
        now = time.monotonic()  # the syncers' clock too (CLOCK_MONOTONIC)
        if self._sync_stats is not None:
            for seconds in times:
                self._sync_stats.success(seconds)
        if times:
            self._last_sync_s = times[-1]
            self._idle_since = last_end
            if self._taken_stats is not None:
                self._taken_stats.success(max(0.0, now - last_end))
        tokens: list[Any] = []
        records = end = zeros = 0
        unsynced = self._unsynced
        while unsynced and unsynced[0][0] <= synced:
            _, group_tokens, group_records, end, since = unsynced.popleft()
            tokens += group_tokens
            records += group_records
            zeros += not group_records  # a sync asked for zeros ahead only
            if self._add_stats is not None and group_records and not error:
                self._add_stats.successes(now - since, group_records)
        self._unsynced_records -= records
        if records and not error:
            self._count_synced(end, max(1, len(times) - zeros))
        if error:
            self._fail(OSError(error, os.strerror(error)))
            self._on_synced(tokens, self.failure)
        elif tokens or records:
            self._done(tokens, records, end)
        if idle_work and self._writing and self._flush_handle is None:
            if self._background:
                self._flush_soon()  # the next copies (or, after a failure, their failure)
            elif not unsynced and not self._gather and self.failure is None:
                self._zeros_ahead_on_loop()

    def _fail(self, error: OSError) -> None:
        if self.failure is None:
            self.failure = JournalError(
                f"journal {journal_name(self._file_id)} in {self.directory}: write or fsync "
                f"failed: {error}; the bookie takes no more writes on this journal"
            )
            log.error("%s", self.failure)

    def _zeros_ahead_on_loop(self) -> None:
        """An idle journal written by the loop writes the next stretch of zeros ahead (see
        ``_write_zeros_ahead``) and has the syncer sync them."""
        if self._write_zeros_ahead(sync=False):
            self._ask_sync([], 0, time.monotonic())

    def _roll_on_loop(self) -> None:
        if not self._writing:
            return  # closed since the roll was asked for
        if self.failure is None and self._size > FILE_HEADER.size:
            try:
                self._roll(self._file_id + 1)
            except OSError as error:
                log.warning("journal: cannot start a new file to free space: %s", error)
        if self._background and self._flush_handle is None:
            self._flush_soon()  # the roll took the syncer's signal these were waiting for

    # -- written by the journal thread ---------------------------------------------------------

    def _run(self) -> None:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        background = self._background
        threshold = self._threshold
        stop = False
        while not stop:
            batch: list[_Record] = []
            size = 0
            deadline = -1.0
            # Foreground records up to the threshold: everything queued now, and with
            # journalMaxGroupWaitMSec more until the deadline; background ones wait aside. An
            # item (the records appended together) is never split.
            while size < threshold:
                try:
                    items = get() if not batch and not background else get_nowait()
                except queue.Empty:
                    if deadline < 0:
                        deadline = time.monotonic() + self._max_group_wait_s
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        items = get(timeout=remaining)
                    except queue.Empty:
                        break
                if items is None:
                    stop = True  # after writing what was queued
                    break
                if items[0][0] >= 0:  # a request to the thread is no appended record
                    self._taken += _records(items)
                if items[0][3]:
                    background.extend(items)
                else:
                    batch.extend(items)
                    for record in items:
                        size += _record_bytes(record)
            if not batch and not background:
                break  # stopping with nothing queued
            limit = size + BACKGROUND_WITH_FOREGROUND if batch else threshold
            self._commit(self._with_background(batch, size, limit))
            if not background and self._queue.empty():
                self._write_zeros_ahead(sync=True)
        while background:  # stopping: the copies still waiting, in groups
            self._commit(self._with_background([], 0, threshold))

    def _with_background(self, batch: list[_Record], size: int, limit: int) -> list[_Record]:
        """``batch`` (``size`` bytes) with waiting background records added up to ``limit``
        bytes, one at least if any waits."""
        background = self._background
        taken = 0
        while background and (taken == 0 or size < limit):
            record = background.popleft()
            batch.append(record)
            size += len(record[1])
            taken += 1
        return batch

    def request_roll(self) -> None:
        """Asks for a new file (if the current one holds any record), so that the next
        checkpoint can delete the current one and give its space back; from any thread."""
        if self._writing:
            assert self._loop is not None
            try:
                self._loop.call_soon_threadsafe(self._roll_on_loop)
            except RuntimeError:
                pass  # the loop is closed: so is the journal
            return
        self._queue.put([(_ROLL, b"", None, False)])

    def _commit(self, batch: list[_Record]) -> None:
        """The journal thread's group: written, synced, its tokens reported."""
        if any(record[0] < 0 for record in batch):
            rolls = any(record[0] == _ROLL for record in batch)
            batch = [item for item in batch if item[0] >= 0]
            if rolls and self.failure is None and self._size > FILE_HEADER.size:
                try:
                    self._roll(self._file_id + 1)
                except OSError as error:
                    log.warning("journal: cannot start a new file to free space: %s", error)
            if not batch:
                return
        since = time.monotonic()
        records = _records(batch)
        tokens = self._write_group(batch, records)
        if tokens is None:
            return
        if self._sync_data:
            self._sync_here(tokens, records, since)
        else:
            self._done(tokens, records, since=since)

    def _write_group(self, batch: list[_Record], records: int) -> list[Any] | None:
        """Writes ``batch`` (``records`` records) as one group (rolling or growing the file
        first if need be) and returns its tokens; None if it failed (its tokens then reported
        failed)."""
        made = None if native is None else native.journal_group(batch, _GATHER_MIN_RECORD)
        pieces, tokens = made if made is not None else _group_pieces(batch, _GATHER_MIN_RECORD)
        if self.failure is not None:
            self._on_synced(tokens, self.failure)
            return None
        try:
            if self._size >= self._max_file_size:
                try:
                    self._roll(self._file_id + 1)
                    if self._on_rolled is not None:
                        self._on_rolled()  # a checkpoint now frees the file just closed
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
                    self.out_of_space = True
                    log.error(
                        "journal: disk full, cannot start a new file; failing %d records",
                        records,
                    )
                    self._on_synced(tokens, JournalError(f"journal disk full: {error}"))
                    return None
                if self.failure is not None:  # the roll took a failed sync's report
                    self._on_synced(tokens, self.failure)
                    return None
            total = sum(map(len, pieces))
            try:
                if self._preallocate > 0 and self._size + total > self._allocated:
                    # Grow the file ahead of the writes so that a group's fdatasync need not
                    # also record a new file size. Replay stops at the zeros that follow.
                    # Never past the roll size: preallocation must not cost more than a full file.
                    # Nor past 90 % of the disk: on a small journal disk a whole preallocation
                    # would fail (or fill the disk) long before the records do.
                    stats = os.fstatvfs(self._fd)
                    room = (stats.f_bavail - stats.f_blocks // 10) * stats.f_frsize
                    grow = max(
                        min(self._preallocate, self._max_file_size - self._allocated, room), total
                    )
                    try:
                        os.posix_fallocate(self._fd, self._allocated, grow)
                    except OSError as error:
                        if error.errno != errno.ENOSPC or grow == total:
                            raise
                        grow = total  # what the records need, no more
                        os.posix_fallocate(self._fd, self._allocated, grow)
                    self._allocated += grow
                # One writev where it can take the group whole (nearly always), else _write_all.
                written = os.writev(self._fd, pieces) if len(pieces) <= _IOV_MAX else 0
                if written != total:
                    _write_all(self._fd, pieces, written)
            except OSError as error:
                if error.errno != errno.ENOSPC or not self._cut_partial_group():
                    raise
                # Out of space while writing: the partial group is cut off again and nothing in it
                # was acknowledged, so the journal stays usable once space is freed.
                self.out_of_space = True
                log.error(
                    "journal %s: disk full; failing %d records",
                    journal_name(self._file_id),
                    records,
                )
                self._on_synced(tokens, JournalError(f"journal disk full: {error}"))
                return None
        except OSError as error:
            self._fail(error)
            self._on_synced(tokens, self.failure)
            return None
        self._size += total
        self.position = (self._file_id, self._size)
        self.out_of_space = False
        return tokens

    def _write_zeros_ahead(self, sync: bool) -> bool:
        """Idle time: turns the next stretch of preallocated space into zeros on disk (one
        ``_ZERO_CHUNK`` write, and its fdatasync here if ``sync``), up to ``_ZERO_AHEAD`` bytes
        past the records, so that the records written there later sync faster. Never touches a
        byte at or before the end of the records, and only one thread writes the file, so the
        zeros cannot land on a record. A failure costs only the speed-up, for the space
        allocated so far. True if zeros were written."""
        if (
            not self._zero_ahead
            or self.failure is not None
            or self._sync_bytes > ZERO_AHEAD_MAX_SYNC_BYTES
        ):
            return False
        start = max(self._zeroed, self._size)
        end = min(start + _ZERO_CHUNK, self._allocated)
        if start - self._size >= _ZERO_AHEAD or end <= start:
            return False
        try:
            os.pwrite(self._fd, _ZEROS[: end - start], start)
            if sync:
                os.fdatasync(self._fd)
        except OSError as error:
            log.warning(
                "journal %s: could not write zeros ahead of the records (%s); the next groups "
                "are synced over unwritten space, only slower",
                journal_name(self._file_id),
                error,
            )
            self._zeroed = self._allocated
            return False
        self._zeroed = end
        return True

    def _drop_durable_pages(self, synced_end: int) -> None:
        """Drops the whole pages synced since the last drop (up to ``synced_end``) from the page
        cache, once there are ``_DROP_EVERY`` bytes of them (the page that the next group
        continues stays, or the kernel would read it back first)."""
        end = synced_end - synced_end % _PAGE
        if end - self._dropped < _DROP_EVERY:
            return
        try:
            os.posix_fadvise(self._fd, self._dropped, end - self._dropped, os.POSIX_FADV_DONTNEED)
        except OSError as error:  # advice only: the data is durable either way
            log.debug("journal %s: posix_fadvise failed: %s", journal_name(self._file_id), error)
        self._dropped = end

    def _cut_partial_group(self) -> bool:
        """Truncates the file back to the end of the last whole group; False if even that fails."""
        try:
            os.ftruncate(self._fd, self._size)
            os.lseek(self._fd, self._size, os.SEEK_SET)
            self._allocated = self._zeroed = self._size
        except OSError:
            log.exception("journal %s: cannot cut a partial group", journal_name(self._file_id))
            return False
        return True

    def delete_before(self, file_id: int) -> list[int]:
        """Deletes the journal files older than ``file_id`` (never the one being written)."""
        deleted = [
            old
            for old in list_journal_ids(self.directory)
            if old < file_id and old != self._file_id
        ]
        for old in deleted:
            os.unlink(os.path.join(self.directory, journal_name(old)))
        if deleted:
            fsync_directory(self.directory)
        return deleted

    def _close_on_loop(self) -> None:
        """Writes and syncs every record gathered, then stops the syncer."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        else:
            self._gathered_at = time.monotonic()
        self._flush(everything=True)
        self._writing = False
        syncer = self._syncer
        if syncer is not None:
            syncer.drain()
            self._take_synced(idle_work=False)
            self._syncer = None
            assert self._loop is not None
            if not self._loop.is_closed():
                self._loop.remove_reader(syncer.eventfd)
            syncer.close()

    def close(self) -> None:
        """Writes and syncs what is queued, then stops the thread; from any thread."""
        if self._writing:
            self._call_on_loop(self._close_on_loop)
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._fd >= 0:
            if self._allocated > self._size:
                try:
                    os.ftruncate(self._fd, self._size)  # give back the preallocated space
                except OSError:
                    log.warning(
                        "journal %s: could not trim preallocated space", journal_name(self._file_id)
                    )
            os.close(self._fd)
            self._fd = -1
