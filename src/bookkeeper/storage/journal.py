"""The bookie journal: append records, group-commit them with one write + fsync, replay them.

Format (docs/formats/journal.md): files ``<16 hex digit id>.txn`` that start with a 16-byte
header (magic ``PBKJ``, u32 format version 1, u64 file id) followed by records::

    u32 length      bytes after the checksum (type byte + body)
    u32 crc32c      CRC32C of type byte + body
    u8  type        1 entry, 2 master key, 3 fence, 4 explicit LAC, 5 force
    ... body

All integers are big-endian. A record is durable once the fsync of the group that holds it
returned. At replay a short or failing record at the tail of the newest file is a torn write
and is cut off; anywhere else it is corruption and replay stops with the file and offset.

Group commit: the journal thread takes every record queued while the previous fsync ran (up to
``buffered_writes_threshold`` bytes), writes them with one ``write`` and makes them durable with
one ``fdatasync``. A failed write or fsync fails every waiting record and every later one: the
journal does not pretend the data reached the disk.
"""

from __future__ import annotations

import enum
import logging
import os
import queue
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import crc32c

log = logging.getLogger(__name__)

MAGIC = b"PBKJ"
FORMAT_VERSION = 1
FILE_HEADER = struct.Struct(">4sIQ")
RECORD_HEADER = struct.Struct(">IIB")  # length, crc, type
MAX_RECORD_SIZE = 64 * 1024 * 1024


class RecordType(enum.IntEnum):
    ENTRY = 1
    MASTER_KEY = 2
    FENCE = 3
    EXPLICIT_LAC = 4
    FORCE = 5


class JournalError(Exception):
    """The journal could not make records durable; the bookie must stop taking writes."""


class CorruptJournalError(JournalError):
    """A record in the middle of the journal is damaged."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"journal {path} is corrupt at offset {offset}: {reason}")
        self.path = path
        self.offset = offset


@dataclass(frozen=True, slots=True)
class Location:
    """Where a record's body lies: journal file id, offset of the body, body length."""

    file_id: int
    offset: int
    length: int


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


def fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def scan(path: str, *, is_last: bool) -> Iterator[tuple[RecordType, bytes, int]]:
    """Yields (type, body, body offset) of each valid record; cuts a torn tail of the last file."""
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
        end = len(data)
        while offset < end:
            problem = None
            if end - offset < RECORD_HEADER.size:
                problem = "truncated record header"
            else:
                length, crc, rtype = RECORD_HEADER.unpack_from(data, offset)
                body_start = offset + RECORD_HEADER.size
                body_end = body_start + length - 1
                if length < 1 or length > MAX_RECORD_SIZE:
                    problem = f"impossible record length {length}"
                elif body_end > end:
                    problem = "truncated record body"
                elif crc32c.crc32c(data[offset + 8 : body_end]) != crc:
                    problem = "record checksum mismatch"
                elif rtype not in RecordType.__members__.values():
                    problem = f"unknown record type {rtype}"
            if problem is not None:
                if is_last and _only_zeros_or_tail(data, offset, problem):
                    log.warning(
                        "journal %s: cutting torn tail at offset %d (%s)", path, offset, problem
                    )
                    handle.truncate(offset)
                    handle.flush()
                    os.fsync(handle.fileno())
                    return
                raise CorruptJournalError(path, offset, problem)
            yield RecordType(rtype), data[body_start:body_end], body_start
            offset = body_end


def replay(
    directory: str, mark: tuple[int, int] | None
) -> Iterator[tuple[RecordType, bytes, int, int]]:
    """Yields (type, body, file id, offset after the record) of every record at or after ``mark``
    (all records when there is none), in order; the newest file's torn tail is cut."""
    ids = list_journal_ids(directory)
    start_file, start_offset = mark if mark is not None else (-1, 0)
    for position, file_id in enumerate(ids):
        if file_id < start_file:
            continue
        path = os.path.join(directory, journal_name(file_id))
        for record_type, body, body_offset in scan(path, is_last=position == len(ids) - 1):
            if file_id == start_file and body_offset - RECORD_HEADER.size < start_offset:
                continue
            yield record_type, body, file_id, body_offset + len(body)


def _only_zeros_or_tail(data: bytes, offset: int, problem: str) -> bool:
    # A torn write leaves a partial record at the very end. A checksum failure followed by more
    # valid-looking data is corruption, not a torn tail; we accept it as a tail only when it is the
    # last record (its declared end reaches the end of the file) or the rest is zero fill.
    if problem in ("truncated record header", "truncated record body"):
        return True
    rest = data[offset:]
    if not rest.strip(b"\0"):
        return True
    length = struct.unpack_from(">I", data, offset)[0] if len(rest) >= 4 else 0
    return offset + RECORD_HEADER.size + length - 1 >= len(data)


Callback = Callable[[list[tuple[Any, Location | None]], Exception | None], None]


class Journal:
    """Group-committing journal in one directory, written by its own thread."""

    def __init__(
        self,
        directory: str,
        on_synced: Callback,
        *,
        max_file_size: int = 2 * 1024**3,
        buffered_writes_threshold: int = 512 * 1024,
        sync_data: bool = True,
    ) -> None:
        self.directory = directory
        self._on_synced = on_synced
        self._max_file_size = max_file_size
        self._threshold = buffered_writes_threshold
        self._sync_data = sync_data
        self._queue: queue.SimpleQueue[tuple[int, bytes, Any] | None] = queue.SimpleQueue()
        self._failure: Exception | None = None
        self._thread: threading.Thread | None = None
        self._fd = -1
        self._file_id = -1
        self._size = 0
        # (file id, offset) just past the last record written: a LastLogMark candidate.
        self.position: tuple[int, int] = (-1, 0)

    def open(self, next_file_id: int) -> None:
        """Starts a new journal file and the writer thread."""
        self._roll(next_file_id)
        self._thread = threading.Thread(target=self._run, name="journal", daemon=True)
        self._thread.start()

    @property
    def current_file_id(self) -> int:
        return self._file_id

    @property
    def failure(self) -> Exception | None:
        return self._failure

    def _roll(self, file_id: int) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        path = os.path.join(self.directory, journal_name(file_id))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, FILE_HEADER.pack(MAGIC, FORMAT_VERSION, file_id))
        os.fsync(fd)
        fsync_directory(self.directory)
        self._fd = fd
        self._file_id = file_id
        self._size = FILE_HEADER.size
        self.position = (file_id, FILE_HEADER.size)

    def append(self, record_type: RecordType, body: bytes, token: Any) -> None:
        """Queues a record; ``on_synced`` reports ``token`` once the record is durable (or failed)."""
        self._queue.put((record_type, body, token))

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            size = len(first[1])
            stop = False
            while size < self._threshold:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
                size += len(item[1])
            self._commit(batch)
            if stop:
                break

    def _commit(self, batch: list[tuple[int, bytes, Any]]) -> None:
        if self._failure is not None:
            self._on_synced([(token, None) for _, _, token in batch], self._failure)
            return
        try:
            if self._size >= self._max_file_size:
                self._roll(self._file_id + 1)
            parts: list[bytes] = []
            results: list[tuple[Any, Location | None]] = []
            offset = self._size
            for record_type, body, token in batch:
                type_byte = bytes((record_type,))
                crc = crc32c.crc32c(body, crc32c.crc32c(type_byte))
                parts.append(RECORD_HEADER.pack(len(body) + 1, crc, record_type))
                parts.append(body)
                body_offset = offset + RECORD_HEADER.size
                results.append((token, Location(self._file_id, body_offset, len(body))))
                offset = body_offset + len(body)
            data = b"".join(parts)
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            self._size = offset
            self.position = (self._file_id, offset)
            if self._sync_data:
                os.fdatasync(self._fd)
        except OSError as error:
            self._failure = JournalError(
                f"journal {journal_name(self._file_id)} in {self.directory}: write or fsync failed: {error}; "
                "the bookie takes no more writes on this journal"
            )
            log.error("%s", self._failure)
            self._on_synced([(token, None) for _, _, token in batch], self._failure)
            return
        self._on_synced(results, None)

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

    def close(self) -> None:
        """Writes and syncs what is queued, then stops the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
