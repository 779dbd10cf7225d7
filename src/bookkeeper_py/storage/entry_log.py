"""Entry logs: the entries of all ledgers, interleaved in one active file, written sequentially.

Format (docs/formats/entry-log.md): files ``<16 hex digit id>.log`` starting with a 1 KiB header::

    0   4  magic "PBKL"
    4   4  format version (1)
    8   8  log id
    16  8  offset of the ledgers map (0 while the log is active)
    24  4  number of ledgers in the map
    28  4  CRC32C of bytes 0-27
    ..     zero up to 1024

then records ``[u32 length][u32 crc32c(body)][body]`` where the body is the packaged entry (its
first 16 bytes are ledgerId and entryId). An entry's location is ``(log id << 32) | offset`` of
its record. When a log is rolled, its ledgers map is appended as one record whose body is
``ledgerId -1 (8), entry -2 (8), count (4), then (ledgerId, bytes) pairs of 16 bytes`` and the
header is rewritten to point at it, so garbage collection need not scan the log.

A log is only appended to by the process that created it; after a restart a new log is started,
so a torn tail in an old log is never followed by live data. Records reach the index only after
the log was fsynced.

With ``remove_from_page_cache`` the whole pages of the active log are dropped from the page cache
after each fsync, as the journal's are. Entries are read from the write cache while they are
recent, and a page cache that keeps every page written makes the kernel find a fresh page for every
4 KiB, which costs more than the copy into it where memory is handed back to a hypervisor (the
append profile of a bookie spent a third of its CPU there). Older entries are then read from disk.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import struct
import threading
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterator
from itertools import accumulate, chain

import crc32c

from bookkeeper_py.speedups import native
from bookkeeper_py.storage.files import fsync_directory

log = logging.getLogger(__name__)

MAGIC = b"PBKL"
FORMAT_VERSION = 1
HEADER_SIZE = 1024
_HEADER = struct.Struct(">4sIQQI")
_RECORD = struct.Struct(">II")
_IDS = struct.Struct(">qq")
_MAP_ENTRY = struct.Struct(">qq")
LEDGERS_MAP_ENTRY_ID = -2
WRITE_BUFFER_BYTES = 4 * 1024 * 1024
_BATCH = 512  # entries written by one writev of add_many (two pieces each; IOV_MAX is 1024)
# and about this many bytes at most: the flushes along the way (flushEntrylogBytes), the pace of a
# checkpoint and the pages dropped from the page cache follow the writes this closely.
_BATCH_BYTES = 1024 * 1024
_WRITEV_MIN = 32  # fewer entries than this are buffered instead,
_WRITEV_MIN_BYTES = 64 * 1024  # unless they hold this many bytes (copying them costs more)
_PAGE = 4096  # page cache granularity for dropping written pages (a multiple of any page size)
# Direct writes (``_DirectAppender``) start at offsets and write sizes that are multiples of this
# (a multiple of any device's logical block size), from a page-aligned buffer this big at first.
_ALIGN = 4096
_DIRECT_BUFFER_BYTES = 2 * _BATCH_BYTES + 2 * _ALIGN


class EntryLogError(Exception):
    """An entry log could not be read or written."""


class ReadWouldBlockError(Exception):
    """A read asked not to wait for the disk found its bytes outside the page cache: read it
    again where waiting is harmless (a reader thread, not the bookie's event loop)."""


# Reads that must not wait for the disk (preadv with RWF_NOWAIT, Linux 4.14+): EAGAIN when a
# page is not cached. Elsewhere every read may wait.
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
# posix_fadvise(WILLNEED), where the system has it (see WALK_ADVICE_BYTES).
_ADVICE = getattr(os, "POSIX_FADV_WILLNEED", 0) if hasattr(os, "posix_fadvise") else 0
# The C check of a record read ahead (``bookkeeper_py.speedups``), where it is in use.
_c_record: Callable[[bytes | memoryview, int, int, int], bytes | None] | None = (
    native.entry_log_record if native is not None else None
)
# The C framing of a batch of records into one buffer (``add_many``), where it is in use.
_c_frame: Callable[..., list[int]] | None = native.entry_log_frame if native is not None else None
_O_DIRECT = getattr(os, "O_DIRECT", 0)


class _DirectAppender:
    """Appends records to the active log with ``O_DIRECT``: from a page-aligned buffer straight to
    the disk, never through the page cache. Buffered, every 4 KiB written took a fresh page of the
    page cache, the kernel's delayed-allocation bookkeeping for it, its writeback at the next
    fdatasync and its dropping after (``remove_from_page_cache``): about half of a checkpoint's
    CPU. Direct writes must start and end on ``_ALIGN`` bounds, so the buffer starts with the
    log's last partial block (the bytes already written from the block's start), new records go
    after it until ``write`` (at the log's next flush, or when the buffer is full: about one
    write per ``flushEntrylogBytes``), the rest of the last block is written as zeros, and the
    next write writes that block again with more records in it. The file may so end in up to
    ``_ALIGN - 1`` zero bytes past the last record until the log is closed (``_trim``); a zero
    length is a torn tail to every reader. Records are durable after the next fdatasync, as
    buffered ones (that also writes the file's size and the disk's cache)."""

    def __init__(self, fd: int) -> None:
        """``fd`` is a new, empty log opened with ``O_DIRECT``."""
        self.fd = fd
        self.base = 0  # the file offset of the buffer's first byte
        self.tail = 0  # bytes of the buffer in the file already
        self.end = 0  # bytes of the buffer in use: the tail, then records to write
        self.buffer = mmap.mmap(-1, _DIRECT_BUFFER_BYTES)

    def _room(self, size: int) -> None:
        """Makes room for ``size`` more bytes: writes what waits if they would not fit, and grows
        the buffer for a batch of entries larger than it."""
        if self.end + size + _ALIGN > len(self.buffer):
            self.write()
        needed = self.end + size + _ALIGN
        if needed > len(self.buffer):
            grown = mmap.mmap(-1, needed + _ALIGN - needed % _ALIGN)
            grown[: self.end] = self.buffer[: self.end]
            self.buffer.close()
            self.buffer = grown

    def frame(self, entries: list[bytes], location: int, size: int) -> list[int]:
        """Frames ``entries`` (``size`` bytes of records) into the buffer, in C."""
        self._room(size)
        assert _c_frame is not None
        locations = _c_frame(self.buffer, entries, location, self.end)
        self.end += size
        return locations

    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Puts ``data`` (records framed already) into the buffer."""
        self._room(len(data))
        self.buffer[self.end : self.end + len(data)] = data
        self.end += len(data)

    def write(self) -> None:
        """Writes the records in the buffer, with the tail's block before them and zeros to the
        next ``_ALIGN`` bound after; keeps their last partial block as the new tail."""
        end = self.end
        if end == self.tail:
            return
        padded = end + (-end % _ALIGN)
        self.buffer[end:padded] = bytes(padded - end)
        with memoryview(self.buffer) as whole, whole[:padded] as view:
            written = os.pwrite(self.fd, view, self.base)
        if written != padded:  # a direct write is all or nothing but for a full disk
            raise OSError(errno.ENOSPC, f"short direct write ({written} of {padded} bytes)")
        keep = end - end % _ALIGN
        if keep:
            self.buffer[: end - keep] = self.buffer[keep:end]
            self.base += keep
        self.tail = self.end = end - keep

    def close(self) -> None:
        try:
            os.close(self.fd)
        finally:
            self.buffer.close()


# A walk over a ledger's records (a batch read, a striped read's share) reads spans of at most
# this many bytes.
READ_RUN_BYTES = 1024 * 1024
# Sequential reads (one ledger's entries, stored one after the other in a log) read this much
# at once and serve the next entries from it, as DbLedgerStorage's read-ahead does; the last
# READ_AHEAD_BLOCKS such blocks are kept (readers of several ledgers at once).
READ_AHEAD_BYTES = 128 * 1024
READ_AHEAD_BLOCKS = 4
# Walks ask the kernel to read the log ahead of them (posix_fadvise WILLNEED) this many bytes at
# a time, once a walk comes within half of it of the end of what was asked for: a striped
# reader's walks over one bookie's log skip stretches (the parts other bookies lead), and the
# kernel's own read-ahead, which follows sequential reads of a file, lost them (half of a 3/2/2
# bookie's reads on the loop then found their pages not cached and went to a reader thread).
WALK_ADVICE_BYTES = 4 * 1024 * 1024
# A read that starts at most this far after the last record read counts as sequential: an
# entry by entry reader of E > Qw asks each bookie for every E-th entry, and the bookie holds
# Qw of every E.
READ_AHEAD_GAP = 16 * 1024


class CorruptEntryError(EntryLogError):
    """A record of an entry log failed its checks; the data is not trustworthy (answer EIO)."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"entry log {path} is corrupt at offset {offset}: {reason}")
        self.path = path
        self.offset = offset


def log_name(log_id: int) -> str:
    return f"{log_id:016x}.log"


def location_of(log_id: int, offset: int) -> int:
    return (log_id << 32) | offset


def split_location(location: int) -> tuple[int, int]:
    return location >> 32, location & 0xFFFFFFFF


def _header(log_id: int, map_offset: int, map_count: int) -> bytes:
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, log_id, map_offset, map_count)
    return (head + struct.pack(">I", crc32c.crc32c(head))).ljust(HEADER_SIZE, b"\0")


class EntryLogger:
    """Appends entries to the active log and reads any log. ``add`` and ``flush`` come from one
    thread (the checkpoint); ``read`` from any."""

    def __init__(
        self,
        directory: str,
        log_size_limit: int = 1024**3,
        flush_every_bytes: int = 0,
        *,
        remove_from_page_cache: bool = False,
        direct_writes: bool = False,
    ) -> None:
        if log_size_limit >= 2**32:
            raise ValueError("logSizeLimit must stay below 4 GiB: offsets are 32 bits")
        self.directory = directory
        self._limit = log_size_limit
        # flushEntrylogBytes: fdatasync the active log every so many bytes written, so a
        # checkpoint never leaves the disk a large flush at once (which the journal's next fsync
        # would wait for when both share a file system); 0: only when a checkpoint ends.
        self._flush_every = flush_every_bytes
        self._flushed_size = 0
        self._drop_pages = remove_from_page_cache and hasattr(os, "posix_fadvise")
        # Records written with O_DIRECT where the file system takes it and the C framing is in
        # use (``_DirectAppender``); otherwise through the page cache.
        self._direct_writes = direct_writes and bool(_O_DIRECT) and _c_frame is not None
        self._direct: _DirectAppender | None = None
        self._dropped = 0  # bytes at the start of the active log dropped from the page cache
        # Bytes a read takes at first: the size of the last record read (header and entry).
        self._record_guess = _RECORD.size + 1024
        self.written = 0  # bytes of records written so far, all logs
        # Called after each flush along the way (the checkpoint paces itself there).
        self.after_flush: Callable[[], None] | None = None
        self._read_fds: dict[int, int] = {}
        self._fd_lock = threading.Lock()
        self._active_fd = -1
        self._active_id = -1
        existing = self.log_ids()
        self._next_id = existing[-1] + 1 if existing else 0  # logs from earlier runs stay below
        self._size = 0
        self._synced_size = 0
        # (active log id, its synced size), replaced as one: readers on other threads keep
        # read-ahead bytes of the active log only below it (past it a failed write may be cut
        # off and written again).
        self._active_bound = (-1, 0)
        # Read-ahead blocks (log id, offset, bytes), newest first, and where the last record
        # read ended: a read that starts there (or at a block's end) reads ahead.
        self._ahead: list[tuple[int, int, bytes | memoryview]] = []
        self._next_offset = (-1, 0)
        self._buffer = bytearray()
        # add_many's batch of records framed in C, kept from one batch to the next
        self._frame = bytearray()
        # Buffers of READ_RUN_BYTES that walks read their spans into (one per walk at a time,
        # taken with an atomic pop): a fresh buffer per span cost its allocation and zeroing,
        # a page fault per page, and a copy into cold memory.
        self._span_buffers: list[bytearray] = []
        # Log id -> ledger id -> (start, end) of the stretch of the log that the walks over the
        # ledger's records last asked the kernel to read ahead.
        self._advised: dict[int, dict[int, tuple[int, int]]] = {}
        self._ledger_bytes: dict[int, int] = defaultdict(int)

    def log_ids(self) -> list[int]:
        ids = []
        for name in os.listdir(self.directory):
            stem, _, ext = name.partition(".")
            if ext == "log" and len(stem) == 16:
                try:
                    ids.append(int(stem, 16))
                except ValueError:
                    continue
        return sorted(ids)

    def path(self, log_id: int) -> str:
        return os.path.join(self.directory, log_name(log_id))

    @property
    def active_log_id(self) -> int:
        return self._active_id

    @property
    def writable_floor(self) -> int:
        """Every log below this id is closed: never appended to again. Logs at or above it are
        active or about to be created (a new log's file exists before it becomes the active one)."""
        return self._active_id if self._active_id >= 0 else self._next_id

    def _start_log(self) -> None:
        existing = self.log_ids()
        log_id = max(existing[-1] + 1 if existing else 0, self._next_id)
        self._next_id = log_id + 1
        fd = os.open(self.path(log_id), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        header = _header(log_id, 0, 0)
        try:
            self._direct = self._open_direct(log_id, header) if self._direct_writes else None
            if self._direct is None:
                os.write(fd, header)
        except BaseException:
            os.close(fd)
            raise
        os.fsync(fd)
        fsync_directory(self.directory)
        self._active_fd, self._active_id, self._size = fd, log_id, HEADER_SIZE
        self._synced_size = self._flushed_size = HEADER_SIZE
        self._active_bound = (log_id, HEADER_SIZE)
        self._dropped = 0
        self._ledger_bytes = defaultdict(int)

    def _open_direct(self, log_id: int, header: bytes) -> _DirectAppender | None:
        """The new log ``log_id`` opened for direct writes, its header written through it (the
        first direct write, which proves the file system takes them: some refuse ``O_DIRECT`` at
        the open, some only at the first write). None, and the page cache for this logger's
        logs from now on (said once in the log), where they are refused."""
        path = self.path(log_id)
        direct: _DirectAppender | None = None
        try:
            direct = _DirectAppender(os.open(path, os.O_WRONLY | _O_DIRECT))
            direct.append(header)
            direct.write()
        except OSError as error:
            if direct is not None:
                direct.close()
            if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
            log.info(
                "entry logs in %s are written through the page cache: %s does not take direct "
                "writes (%s)",
                self.directory,
                path,
                error,
            )
            self._direct_writes = False
            return None
        return direct

    def add(self, ledger_id: int, entry: bytes) -> int:
        """Buffers ``entry`` in the active log and returns its location (durable after ``flush``)."""
        return self.add_many(ledger_id, [entry])[0]

    def add_many(self, ledger_id: int, entries: list[bytes]) -> list[int]:
        """Writes the entries of one ledger, in order; returns their locations (durable after
        ``flush``).

        A batch of many entries that fits in the active log is framed in C into one buffer kept
        for the next batch (``entry_log_frame``: the checksums and copies without the GIL) and
        written with one ``os.write``; on the pure-Python path, with C-level loops (``map`` over
        lengths, checksums and headers) and handed to ``os.writev`` as is. A checkpoint runs this
        for every entry of the write cache, and the bookie's loop needs the GIL meanwhile. A few
        entries (one at a time from compaction) go into the write buffer, not a system call
        each."""
        locations: list[int] = []
        start = 0
        while start < len(entries):
            batch = entries[start : start + _BATCH]
            lengths = list(map(len, batch))
            if sum(lengths) > _BATCH_BYTES:  # large entries: a few per writev
                fit = bisect_left(list(accumulate(lengths)), _BATCH_BYTES) + 1
                batch, lengths = batch[:fit], lengths[:fit]
            start += len(batch)
            batch_size = sum(lengths) + _RECORD.size * len(batch)
            if (
                (len(batch) < _WRITEV_MIN and batch_size < _WRITEV_MIN_BYTES)
                or self._active_fd < 0
                or (self._size + batch_size > self._limit and self._size > HEADER_SIZE)
            ):
                locations += self._add_buffered(ledger_id, batch)
                continue
            if self._buffer:
                self._write_buffer()
            first = (self._active_id << 32) | self._size
            self._size += batch_size
            self.written += batch_size
            self._ledger_bytes[ledger_id] += batch_size
            if self._direct is not None:
                locations += self._direct.frame(batch, first, batch_size)
                self._wrote()
                continue
            if _c_frame is not None:
                # the records framed back to back in C (checksums without the GIL): one write
                frame = self._frame
                locations += _c_frame(frame, batch, first)
                written = os.write(self._active_fd, frame)
                rest = memoryview(frame)[written:] if written < batch_size else None
            else:
                headers = map(_RECORD.pack, lengths, map(crc32c.crc32c, batch))
                pieces = list(chain.from_iterable(zip(headers, batch, strict=True)))
                record_sizes = map(_RECORD.size.__add__, lengths[:-1])
                locations += accumulate(record_sizes, initial=first)
                written = os.writev(self._active_fd, pieces)
                rest = memoryview(b"".join(pieces))[written:] if written < batch_size else None
            if rest is not None:  # a short write: the rest the ordinary way
                with rest:
                    self._buffer += rest
                self._write_buffer()
            else:
                self._wrote()
        return locations

    def _add_buffered(self, ledger_id: int, entries: list[bytes]) -> list[int]:
        """``add_many`` for a few entries, or a batch that rolls the log on the way (or starts
        the first log): entry by entry into the write buffer."""
        locations: list[int] = []
        append = locations.append
        pack = _RECORD.pack
        crc = crc32c.crc32c
        buffer = self._buffer
        total = 0
        for entry in entries:
            record_size = _RECORD.size + len(entry)
            if self._active_fd < 0 or (
                self._size + record_size > self._limit and self._size > HEADER_SIZE
            ):
                self._ledger_bytes[ledger_id] += total
                total = 0
                self._roll()
                buffer = self._buffer
            append((self._active_id << 32) | self._size)
            buffer += pack(len(entry), crc(entry))
            buffer += entry
            self._size += record_size
            self.written += record_size
            total += record_size
            if len(buffer) >= WRITE_BUFFER_BYTES:
                self._write_buffer()
        self._ledger_bytes[ledger_id] += total
        return locations

    def _write_buffer(self) -> None:
        if self._direct is not None:
            if self._buffer:
                self._direct.append(self._buffer)
                self._buffer.clear()
            self._direct.write()
            self._wrote()
            return
        with memoryview(self._buffer) as whole:
            view = whole
            try:
                while view:
                    written = os.write(self._active_fd, view)
                    view = view[written:]
            finally:
                view.release()  # the buffer can only be cleared once no view of it is alive
        self._buffer.clear()
        self._wrote()

    def _wrote(self) -> None:
        """After the records up to ``_size`` were written: flush if flushEntrylogBytes says so."""
        if 0 < self._flush_every <= self._size - self._flushed_size:
            if self._direct is not None:
                self._direct.write()
            os.fdatasync(self._active_fd)
            self._flushed_size = self._size
            self._drop_synced_pages()
            if self.after_flush is not None:
                self.after_flush()

    def flush(self) -> None:
        """Writes buffered records and fsyncs the active log."""
        if self._active_fd < 0:
            return
        self._write_buffer()
        os.fdatasync(self._active_fd)
        self._synced_size = self._flushed_size = self._size
        self._active_bound = (self._active_id, self._synced_size)
        self._drop_synced_pages()

    def _drop_synced_pages(self) -> None:
        """Drops the whole pages of the active log synced since the last call from the page cache
        (the page the next record continues stays, or the kernel would read it back first)."""
        end = self._size - self._size % _PAGE
        if not self._drop_pages or self._direct is not None or end <= self._dropped:
            return
        try:
            os.posix_fadvise(
                self._active_fd, self._dropped, end - self._dropped, os.POSIX_FADV_DONTNEED
            )
        except OSError as error:  # advice only: the data is durable either way
            log.debug("entry log %d: posix_fadvise failed: %s", self._active_id, error)
        self._dropped = end

    def abandon_active(self) -> None:
        """After a failed write or sync: cut the active log back to what was synced (the index
        points only there) and start a new log at the next write, so offsets stay right."""
        self._buffer = bytearray()
        self._close_direct()
        if self._active_fd >= 0:
            try:
                os.ftruncate(self._active_fd, self._synced_size)
            except OSError:
                log.exception("cannot truncate entry log %d after a failed write", self._active_id)
            try:
                os.close(self._active_fd)
            except OSError:
                log.exception("cannot close entry log %d after a failed write", self._active_id)
            self._active_fd = -1

    def roll(self) -> None:
        """Closes the active log (writing its ledgers map) and starts a new one."""
        self._roll()

    def _roll(self) -> None:
        if self._active_fd >= 0:
            self._write_ledgers_map()
            os.close(self._active_fd)
            self._active_fd = -1
        self._start_log()

    def _write_ledgers_map(self) -> None:
        body = bytearray(_IDS.pack(-1, LEDGERS_MAP_ENTRY_ID))
        body += struct.pack(">I", len(self._ledger_bytes))
        for ledger_id, size in sorted(self._ledger_bytes.items()):
            body += _MAP_ENTRY.pack(ledger_id, size)
        map_offset = self._size
        self._buffer += _RECORD.pack(len(body), crc32c.crc32c(body))
        self._buffer += body
        self._size += _RECORD.size + len(body)
        self._write_buffer()
        self._trim()
        os.fdatasync(self._active_fd)
        os.pwrite(self._active_fd, _header(self._active_id, map_offset, len(self._ledger_bytes)), 0)
        os.fdatasync(self._active_fd)

    def _trim(self) -> None:
        """Ends a log written directly at its last record (cuts the zeros of its last block)."""
        if self._direct is not None:
            self._close_direct()
            os.ftruncate(self._active_fd, self._size)

    def _close_direct(self) -> None:
        direct, self._direct = self._direct, None
        if direct is not None:
            direct.close()

    def close(self) -> None:
        """Writes what is buffered and syncs; the log stays without a ledgers map (GC scans it)."""
        if self._active_fd >= 0:
            self._write_buffer()
            self._trim()
            self.flush()
            os.close(self._active_fd)
            self._active_fd = -1
        with self._fd_lock:
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()

    # -- reading -----------------------------------------------------------------------------

    def _fd(self, log_id: int) -> int:
        with self._fd_lock:
            fd = self._read_fds.get(log_id)
            if fd is None:
                fd = os.open(self.path(log_id), os.O_RDONLY)
                self._read_fds[log_id] = fd
            return fd

    def read(self, location: int, ledger_id: int, entry_id: int, nowait: bool = False) -> bytes:
        """The entry stored at ``location``; raises ``CorruptEntryError`` or ``EntryLogError``.
        With ``nowait`` (where the system can tell), ``ReadWouldBlockError`` instead of waiting
        for the disk."""
        log_id, offset = split_location(location)
        found = self._block_at(log_id, offset)
        if found is not None and _c_record is not None:
            # One C call checks the record (checksum and ids); a record that fails it is
            # checked again below, which says what is wrong.
            checked = _c_record(found[0], found[1], ledger_id, entry_id)
            if checked is not None:
                self._next_offset = (log_id, offset + _RECORD.size + len(checked))
                return checked
        record = self._cut_record(log_id, offset, *found) if found is not None else None
        length, expected_crc, entry = record or self._pread_record(log_id, offset, nowait)
        if len(entry) != length:
            raise CorruptEntryError(
                self.path(log_id), offset, f"record of {length} bytes cut short at {len(entry)}"
            )
        actual_crc = crc32c.crc32c(entry)
        if actual_crc != expected_crc:
            raise CorruptEntryError(
                self.path(log_id),
                offset,
                f"checksum mismatch (stored {expected_crc:08x}, computed {actual_crc:08x})",
            )
        if len(entry) < 16 or _IDS.unpack_from(entry, 0) != (ledger_id, entry_id):
            raise CorruptEntryError(
                self.path(log_id), offset, f"record is not ledger {ledger_id} entry {entry_id}"
            )
        return entry

    def read_run(
        self, location: int, ledger_id: int, entry_id: int, max_count: int, max_bytes: int
    ) -> list[bytes]:
        """The ledger's entries ``entry_id``, ``entry_id + 1``, ... whose records follow one
        another in the log from ``location`` (a checkpoint writes each ledger's entries
        together), at most ``max_count`` of them and as many as fit in ``max_bytes`` counting
        4 bytes more per entry (a batch read): ``read_picked`` of those ids. Waits for the
        disk."""
        wanted = list(range(entry_id, entry_id + max_count))
        return self.read_picked(location, ledger_id, wanted, 0, max_bytes=max_bytes)

    def read_picked(
        self,
        location: int,
        ledger_id: int,
        wanted: list[int],
        start: int,
        nowait: bool = False,
        max_bytes: int = 2**62,
        last: int | None = None,
    ) -> list[bytes]:
        """The ledger's entries ``wanted[start]``, ``wanted[start + 1]``, ... (increasing ids:
        a batch read's, or every E-th entry, as an E > Qw reader asks a bookie) whose records
        come in the log from ``location`` on, among records of the ledger's other entries
        stepped over, as many as fit in ``max_bytes`` counting 4 bytes more per entry; read in
        spans of up to ``READ_RUN_BYTES``, each entry taken checked as ``read`` checks it. Stops
        before the first wanted entry not met there (another ledger's record, past what is
        stable, damaged: ``read`` of that entry says what is wrong), so maybe at once: at once
        if the record at ``location`` is not the first one wanted. With ``nowait``, only from
        what the page cache holds. ``last``, where known, is the location of ``wanted[-1]``:
        no span reaches much past its record. (Without it a span is sized as if every id up to
        ``wanted[-1]`` had a record here, but a bookie holds only Qw of every E entries of a
        ledger: a 3/2/2 bookie's spans were a third longer than the walk, and that third read
        again for the next run.)"""
        pick = _c_pick or _pick_records
        budget = max_bytes
        first = (ledger_id, wanted[start]) if start < len(wanted) else None
        last_log, last_offset = split_location(last) if last is not None else (-1, 0)
        if last_log != split_location(location)[0]:
            last_offset = -1

        def span_size(taken: int, offset: int) -> int:
            at = start + taken
            if at >= len(wanted):
                return 0
            guess = self._record_guess
            size = min(READ_RUN_BYTES, (wanted[-1] - wanted[at] + 1) * guess)
            if last_offset >= offset:
                size = min(size, last_offset - offset + guess)
            return size

        def step(span: bytes | memoryview, taken: int) -> tuple[list[bytes], int]:
            nonlocal budget, first
            if first is not None:  # the record at ``location`` must be the first one wanted
                if (
                    len(span) < _RECORD.size + _IDS.size
                    or _IDS.unpack_from(span, _RECORD.size) != first
                ):
                    return [], 0
                first = None
            got, _, at = pick(span, 0, ledger_id, wanted, start + taken, budget)
            budget -= sum(map(len, got)) + 4 * len(got)
            return got, at

        walk_at = split_location(location)[1]
        expected = span_size(0, walk_at)
        return self._read_spans(location, span_size, step, nowait, ledger_id, expected)

    def _read_spans(
        self,
        location: int,
        span_size: Callable[[int, int], int],
        step: Callable[[bytes | memoryview, int], tuple[list[bytes], int]],
        nowait: bool,
        ledger_id: int,
        expected: int,
    ) -> list[bytes]:
        """The walk of ``read_picked``: spans of the log from ``location`` of
        ``span_size(entries taken so far, offset)`` bytes (0: done), each handed to ``step``, which
        returns the entries it took and where in the span it stopped; on while a record was
        cut by the span's end. Nothing past the active log's synced end. ``expected``: about how
        many bytes the walk over ``ledger_id``'s records covers (for the read-ahead, see
        ``_advise_ahead``)."""
        log_id, offset = split_location(location)
        entries: list[bytes] = []
        active_id, synced = self._active_bound
        if 0 <= active_id < log_id:
            return entries  # a log being started
        end = synced if log_id == active_id else None  # past it nothing is stable yet
        need = 0
        # On the loop (``nowait``) every span is read into one buffer, used again (``step``
        # copies what it takes); a read that may wait for the disk takes bytes of its own
        buffer: bytearray | None = None
        if nowait:
            try:
                buffer = self._span_buffers.pop()
            except IndexError:
                buffer = bytearray(READ_RUN_BYTES)
        into = memoryview(buffer if buffer is not None else b"")
        try:
            fd = self._fd(log_id)
            self._advise_ahead(fd, log_id, ledger_id, offset, expected)
            while (size := span_size(len(entries), offset)) > 0:
                want = max(need, size)
                if end is not None:
                    want = min(want, end - offset)
                if want < _RECORD.size:
                    break
                if not nowait:
                    span: bytes | memoryview = os.pread(fd, want, offset)
                else:
                    if want > len(into):  # a record longer than a span: a buffer of its own
                        into = memoryview(bytearray(want))
                    span = _cached_pread_into(fd, into[:want], offset, exact=False)
                got, at = step(span, len(entries))
                entries += got
                offset += at
                if at:
                    need = 0  # on from where the walk stopped
                if at + _RECORD.size > len(span):
                    if len(span) < want:
                        break  # the end of the file (or of what the page cache holds)
                    continue  # the next record's header was cut by the span
                length = _RECORD.unpack_from(span, at)[0]
                if at + _RECORD.size + length <= len(span) or len(span) < want:
                    break  # whole but not taken, or cut by the end of the file or cache
                if not at:  # the first record is cut
                    if need:
                        break  # even in a span read to hold it: by the end of what is stable
                    need = _RECORD.size + length  # longer than a span: read it whole
        except ReadWouldBlockError:
            pass  # the rest is on the disk: the one-entry way reads it off the loop
        except OSError:
            pass  # a log deleted meanwhile (compaction): ``read`` follows the entry
        finally:
            if buffer is not None:
                self._span_buffers.append(buffer)
        if entries:
            self._record_guess = _RECORD.size + len(entries[-1])
            self._next_offset = (log_id, offset)
        return entries

    def _advise_ahead(
        self, fd: int, log_id: int, ledger_id: int, offset: int, expected: int
    ) -> None:
        """Asks the kernel to read the log ahead of a walk over a ledger's records from
        ``offset`` (of about ``expected`` bytes). Kept per ledger: readers of several ledgers
        read one log at several places at once. A walk that goes on forward from the last ones
        over the ledger's records here (it starts in the stretch asked for, or at most
        ``WALK_ADVICE_BYTES`` past it: a striped reader's walks skip the parts other bookies
        lead) keeps ``WALK_ADVICE_BYTES`` asked for ahead of it, asking for more once less than
        half of that is left; any other walk (the first here, or one that jumps back or far
        ahead: a reader here and there) asks only for its own bytes, so that reads at random
        places do not each read megabytes from the disk."""
        if not _ADVICE:
            return
        advised = self._advised.setdefault(log_id, {})
        start, end = advised.get(ledger_id, (0, 0))
        onward = start <= offset <= end + WALK_ADVICE_BYTES and end > start
        if onward and offset + WALK_ADVICE_BYTES // 2 <= end:
            return  # enough asked for ahead of it already
        if onward:
            begin, stop = max(end, offset), offset + WALK_ADVICE_BYTES
        else:
            start = begin = offset
            stop = offset + max(0, min(expected, WALK_ADVICE_BYTES))
        if stop <= begin:
            return
        try:
            os.posix_fadvise(fd, begin, stop - begin, _ADVICE)
        except OSError as error:  # advice only
            log.debug("entry log %d: posix_fadvise(WILLNEED) failed: %s", log_id, error)
            return
        advised[ledger_id] = (start, stop)

    def _block_at(self, log_id: int, offset: int) -> tuple[bytes | memoryview, int] | None:
        """The read-ahead block holding ``offset`` of the log, and where in it, if any."""
        for block_log, start, block in self._ahead:
            if block_log == log_id and start <= offset < start + len(block):
                return block, offset - start
        return None

    def _cut_record(
        self, log_id: int, offset: int, block: bytes | memoryview, at: int
    ) -> tuple[int, int, bytes] | None:
        """(length, checksum, entry) of the record at ``at`` in ``block`` if it holds all of
        it (unchecked)."""
        if at + _RECORD.size > len(block):
            return None
        length, expected_crc = _RECORD.unpack_from(block, at)
        end = at + _RECORD.size + length
        if end > len(block):
            return None
        self._next_offset = (log_id, offset + _RECORD.size + length)
        return length, expected_crc, bytes(block[at + _RECORD.size : end])

    def _pread_record(self, log_id: int, offset: int, nowait: bool) -> tuple[int, int, bytes]:
        """(length, checksum, entry) of the record at ``offset``, read from the file. A read
        that starts where the last record read ended, or a little after (one ledger's entries
        follow each other in a log), reads ``READ_AHEAD_BYTES`` and keeps them as a block."""
        try:
            fd = self._fd(log_id)
            # One read for the record header and an entry as long as the last one read (entries
            # of a ledger tend to be alike); a longer entry's rest in a second read.
            size = guess = self._record_guess
            last_log, last_end = self._next_offset
            if last_log == log_id and 0 <= offset - last_end <= READ_AHEAD_GAP:
                size = max(guess, READ_AHEAD_BYTES)
            first = (
                _cached_pread(fd, size, offset, exact=False)
                if nowait
                else os.pread(fd, size, offset)
            )
            if len(first) < _RECORD.size:
                if nowait:
                    # The page cache holds the header's start only (it crosses a page): the
                    # waiting read tells whether the file really ends there.
                    raise ReadWouldBlockError()
                raise CorruptEntryError(
                    self.path(log_id), offset, "record header beyond the end of the file"
                )
            length, expected_crc = _RECORD.unpack_from(first)
            end = self._record_guess = _RECORD.size + length
            self._next_offset = (log_id, offset + end)
            if size > guess:
                self._keep_ahead(log_id, offset, first)
            if len(first) >= end:
                entry = bytes(first[_RECORD.size : end])
            else:
                at = offset + len(first)
                rest = (
                    _cached_pread(fd, end - len(first), at)
                    if nowait
                    else os.pread(fd, end - len(first), at)
                )
                entry = b"".join((first[_RECORD.size :], rest))
        except OSError as error:
            raise EntryLogError(
                f"reading entry log {self.path(log_id)} at {offset}: {error}"
            ) from error
        return length, expected_crc, entry

    def _keep_ahead(self, log_id: int, offset: int, block: bytes | memoryview) -> None:
        active_id, synced = self._active_bound
        if log_id == active_id:
            if offset >= synced:
                return  # nothing of it is stable yet
            block = block[: synced - offset]
        elif 0 <= active_id < log_id:
            return  # a log being started
        self._ahead = [(log_id, offset, block), *self._ahead[: READ_AHEAD_BLOCKS - 1]]

    def ledgers_map(self, log_id: int) -> dict[int, int]:
        """Ledger id -> bytes of ``log_id``: from its ledgers map, or by scanning a log without one."""
        path = self.path(log_id)
        with open(path, "rb") as handle:
            header = handle.read(HEADER_SIZE)
            if len(header) < 32 or header[:4] != MAGIC:
                raise CorruptEntryError(path, 0, "bad header")
            _, _, _, map_offset, count = _HEADER.unpack_from(header, 0)
            if struct.unpack_from(">I", header, 28)[0] != crc32c.crc32c(header[:28]):
                raise CorruptEntryError(path, 0, "header checksum mismatch")
            if map_offset:
                handle.seek(map_offset)
                length, crc = _RECORD.unpack(handle.read(_RECORD.size))
                body = handle.read(length)
                if crc32c.crc32c(body) != crc:
                    raise CorruptEntryError(path, map_offset, "ledgers map checksum mismatch")
                (stored_count,) = struct.unpack_from(">I", body, 16)
                if stored_count != count:
                    raise CorruptEntryError(
                        path, map_offset, "ledgers map count differs from the header's"
                    )
                return {
                    lid: size
                    for lid, size in (
                        _MAP_ENTRY.unpack_from(body, 20 + 16 * i) for i in range(count)
                    )
                }
        return self.scan_ledgers(log_id)

    def _walk(
        self, log_id: int, *, with_bodies: bool
    ) -> Iterator[tuple[int, int, int, int, bytes | None]]:
        """(ledger id, entry id, record offset, body length, body or None) of each record, in order,
        up to the ledgers map or a torn tail. Without bodies only the ids are read; with them,
        a checksum mismatch raises ``CorruptEntryError``."""
        path = self.path(log_id)
        with open(path, "rb") as handle:
            offset = HEADER_SIZE
            handle.seek(offset)
            while True:
                head = handle.read(_RECORD.size)
                if len(head) < _RECORD.size:
                    return
                length, expected_crc = _RECORD.unpack(head)
                body = handle.read(length if with_bodies else 16)
                if len(body) < (length if with_bodies else 16) or length < 16:
                    return  # torn tail
                ledger_id, entry_id = _IDS.unpack_from(body, 0)
                if ledger_id == -1 and entry_id == LEDGERS_MAP_ENTRY_ID:
                    return
                if with_bodies and crc32c.crc32c(body) != expected_crc:
                    raise CorruptEntryError(path, offset, "checksum mismatch")
                yield ledger_id, entry_id, offset, length, body if with_bodies else None
                offset += _RECORD.size + length
                if not with_bodies:
                    handle.seek(offset)

    def scan_ledgers(self, log_id: int) -> dict[int, int]:
        """Ledger id -> bytes, by reading every record's ids (stops at a torn tail)."""
        sizes: dict[int, int] = defaultdict(int)
        for ledger_id, _, _, length, _ in self._walk(log_id, with_bodies=False):
            sizes[ledger_id] += _RECORD.size + length
        return dict(sizes)

    def file_size(self, log_id: int) -> int:
        return os.path.getsize(self.path(log_id))

    def records(self, log_id: int) -> Iterator[tuple[int, int, int, bytes]]:
        """(ledger id, entry id, record offset, entry) of every valid record of a log, in order;
        stops at the ledgers map or a torn tail, raises ``CorruptEntryError`` on a bad checksum."""
        for ledger_id, entry_id, offset, _, body in self._walk(log_id, with_bodies=True):
            assert body is not None
            yield ledger_id, entry_id, offset, body

    def delete(self, log_id: int) -> None:
        if log_id >= self.writable_floor:
            raise EntryLogError(f"cannot delete the active entry log {log_id}")
        self._ahead = [block for block in self._ahead if block[0] != log_id]
        self._advised.pop(log_id, None)
        with self._fd_lock:
            fd = self._read_fds.pop(log_id, None)
            if fd is not None:
                os.close(fd)
        os.unlink(self.path(log_id))
        fsync_directory(self.directory)


def _pick_records(
    block: bytes | memoryview,
    at: int,
    ledger_id: int,
    wanted: list[int],
    start: int,
    max_bytes: int,
) -> tuple[list[bytes], int, int]:
    """The pure-Python ``entry_log_pick`` of the C speedups (see ``EntryLogger.read_picked``):
    the checked entries of ``wanted[start:]`` among the ledger's records following one another
    in ``block`` from ``at`` with increasing ids, within ``max_bytes`` (4 bytes more counted per
    entry); the index of the first not taken, and where the walk stopped."""
    entries: list[bytes] = []
    last = -1
    while start < len(wanted) and at + _RECORD.size <= len(block):
        length, expected_crc = _RECORD.unpack_from(block, at)
        stop = at + _RECORD.size + length
        if length < 16 or stop > len(block):
            break
        ledger, entry_id = _IDS.unpack_from(block, at + _RECORD.size)
        if ledger != ledger_id or entry_id <= last or entry_id > wanted[start]:
            break
        if entry_id == wanted[start]:
            entry = bytes(block[at + _RECORD.size : stop])
            if max_bytes < 4 + length or crc32c.crc32c(entry) != expected_crc:
                break
            entries.append(entry)
            max_bytes -= 4 + length
            start += 1
        last = entry_id
        at = stop
    return entries, start, at


_c_pick: Callable[..., tuple[list[bytes], int, int]] | None = (
    native.entry_log_pick if native is not None else None
)


def _cached_pread(fd: int, size: int, offset: int, exact: bool = True) -> bytes | memoryview:
    """``size`` bytes at ``offset`` if the page cache holds them all; ``ReadWouldBlockError``
    if reading them would wait for the disk (or, when ``exact``, they are cut short: the waiting
    read tells). Not ``exact``: what the cache holds from ``offset`` on, up to ``size`` bytes
    (fewer at the end of the file), at least one byte."""
    if not _NOWAIT:
        return os.pread(fd, size, offset)
    return _cached_pread_into(fd, memoryview(bytearray(size)), offset, exact)


def _cached_pread_into(
    fd: int, into: memoryview, offset: int, exact: bool = True
) -> bytes | memoryview:
    """``_cached_pread`` of ``len(into)`` bytes, read into ``into``: the part of it read (or,
    where the system cannot tell what is cached, bytes of their own from a waiting read)."""
    if not _NOWAIT:
        return os.pread(fd, len(into), offset)
    try:
        got = os.preadv(fd, [into], offset, _NOWAIT)
    except BlockingIOError:
        raise ReadWouldBlockError() from None
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        return os.pread(fd, len(into), offset)  # a file system that cannot tell: wait
    if got != len(into) and (exact or got == 0):
        raise ReadWouldBlockError()
    return into[:got]
