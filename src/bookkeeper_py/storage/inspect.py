"""Read-only views of a bookie's local storage, for operators (``bookkeeper shell`` commands
``lastmark``, ``readjournal``, ``readlog``, ``localconsistencycheck``). Safe to run next to a
live bookie: nothing here writes, and LMDB admits readers from other processes."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from bookkeeper_py.storage.entry_log import (
    CorruptEntryError,
    EntryLogError,
    EntryLogger,
    split_location,
)
from bookkeeper_py.storage.index import LedgerIndex
from bookkeeper_py.storage.journal import RecordType, journal_name, list_journal_ids, scan
from bookkeeper_py.storage.last_log_mark import read_mark

_IDS = struct.Struct(">qq")
_LEDGER = struct.Struct(">q")


def last_mark(ledger_directory: str) -> tuple[int, int] | None:
    return read_mark(ledger_directory)


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
    ids = list_journal_ids(journal_directory) if file_id is None else [file_id]
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


def log_records(ledger_directory: str, log_id: int) -> Iterator[LogRecord]:
    logger = EntryLogger(ledger_directory)
    for ledger_id, entry_id, offset, entry in logger.records(log_id):
        yield LogRecord(log_id, offset, ledger_id, entry_id, len(entry))


@dataclass
class ConsistencyReport:
    ledgers: int = 0
    entries: int = 0
    problems: list[str] | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def local_consistency_check(ledger_directory: str) -> ConsistencyReport:
    """Reads every indexed entry from its entry log and checks it: present, checksum, ids."""
    report = ConsistencyReport(problems=[])
    assert report.problems is not None
    index = LedgerIndex(ledger_directory)
    logger = EntryLogger(ledger_directory)
    try:
        for ledger_id in index.ledger_ids():
            report.ledgers += 1
            for entry_id, location in index.entries(ledger_id):
                report.entries += 1
                try:
                    logger.read(location, ledger_id, entry_id)
                except (CorruptEntryError, EntryLogError) as error:
                    log_id, offset = split_location(location)
                    report.problems.append(
                        f"ledger {ledger_id} entry {entry_id} (log {log_id:x} offset {offset}): {error}"
                    )
    finally:
        logger.close()
        index.close()
    return report
