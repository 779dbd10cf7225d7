"""Read-only views of a bookie's local storage, for operators (``bookkeeper shell`` commands
``lastmark``, ``readjournal``, ``readlog``, ``localconsistencycheck``). Safe to run next to a
live bookie: nothing here creates or writes anything (the index is opened read-only; LMDB admits
readers from other processes), and a path that is not a bookie's directory is refused with a
``NotABookieDirectoryError`` rather than read as an empty one."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from bookkeeper_py.errors import BKError
from bookkeeper_py.progress import SILENT, Display
from bookkeeper_py.storage.cookie import VERSION_FILE
from bookkeeper_py.storage.entry_log import (
    CorruptEntryError,
    EntryLogError,
    EntryLogger,
    log_name,
    split_location,
)
from bookkeeper_py.storage.index import LedgerIndex
from bookkeeper_py.storage.journal import RecordType, journal_name, list_journal_ids, scan
from bookkeeper_py.storage.last_log_mark import FILE_NAME as LAST_MARK_FILE
from bookkeeper_py.storage.last_log_mark import mark_file_name, read_mark
from bookkeeper_py.wire.proto import data_formats_pb2 as formats

_IDS = struct.Struct(">qq")
_LEDGER = struct.Struct(">q")


class NotABookieDirectoryError(BKError):
    """A storage tool was pointed at a path that is not a bookie's journal or ledger directory."""


def _check_directory(path: str, kind: str, key: str, looks_right: bool) -> None:
    if not os.path.exists(path):
        raise NotABookieDirectoryError(
            f"{kind} {path} does not exist; pass the bookie's {kind} ({key} in its configuration)"
        )
    if not os.path.isdir(path):
        raise NotABookieDirectoryError(f"{path} is not a directory; pass the bookie's {kind}")
    if not looks_right:
        raise NotABookieDirectoryError(
            f"{path} holds no bookie data (no cookie {VERSION_FILE}, no {kind} files); pass the "
            f"bookie's {kind} ({key} in its configuration)"
        )


def check_ledger_directory(path: str) -> None:
    """Raises ``NotABookieDirectoryError`` unless ``path`` is a bookie's ledger directory: its
    cookie, index, LastLogMark or an entry log is there."""
    marks = (VERSION_FILE, "data.mdb", LAST_MARK_FILE)
    looks_right = os.path.isdir(path) and (
        any(os.path.exists(os.path.join(path, mark)) for mark in marks)
        or any(name.endswith(".log") for name in os.listdir(path))
    )
    _check_directory(path, "ledger directory", "ledgerDirectories", looks_right)


def check_journal_directory(path: str) -> None:
    """Raises ``NotABookieDirectoryError`` unless ``path`` is a bookie's journal directory."""
    looks_right = os.path.isdir(path) and (
        os.path.exists(os.path.join(path, VERSION_FILE)) or bool(list_journal_ids(path))
    )
    _check_directory(path, "journal directory", "journalDirectories", looks_right)


def last_marks(ledger_directory: str) -> list[tuple[int, int] | None]:
    """The LastLogMark of each journal (journalDirectories, in order), as far as the marks go:
    ``lastMark``, ``lastMark.1``, ...; [None] before the first checkpoint."""
    check_ledger_directory(ledger_directory)
    marks = [read_mark(ledger_directory)]
    for index in range(1, 1000):  # bounded: a bookie has a few journal directories
        if not os.path.exists(os.path.join(ledger_directory, mark_file_name(index))):
            break
        marks.append(read_mark(ledger_directory, mark_file_name(index)))
    return marks


@dataclass(frozen=True, slots=True)
class JournalRecord:
    file_id: int
    group_end: int
    record_type: RecordType
    ledger_id: int
    entry_id: int | None
    length: int


def journal_records(journal_directory: str, file_id: int | None = None) -> Iterator[JournalRecord]:
    """Every record of one journal file (or all of them, oldest first). Does not cut torn tails."""
    check_journal_directory(journal_directory)
    ids = list_journal_ids(journal_directory) if file_id is None else [file_id]
    if file_id is not None and not os.path.exists(
        os.path.join(journal_directory, journal_name(file_id))
    ):
        present = ", ".join(f"{each:x}" for each in list_journal_ids(journal_directory))
        raise NotABookieDirectoryError(
            f"no journal file {journal_name(file_id)} in {journal_directory}; "
            f"its journal files: {present or 'none'}"
        )
    for each in ids:
        path = os.path.join(journal_directory, journal_name(each))
        for record_type, body, group_end in scan(path, is_last=False):
            ledger_id = int(_LEDGER.unpack_from(body, 0)[0]) if len(body) >= 8 else -1
            is_entry = record_type == RecordType.ENTRY and len(body) >= 16
            entry_id = int(_IDS.unpack_from(body, 0)[1]) if is_entry else None
            yield JournalRecord(each, group_end, record_type, ledger_id, entry_id, len(body))


@dataclass(frozen=True, slots=True)
class LogRecord:
    log_id: int
    offset: int
    ledger_id: int
    entry_id: int
    length: int
    body: bytes  # the entry as stored (the packaged entry the client sent)


def _entry_logger(ledger_directory: str, log_id: int) -> EntryLogger:
    """An entry logger of ``ledger_directory`` (checked) that holds entry log ``log_id``."""
    check_ledger_directory(ledger_directory)
    logger = EntryLogger(ledger_directory)
    if not os.path.exists(logger.path(log_id)):
        present = ", ".join(f"{each:x}" for each in logger.log_ids())
        raise NotABookieDirectoryError(
            f"no entry log {log_name(log_id)} in {ledger_directory}; its entry logs: "
            f"{present or 'none'}"
        )
    return logger


def log_records(ledger_directory: str, log_id: int) -> Iterator[LogRecord]:
    logger = _entry_logger(ledger_directory, log_id)
    for ledger_id, entry_id, offset, entry in logger.records(log_id):
        yield LogRecord(log_id, offset, ledger_id, entry_id, len(entry), bytes(entry))


def log_ledgers(ledger_directory: str, log_id: int) -> dict[int, int]:
    """Ledger id -> bytes of its entries in entry log ``log_id`` (BookKeeper's
    ``EntryLogMetadata``): from the log's ledgers map, or a scan of a log without one."""
    return _entry_logger(ledger_directory, log_id).ledgers_map(log_id)


def entry_files(
    journal_directories: list[str], ledger_directory: str
) -> tuple[list[str], list[str], list[str]]:
    """The paths of the journal files, entry logs and index files of a bookie's directories
    (each checked), in id order (BookKeeper's ``listfilesondisc``)."""
    for directory in journal_directories:
        check_journal_directory(directory)
    check_ledger_directory(ledger_directory)
    journals = [
        os.path.join(directory, journal_name(file_id))
        for directory in journal_directories
        for file_id in list_journal_ids(directory)
    ]
    logs = [
        os.path.join(ledger_directory, log_name(log_id))
        for log_id in EntryLogger(ledger_directory).log_ids()
    ]
    index = [
        os.path.join(ledger_directory, name)
        for name in ("data.mdb", "lock.mdb")
        if os.path.exists(os.path.join(ledger_directory, name))
    ]
    return journals, logs, index


def ledger_index_entries(
    ledger_directory: str, ledger_id: int
) -> tuple[formats.LedgerData, list[tuple[int, int, int]]]:
    """A ledger's state and (entry id, entry log id, offset) of each of its indexed entries
    (``shell ledger``); ``NotABookieDirectoryError`` when the index does not know it."""
    check_ledger_directory(ledger_directory)
    if not os.path.exists(os.path.join(ledger_directory, "data.mdb")):
        raise NotABookieDirectoryError(f"{ledger_directory} has no entry-location index (data.mdb)")
    index = LedgerIndex(ledger_directory, readonly=True)
    try:
        state = index.ledger(ledger_id)
        if state is None:
            raise NotABookieDirectoryError(
                f"ledger {ledger_id} is not in the index of {ledger_directory} (never stored "
                "here, or collected)"
            )
        entries = [
            (entry_id, *split_location(location)) for entry_id, location in index.entries(ledger_id)
        ]
    finally:
        index.close()
    return state, entries


@dataclass
class ConsistencyReport:
    ledgers: int = 0
    entries: int = 0
    problems: list[str] | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def local_consistency_check(ledger_directory: str, progress: Display = SILENT) -> ConsistencyReport:
    """Reads every indexed entry from its entry log and checks it: present, checksum, ids.
    ``progress`` shows the entries checked."""
    check_ledger_directory(ledger_directory)
    if not os.path.exists(os.path.join(ledger_directory, "data.mdb")):
        raise NotABookieDirectoryError(
            f"{ledger_directory} has no entry-location index (data.mdb): nothing to check"
        )
    report = ConsistencyReport(problems=[])
    assert report.problems is not None
    index = LedgerIndex(ledger_directory, readonly=True)
    logger = EntryLogger(ledger_directory)
    checked = progress.task("checking entries", index.counts()[1], "entries")
    try:
        for ledger_id in index.ledger_ids():
            report.ledgers += 1
            for entry_id, location in index.entries(ledger_id):
                report.entries += 1
                checked.advance()
                try:
                    logger.read(location, ledger_id, entry_id)
                except (CorruptEntryError, EntryLogError) as error:
                    log_id, offset = split_location(location)
                    report.problems.append(
                        f"ledger {ledger_id} entry {entry_id} (log {log_id:x} offset {offset}): {error}"
                    )
    finally:
        checked.close()
        logger.close()
        index.close()
    return report
