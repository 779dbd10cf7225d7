"""Garbage collection and compaction of a bookie's ledger storage (the seeds' "GC thread").

One round:

1. **Deleted ledgers.** Snapshot the ledgers the index holds, then list every ledger in the
   metadata store. A listing that fails or stops part way aborts the round: data is never
   removed because a listing was incomplete. Each local ledger missing from the listing is then
   checked again with a direct metadata read, and removed (index state, locations) only if that
   read says "no such ledger" — so a ledger created after the listing began is never touched.
2. **Entry logs.** For every *settled* entry log (closed, and every record in it indexed or dead
   for good: below ``LedgerStorage.settled_log_floor``, so neither the active log, nor a log
   whose file is being created, nor a log a running checkpoint rolled before committing), the
   bytes of each ledger come from the log's ledgers map (or a scan). A log whose ledgers are all
   gone is deleted.
3. **Compaction.** A log whose live fraction is below the threshold has its live entries copied to
   the active log; an entry is copied only if the index still points at this log's record, and its
   new location is committed only under the same condition; then the old log is deleted. Minor
   compaction (threshold 0.2, every hour) and major compaction (0.8, every day) are configurable
   and off when the threshold or interval is <= 0. Copying is throttled to
   ``compaction_rate_bytes`` per second.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from bookkeeper_py.storage.entry_log import EntryLogError, EntryLogger, location_of
from bookkeeper_py.storage.ledger_storage import LedgerStorage

log = logging.getLogger(__name__)

# Returns every ledger id in the metadata store; raises if it cannot list them all.
ListLedgers = Callable[[], Iterable[int]]
# True if the ledger exists in metadata, False if it certainly does not; raises when unsure.
LedgerExists = Callable[[int], bool]


@dataclass(frozen=True, slots=True)
class GcConfig:
    """Garbage collection settings (``bk_server.conf`` names)."""

    gc_wait_time_s: float = 600.0  # gcWaitTime
    minor_compaction_threshold: float = 0.2  # minorCompactionThreshold
    minor_compaction_interval_s: float = 3600.0  # minorCompactionInterval
    major_compaction_threshold: float = 0.8  # majorCompactionThreshold
    major_compaction_interval_s: float = 86400.0  # majorCompactionInterval
    compaction_rate_bytes: int = 100 * 1024 * 1024  # compactionRateByBytes (per second)


@dataclass
class GcStats:
    """What garbage collection did, for logs, metrics and tests."""

    rounds: int = 0
    aborted_rounds: int = 0
    ledgers_deleted: int = 0
    entry_logs_deleted: int = 0
    entry_logs_compacted: int = 0
    reclaimed_deletion_bytes: int = 0
    reclaimed_compaction_bytes: int = 0
    minor_compactions: int = 0
    major_compactions: int = 0
    last_round_error: str | None = None
    log_usage: dict[int, float] = field(default_factory=dict)


class GarbageCollector:
    """Runs GC rounds for one ``LedgerStorage``, on demand or in its own thread."""

    def __init__(
        self,
        storage: LedgerStorage,
        list_ledgers: ListLedgers,
        ledger_exists: LedgerExists,
        config: GcConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.storage = storage
        self.config = config or GcConfig()
        self._list_ledgers = list_ledgers
        self._ledger_exists = ledger_exists
        self._clock = clock
        self.stats = GcStats()
        self._log_ledgers: dict[int, dict[int, int]] = {}  # log id -> ledger -> bytes (cached maps)
        self._deleted: set[int] = set()
        self._last_minor = self._last_major = clock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- thread --------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gc", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.config.gc_wait_time_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_round()
            except Exception:
                log.exception("garbage collection round failed; will retry next round")

    # -- one round -----------------------------------------------------------------------------

    def run_round(self, *, force_minor: bool = False, force_major: bool = False) -> GcStats:
        """Collects deleted ledgers, deletes dead entry logs and compacts when due."""
        self.stats.rounds += 1
        if not self._collect_deleted_ledgers():
            return self.stats
        usage = self._entry_log_usage()
        now = self._clock()
        major = self._due(
            force_major,
            self.config.major_compaction_threshold,
            self.config.major_compaction_interval_s,
            self._last_major,
            now,
        )
        minor = not major and self._due(
            force_minor,
            self.config.minor_compaction_threshold,
            self.config.minor_compaction_interval_s,
            self._last_minor,
            now,
        )
        if major or minor:
            threshold = (
                self.config.major_compaction_threshold
                if major
                else self.config.minor_compaction_threshold
            )
            for log_id, fraction in sorted(usage.items(), key=lambda item: item[1]):
                if fraction >= threshold or self._stop.is_set():
                    continue
                self._compact(log_id)
            if major:
                self.stats.major_compactions += 1
                self._last_major = self._last_minor = now
            else:
                self.stats.minor_compactions += 1
                self._last_minor = now
        return self.stats

    @staticmethod
    def _due(forced: bool, threshold: float, interval: float, last: float, now: float) -> bool:
        if threshold <= 0 or interval <= 0:
            return False
        return forced or now - last >= interval

    def _collect_deleted_ledgers(self) -> bool:
        local = set(self.storage.index.ledger_ids())
        try:
            in_metadata = set(self._list_ledgers())
        except Exception as error:
            self.stats.aborted_rounds += 1
            self.stats.last_round_error = f"listing ledgers failed: {error}"
            log.warning("GC round aborted, nothing deleted: listing ledgers failed: %s", error)
            return False
        for ledger_id in sorted(local - in_metadata):
            try:
                exists = self._ledger_exists(ledger_id)
            except Exception as error:
                log.warning(
                    "GC: cannot confirm ledger %d is deleted (%s); keeping it", ledger_id, error
                )
                continue
            if exists:
                continue  # created after the listing began
            self.storage.delete_ledger(ledger_id)
            self._deleted.add(ledger_id)
            self.stats.ledgers_deleted += 1
            log.info("GC: removed deleted ledger %d", ledger_id)
        return True

    def _ledgers_of(self, logger: EntryLogger, log_id: int) -> dict[int, int]:
        cached = self._log_ledgers.get(log_id)
        if cached is None:
            cached = self._log_ledgers[log_id] = dict(logger.ledgers_map(log_id))
        for ledger_id in [lid for lid in cached if lid in self._deleted]:
            del cached[ledger_id]
        return cached

    def _entry_log_usage(self) -> dict[int, float]:
        """Live fraction of every inactive entry log; deletes the ones with nothing live."""
        logger = self.storage.entry_logger
        usage: dict[int, float] = {}
        settled = self.storage.settled_log_floor  # read before listing: new logs are above it
        for log_id in logger.log_ids():
            if log_id >= settled:
                continue
            try:
                total = logger.file_size(log_id)
                live = self._ledgers_of(logger, log_id)
            except (OSError, EntryLogError) as error:
                log.error("GC: cannot read entry log %d: %s", log_id, error)
                continue
            live_bytes = sum(live.values())
            if not live:
                self._delete_log(log_id, total, compaction=False)
                continue
            usage[log_id] = live_bytes / max(total, 1)
        self.stats.log_usage = usage
        return usage

    def _delete_log(self, log_id: int, size: int, *, compaction: bool) -> None:
        with self.storage.exclusive():
            self.storage.entry_logger.delete(log_id)
        self._log_ledgers.pop(log_id, None)
        self.stats.entry_logs_deleted += 1
        if compaction:
            self.stats.reclaimed_compaction_bytes += size
        else:
            self.stats.reclaimed_deletion_bytes += size
        log.info("GC: deleted entry log %d (%d bytes)", log_id, size)

    def _compact(self, log_id: int) -> None:
        logger = self.storage.entry_logger
        index = self.storage.index
        size = logger.file_size(log_id)
        live = self._ledgers_of(logger, log_id)
        copied_bytes = 0
        started = self._clock()
        batch: list[tuple[int, int, int, bytes]] = []  # ledger, entry, old location, bytes
        for ledger_id, entry_id, offset, entry in logger.records(log_id):
            if ledger_id not in live:
                continue
            old = location_of(log_id, offset)
            if index.location(ledger_id, entry_id) != old:
                continue  # superseded (a later copy of the entry) or removed
            batch.append((ledger_id, entry_id, old, entry))
            copied_bytes += len(entry)
            if len(batch) >= 10_000:
                self._move(batch)
                batch = []
            self._throttle(copied_bytes, started)
        self._move(batch)
        self._delete_log(log_id, size, compaction=True)
        self.stats.entry_logs_compacted += 1
        log.info(
            "GC: compacted entry log %d: copied %d bytes, reclaimed %d",
            log_id,
            copied_bytes,
            size - copied_bytes,
        )

    def _move(self, batch: list[tuple[int, int, int, bytes]]) -> None:
        if not batch:
            return
        with self.storage.exclusive():
            logger = self.storage.entry_logger
            try:
                moved = [(lid, eid, old, logger.add(lid, entry)) for lid, eid, old, entry in batch]
                logger.flush()
                self.storage.index.move_locations(moved)
                self.storage.settle()
            except BaseException:
                logger.abandon_active()  # keep offsets right for the next writer; nothing moved
                raise

    def _throttle(self, copied: int, started: float) -> None:
        rate = self.config.compaction_rate_bytes
        if rate <= 0:
            return
        ahead = copied / rate - (self._clock() - started)
        if ahead > 0:
            self._stop.wait(min(ahead, 1.0))
