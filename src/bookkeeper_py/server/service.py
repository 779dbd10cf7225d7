"""The bookie's admin operations as a service returning data: what the HTTP admin API (and the
coming REST API and dashboard) show and change, without reaching into the storage engine's
parts. ``server.http`` only turns these answers into BookKeeper's JSON."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bookkeeper_py.errors import BKError
from bookkeeper_py.server.bookie import Bookie
from bookkeeper_py.storage.disk import total_and_free
from bookkeeper_py.storage.engine import StorageEngine
from bookkeeper_py.storage.gc import GarbageCollector, GcStatus
from bookkeeper_py.storage.inspect import entry_files


@dataclass(frozen=True)
class BookieInfo:
    bookie_id: str
    total_bytes: int
    free_bytes: int
    read_only: bool
    journal_directories: tuple[str, ...]
    ledger_directories: tuple[str, ...]
    # (kind "journal" or "ledger", path, total bytes, free bytes) of each directory's file system
    directory_usage: tuple[tuple[str, str, int, int], ...] = ()


@dataclass(frozen=True)
class BookieState:
    running: bool
    read_only: bool
    shutting_down: bool
    writable_for_high_priority: bool  # the engine still takes writes


@dataclass(frozen=True)
class DiskFiles:
    journals: tuple[str, ...]
    entry_logs: tuple[str, ...]
    index: tuple[str, ...]


class StateChangeRefused(BKError):
    """The configuration forbids the read-only switch asked for."""


class GcNotRunning(BKError):
    """The bookie runs no garbage collection (yet): it starts once the bookie reaches the
    metadata store."""


class BookieService:
    """Admin operations of one bookie process: ``bookie`` over the real ``engine``."""

    def __init__(
        self,
        bookie: Bookie,
        engine: StorageEngine,
        bookie_id: str,
        state_changed: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._bookie = bookie
        self._engine = engine
        self._bookie_id = bookie_id
        self._state_changed = state_changed
        self._storage = bookie.config.storage

    def info(self) -> BookieInfo:
        total, free = self._bookie.disk_info()
        return BookieInfo(
            self._bookie_id,
            total,
            free,
            self._bookie.read_only,
            tuple(self._storage.journal_directories),
            tuple(self._storage.ledger_directories),
            tuple(
                (kind, path, *total_and_free(path))
                for kind, paths in (
                    ("journal", self._storage.journal_directories),
                    ("ledger", self._storage.ledger_directories),
                )
                for path in paths
            ),
        )

    def state(self) -> BookieState:
        return BookieState(
            running=True,
            read_only=self._bookie.read_only,
            shutting_down=False,
            writable_for_high_priority=self._engine.failure is None,
        )

    async def set_read_only(self, read_only: bool) -> bool:
        """The operator's read-only switch; re-registers the bookie. The mode now in force
        (a full disk keeps it read-only). ``StateChangeRefused`` where the configuration forbids
        it, with BookKeeper's words: forceReadOnlyBookie keeps it read-only, and
        readOnlyModeEnabled=false forbids read-only."""
        config = self._bookie.config
        if not read_only and config.force_read_only:
            raise StateChangeRefused(
                "Bookie is in forceReadOnly mode, cannot transit to writable mode"
            )
        if read_only and not config.read_only_mode_enabled:
            raise StateChangeRefused(
                "Bookie is disabled ReadOnly mode, cannot transit to readOnly mode"
            )
        self._bookie.set_forced_read_only(read_only)
        if self._state_changed is not None:
            await self._state_changed()
        return self._bookie.read_only

    def last_log_marks(self) -> dict[str, tuple[int, int] | None]:
        """Per journal directory, the LastLogMark (journal file id, offset) replay starts
        from; None before the first checkpoint."""
        return dict(zip(self._storage.journal_directories, self._engine.last_marks, strict=True))

    def disk_files(self) -> DiskFiles:
        storage = self._storage
        journals: list[str] = []
        logs: list[str] = []
        index: list[str] = []
        for number, directory in enumerate(storage.ledger_directories):
            found = entry_files(list(storage.journal_directories) if number == 0 else [], directory)
            journals += found[0]
            logs += found[1]
            index += found[2]
        return DiskFiles(journals=tuple(journals), entry_logs=tuple(logs), index=tuple(index))

    # -- garbage collection (BookKeeper's /api/v1/bookie/gc*) ----------------------------------

    def _gcs(self) -> list[GarbageCollector]:
        """The garbage collectors, one per ledger directory (``GcNotRunning`` before)."""
        gcs = self._engine.gcs
        if not gcs:
            raise GcNotRunning(
                "garbage collection is not running on this bookie: it starts once the bookie "
                "has reached the metadata store"
            )
        return gcs

    def force_gc(self, major: bool | None = None, minor: bool | None = None) -> bool:
        """Asks every directory's collector for a round now (see ``GarbageCollector.force``);
        False if one was running a forced round already."""
        return all([gc.force(major, minor) for gc in self._gcs()])

    def gc_in_force(self) -> bool:
        return any(gc.in_force for gc in self._gcs())

    def gc_status(self) -> list[GcStatus]:
        """One status per garbage collector (per ledger directory, as BookKeeper's)."""
        return [gc.status() for gc in self._gcs()]

    def gc_suspended(self) -> tuple[bool, bool]:
        """(major, minor) compactions suspended (they are suspended and resumed together)."""
        gc = self._gcs()[0]
        return gc.major_suspended, gc.minor_suspended

    def suspend_gc(self, *, major: bool, minor: bool) -> None:
        for gc in self._gcs():
            gc.suspend(major=major, minor=minor)

    def resume_gc(self, *, major: bool, minor: bool) -> None:
        for gc in self._gcs():
            gc.resume(major=major, minor=minor)

    def describe(self) -> str:
        """BookKeeper's ``BookieServer.toString()``, which its GC answers name the bookie by."""
        config = self._bookie.config
        return f"Bookie Server listening on {config.host}:{config.port} with id {self._bookie_id}"
