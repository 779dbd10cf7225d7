"""The bookie: request semantics of reference section 2.6 over the storage engine.

* Add: a fenced ledger refuses adds (EFENCED) unless the add is a recovery add; the first write
  or fence of a ledger records its master key (journaled); later writes and fences must present
  the same key (EUA otherwise, compared in constant time). The add is answered once the journal
  record is durable.
* Fence (a read with the fence flag): set fenced, journal a fence record, answer only once that
  record is durable; a second fence waits for the same record. Then read the requested entry.
* Read of entry -1 returns the last entry. ENOLEDGER / ENOENTRY come only from the index; an I/O
  error is EIO.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bookkeeper_py.loop import call_on
from bookkeeper_py.metrics import Metrics, NullMetrics, OpStats
from bookkeeper_py.server.limbo import Limbo
from bookkeeper_py.storage.disk import (
    DiskChecker,
    DiskReport,
    DiskState,
    DiskThresholds,
    total_and_free,
)
from bookkeeper_py.storage.engine import LedgerEngine, StorageConfig, StorageEngine
from bookkeeper_py.storage.entry_log import ReadWouldBlockError
from bookkeeper_py.storage.gc import GcConfig
from bookkeeper_py.storage.ledger_storage import (
    LedgerInfo,
    NoEntryError,
    NoLedgerError,
    StorageIOError,
)
from bookkeeper_py.tls import TlsConfig
from bookkeeper_py.wire import availability
from bookkeeper_py.wire.output import PassFlusher
from bookkeeper_py.wire.status import StatusCode

log = logging.getLogger(__name__)


ReadDone = Callable[[StatusCode, bytes], None]
# Answers to plain reads of one ledger: entry ids, entries, statuses (see Bookie.read_entries)
ReadsDone = Callable[[list[int], list[bytes], dict[int, StatusCode]], None]
StatusDone = Callable[[StatusCode], None]
DISK_CHECK_BYTES = 1024 * 1024
THROTTLE_POLL_S = 0.005  # how often adds held back by a full write cache look for room
# An idle journal's group is synced on the loop (two thread hops fewer per add) only when no read
# came in for this long: a sync on the loop delays the answers to readers by its length.
READERS_QUIET_S = 1.0
LongPollDone = Callable[[StatusCode, bytes, int], None]  # status, entry (or b""), maxLAC
_LAC_AT = struct.Struct(">q")
_ENTRY_IDS = struct.Struct(">qq")  # an entry starts with its ledger id and entry id
LAST_ENTRY = -1  # a read of entry -1 asks for the last entry the bookie holds (v2 and v3)
LAC_CACHE_SIZE = 100_000


@dataclass(slots=True)
class _LacWaiter:
    """A long-poll read parked until the ledger's LAC passes ``previous_lac``."""

    previous_lac: int
    wake: Callable[[], None]
    timer: asyncio.TimerHandle | None = None


@dataclass(frozen=True, slots=True)
class BookieConfig:
    """Settings of one bookie (``bk_server.conf`` names in the comments)."""

    storage: StorageConfig
    gc: GcConfig = field(default_factory=GcConfig)
    disk: DiskThresholds = field(default_factory=DiskThresholds)
    disk_check_interval_s: float = 10.0  # diskCheckInterval
    host: str = "127.0.0.1"  # advertisedAddress / listeningInterface
    port: int = 3181  # bookiePort
    bookie_id: str | None = None  # bookieId; default host:port
    max_frame_size: int = 5 * 1024 * 1024  # nettyMaxFrameSizeBytes
    # Options of every accepted connection: serverTcpNoDelay, serverSockKeepalive, and
    # serverTcpLinger (seconds a close may wait for unsent answers; -1: the system's default)
    tcp_no_delay: bool = True
    tcp_keepalive: bool = True
    tcp_linger_s: int = -1
    force_read_only: bool = False  # forceReadOnlyBookie: read-only from the start, and for good
    read_only_mode_enabled: bool = True  # readOnlyModeEnabled; False: full disks stop the bookie
    http_port: int | None = None  # httpServerPort when httpServerEnabled; None: no HTTP endpoint
    http_host: str | None = None  # httpServerHost; None: the bookie's address (host)
    # httpServerTlsEnable: (keystore, its password, truststore, its password), or None: plain
    http_tls: tuple[str, str | None, str, str | None] | None = None
    metrics_port: int | None = None  # prometheusStatsHttpPort: /metrics on a port of its own
    metrics_host: str | None = None  # prometheusStatsHttpAddress; None: the bookie's address
    metrics_style: str = "histograms"  # metricsStyle (ours): histograms or bookkeeper
    metrics_rollover_s: float = 60.0  # prometheusStatsLatencyRolloverSeconds
    max_pending_adds: int = 50_000  # adds not yet durable, per bookie (see server/config.py)
    max_throttle_time_s: float = 10.0  # dbStorage_maxThrottleTimeMs: an add waits this long
    # for a full write cache to drain before it is answered ETOOMANYREQUESTS
    max_parked_long_polls: int = 10_000  # long-poll reads parked at once
    # unanswered requests of one connection at which it is not read until half are answered
    max_pending_per_connection: int = 10_000
    idle_connection_timeout_s: float = 600.0  # close connections idle this long (0: never)
    tls: TlsConfig | None = None  # tlsCertificatePath and friends; None: plain connections only
    auth_provider: str | None = None  # bookieAuthProviderFactoryClass; None: no authentication
    # The bk_server.conf keys set (after defaults, the file and the command line): the auth
    # provider's factory reads its keys here, /api/v1/config/server_config shows them
    settings: dict[str, Any] = field(default_factory=dict)
    # zkTimeout: the metadata session's timeout (the SQLite lease), how long the registration of
    # a bookie that died outlives it; None: the store's default (10 s ZooKeeper, 5 s SQLite)
    metadata_session_timeout_s: float | None = None

    @property
    def effective_bookie_id(self) -> str:
        return self.bookie_id or f"{self.host}:{self.port}"


# Background work (re-replication copies) a pass of the loop may run: then the requests that
# arrived meanwhile are served.
BACKGROUND_SLICE_S = 0.0005


def _observe(stats: OpStats, status: StatusCode, elapsed: float) -> None:
    """Records one request's latency under its outcome."""
    if status == StatusCode.EOK:
        stats.success(elapsed)
    else:
        stats.failure(elapsed)


def _observe_run(
    stats: OpStats, answered: int, statuses: dict[int, StatusCode], elapsed: float
) -> None:
    """Records the latency of ``answered`` requests served together, ``statuses`` holding the
    failed ones: one histogram update for the successes."""
    if answered > len(statuses):
        stats.successes(elapsed, answered - len(statuses))
    for _ in statuses:
        stats.failure(elapsed)


def _bad_read_ids(ledger_id: int, entry_id: int) -> bool:
    """Ids no read may name (a read of -1 means "the last entry"): answered EBADREQ."""
    return ledger_id < 0 or entry_id < LAST_ENTRY


def _one(done: Callable[[StatusCode, list[int]], None], entry_id: int, status: StatusCode) -> None:
    """The answer to one add of a batch, as the batch's callback takes it."""
    done(status, [entry_id])


class Bookie:
    """Request handling over storage. Runs on one asyncio loop; the journal has its own thread."""

    def __init__(
        self,
        config: BookieConfig,
        loop: asyncio.AbstractEventLoop,
        metrics: Metrics | None = None,
        engine_factory: Callable[..., LedgerEngine] = StorageEngine,
    ) -> None:
        """``engine_factory(storage config, sync callback, metrics)`` makes the storage: the
        real engine, or the simulator's (``bookkeeper_py.testing.sim.engine``), which runs this
        very request handling on a simulated disk and clock."""
        self.config = config
        self._loop = loop
        # The connections' answers of a pass, written together (see ``_journal_synced``).
        self._output_flusher = PassFlusher.of(loop)
        self.metrics: Metrics = metrics or NullMetrics()
        self.engine = engine_factory(config.storage, self._journal_synced, self.metrics)
        self._read_at = -READERS_QUIET_S  # perf_counter() of the last read request
        self.engine.write_journals_on(loop, self._sync_on_loop_ok, partial(call_on, loop))
        stats = self.metrics.op_stats
        # BookKeeper times an add twice: from its arrival (ADD_ENTRY_REQUEST) and from its
        # processing on a write thread (ADD_ENTRY); here one loop takes it at arrival: one span.
        self._add_stats = stats(
            "bookkeeper_server_ADD_ENTRY_REQUEST",
            "add requests, arrival to answer (s)",
            aliases=("bookkeeper_server_ADD_ENTRY",),
        )
        self._recovery_add_stats = stats(
            "bookkeeper_server_RECOVERY_ADD_ENTRY_REQUEST",
            "recovery add requests, arrival to answer (s)",
        )
        self._read_stats = stats(
            "bookkeeper_server_READ_ENTRY_REQUEST",
            "read requests (s)",
            aliases=("bookkeeper_server_READ_ENTRY",),
        )
        self._fence_stats = stats(
            "bookkeeper_server_READ_ENTRY_FENCE_REQUEST",
            "fencing reads, durable fence included (s)",
        )
        self._long_poll_stats = stats(
            "bookkeeper_server_READ_ENTRY_LONG_POLL_REQUEST",
            "long-poll reads, parked time included (s)",
        )
        self._write_lac_stats = stats("bookkeeper_server_WRITE_LAC", "WRITE_LAC requests (s)")
        self._force_stats = stats("bookkeeper_server_FORCE_LEDGER", "FORCE_LEDGER requests (s)")
        self._batch_read_stats = stats(
            "bookkeeper_server_BATCH_READ_ENTRY_REQUEST", "batch read requests (s)"
        )
        self._list_entries_stats = stats(
            "bookkeeper_server_GET_LIST_OF_ENTRIES_OF_LEDGER",
            "GET_LIST_OF_ENTRIES_OF_LEDGER requests (s)",
        )
        self._write_bytes = self.metrics.counter("bookie_WRITE_BYTES", "entry bytes added")
        self._read_bytes = self.metrics.counter("bookie_READ_BYTES", "entry bytes read")
        self.metrics.gauge_function(
            "bookie_SERVER_STATUS",
            "1 writable, 0 read-only",
            lambda: 0.0 if self.read_only else 1.0,
        )
        gauge = self.metrics.gauge_function
        gauge(
            "bookkeeper_server_ADD_ENTRY_IN_PROGRESS",
            "adds taken and not yet answered (durable)",
            lambda: float(self.pending_adds),
        )
        gauge(
            "bookkeeper_server_ADD_ENTRY_BLOCKED",
            "adds held back until the write cache has room",
            lambda: float(len(self._throttled)),
        )
        gauge(
            "bookkeeper_server_READ_ENTRY_IN_PROGRESS",
            "reads waiting for a reader thread (the others are answered in the pass that takes them)",
            lambda: float(self._reads_off_loop),
        )
        gauge(
            "bookie_ledger_writable_dirs",
            "ledger directories with room for writes",
            self._writable_ledger_dirs,
        )
        gauge(
            "bookkeeper_server_READ_ENTRY_BLOCKED",
            "reads held back (this bookie holds none back: always 0)",
            lambda: 0.0,
        )
        # Ledgers whose fence record is not durable yet -> callbacks waiting for it.
        self._fences_in_flight: dict[int, list[Callable[[bool], None]]] = {}
        self._closed = False
        self._shutting_down = False
        # Absence answers are not trusted while the bookie repairs lost journal records.
        self.limbo = Limbo(config.storage.ledger_directory)
        self.disk = DiskChecker(
            [*config.storage.journal_directories, *config.storage.ledger_directories], config.disk
        )
        # Read-only (disks full, or an operator asked): normal adds get EREADONLY; recovery adds,
        # fences and reads still work.
        self.disk_full = False
        self.forced_read_only = config.force_read_only
        if config.force_read_only:
            log.warning("forceReadOnlyBookie is set: the bookie serves reads only")
        self._last_disk_state: DiskState | None = None
        self._free_when_out_of_space: int | None = None  # free bytes when a write hit ENOSPC
        # Bytes added since the last disk check: a fast writer triggers a check every
        # DISK_CHECK_BYTES, so it cannot fill the disk between two periodic checks.
        self._added_since_disk_check = 0
        # The last add confirmed known per ledger: the largest LAC carried by an entry stored here
        # or by an explicit LAC; long-poll reads park on it.
        self._lacs: dict[int, int] = {}
        self._lac_waiters: dict[int, list[_LacWaiter]] = {}
        self.pending_adds = 0  # adds whose journal record is not durable yet
        self._reads_off_loop = 0  # reads handed to a reader thread, not answered yet
        self.parked_long_polls = 0
        self._rejected = self.metrics.counter(
            "bookkeeper_server_REQUESTS_REJECTED", "requests answered ETOOMANYREQUESTS"
        )
        self.connections_held = self.metrics.counter(
            "bookkeeper_server_CONNECTIONS_HELD",
            "times a connection stopped being read at its bound of unanswered requests",
        )
        # Adds that met a full write cache, in arrival order: (deadline, resume, done).
        self._throttled: deque[tuple[float, Callable[[], None], StatusDone]] = deque()
        self._throttle_timer: asyncio.TimerHandle | None = None
        self._throttled_count = self.metrics.counter(
            "bookkeeper_server_ADD_ENTRY_THROTTLED", "adds that waited for the write cache"
        )
        self._disk_reads = self.metrics.counter(
            "bookkeeper_server_READ_ENTRY_FROM_DISK",
            "reads whose entry was not in memory, read by a reader thread off the event loop",
        )
        # Background work (re-replication copies, ``in_background``), a slice a loop pass.
        self._background: deque[Callable[[], None]] = deque()
        self._pumping = False
        self.metrics.gauge_function(
            "bookkeeper_server_BACKGROUND_REQUESTS_QUEUED",
            "background requests (re-replication copies) waiting for a pass of the loop",
            lambda: float(len(self._background)),
        )

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the bookie and its connections run on."""
        return self._loop

    def in_background(self, work: Callable[[], None]) -> None:
        """Runs ``work`` (a request of background traffic: a re-replication copy) after what
        the loop has to do now, ``BACKGROUND_SLICE_S`` of such work a pass of the loop (one
        item at least): requests that arrive meanwhile on any connection are served before the
        next slice. A burst of 64 KiB copies then delays a live writer's add by a slice, not by
        the burst."""
        self._background.append(work)
        if not self._pumping:
            self._pumping = True
            self._loop.call_soon(self._pump)

    def _pump(self) -> None:
        background = self._background
        ends = time.perf_counter() + BACKGROUND_SLICE_S
        while background:
            background.popleft()()
            if time.perf_counter() >= ends:
                break
        if background:
            self._loop.call_soon(self._pump)
        else:
            self._pumping = False

    def check_disks(self) -> DiskReport:
        """Checks disk usage and turns the bookie read-only or writable; safe from any thread."""
        report = self.disk.check()
        if report.state == DiskState.WARN and self._last_disk_state != DiskState.WARN:
            log.warning("disk %s is %.1f%% full", report.path, 100 * report.usage)
        self._last_disk_state = report.state
        # A journal disk past the warning mark gets its space back before it is full: the journal
        # starts a new file and the next checkpoint deletes the old one.
        filling = [
            directory
            for directory in self.config.storage.journal_directories
            if self.disk.usages.get(directory, 0.0) >= self.disk.thresholds.warn_threshold
        ]
        if filling:
            self.engine.reclaim_journal_space(filling)
        # A write that ran out of space means full, whatever the usage figure says: large writes
        # (a checkpoint, a journal group) can fail while statvfs still shows some room. It ends,
        # with hysteresis, once usage is under the low-water mark and a margin of the disk (the
        # larger of 5 % and 1 - diskUsageThreshold) was freed since: clearing it as soon as usage
        # looked low let a bookie stay writable and answer EIO to every add.
        if self.engine.out_of_space:
            if self._free_when_out_of_space is None:
                self._free_when_out_of_space = report.free_bytes
            margin = max(0.05, 1 - self.disk.thresholds.usage_threshold) * report.total_bytes
            if (
                report.usage < self.disk.thresholds.lwm
                and report.free_bytes >= self._free_when_out_of_space + margin
            ):
                self.engine.space_freed()
        if not self.engine.out_of_space:
            self._free_when_out_of_space = None
        full = report.state == DiskState.FULL or self.engine.out_of_space
        if full != self.disk_full:
            self.disk_full = full
            log.warning(
                "disk %s is %.1f%% full: bookie is now %s",
                report.path,
                100 * report.usage,
                "read-only" if self.read_only else "writable again",
            )
        return report

    @property
    def read_only(self) -> bool:
        return self.disk_full or self.forced_read_only

    def set_forced_read_only(self, read_only: bool) -> None:
        """An operator turns the bookie read-only, or back (it stays read-only while disks are
        full). What the configuration forbids (forceReadOnlyBookie, readOnlyModeEnabled=false) is
        refused before, by the admin service (``server.service``)."""
        if read_only != self.forced_read_only:
            self.forced_read_only = read_only
            log.warning("an operator set the bookie %s", "read-only" if read_only else "writable")

    def start(self) -> None:
        self.engine.start()
        lost = self.engine.lost_journal_tails
        if lost:
            self.limbo.enter("; ".join(lost))
        if self.limbo.active:
            log.warning(
                "bookie in limbo: journal records it may have acknowledged are gone (%s); it "
                "answers EUNKNOWNLEDGERSTATE instead of 'no such entry' until its ledgers are "
                "repaired from the other replicas",
                self.limbo.reason,
            )

    def begin_shutdown(self) -> None:
        """Answers every parked long poll now, as its timeout would (and new ones at once), so
        that a stopping bookie leaves no reader waiting on a connection about to close."""
        self._shutting_down = True
        parked = [waiter for waiters in self._lac_waiters.values() for waiter in waiters]
        self._lac_waiters.clear()
        for waiter in parked:
            if waiter.timer is not None:
                waiter.timer.cancel()
            waiter.wake()

    def close(self) -> None:
        self._closed = True
        self._shutting_down = True
        if self._throttle_timer is not None:
            self._throttle_timer.cancel()
            self._throttle_timer = None
        self.engine.close()

    def _refuses_writes(self) -> bool:
        return self._closed or self.engine.failure is not None

    @staticmethod
    def _timed(stats: OpStats, done: Callable[..., None]) -> Callable[..., None]:
        """``done`` that also records the time from now to the answer, by outcome."""
        started = time.perf_counter()

        def finish(status: StatusCode, *rest: Any) -> None:
            _observe(stats, status, time.perf_counter() - started)
            done(status, *rest)

        return finish

    # -- journal plumbing ----------------------------------------------------------------------

    def _journal_synced(self, tokens: list[Any], error: Exception | None) -> None:
        # Called on the loop, which writes the journals, at the end of its step (the journal's
        # state is whole: a token's answer may append more records), or on a journal thread
        # where a journal has one (hop to the loop once per group). On the loop, the answers
        # go out at once, not a loop iteration later: an add's latency ends at the socket.
        if asyncio._get_running_loop() is self._loop:
            try:
                self._complete(tokens, error)
            except Exception as raised:  # as the loop reports a callback that raised
                self._loop.call_exception_handler(
                    {"message": "a journal sync's answer raised", "exception": raised}
                )
            self._output_flusher.flush_now()
            return
        if self._loop.is_closed():
            return
        try:
            self._loop.call_soon_threadsafe(self._complete, tokens, error)
        except RuntimeError:
            pass  # the loop is shutting down; the clients will see their connections close

    def _sync_on_loop_ok(self) -> bool:
        """Whether an idle journal may sync a group on this loop: not while readers are about,
        since a sync on the loop holds up their answers for its length, a sync on the journal's
        syncer thread does not."""
        return time.perf_counter() - self._read_at >= READERS_QUIET_S

    @staticmethod
    def _complete(tokens: list[Any], error: Exception | None) -> None:
        for token in tokens:
            token(error)

    def _ensure_ledger(
        self, ledger_id: int, master_key: bytes
    ) -> tuple[LedgerInfo | None, StatusCode]:
        """The ledger's state after checking (and on first use, journaling) its master key."""
        info = self.engine.ledger(ledger_id)
        if info is not None and info.master_key:
            if not self.engine.key_matches(info, master_key):
                log.warning("ledger %d: request with a wrong master key refused", ledger_id)
                return None, StatusCode.EUA
            return info, StatusCode.EOK
        return self.engine.create_ledger(ledger_id, master_key), StatusCode.EOK

    @staticmethod
    def _fenced_for(info: LedgerInfo, recovery: bool) -> bool:
        """Whether the ledger's fence refuses an add (a recovery add goes through): the one
        fence check of every add path."""
        return info.fenced and not recovery

    # -- operations ----------------------------------------------------------------------------

    def add_entry(
        self,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        entry: bytes,
        recovery: bool,
        done: StatusDone,
        deferred_sync: bool = False,
        resumed: bool = False,
        background: bool = False,
    ) -> None:
        """Stores an entry; ``done`` gets the answer once its journal record is durable, or, with
        ``deferred_sync`` (v3 write flag DEFERRED_SYNC), as soon as it is stored and queued: the
        writer then learns of durability from FORCE_LEDGER. A ``background`` entry (a
        re-replication copy) gives way to the others in the journal."""
        # One closure per add (the journal's callback answers and times it): this runs for
        # every copy of every entry.
        stats = self._recovery_add_stats if recovery else self._add_stats
        started = time.perf_counter()
        self._added_since_disk_check += len(entry)
        if self._added_since_disk_check >= DISK_CHECK_BYTES:
            self._added_since_disk_check = 0
            self.check_disks()  # one statvfs per MiB added
        refusal = None
        if self.read_only and not recovery:
            refusal = StatusCode.EREADONLY
        elif self._refuses_writes():
            refusal = StatusCode.EIO
        elif self.pending_adds >= self.config.max_pending_adds:
            self._rejected.inc()
            refusal = StatusCode.ETOOMANYREQUESTS
        elif not resumed and (self._throttled or self.engine.write_cache_full):
            # As DbLedgerStorage: a full write cache holds adds back (in arrival order) until a
            # checkpoint frees room, refusing them only after the throttle time.
            resume = partial(
                self.add_entry,
                ledger_id,
                entry_id,
                master_key,
                entry,
                recovery,
                done,
                deferred_sync,
                True,
                background,
            )
            self._throttled.append(
                (self._loop.time() + self.config.max_throttle_time_s, resume, done)
            )
            self._throttled_count.inc()
            if self._throttle_timer is None:
                self._throttle_timer = self._loop.call_later(THROTTLE_POLL_S, self._drain_throttled)
            return
        elif (
            ledger_id < 0
            or entry_id < 0
            or len(entry) < 16
            or _ENTRY_IDS.unpack_from(entry) != (ledger_id, entry_id)
        ):
            refusal = StatusCode.EBADREQ  # ids are >= 0 (a read of -1 means "the last entry")
        if refusal is not None:
            stats.failure(time.perf_counter() - started)
            done(refusal)
            return
        info, status = self._ensure_ledger(ledger_id, master_key)
        if info is None or self._fenced_for(info, recovery):
            stats.failure(time.perf_counter() - started)
            done(status if info is None else StatusCode.EFENCED)
            return
        # The LAC an entry carries is the writer's word that every entry up to it has Qa durable
        # copies, true whether or not this entry itself becomes durable: it is known (and long
        # polls are answered) as the entry arrives, as BookKeeper's ledger storage does, not a
        # journal sync later, which readers following the writer would wait for.
        if len(entry) >= 24:
            self._advance_lac(ledger_id, _LAC_AT.unpack_from(entry, 16)[0])

        def durable(error: Exception | None) -> None:
            self.pending_adds -= 1
            if error is None:
                self._write_bytes.inc(len(entry))
                if not deferred_sync:
                    stats.success(time.perf_counter() - started)
                    done(StatusCode.EOK)
            elif not deferred_sync:
                stats.failure(time.perf_counter() - started)
                done(StatusCode.EIO)

        self.pending_adds += 1
        self.engine.add_entry(ledger_id, entry_id, bytes(entry), durable, background)
        if deferred_sync:
            stats.success(time.perf_counter() - started)
            done(StatusCode.EOK)

    def add_entries(
        self,
        ledger_id: int,
        master_key: bytes,
        entry_ids: list[int],
        entries: list[bytes],
        done: Callable[[StatusCode, list[int]], None],
        last_add_confirmed: int | None = None,
    ) -> None:
        """Stores plain adds (not recovery, not DEFERRED_SYNC) of one ledger that arrived
        together, with one master key, each entry starting with its ids; ``done(status,
        entry_ids)`` answers them together once their journal records are durable (one callback
        on the last record: the journal makes a ledger's records durable in order). When any
        check would not pass for them all alike (read-only, a disk failed, limits, a full
        write cache, a bad id), each goes through ``add_entry`` on its own instead.
        ``last_add_confirmed``, where the caller knows it (``v2.take_plain_adds``), is the
        highest LAC the entries carry, every entry holding one and every id at least 0."""
        count = len(entries)
        checked = last_add_confirmed is not None
        engine = self.engine
        if (
            self.read_only
            or self._refuses_writes()
            or self.pending_adds + count > self.config.max_pending_adds
            or self._throttled
            or engine.write_cache_full
            or ledger_id < 0
            or (not checked and min(entry_ids) < 0)
            or (not checked and min(map(len, entries)) < 24)  # no LAC to read (see add_entry)
        ):
            for entry_id, entry in zip(entry_ids, entries, strict=True):
                self.add_entry(
                    ledger_id, entry_id, master_key, entry, False, partial(_one, done, entry_id)
                )
            return
        stats = self._add_stats
        started = time.perf_counter()
        size = sum(map(len, entries))
        self._added_since_disk_check += size
        if self._added_since_disk_check >= DISK_CHECK_BYTES:
            self._added_since_disk_check = 0
            self.check_disks()
        info, status = self._ensure_ledger(ledger_id, master_key)
        if info is None or self._fenced_for(info, False):
            elapsed = time.perf_counter() - started
            for _ in entry_ids:
                stats.failure(elapsed)
            done(status if info is None else StatusCode.EFENCED, entry_ids)
            return
        if last_add_confirmed is None:
            lac_at = _LAC_AT.unpack_from
            last_add_confirmed = max(lac_at(entry, 16)[0] for entry in entries)
        self._advance_lac(ledger_id, last_add_confirmed)

        def durable(error: Exception | None) -> None:
            self.pending_adds -= count
            elapsed = time.perf_counter() - started
            if error is None:
                self._write_bytes.inc(size)
                stats.successes(elapsed, count)
                done(StatusCode.EOK, entry_ids)
            else:
                for _ in entry_ids:
                    stats.failure(elapsed)
                done(StatusCode.EIO, entry_ids)

        self.pending_adds += count
        engine.add_entries(ledger_id, entry_ids, entries, durable)

    def _drain_throttled(self) -> None:
        """Resumes held-back adds while the write cache has room; refuses those that waited
        the whole throttle time; looks again shortly while any are left."""
        self._throttle_timer = None
        if self._closed:
            return
        while self._throttled and not self.engine.write_cache_full:
            _, resume, _ = self._throttled.popleft()
            resume()
        now = self._loop.time()
        while self._throttled and self._throttled[0][0] <= now:
            _, _, done = self._throttled.popleft()
            self._rejected.inc()
            done(StatusCode.ETOOMANYREQUESTS)
        if self._throttled:
            self._throttle_timer = self._loop.call_later(THROTTLE_POLL_S, self._drain_throttled)

    def read_entry(
        self, ledger_id: int, entry_id: int, fence: bool, master_key: bytes | None, done: ReadDone
    ) -> None:
        done = self._timed(self._fence_stats if fence else self._read_stats, done)
        self._read_at = time.perf_counter()
        if _bad_read_ids(ledger_id, entry_id):
            done(StatusCode.EBADREQ, b"")
            return
        if not fence:
            try:
                answer = self._read(ledger_id, entry_id, nowait=True)
            except ReadWouldBlockError:
                self._read_rest_from_disk(
                    ledger_id,
                    [entry_id],
                    lambda _, entries, statuses: done(statuses.get(0, StatusCode.EOK), entries[0]),
                )
            else:
                done(*answer)
            return
        if self._refuses_writes():
            done(StatusCode.EIO, b"")
            return
        info, status = self._ensure_ledger(ledger_id, master_key or b"")
        if info is None:
            done(status, b"")
            return

        def fenced(ok: bool) -> None:
            if not ok:
                done(StatusCode.EIO, b"")
            else:
                done(*self._read(ledger_id, entry_id, fencing=True))

        waiting = self._fences_in_flight.get(ledger_id)
        if waiting is not None:
            waiting.append(fenced)
            return
        if info.fenced:
            fenced(True)
            return
        self._fences_in_flight[ledger_id] = [fenced]

        def durable(error: Exception | None) -> None:
            for callback in self._fences_in_flight.pop(ledger_id, []):
                callback(error is None)

        self.engine.fence(ledger_id, durable)

    # -- last add confirmed and long polls --------------------------------------------------

    def last_add_confirmed(self, ledger_id: int) -> int:
        """The largest LAC this bookie has seen for the ledger (-1 if none)."""
        lac = self._lacs.get(ledger_id)
        if lac is not None:
            return lac
        lac = -1
        remember = True
        try:  # straight from storage: an internal lookup, not a client read (bookie_READ_BYTES)
            last = self.engine.read(ledger_id, -1)
        except (NoLedgerError, NoEntryError):
            last = b""
        except StorageIOError as error:
            log.error(
                "ledger %d: cannot read its last entry to learn its LAC: %s", ledger_id, error
            )
            last = b""
            remember = False  # a guess from the explicit LAC only: ask the storage next time
        if len(last) >= 24:
            lac = _LAC_AT.unpack_from(last, 16)[0]
        info = self.engine.ledger(ledger_id)
        if info is not None and info.explicit_lac is not None and len(info.explicit_lac) >= 16:
            lac = max(lac, _LAC_AT.unpack_from(info.explicit_lac, 8)[0])
        if remember:
            self._remember_lac(ledger_id, lac)
        return lac

    def _remember_lac(self, ledger_id: int, lac: int) -> None:
        if len(self._lacs) >= LAC_CACHE_SIZE and ledger_id not in self._lacs:
            for old in list(self._lacs)[
                : LAC_CACHE_SIZE // 2
            ]:  # recomputed from storage when asked
                if old not in self._lac_waiters:
                    del self._lacs[old]
        self._lacs[ledger_id] = lac

    def _advance_lac(self, ledger_id: int, lac: int) -> None:
        # (Once per batch of adds: the LAC known, and kept, without a call where it is cached.)
        lacs = self._lacs
        known = lacs.get(ledger_id)
        if known is None:
            known = self.last_add_confirmed(ledger_id)
        if lac <= known:
            return
        if ledger_id in lacs:
            lacs[ledger_id] = lac
        else:
            self._remember_lac(ledger_id, lac)
        waiters = self._lac_waiters.get(ledger_id)
        if not waiters:
            return
        ready = [waiter for waiter in waiters if waiter.previous_lac < lac]
        self._lac_waiters[ledger_id] = [waiter for waiter in waiters if waiter.previous_lac >= lac]
        if not self._lac_waiters[ledger_id]:
            del self._lac_waiters[ledger_id]
        for waiter in ready:
            if waiter.timer is not None:
                waiter.timer.cancel()
            waiter.wake()

    def read_long_poll(
        self,
        ledger_id: int,
        entry_id: int,
        previous_lac: int,
        timeout_s: float,
        piggyback: bool,
        done: LongPollDone,
    ) -> None:
        """Answers once the ledger's LAC passes ``previous_lac`` (at once if it has) or when
        ``timeout_s`` ends: EOK with maxLAC, and with ``piggyback`` the entry ``entry_id`` (its
        read status if this bookie does not hold it). A timeout answers EOK with the unchanged
        maxLAC and no entry."""
        done = self._timed(self._long_poll_stats, done)
        self._read_at = time.perf_counter()
        if ledger_id < 0 or previous_lac < LAST_ENTRY or entry_id < LAST_ENTRY:
            done(StatusCode.EBADREQ, b"", LAST_ENTRY)
            return

        if piggyback and entry_id == LAST_ENTRY:
            entry_id = previous_lac + 1  # Java's clients name the entry by previousLAC

        def answer() -> None:
            lac = self.last_add_confirmed(ledger_id)
            if piggyback and lac > previous_lac:
                status, body = self._read(ledger_id, entry_id)
                if status in (
                    StatusCode.ENOENTRY,
                    StatusCode.ENOLEDGER,
                    StatusCode.EUNKNOWNLEDGERSTATE,
                ):
                    status, body = StatusCode.EOK, b""  # best effort: striped elsewhere
                done(status, body, lac)
            else:
                done(StatusCode.EOK, b"", lac)

        if (
            self.last_add_confirmed(ledger_id) > previous_lac
            or timeout_s <= 0
            or self._shutting_down
        ):
            answer()
            return
        if self.parked_long_polls >= self.config.max_parked_long_polls:
            self._rejected.inc()
            done(StatusCode.ETOOMANYREQUESTS, b"", self.last_add_confirmed(ledger_id))
            return
        self.parked_long_polls += 1

        def answer_parked() -> None:
            self.parked_long_polls -= 1
            answer()

        waiter = _LacWaiter(previous_lac, answer_parked)

        def expire() -> None:
            waiters = self._lac_waiters.get(ledger_id, [])
            if waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    self._lac_waiters.pop(ledger_id, None)
                answer_parked()

        waiter.timer = self._loop.call_later(timeout_s, expire)
        self._lac_waiters.setdefault(ledger_id, []).append(waiter)

    def batch_read(
        self, ledger_id: int, start: int, max_count: int, max_size: int
    ) -> tuple[StatusCode, list[bytes]]:
        """Entries from ``start`` on, at most ``max_count`` of them and ``max_size`` bytes of answer
        (cut to the frame limit; the first entry is sent even if larger). The status is that of
        the first entry; the batch stops at the first entry that cannot be read."""
        started = self._read_at = time.perf_counter()
        if ledger_id < 0 or start < 0:
            self._batch_read_stats.failure(time.perf_counter() - started)
            return StatusCode.EBADREQ, []
        status, entries = self._batch_read(ledger_id, start, max_count, max_size)
        elapsed = time.perf_counter() - started
        # BookKeeper counts a batch read as a read request too (its batch processor is one)
        if status == StatusCode.EOK:
            self._batch_read_stats.success(elapsed)
            self._read_stats.success(elapsed)
            self._read_bytes.inc(sum(map(len, entries)))
        else:
            self._batch_read_stats.failure(elapsed)
            self._read_stats.failure(elapsed)
        return status, entries

    def _batch_read(
        self, ledger_id: int, start: int, max_count: int, max_size: int
    ) -> tuple[StatusCode, list[bytes]]:
        budget = min(max_size, self.config.max_frame_size) - 32  # fixed part and request id
        count = max(0, min(max_count, 100_000))
        if count == 0:
            return StatusCode.EBADREQ, []
        unknown = self.limbo.active and self.limbo.unknown(ledger_id)
        try:
            entries = self.engine.read_range(ledger_id, start, count, budget)
        except (NoLedgerError, NoEntryError, StorageIOError) as error:
            return self._read_failed(ledger_id, start, error, unknown), []
        return StatusCode.EOK, entries

    def read_entries(
        self, ledger_id: int, entry_ids: list[int], done: ReadsDone
    ) -> tuple[list[bytes], dict[int, StatusCode]]:
        """Plain reads (no fencing) of one ledger that arrived together: the answers it can give
        at once, from the write cache or the page cache, as ``(entries, statuses)``:
        ``entries[i]`` answers ``entry_ids[i]``, EOK unless ``statuses`` holds another status
        under ``i`` (then the entry is empty). From the first entry that must come from a disk
        on, the rest are read on a reader thread and answered the same way, through
        ``done(entry_ids, entries, statuses)``. Each read's latency is recorded as for
        ``read_entry`` (all of them took the time the whole run took)."""
        started = self._read_at = time.perf_counter()
        stats = self._read_stats
        entries: list[bytes] = []
        statuses: dict[int, StatusCode] = {}
        taken = self._serve_reads(ledger_id, entry_ids, entries, statuses, nowait=True)
        if taken < len(entry_ids):
            self._read_rest_from_disk(ledger_id, entry_ids[taken:], done, (started, stats))
        _observe_run(stats, len(entries), statuses, time.perf_counter() - started)
        return entries, statuses

    def _serve_reads(
        self,
        ledger_id: int,
        entry_ids: list[int],
        entries: list[bytes],
        statuses: dict[int, StatusCode],
        nowait: bool,
    ) -> int:
        """Answers ``entry_ids`` in order into ``entries`` and ``statuses`` (see
        ``read_entries``): runs of them as the storage serves them together (``read_many``),
        each other one on its own. With ``nowait``, stops at the first that must come from a
        disk; how many were answered."""
        at, count = 0, len(entry_ids)
        read_many, read = self.engine.read_many, self._read
        with self.engine.read_run(ledger_id):
            while at < count:
                run = read_many(ledger_id, entry_ids, at, nowait)
                if run:
                    self._read_bytes.inc(sum(map(len, run)))
                    entries += run
                    at += len(run)
                    if at == count:
                        break
                entry_id = entry_ids[at]
                if _bad_read_ids(ledger_id, entry_id):
                    status, body = StatusCode.EBADREQ, b""
                else:
                    try:
                        status, body = read(ledger_id, entry_id, nowait=nowait)
                    except ReadWouldBlockError:
                        return at
                if status is not StatusCode.EOK:
                    statuses[at] = status
                entries.append(body)
                at += 1
        return at

    def _read_rest_from_disk(
        self,
        ledger_id: int,
        entry_ids: list[int],
        done: ReadsDone,
        timed: tuple[float, OpStats] | None = None,
    ) -> None:
        """Reads entries that must come from a disk (a read, or the rest of a run) on a reader
        thread (the loop's executor), so that the loop serves other requests (a writer's adds)
        meanwhile; they are answered together on the loop (``done``, as ``read_entries``
        answers), their latencies recorded in ``timed`` (since when, where) if given."""
        self._disk_reads.inc(len(entry_ids))
        self._reads_off_loop += len(entry_ids)

        def serve() -> tuple[list[bytes], dict[int, StatusCode]]:
            entries: list[bytes] = []
            statuses: dict[int, StatusCode] = {}
            self._serve_reads(ledger_id, entry_ids, entries, statuses, nowait=False)
            return entries, statuses

        def answer(future: asyncio.Future[tuple[list[bytes], dict[int, StatusCode]]]) -> None:
            try:
                entries, statuses = future.result()
            except Exception:
                log.exception("ledger %d: reading %d entries failed", ledger_id, len(entry_ids))
                entries = [b""] * len(entry_ids)
                statuses = dict.fromkeys(range(len(entry_ids)), StatusCode.EIO)
            self._reads_off_loop -= len(entry_ids)
            if timed is not None:
                _observe_run(timed[1], len(entries), statuses, time.perf_counter() - timed[0])
            done(entry_ids, entries, statuses)

        self._loop.run_in_executor(None, serve).add_done_callback(answer)

    def _read(
        self,
        ledger_id: int,
        entry_id: int,
        count: bool = True,
        fencing: bool = False,
        nowait: bool = False,
    ) -> tuple[StatusCode, bytes]:
        """One entry from storage; ``count``: add it to bookie_READ_BYTES (a batch counts only
        the entries it sends). In limbo, absence is answered EUNKNOWNLEDGERSTATE, except to a
        fencing read: its fence is durable, and the last entry it reports is only a lower bound
        of the LAC, which recovery reads forward from (meeting this bookie's unknown answers).
        ``nowait``: ``ReadWouldBlockError`` if the entry must come from a disk."""
        unknown = self.limbo.active and not fencing and self.limbo.unknown(ledger_id)
        if entry_id == LAST_ENTRY and unknown:
            return StatusCode.EUNKNOWNLEDGERSTATE, b""  # its last entry may be among the lost
        try:
            entry = self.engine.read(ledger_id, entry_id, nowait)
        except (NoLedgerError, NoEntryError, StorageIOError) as error:
            return self._read_failed(ledger_id, entry_id, error, unknown), b""
        if count:
            self._read_bytes.inc(len(entry))
        return StatusCode.EOK, entry

    @staticmethod
    def _read_failed(ledger_id: int, entry_id: int, error: Exception, unknown: bool) -> StatusCode:
        """The answer to a read the storage could not serve; ``unknown``: the ledger is in
        limbo (an absent entry may have been lost)."""
        if isinstance(error, StorageIOError):
            log.error("ledger %d entry %d: %s", ledger_id, entry_id, error)
            return StatusCode.EIO
        if unknown:
            return StatusCode.EUNKNOWNLEDGERSTATE
        return StatusCode.ENOLEDGER if isinstance(error, NoLedgerError) else StatusCode.ENOENTRY

    def write_lac(self, ledger_id: int, master_key: bytes, body: bytes, done: StatusDone) -> None:
        done = self._timed(self._write_lac_stats, done)
        if self._refuses_writes():
            done(StatusCode.EIO)
            return
        info, status = self._ensure_ledger(ledger_id, master_key)
        if info is None:
            done(status)
            return

        # As with the LAC an entry carries: the writer's word that entries up to it have Qa
        # durable copies, known (and long polls answered) on arrival, as BookKeeper's
        # setExplicitLac does; the journal record only keeps it across a restart.
        if len(body) >= 16:
            self._advance_lac(ledger_id, _LAC_AT.unpack_from(body, 8)[0])

        def durable(error: Exception | None) -> None:
            done(StatusCode.EOK if error is None else StatusCode.EIO)

        self.engine.set_explicit_lac(ledger_id, body, durable)

    def read_lac(self, ledger_id: int) -> tuple[StatusCode, bytes | None, bytes | None]:
        """(status, explicit LAC body, last entry) for READ_LAC."""
        self._read_at = time.perf_counter()
        info = self.engine.ledger(ledger_id)
        if info is None:
            return StatusCode.ENOLEDGER, None, None
        status, last_entry = self._read(ledger_id, -1)
        if status not in (StatusCode.EOK, StatusCode.ENOENTRY):
            return status, None, None
        last = last_entry if status == StatusCode.EOK else None
        if info.explicit_lac is None and last is None:
            return StatusCode.ENOENTRY, None, None
        return StatusCode.EOK, info.explicit_lac, last

    def force_ledger(self, ledger_id: int, done: StatusDone) -> None:
        done = self._timed(self._force_stats, done)
        if self._refuses_writes():
            done(StatusCode.EIO)
            return

        def durable(error: Exception | None) -> None:
            done(StatusCode.EOK if error is None else StatusCode.EIO)

        self.engine.force(ledger_id, durable)

    def list_entries(self, ledger_id: int, done: Callable[[StatusCode, bytes], None]) -> None:
        """Answers ``done(status, availability bytes)`` with the entries held of the ledger.

        The index scan runs on a worker thread: a ledger of millions of entries must not stall
        the loop (the write cache is read under its lock, so any thread may call this)."""
        done = self._timed(self._list_entries_stats, done)
        if self.limbo.unknown(ledger_id):
            done(StatusCode.EUNKNOWNLEDGERSTATE, b"")  # what it holds may lack lost entries
            return

        def scan() -> tuple[StatusCode, bytes]:
            try:
                return StatusCode.EOK, availability.encode(self.engine.entry_ids(ledger_id))
            except NoLedgerError:
                return StatusCode.ENOLEDGER, b""
            except Exception:
                log.exception("ledger %d: listing its entries failed", ledger_id)
                return StatusCode.EIO, b""

        def answer(future: asyncio.Future[tuple[StatusCode, bytes]]) -> None:
            done(*future.result())

        self._loop.run_in_executor(None, scan).add_done_callback(answer)

    def _writable_ledger_dirs(self) -> float:
        """Ledger directories under diskUsageThreshold at the last disk check (none once a
        write ran out of space)."""
        if self.engine.out_of_space:
            return 0.0
        limit = self.disk.thresholds.usage_threshold
        return float(
            sum(
                1
                for directory in self.config.storage.ledger_directories
                if self.disk.usages.get(directory, 0.0) < limit
            )
        )

    def disk_info(self) -> tuple[int, int]:
        """(total, free) bytes of the ledger disks (each file system counted once)."""
        seen: set[int] = set()
        total = free = 0
        for directory in self.config.storage.ledger_directories:
            device = os.stat(directory).st_dev
            if device in seen:
                continue
            seen.add(device)
            size, room = total_and_free(directory)
            total += size
            free += room
        return total, free
