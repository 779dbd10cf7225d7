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

An operator (BookKeeper's ``/api/v1/bookie/gc`` endpoints) can force a round now, with or without
its major and minor compactions, and suspend or resume either kind: a suspended kind is not run
when due, nor by a forced round that does not ask for it by name.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from bookkeeper_py.metrics import OpStats
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
    last_round_seconds: float = 0.0  # how long the last round took


@dataclass(frozen=True)
class GcStatus:
    """BookKeeper's ``GarbageCollectionStatus`` (``/api/v1/bookie/gc_details``): what runs now,
    when each compaction last ran (ms since the epoch, 0: never) and how many have run."""

    force_compacting: bool
    major_compacting: bool
    minor_compacting: bool
    last_major_compaction_ms: int
    last_minor_compaction_ms: int
    major_compactions: int
    minor_compactions: int

    def as_json(self) -> dict[str, object]:
        return {
            "forceCompacting": self.force_compacting,
            "majorCompacting": self.major_compacting,
            "minorCompacting": self.minor_compacting,
            "lastMajorCompactionTime": self.last_major_compaction_ms,
            "lastMinorCompactionTime": self.last_minor_compaction_ms,
            "lastEntryLocationCompactionTime": 0,  # the LMDB index needs no compaction
            "majorCompactionCounter": self.major_compactions,
            "minorCompactionCounter": self.minor_compactions,
            "entryLocationCompactionCounter": 0,
        }


class GarbageCollector:
    """Runs GC rounds for one ``LedgerStorage``, on demand or in its own thread."""

    def __init__(
        self,
        storage: LedgerStorage,
        list_ledgers: ListLedgers,
        ledger_exists: LedgerExists,
        config: GcConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        runtime: OpStats | None = None,
    ) -> None:
        """``runtime`` records each round's time (BookKeeper's ``THREAD_RUNTIME``)."""
        self.storage = storage
        self._runtime = runtime
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
        # The operator's controls (any thread): a forced round asked for (its major and minor
        # flags) or running, the kinds suspended, what the running round compacts, and when
        # each kind last ran (ms since the epoch).
        self._lock = threading.Lock()
        self._forced: tuple[bool, bool] | None = None
        self.in_force = False
        self.major_suspended = False
        self.minor_suspended = False
        self._compacting: str | None = None
        self._last_major_ms = self._last_minor_ms = 0

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
            with self._lock:
                forced, self._forced = self._forced, None
            major, minor = forced or (False, False)
            try:
                self.run_round(force_major=major, force_minor=minor)
            except Exception:
                log.exception("garbage collection round failed; will retry next round")
            finally:
                if forced is not None:
                    with self._lock:
                        self.in_force = False

    def force(self, major: bool | None = None, minor: bool | None = None) -> bool:
        """Asks the GC thread for a round now (BookKeeper's forceGC): with a major compaction if
        ``major``, else a minor one if ``minor`` (None: unless that kind is suspended). False if
        a forced round is already asked for or running (nothing more is asked)."""
        with self._lock:
            if self.in_force:
                return False
            self._forced = (
                not self.major_suspended if major is None else major,
                not self.minor_suspended if minor is None else minor,
            )
            self.in_force = True
        self._wake.set()
        return True

    def suspend(self, *, major: bool = False, minor: bool = False) -> None:
        """Stops the kinds named from running when due (a round already compacting finishes)."""
        with self._lock:
            self.major_suspended |= major
            self.minor_suspended |= minor

    def resume(self, *, major: bool = False, minor: bool = False) -> None:
        with self._lock:
            self.major_suspended &= not major
            self.minor_suspended &= not minor

    def status(self) -> GcStatus:
        with self._lock:
            return GcStatus(
                force_compacting=self.in_force and self._compacting is not None,
                major_compacting=self._compacting == "major",
                minor_compacting=self._compacting == "minor",
                last_major_compaction_ms=self._last_major_ms,
                last_minor_compaction_ms=self._last_minor_ms,
                major_compactions=self.stats.major_compactions,
                minor_compactions=self.stats.minor_compactions,
            )

    # -- one round -----------------------------------------------------------------------------

    def run_round(self, *, force_minor: bool = False, force_major: bool = False) -> GcStats:
        """Collects deleted ledgers, deletes dead entry logs and compacts when due; logs what
        the round did and how long it took (at INFO when it changed anything)."""
        before = replace(self.stats, log_usage={})
        started = self._clock()
        failed = True
        try:
            self._round(force_minor, force_major)
            failed = False
        finally:
            seconds = self._clock() - started
            self.stats.last_round_seconds = seconds
            if self._runtime is not None:
                (self._runtime.failure if failed else self._runtime.success)(seconds)
            self._log_round(before, seconds)
        return self.stats

    def _log_round(self, before: GcStats, seconds: float) -> None:
        now = self.stats
        ledgers = now.ledgers_deleted - before.ledgers_deleted
        deleted = now.entry_logs_deleted - before.entry_logs_deleted
        compacted = now.entry_logs_compacted - before.entry_logs_compacted
        kind = (
            "major compaction"
            if now.major_compactions > before.major_compactions
            else "minor compaction"
            if now.minor_compactions > before.minor_compactions
            else "no compaction"
        )
        level = logging.INFO if ledgers or deleted or compacted else logging.DEBUG
        log.log(
            level,
            "GC round %d of %s done in %.2f s: %d ledgers and %d entry logs deleted "
            "(%.1f MB), %s: %d entry logs compacted (%.1f MB reclaimed)%s",
            now.rounds,
            self.storage.directory,
            seconds,
            ledgers,
            deleted,
            (now.reclaimed_deletion_bytes - before.reclaimed_deletion_bytes) / 1e6,
            kind,
            compacted,
            (now.reclaimed_compaction_bytes - before.reclaimed_compaction_bytes) / 1e6,
            "; aborted" if now.aborted_rounds > before.aborted_rounds else "",
        )

    def _round(self, force_minor: bool, force_major: bool) -> None:
        self.stats.rounds += 1
        if not self._collect_deleted_ledgers():
            return
        usage = self._entry_log_usage()
        now = self._clock()
        major = self._due(
            force_major,
            self.major_suspended,
            self.config.major_compaction_threshold,
            self.config.major_compaction_interval_s,
            self._last_major,
            now,
        )
        minor = not major and self._due(
            force_minor,
            self.minor_suspended,
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
            with self._lock:
                self._compacting = "major" if major else "minor"
            try:
                for log_id, fraction in sorted(usage.items(), key=lambda item: item[1]):
                    if fraction >= threshold or self._stop.is_set():
                        continue
                    self._compact(log_id)
            finally:
                with self._lock:
                    self._compacting = None
            wall_ms = int(time.time() * 1000)
            with self._lock:
                if major:
                    self.stats.major_compactions += 1
                    self._last_major = self._last_minor = now
                    self._last_major_ms = self._last_minor_ms = wall_ms
                else:
                    self.stats.minor_compactions += 1
                    self._last_minor = now
                    self._last_minor_ms = wall_ms

    @staticmethod
    def _due(
        forced: bool, suspended: bool, threshold: float, interval: float, last: float, now: float
    ) -> bool:
        """Whether a compaction kind runs this round: asked for by name (even when suspended),
        or due by its interval and not suspended; never while off (threshold or interval 0)."""
        if threshold <= 0 or interval <= 0:
            return False
        return forced or (not suspended and now - last >= interval)

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
