"""Ledger storage of the walking-skeleton bookie: an in-memory index over the journal files.

Each ledger has a master key, a fence bit, an optional explicit LAC and the location of every
entry (journal file, offset, length). The index is rebuilt at start by replaying the journal, so
everything it says was durable. Reads ``pread`` the journal file. (Issue 3 moves entries to
interleaved entry logs with a persistent index, checkpoints and GC.)

"No such ledger / entry" is answered only from the index; an I/O error while reading is raised
as ``StorageIOError`` so the bookie answers EIO, never a false negative.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
from dataclasses import dataclass, field

from bookkeeper.storage.journal import (
    Location,
    RecordType,
    journal_name,
    list_journal_ids,
    scan,
)

log = logging.getLogger(__name__)


class StorageIOError(Exception):
    """Reading stored data failed; the answer is unknown, not absent."""


class NoLedgerError(Exception):
    """The index holds nothing of this ledger."""


class NoEntryError(Exception):
    """The index knows the ledger but not this entry."""


@dataclass(slots=True)
class LedgerInfo:
    master_key: bytes
    fenced: bool = False
    explicit_lac: bytes | None = None
    entries: dict[int, Location] = field(default_factory=dict)
    last_entry_id: int = -1


class LedgerStorage:
    """The bookie's view of its ledgers. Mutated from one thread (the bookie's event loop)."""

    def __init__(self, journal_directory: str) -> None:
        self.journal_directory = journal_directory
        self._ledgers: dict[int, LedgerInfo] = {}
        self._read_fds: dict[int, int] = {}
        self._fd_lock = threading.Lock()

    # -- replay ------------------------------------------------------------------------------

    def replay(self) -> int:
        """Rebuilds the index from every journal file; returns the id the next file should take."""
        ids = list_journal_ids(self.journal_directory)
        for position, file_id in enumerate(ids):
            path = os.path.join(self.journal_directory, journal_name(file_id))
            count = 0
            for record_type, body, offset in scan(path, is_last=position == len(ids) - 1):
                self.apply(record_type, body, Location(file_id, offset, len(body)))
                count += 1
            log.info("replayed %d records from %s", count, path)
        return (ids[-1] + 1) if ids else 0

    def apply(self, record_type: RecordType, body: bytes, location: Location) -> None:
        """Applies a durable journal record to the index."""
        ledger_id = int.from_bytes(body[0:8], "big", signed=True)
        if record_type == RecordType.MASTER_KEY:
            self._ledgers.setdefault(ledger_id, LedgerInfo(master_key=bytes(body[8:28])))
        elif record_type == RecordType.FENCE:
            self._info_or_new(ledger_id).fenced = True
        elif record_type == RecordType.EXPLICIT_LAC:
            self._info_or_new(ledger_id).explicit_lac = bytes(body[8:])
        elif record_type == RecordType.ENTRY:
            entry_id = int.from_bytes(body[8:16], "big", signed=True)
            self.index_entry(ledger_id, entry_id, location)

    def _info_or_new(self, ledger_id: int) -> LedgerInfo:
        info = self._ledgers.get(ledger_id)
        if info is None:
            info = self._ledgers[ledger_id] = LedgerInfo(master_key=b"")
        return info

    # -- state ---------------------------------------------------------------------------------

    def ledger(self, ledger_id: int) -> LedgerInfo | None:
        return self._ledgers.get(ledger_id)

    def add_ledger(self, ledger_id: int, master_key: bytes) -> LedgerInfo:
        """Records a ledger's master key (the caller journals it)."""
        info = self._ledgers.get(ledger_id)
        if info is None:
            info = self._ledgers[ledger_id] = LedgerInfo(master_key=master_key)
        elif not info.master_key:
            info.master_key = master_key
        return info

    @staticmethod
    def key_matches(info: LedgerInfo, master_key: bytes) -> bool:
        """Constant-time comparison of a presented master key with the stored one."""
        return hmac.compare_digest(info.master_key, master_key)

    def index_entry(self, ledger_id: int, entry_id: int, location: Location) -> None:
        info = self._info_or_new(ledger_id)
        info.entries[entry_id] = location
        if entry_id > info.last_entry_id:
            info.last_entry_id = entry_id

    def ledger_ids(self) -> list[int]:
        return sorted(self._ledgers)

    # -- reads ---------------------------------------------------------------------------------

    def read(self, ledger_id: int, entry_id: int) -> bytes:
        """The stored bytes of an entry; entry -1 is the last one. Raises NoLedger/NoEntry/StorageIO."""
        info = self._ledgers.get(ledger_id)
        if info is None:
            raise NoLedgerError(ledger_id)
        if entry_id == -1:
            entry_id = info.last_entry_id
        location = info.entries.get(entry_id)
        if location is None:
            raise NoEntryError(ledger_id, entry_id)
        return self.read_location(location)

    def read_location(self, location: Location) -> bytes:
        try:
            fd = self._read_fd(location.file_id)
            data = os.pread(fd, location.length, location.offset)
        except OSError as error:
            raise StorageIOError(
                f"reading journal {journal_name(location.file_id)}: {error}"
            ) from error
        if len(data) != location.length:
            raise StorageIOError(
                f"journal {journal_name(location.file_id)} offset {location.offset}: "
                f"short read of {len(data)} bytes, expected {location.length}"
            )
        return data

    def _read_fd(self, file_id: int) -> int:
        with self._fd_lock:
            fd = self._read_fds.get(file_id)
            if fd is None:
                fd = os.open(
                    os.path.join(self.journal_directory, journal_name(file_id)), os.O_RDONLY
                )
                self._read_fds[file_id] = fd
            return fd

    def close(self) -> None:
        with self._fd_lock:
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
