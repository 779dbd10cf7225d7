"""The bookie's storage engine: journal + write cache + entry logs + index + checkpoints.

Write path (reference 1.11): an add goes into ledger storage (the write cache) first, then into
the journal; the caller is told once the journal record is durable. Meta-records (master key,
fence, explicit LAC, force) go through the journal the same way.

Checkpoint (the "sync thread" of the seeds), every ``flush_interval_s`` or when the write cache
passes half its size:

1. record the journal position (the LastLogMark candidate);
2. swap the write cache, write its entries to the entry log sorted by ledger and entry, fsync the
   log, commit their locations and the changed ledger states to the index;
3. persist the mark atomically;
4. delete journal files older than the mark.

At start the journal is replayed from the persisted mark into the write cache, restoring entries,
master keys, fence state and explicit LACs; the first checkpoint then writes them out. A failed
checkpoint or journal write stops the engine from taking writes (``failure``), never pretending.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from bookkeeper_py.metrics import Metrics, NullMetrics, OpStats, read_attribute
from bookkeeper_py.progress import Display, logged
from bookkeeper_py.storage.gc import GarbageCollector, GcConfig, LedgerExists, ListLedgers
from bookkeeper_py.storage.journal import (
    FILE_HEADER,
    Callback,
    Journal,
    JournalStats,
    RecordType,
    journal_name,
    list_journal_ids,
    replay,
)
from bookkeeper_py.storage.last_log_mark import mark_file_name, read_mark, write_mark
from bookkeeper_py.storage.ledger_storage import LedgerInfo, LedgerStorage

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger(__name__)


def _journal_sizes_after(directory: str, mark: tuple[int, int] | None) -> dict[int, int]:
    """file id -> bytes to replay of each journal file at or after ``mark`` (an estimate: a
    file's preallocated tail counts too)."""
    first, offset = mark if mark is not None else (-1, 0)
    sizes = {}
    for file_id in list_journal_ids(directory):
        if file_id < first:
            continue
        try:
            size = os.path.getsize(os.path.join(directory, journal_name(file_id)))
        except OSError:
            continue  # replay reports what it cannot read
        sizes[file_id] = max(0, size - offset) if file_id == first else size
    return sizes


_LEDGER_ID = struct.Struct(">q")
# A checkpoint asked for is paced over this share of the time since the last one began.
REQUESTED_PACE_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """Storage settings (``bk_server.conf`` names in the comments)."""

    journal_directory: str  # journalDirectories (the first)
    ledger_directory: str  # ledgerDirectories (the first)
    extra_journal_directories: tuple[str, ...] = ()  # journalDirectories (the others)
    extra_ledger_directories: tuple[str, ...] = ()  # ledgerDirectories (the others)
    journal_max_size_bytes: int = 2048 * 1024 * 1024  # journalMaxSizeMB
    journal_buffered_writes_threshold: int = 512 * 1024  # journalBufferedWritesThreshold
    journal_max_group_wait_s: float = (
        0.0  # journalMaxGroupWaitMSec (BookKeeper: 2 ms; see journal.py)
    )
    journal_preallocate_bytes: int = 16 * 1024 * 1024  # journalPreAllocSizeMB
    journal_sync_data: bool = True  # journalSyncData
    # journalRemoveFromPageCache: drop the journal's pages from the page cache once synced
    journal_remove_from_page_cache: bool = True
    log_size_limit: int = 1024**3  # logSizeLimit
    # flushEntrylogBytes (BookKeeper: 0, only at checkpoints; here 1 MiB: see entry_log.py)
    flush_entrylog_bytes: int = 1024 * 1024
    # ours: drop the active entry log's pages from the page cache once synced (entry_log.py)
    entry_log_remove_from_page_cache: bool = True
    # dbStorage_directIOEntryLogger (BookKeeper: false, another file format there; here the same
    # format): entry logs written with O_DIRECT, where the file system takes it (entry_log.py)
    entry_log_direct_writes: bool = True
    # checkpointPace (ours): a periodic checkpoint spreads its entry-log writes over this
    # fraction of flushInterval, so that the journal's fsyncs are not queued behind it; 0: at
    # full speed. A checkpoint of a write cache half full always runs at full speed.
    checkpoint_pace: float = 0.5
    write_cache_max_bytes: int = 256 * 1024 * 1024  # dbStorage_writeCacheMaxSizeMb
    flush_interval_s: float = 10.0  # flushInterval (ms in bk_server.conf)
    ledger_cache_size: int = 100_000  # ledger states kept in memory

    @property
    def journal_directories(self) -> tuple[str, ...]:
        return (self.journal_directory, *self.extra_journal_directories)

    @property
    def ledger_directories(self) -> tuple[str, ...]:
        return (self.ledger_directory, *self.extra_ledger_directories)


class LedgerEngine(Protocol):
    """What a bookie's request handling (``server.bookie.Bookie``) needs of its storage. The
    real ``StorageEngine`` and the simulator's ``testing.sim.engine.SimEngine`` implement it and
    pass one conformance suite (``tests/storage/test_engine_conformance.py``).

    Writes are taken at once and made durable in groups: ``add_entry``, ``fence``,
    ``set_explicit_lac`` and ``force`` carry a ``token`` that the engine hands back, in a list,
    to the durability callback it was made with (``callback(tokens, error)``) once the record is
    durable (``error`` None) or could not be made so. Reads see every write taken, durable or
    not. ``read(ledger, -1)`` is the last entry held; ``NoLedgerError`` / ``NoEntryError`` /
    ``StorageIOError`` tell absence from failure."""

    def start(self) -> int:
        """Brings back what was durable (replay); the number of records replayed."""
        ...

    def close(self) -> None: ...

    def write_journals_on(
        self,
        loop: asyncio.AbstractEventLoop,
        inline_ok: Callable[[], bool],
        call_on_loop: Callable[[Callable[[], Any]], Any],
    ) -> None:
        """Before ``start``: the journals are written by ``loop`` (the thread that takes the
        writes, the bookie's), each with a syncer thread that only syncs; ``inline_ok()`` says
        whether an idle journal's group may be synced on the loop too, ``call_on_loop(call)``
        runs ``call`` there from any thread and waits for it. The durability callback then
        runs on the loop."""
        ...

    @property
    def failure(self) -> Exception | None:
        """Why the engine takes no more writes, if it does not."""
        ...

    def add_entries(
        self, ledger_id: int, entry_ids: list[int], entries: list[bytes], token: Any
    ) -> None:
        """Stores entries of one ledger that arrived together (foreground adds, ids
        increasing); ``token`` comes back once every one of them is durable."""
        ...

    @property
    def write_cache_full(self) -> bool: ...

    def ledger(self, ledger_id: int) -> LedgerInfo | None: ...

    def create_ledger(self, ledger_id: int, master_key: bytes) -> LedgerInfo: ...

    def key_matches(self, info: LedgerInfo, master_key: bytes) -> bool:
        """Constant-time comparison of a presented master key with the stored one."""
        ...

    def add_entry(
        self, ledger_id: int, entry_id: int, entry: bytes, token: Any, background: bool = False
    ) -> None:
        """Stores an entry; ``token`` comes back once it is durable. A ``background`` entry (a
        re-replication copy) may wait behind the others for its journal write."""
        ...

    def fence(self, ledger_id: int, token: Any) -> None: ...

    def set_explicit_lac(self, ledger_id: int, body: bytes, token: Any) -> None: ...

    def force(self, ledger_id: int, token: Any) -> None:
        """``token`` comes back once every write of the ledger taken before it is durable."""
        ...

    def read(self, ledger_id: int, entry_id: int, nowait: bool = False) -> bytes:
        """The entry; with ``nowait``, ``ReadWouldBlockError`` if reading it waits for a disk."""
        ...

    def read_run(self, ledger_id: int) -> AbstractContextManager[None]:
        """A run of reads of ``ledger_id`` on this thread (a batch a bookie serves together):
        the storage may share work between them (one index transaction)."""
        ...

    def read_range(self, ledger_id: int, first: int, max_count: int, max_bytes: int) -> list[bytes]:
        """Entries ``first``, ``first + 1``, ... (a batch read): at most ``max_count``, as many
        as fit in ``max_bytes`` counting 4 bytes more per entry, the first in any case; raises
        as ``read`` does for the first, stops before the first later entry it cannot read."""
        ...

    def read_many(
        self, ledger_id: int, entry_ids: list[int], start: int, nowait: bool = False
    ) -> list[bytes]:
        """Entries ``entry_ids[start]``, ... (increasing ids), as many from the start as the
        storage serves together, maybe none (the next is then read with ``read``); with
        ``nowait``, without waiting for a disk."""
        ...

    def entry_ids(self, ledger_id: int) -> Iterator[int]:
        """The entry ids held of the ledger, increasing (repeats possible)."""
        ...

    # -- the disks under it (the bookie's disk checks) --

    lost_journal_tails: list[str]  # journal damage found by ``start``: records possibly lost

    @property
    def out_of_space(self) -> bool:
        """Whether the last write ran out of disk space."""
        ...

    def space_freed(self) -> None:
        """The disk has room again: writes may be tried again."""
        ...

    def reclaim_journal_space(self, directories: Iterable[str]) -> None:
        """Journal directories filling up: give their space back soon."""
        ...


class StorageEngine:
    """Durable ledger storage for one bookie (a ``LedgerEngine``)."""

    def __init__(
        self, config: StorageConfig, on_durable: Callback, metrics: Metrics | None = None
    ) -> None:
        self.config = config
        self.metrics: Metrics = metrics or NullMetrics()
        self._checkpoint_stats = self.metrics.op_stats(
            "bookie_CHECKPOINT", "checkpoint latency (s)"
        )
        for directory in config.journal_directories:
            os.makedirs(directory, exist_ok=True)
        # One ledger storage (entry logs and index) per ledger directory; a ledger lives in
        # directory ledgerId mod n, as in BookKeeper's DbLedgerStorage.
        self.storages: list[LedgerStorage] = []
        for directory in config.ledger_directories:
            os.makedirs(directory, exist_ok=True)
            self.storages.append(
                LedgerStorage(
                    directory,
                    log_size_limit=config.log_size_limit,
                    flush_entrylog_bytes=config.flush_entrylog_bytes,
                    ledger_cache_size=config.ledger_cache_size,
                    remove_from_page_cache=config.entry_log_remove_from_page_cache,
                    direct_writes=config.entry_log_direct_writes,
                )
            )
        # One journal (and syncer or journal thread) per directory; a ledger always uses the same
        # one, so its records keep their order.
        self._reclaiming: set[str] = set()  # journals rolled, waiting for a checkpoint
        self._checkpoint_requested = threading.Event()
        self.journals = [
            Journal(
                directory,
                on_durable,
                max_file_size=config.journal_max_size_bytes,
                buffered_writes_threshold=config.journal_buffered_writes_threshold,
                sync_data=config.journal_sync_data,
                preallocate_bytes=config.journal_preallocate_bytes,
                max_group_wait_s=config.journal_max_group_wait_s,
                on_rolled=self.request_checkpoint,
                remove_from_page_cache=config.journal_remove_from_page_cache,
                stats=JournalStats.of(self.metrics, {"journalIndex": str(index)}),
            )
            for index, directory in enumerate(config.journal_directories)
        ]
        self._stopping = threading.Event()
        self._pace_s = config.flush_interval_s * config.checkpoint_pace
        self._sync_thread: threading.Thread | None = None
        self._checkpoint_failure: Exception | None = None
        self._hurry_next = False  # the next checkpoint goes at full speed (journal space)
        self._checkpoint_lock = threading.Lock()  # one engine checkpoint at a time
        self.last_marks: list[tuple[int, int] | None] = [None] * len(self.journals)
        self.checkpoints = 0
        self.replayed_records = 0
        # Journal damage replay cut off or found missing: records this bookie may have
        # acknowledged are gone, so its answers of absence cannot be trusted until repaired.
        self.lost_journal_tails: list[str] = []
        self.gcs: list[GarbageCollector] = []  # one per ledger directory, once started
        self._gc_runtimes: list[OpStats] = []  # the time of each one's rounds
        # Per journal (BookKeeper's journalIndex label) and per ledger directory (its ledgerDir
        # and indexDir labels: one DbLedgerStorage each there, one LedgerStorage here).
        for index, journal in enumerate(self.journals):
            labels = {"journalIndex": str(index)}
            self.metrics.gauge_function(
                "bookie_journal_JOURNAL_QUEUE_SIZE",
                "records queued for the journal",
                partial(read_attribute, journal, "queued"),
                labels,
            )
            self.metrics.gauge_function(
                "bookie_journal_JOURNAL_FORCE_WRITE_QUEUE_SIZE",
                "records written to the journal and waiting for their sync",
                partial(read_attribute, journal, "unsynced_records"),
                labels,
            )
        for index, storage in enumerate(self.storages):
            self._directory_metrics(index, storage)

    def _directory_metrics(self, index: int, storage: LedgerStorage) -> None:
        """The metrics of ledger directory ``index``: BookKeeper's DbLedgerStorage and GC names
        (dashboards read these), labelled as there."""
        labels = {"ledgerDir": storage.directory, "indexDir": storage.directory}
        gauge = self.metrics.gauge_function
        gauge(
            "bookie_write_cache_size",
            "bytes in the write cache",
            lambda: float(storage.cached_bytes()),
            labels,
        )
        gauge(
            "bookie_read_cache_size",
            "bytes in a read cache: none here (reads go through the page cache): 0",
            lambda: 0.0,
            labels,
        )
        gauge("bookie_ledgers_count", "ledgers in the index", storage.ledger_count, labels)
        gauge(
            "bookie_entries_count",
            "entry locations in the index",
            lambda: float(storage.index.counts()[1]),
            labels,
        )
        self._gc_runtimes.append(
            self.metrics.op_stats(
                "bookie_THREAD_RUNTIME",
                "garbage collection rounds: their time (s)",
                labels=labels,
            )
        )
        for name, field_name in (
            ("bookie_RECLAIMED_DELETION_SPACE_BYTES", "reclaimed_deletion_bytes"),
            ("bookie_RECLAIMED_COMPACTION_SPACE_BYTES", "reclaimed_compaction_bytes"),
            ("bookie_MAJOR_COMPACTION_TOTAL", "major_compactions"),
            ("bookie_MINOR_COMPACTION_TOTAL", "minor_compactions"),
            ("bookie_DELETED_LEDGER_TOTAL", "ledgers_deleted"),
            # its name before BookKeeper 4.16, which older dashboards read
            ("bookie_DELETED_LEDGER_COUNT", "ledgers_deleted"),
        ):
            self.metrics.counter_function(
                name,
                f"garbage collection: {field_name}",
                self._gc_figure(index, field_name),
                labels,
            )

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, progress: Display | None = None) -> int:
        """Replays the journal from the LastLogMark, opens a new journal file, starts the sync
        thread. Returns the number of journal records replayed. ``progress`` (default: log
        lines every few seconds) shows the journal bytes replayed of those after the mark."""
        shown = logged(log) if progress is None else progress
        replayed = 0
        for index, journal in enumerate(self.journals):
            mark = self._read_mark(index)
            self.last_marks[index] = mark
            replayed += self._replay(journal.directory, mark, shown)
        for journal in self.journals:
            ids = list_journal_ids(journal.directory)
            journal.open((ids[-1] + 1) if ids else 0)
        if replayed or any(mark is None for mark in self.last_marks):
            # What was replayed goes to the entry logs now, and a mark always exists from the
            # first start on: a journal file then missing after it is known to be lost.
            self.checkpoint()
        log.info(
            "storage started: replayed %d journal records from marks %s of %d journal(s)",
            replayed,
            self.last_marks,
            len(self.journals),
        )
        self._sync_thread = threading.Thread(target=self._sync_loop, name="checkpoint", daemon=True)
        self._sync_thread.start()
        self.replayed_records = replayed
        return replayed

    def _replay(self, directory: str, mark: tuple[int, int] | None, progress: Display) -> int:
        """Replays one journal directory from ``mark``; the number of records."""
        sizes = _journal_sizes_after(directory, mark)
        replayed = 0  # (replay runs even with no file left: it finds the mark's file missing)
        # Bytes of the journal files before the one being read, from the mark on.
        before = {file_id: sum(sizes[f] for f in sizes if f < file_id) for file_id in sizes}
        start = mark[1] if mark is not None else 0
        task = progress.task(f"replaying journal {directory}", sum(sizes.values()), "bytes")
        with task:
            at = 0
            for record_type, body, file_id, offset in replay(directory, mark, self._tail_lost):
                self._apply(record_type, body)
                replayed += 1
                if self.write_cache_bytes > self.config.write_cache_max_bytes // 2:
                    for storage in self.storages:  # bound memory during a long replay
                        storage.checkpoint()  # (the marks stay)
                position = before.get(file_id, at) + offset
                if mark is not None and file_id == mark[0]:
                    position -= start
                task.advance(max(0, position - at))
                at = max(at, position)
        return replayed

    def _tail_lost(self, path: str, offset: int, problem: str) -> None:
        what = f"{path}: {problem}" if offset < 0 else f"{path} at offset {offset}: {problem}"
        self.lost_journal_tails.append(what)

    def _read_mark(self, journal_index: int) -> tuple[int, int] | None:
        """The journal's LastLogMark: each ledger directory keeps a copy (written after every
        directory's checkpoint); the oldest one counts, and none if one directory has none (a
        directory whose copy was never written would otherwise skip records it lacks)."""
        marks = [
            read_mark(directory, mark_file_name(journal_index))
            for directory in self.config.ledger_directories
        ]
        if any(mark is None for mark in marks):
            return None
        return min(mark for mark in marks if mark is not None)

    @property
    def storage(self) -> LedgerStorage:
        """The first ledger directory's storage (for tools and tests of one directory; the
        engine routes by ledger: ``storage_for``)."""
        return self.storages[0]

    def storage_for(self, ledger_id: int) -> LedgerStorage:
        return self.storages[ledger_id % len(self.storages)]

    @property
    def write_cache_bytes(self) -> int:
        """Bytes in the write caches (being flushed included), over the directories."""
        total = 0
        for storage in self.storages:
            total += storage.cached_bytes()
        return total

    def _apply(self, record_type: RecordType, body: bytes) -> None:
        ledger_id = int(_LEDGER_ID.unpack_from(body, 0)[0])
        storage = self.storage_for(ledger_id)
        if record_type == RecordType.MASTER_KEY:
            storage.add_ledger(ledger_id, bytes(body[8:28]))
        elif record_type == RecordType.FENCE:
            info = storage.ledger(ledger_id)
            if info is not None and not info.fenced:
                info.fenced = True
                storage.mark_dirty(ledger_id)
        elif record_type == RecordType.EXPLICIT_LAC:
            info = storage.ledger(ledger_id)
            if info is not None:
                info.explicit_lac = bytes(body[8:])
                storage.mark_dirty(ledger_id)
        elif record_type == RecordType.ENTRY:
            entry_id = int(_LEDGER_ID.unpack_from(body, 8)[0])
            storage.add_entry(ledger_id, entry_id, bytes(body))

    def _gc_figure(self, index: int, field_name: str) -> Callable[[], float]:
        """A figure of directory ``index``'s garbage collector (0 until it starts)."""
        return lambda: (
            float(getattr(self.gcs[index].stats, field_name)) if index < len(self.gcs) else 0.0
        )

    @property
    def gc(self) -> GarbageCollector | None:
        """The first ledger directory's garbage collector (None until started)."""
        return self.gcs[0] if self.gcs else None

    def start_gc(
        self, list_ledgers: ListLedgers, ledger_exists: LedgerExists, config: GcConfig
    ) -> list[GarbageCollector]:
        """Starts a garbage collection thread per ledger directory (they need the metadata
        store, so the bookie starts them once connected)."""
        self.gcs = [
            GarbageCollector(
                storage, list_ledgers, ledger_exists, config, runtime=self._gc_runtimes[index]
            )
            for index, storage in enumerate(self.storages)
        ]
        for gc in self.gcs:
            gc.start()
        return self.gcs

    def close(self) -> None:
        """Stops GC and the sync thread, syncs the journal, and checkpoints everything so a
        restart replays nothing; entry logs end on a whole record."""
        for gc in self.gcs:
            gc.close()
        self._stopping.set()
        for storage in self.storages:
            storage.hurry()
        self._checkpoint_requested.set()
        if self._sync_thread is not None:
            self._sync_thread.join()
            self._sync_thread = None
        for journal in self.journals:
            journal.close()
        if all(journal.failure is None for journal in self.journals):
            try:
                self.checkpoint()
            except Exception:
                log.exception(
                    "final checkpoint failed; the journal will be replayed at the next start"
                )
        for storage in self.storages:
            storage.close()

    @property
    def out_of_space(self) -> bool:
        """Whether the last journal write or checkpoint ran out of disk space."""
        failure = self._checkpoint_failure
        checkpoint_full = isinstance(failure, OSError) and failure.errno == errno.ENOSPC
        return checkpoint_full or any(journal.out_of_space for journal in self.journals)

    def reclaim_journal_space(self, directories: Iterable[str]) -> None:
        """The disks of ``directories`` are filling: each journal there that holds records in its
        current file starts a new one, and a checkpoint is asked for, which then deletes the
        older files. Once per checkpoint, however often it is asked."""
        wanted = set(directories)
        requested = False
        for journal in self.journals:
            _, size = journal.position
            if (
                journal.directory in wanted
                and size > FILE_HEADER.size
                and journal.directory not in self._reclaiming
            ):
                self._reclaiming.add(journal.directory)  # until a checkpoint has run
                log.info(
                    "journal disk %s is filling: starting a new journal file so that the next "
                    "checkpoint frees the current one",
                    journal.directory,
                )
                journal.request_roll()
                requested = True
        if requested:
            self._hurry_next = True
            self._checkpoint_requested.set()

    def space_freed(self) -> None:
        """The disk check saw usage fall below the low-water mark: forget past out-of-space errors
        (a read-only bookie gets no writes that could clear them); a new one sets them again."""
        for journal in self.journals:
            journal.out_of_space = False

    @property
    def failure(self) -> Exception | None:
        """Why the engine takes no more writes, if it does not."""
        for journal in self.journals:
            if journal.failure is not None:
                return journal.failure
        return self._checkpoint_failure

    def journal_for(self, ledger_id: int) -> Journal:
        return self.journals[ledger_id % len(self.journals)]

    # -- writes --------------------------------------------------------------------------------

    def ledger(self, ledger_id: int) -> LedgerInfo | None:
        return self.storage_for(ledger_id).ledger(ledger_id)

    def create_ledger(self, ledger_id: int, master_key: bytes) -> LedgerInfo:
        """Records a new ledger's master key (journaled; no completion is reported for it)."""
        info = self.storage_for(ledger_id).add_ledger(ledger_id, master_key)
        self.journal_for(ledger_id).append(
            RecordType.MASTER_KEY, _LEDGER_ID.pack(ledger_id) + master_key, None
        )
        return info

    def add_entries(
        self, ledger_id: int, entry_ids: list[int], entries: list[bytes], token: Any
    ) -> None:
        """Stores entries of one ledger that arrived together (foreground adds); ``token`` is
        reported once the last one, and so every one, is durable. One write-cache lock and one
        journal hand-off for them all."""
        self.storage_for(ledger_id).add_entries(ledger_id, entry_ids, entries)
        self.journal_for(ledger_id).append_entries(entries, token)
        self._mind_write_cache()

    def add_entry(
        self, ledger_id: int, entry_id: int, entry: bytes, token: Any, background: bool = False
    ) -> None:
        self.storage_for(ledger_id).add_entry(ledger_id, entry_id, entry)
        self.journal_for(ledger_id).append(RecordType.ENTRY, entry, token, background)
        self._mind_write_cache()

    def write_journals_on(
        self,
        loop: asyncio.AbstractEventLoop,
        inline_ok: Callable[[], bool],
        call_on_loop: Callable[[Callable[[], Any]], Any],
    ) -> None:
        for journal in self.journals:
            journal.write_on(loop, inline_ok, call_on_loop)

    def _mind_write_cache(self) -> None:
        """After adds: a write cache over half full asks for a checkpoint (the next one, if one
        runs); over three quarters (counting what the running checkpoint still flushes), the
        running one, if paced, is hurried so that it keeps up. (Hurrying at half, as this did,
        hurried every checkpoint the cache asked for at once: the bytes it flushes count until
        it ends, so the pace was dropped on the next add, and the flush of half the cache took
        the cores and the disk from the adds all at once.)"""
        cached = self.write_cache_bytes
        limit = self.config.write_cache_max_bytes
        if cached > limit // 2:
            self._checkpoint_requested.set()
            if cached > limit * 3 // 4:
                for storage in self.storages:
                    storage.hurry()

    @property
    def write_cache_full(self) -> bool:
        """True when the write cache holds its maximum; adds should be refused until it drains."""
        return self.write_cache_bytes >= self.config.write_cache_max_bytes

    def fence(self, ledger_id: int, token: Any) -> None:
        storage = self.storage_for(ledger_id)
        info = storage.ledger(ledger_id)
        assert info is not None, "fence needs the ledger's state"
        info.fenced = True
        storage.mark_dirty(ledger_id)
        self.journal_for(ledger_id).append(RecordType.FENCE, _LEDGER_ID.pack(ledger_id), token)

    def set_explicit_lac(self, ledger_id: int, body: bytes, token: Any) -> None:
        storage = self.storage_for(ledger_id)
        info = storage.ledger(ledger_id)
        assert info is not None, "an explicit LAC needs the ledger's state"
        info.explicit_lac = body
        storage.mark_dirty(ledger_id)
        self.journal_for(ledger_id).append(
            RecordType.EXPLICIT_LAC, _LEDGER_ID.pack(ledger_id) + body, token
        )

    def force(self, ledger_id: int, token: Any) -> None:
        self.journal_for(ledger_id).append(RecordType.FORCE, _LEDGER_ID.pack(ledger_id), token)

    def read(self, ledger_id: int, entry_id: int, nowait: bool = False) -> bytes:
        return self.storage_for(ledger_id).read(ledger_id, entry_id, nowait)

    def read_run(self, ledger_id: int) -> AbstractContextManager[None]:
        return self.storage_for(ledger_id).read_run()

    def read_range(self, ledger_id: int, first: int, max_count: int, max_bytes: int) -> list[bytes]:
        return self.storage_for(ledger_id).read_range(ledger_id, first, max_count, max_bytes)

    def read_many(
        self, ledger_id: int, entry_ids: list[int], start: int, nowait: bool = False
    ) -> list[bytes]:
        return self.storage_for(ledger_id).read_many(ledger_id, entry_ids, start, nowait)

    def entry_ids(self, ledger_id: int) -> Iterator[int]:
        return self.storage_for(ledger_id).entry_ids(ledger_id)

    key_matches = staticmethod(LedgerStorage.key_matches)

    def entry_log_ids(self) -> list[int]:
        """The ids of the first ledger directory's entry log files, increasing."""
        return list(self.storage.entry_logger.log_ids())

    # -- checkpoints ---------------------------------------------------------------------------

    def request_checkpoint(self) -> None:
        self._checkpoint_requested.set()

    def checkpoint(self, pace_s: float = 0.0) -> list[tuple[int, int]]:
        """Runs one checkpoint now; returns the LastLogMark it persisted for each journal. With
        ``pace_s``, its entry-log writes are spread over up to that many seconds.

        One at a time (a call waits for the sync thread's checkpoint): two at once wrote the mark
        file together (one rename found the temporary file gone), and the older marks could land
        last, after the newer checkpoint had deleted the journal files they point into."""
        with self._checkpoint_lock:
            return self._checkpoint(pace_s)

    def _checkpoint(self, pace_s: float) -> list[tuple[int, int]]:
        reclaiming = set(self._reclaiming)  # rolled before these marks were taken (or soon)
        marks = [journal.position for journal in self.journals]  # before the write cache is swapped
        started = time.monotonic()
        results = [storage.checkpoint(pace_s / len(self.storages)) for storage in self.storages]
        self._checkpoint_stats.success(time.monotonic() - started)
        deleted = []
        for index, (journal, mark) in enumerate(zip(self.journals, marks, strict=True)):
            for directory in self.config.ledger_directories:  # each keeps a copy
                write_mark(directory, mark, mark_file_name(index))
            self.last_marks[index] = mark
            deleted.extend(journal.delete_before(mark[0]))
        self._reclaiming -= reclaiming
        self.checkpoints += 1
        log.debug(
            "checkpoint: %d entries (%d bytes), %d ledger states; marks %s; deleted journals %s",
            sum(result.entries for result in results),
            sum(result.bytes for result in results),
            sum(result.ledgers for result in results),
            marks,
            deleted,
        )
        return marks

    def _sync_loop(self) -> None:
        last_started = time.monotonic()
        while not self._stopping.is_set():
            requested = self._checkpoint_requested.wait(self.config.flush_interval_s)
            self._checkpoint_requested.clear()
            if self._stopping.is_set():
                return
            started = time.monotonic()
            # A checkpoint is paced (its entry-log writes spread out, see LedgerStorage.
            # checkpoint) so that it takes neither the disk from the journal nor the CPU from
            # the request path all at once: a periodic one over half the period; one asked for
            # (the write cache half full, a journal file rolled) over half the time since the
            # last one began, which is about the time the cache took to fill half: the cache
            # then fills to a quarter meanwhile, and should writes speed up, the adds hurry it
            # on (add_entry) once it is three quarters full with what it flushes. Journal disks filling up hurry it too.
            pace = self._pace_s
            if requested:
                pace = min(pace, (started - last_started) * REQUESTED_PACE_SHARE)
            for storage in self.storages:
                storage.hurry(self._hurry_next)
            self._hurry_next = False
            last_started = started
            try:
                self.checkpoint(pace)
            except Exception as error:
                # Nothing is lost: the journal still holds every record after the old mark. Writes
                # are refused until a checkpoint succeeds again (e.g. once space is freed).
                self._checkpoint_failure = error
                log.error(
                    "checkpoint failed (%s); refusing writes, retrying in %.1f s",
                    error,
                    self.config.flush_interval_s,
                )
                continue
            if self._checkpoint_failure is not None:
                log.warning("checkpoint succeeded again; taking writes")
                self._checkpoint_failure = None
            log.debug("checkpoint took %.3f s", time.monotonic() - started)
