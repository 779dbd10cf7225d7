"""Checking and rebuilding a stopped bookie's LMDB index from its entry logs and journals
(BookKeeper's ``check-db-ledgers-index``, ``rebuild-db-ledger-locations-index`` and
``rebuild-db-ledgers-index``).

* Entry locations come from a scan of every entry log, oldest first: compaction copies live
  entries into newer logs, so the newest record of an entry is where it lives now. Entries of
  ledgers deleted but not yet collected come back too; garbage collection removes them again.
* Ledger states come from the ledgers the entry logs and the journal files hold: each exists
  and is fenced (as BookKeeper's rebuild makes them: a writer whose ledger state was lost must
  not go on writing), with the master key, fence and explicit LAC of its journal records where
  the journal still has them, else an empty master key (the next recovery add sets it).
* The new index is built beside the old one and swapped in; the old one is kept in
  ``index-prev-<time>/`` (delete it once the bookie runs well). The bookie's directory locks are
  held throughout: a running bookie is refused.
"""

from __future__ import annotations

import os
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bookkeeper_py.errors import BKError
from bookkeeper_py.progress import SILENT, Display, Task
from bookkeeper_py.storage.disk import DirectoryLocks
from bookkeeper_py.storage.entry_log import EntryLogger, location_of
from bookkeeper_py.storage.files import fsync_directory
from bookkeeper_py.storage.index import LedgerIndex, LedgerIndexError
from bookkeeper_py.storage.inspect import check_journal_directory, check_ledger_directory
from bookkeeper_py.storage.journal import (
    CorruptJournalError,
    RecordType,
    journal_name,
    list_journal_ids,
    scan,
)
from bookkeeper_py.wire.proto import data_formats_pb2 as formats

INDEX_FILES = ("data.mdb", "lock.mdb")
_LEDGER = struct.Struct(">q")
_COMMIT_ENTRIES = 100_000  # locations written per LMDB commit while rebuilding


class IndexRebuildError(BKError):
    """The index could not be checked or rebuilt (what and why in the message)."""


@dataclass
class IndexReport:
    ledgers: int = 0
    entries: int = 0
    entry_logs: int = 0
    journal_files: int = 0
    previous: str | None = None  # where the replaced index was moved
    problems: list[str] = field(default_factory=list)


def check_ledgers_index(ledger_directory: str, progress: Display = SILENT) -> IndexReport:
    """Reads every ledger state of the index (``check-db-ledgers-index``): each must parse and
    say the ledger exists; the problems found are listed, nothing is changed. ``progress``
    shows the ledgers read."""
    check_ledger_directory(ledger_directory)
    if not os.path.exists(os.path.join(ledger_directory, "data.mdb")):
        raise IndexRebuildError(
            f"{ledger_directory} has no index (data.mdb): rebuild it "
            "(rebuild-db-ledgers-index, rebuild-db-ledger-locations-index)"
        )
    report = IndexReport()
    index = LedgerIndex(ledger_directory, readonly=True)
    checked = progress.task("checking ledger states", index.counts()[0], "ledgers")
    try:
        for ledger_id in index.ledger_ids():
            report.ledgers += 1
            checked.advance()
            try:
                state = index.ledger(ledger_id)
            except Exception as error:  # protobuf's DecodeError, or a torn value
                report.problems.append(f"ledger {ledger_id}: unreadable state ({error})")
                continue
            if state is None or not state.exists:
                report.problems.append(f"ledger {ledger_id}: state says it does not exist")
    finally:
        checked.close()
        index.close()
    return report


def _log_locations(
    logger: EntryLogger, report: IndexReport, steps: Callable[[str], None], progress: Display
) -> dict[int, dict[int, int]]:
    """ledger -> entry -> location of the newest record of each entry, from every entry log."""
    found: dict[int, dict[int, int]] = {}
    log_ids = sorted(logger.log_ids())
    total = sum(logger.file_size(log_id) for log_id in log_ids)
    with progress.task("scanning entry logs", total, "bytes") as scanned:
        for log_id in log_ids:
            report.entry_logs += 1
            at = 0  # bytes of this log counted so far
            for ledger_id, entry_id, offset, _ in logger.records(log_id):
                found.setdefault(ledger_id, {})[entry_id] = location_of(log_id, offset)
                scanned.advance(offset - at)
                at = offset
            scanned.advance(logger.file_size(log_id) - at)
            steps(f"entry log {log_id:x} scanned")
    return found


def _journal_states(
    journal_directories: list[str], report: IndexReport
) -> dict[int, formats.LedgerData]:
    """The ledger states the journal files still tell (master key, fence, explicit LAC)."""
    states: dict[int, formats.LedgerData] = {}
    for directory in journal_directories:
        ids = list_journal_ids(directory)
        for position, file_id in enumerate(ids):
            report.journal_files += 1
            path = os.path.join(directory, journal_name(file_id))
            try:
                for record_type, body, _ in scan(path, is_last=False):
                    if len(body) < 8:
                        continue  # no record this journal writes
                    ledger_id = int(_LEDGER.unpack_from(body, 0)[0])
                    state = states.setdefault(ledger_id, _fresh_state())
                    if record_type == RecordType.MASTER_KEY:
                        state.masterKey = body[8:]
                    elif record_type == RecordType.EXPLICIT_LAC:
                        state.explicitLac = body[8:]
            except CorruptJournalError as error:
                if position != len(ids) - 1:
                    report.problems.append(f"{path}: {error}; its later records were skipped")
                # the newest file's torn tail is where its records end
    return states


def _fresh_state() -> formats.LedgerData:
    return formats.LedgerData(exists=True, fenced=True, masterKey=b"")


def rebuild_index(
    ledger_directory: str,
    journal_directories: list[str],
    *,
    locations: bool,
    ledgers: bool,
    steps: Callable[[str], None] = lambda line: None,
    owns: Callable[[int], bool] = lambda ledger_id: True,
    progress: Display = SILENT,
) -> IndexReport:
    """Builds a new index with the entry locations (``locations``) and ledger states
    (``ledgers``) made from the entry logs and journals, the other part copied from the index
    there (if it reads), and swaps it in (see the module). ``owns(ledger)``: whether this
    directory keeps that ledger (a bookie with several ledger directories: the journals hold
    all of theirs). ``steps`` hears a line per step done, ``progress`` shows the bytes of entry
    logs scanned and the entry locations written. Returns what it found."""
    check_ledger_directory(ledger_directory)
    for directory in journal_directories:
        check_journal_directory(directory)
    locks = DirectoryLocks({"tool": "index rebuild"})
    locks.acquire_all(
        [
            *(
                (directory, "journal directory (journalDirectories)")
                for directory in journal_directories
            ),
            (ledger_directory, "ledger directory (ledgerDirectories)"),
        ]
    )
    try:
        return _rebuild(
            ledger_directory, journal_directories, locations, ledgers, steps, owns, progress
        )
    finally:
        locks.release()


def _old_index(ledger_directory: str) -> LedgerIndex | None:
    if not os.path.exists(os.path.join(ledger_directory, "data.mdb")):
        return None
    try:
        return LedgerIndex(ledger_directory, readonly=True)
    except LedgerIndexError:
        return None


def _rebuild(
    ledger_directory: str,
    journal_directories: list[str],
    locations: bool,
    ledgers: bool,
    steps: Callable[[str], None],
    owns: Callable[[int], bool],
    progress: Display,
) -> IndexReport:
    report = IndexReport()
    old = _old_index(ledger_directory)
    if old is None and not (locations and ledgers):
        kept = "ledger states" if locations else "entry locations"
        raise IndexRebuildError(
            f"the index in {ledger_directory} is missing or unreadable, so its {kept} cannot be "
            "kept: rebuild both (rebuild-db-ledgers-index and "
            "rebuild-db-ledger-locations-index together: --all)"
        )
    logger = EntryLogger(ledger_directory)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    temp = os.path.join(ledger_directory, f"index-rebuild-{stamp}")
    os.makedirs(temp)
    try:
        found = _log_locations(logger, report, steps, progress) if (locations or ledgers) else {}
        new = LedgerIndex(temp)
        try:
            if ledgers:
                states = {
                    ledger_id: state
                    for ledger_id, state in _journal_states(journal_directories, report).items()
                    if owns(ledger_id)
                }
                for ledger_id in found:
                    states.setdefault(ledger_id, _fresh_state())
                steps(f"{len(states)} ledgers found")
            else:
                assert old is not None
                states = {}
                for ledger_id in old.ledger_ids():
                    state = old.ledger(ledger_id)
                    if state is not None:
                        states[ledger_id] = state
            report.ledgers = len(states)
            new.commit([], sorted(states.items()))
            if locations:
                runs = ((ledger_id, found[ledger_id]) for ledger_id in sorted(found))
                total = sum(map(len, found.values()))
            else:
                assert old is not None
                runs = ((ledger_id, dict(old.entries(ledger_id))) for ledger_id in old.ledger_ids())
                total = old.counts()[1]
            with progress.task("writing entry locations", total, "entries") as written:
                report.entries = _write_locations(new, runs, written)
        finally:
            new.close()
        if old is not None:
            old.close()
            old = None
        report.previous = _swap(ledger_directory, temp, stamp)
    except BaseException:
        if old is not None:
            old.close()
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return report


def _write_locations(
    index: LedgerIndex, runs: Iterator[tuple[int, dict[int, int]]], progress: Task
) -> int:
    written = 0
    batch: list[tuple[int, list[int], list[int]]] = []
    pending = 0
    for ledger_id, entries in runs:
        ids = sorted(entries)
        batch.append((ledger_id, ids, [entries[entry_id] for entry_id in ids]))
        pending += len(ids)
        if pending >= _COMMIT_ENTRIES:
            index.commit(batch, [])
            written += pending
            progress.advance(pending)
            batch, pending = [], 0
    if batch:
        index.commit(batch, [])
        written += pending
        progress.advance(pending)
    return written


def _swap(ledger_directory: str, temp: str, stamp: str) -> str | None:
    """Moves the old index files to ``index-prev-<stamp>/`` and the new ones into place."""
    previous = os.path.join(ledger_directory, f"index-prev-{stamp}")
    moved = False
    for name in INDEX_FILES:
        path = os.path.join(ledger_directory, name)
        if os.path.exists(path):
            os.makedirs(previous, exist_ok=True)
            os.replace(path, os.path.join(previous, name))
            moved = True
    for name in INDEX_FILES:
        source = os.path.join(temp, name)
        if os.path.exists(source):
            os.replace(source, os.path.join(ledger_directory, name))
    os.rmdir(temp)
    fsync_directory(ledger_directory)
    return previous if moved else None
