"""The storage engine's interface over a simulated disk and clock, so that the simulator runs the
real request handling of ``bookkeeper_py.server.bookie.Bookie``: master keys, fencing, recovery
adds, the LAC it keeps, long polls, DEFERRED_SYNC and FORCE_LEDGER, explicit LACs.

What it does not run is the real storage engine (journal files, entry logs, the index): records
go to a ``Disk`` that keeps them in memory, loses the unsynced ones on a crash and can lose
everything; a sync after ``sync_delay_ms`` completes every record queued before it, as the
journal's group commit does. A bookie restarts by replaying what the disk kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from bookkeeper_py.storage.ledger_storage import (
    LedgerInfo,
    NoEntryError,
    NoLedgerError,
    StorageIOError,
    read_range_with,
)
from bookkeeper_py.testing.sim.disk import Disk
from bookkeeper_py.wire.status import StatusCode

SyncCallback = Callable[[list[Any], Exception | None], None]


class SimEngine:
    """A ``storage.engine.LedgerEngine`` over a ``Disk``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        rng: random.Random,
        disk: Disk,
        synced: SyncCallback,
        *,
        sync_delay_ms: float,
        read_error_probability: Callable[[], float],
        read_error: Callable[[], StatusCode],
        force_before_sync: Callable[[], bool] = lambda: False,
    ) -> None:
        self.loop, self.rng, self.disk, self._synced = loop, rng, disk, synced
        self.sync_delay_ms = sync_delay_ms
        self._read_error_probability = read_error_probability
        self._read_error = read_error
        self._force_before_sync = force_before_sync
        self.failure: Exception | None = None
        self.lost_journal_tails: list[str] = []
        self.write_cache_full = False
        self._ledgers: dict[int, LedgerInfo] = {}
        self._entries: dict[int, dict[int, bytes]] = {}
        self._tokens: list[Any] = []
        self._sync_timer: asyncio.TimerHandle | None = None
        self._replay()

    def _replay(self) -> None:
        for record in self.disk.durable:
            kind, ledger_id = record[0], record[1]
            assert isinstance(ledger_id, int)
            if kind == "key":
                key = record[2]
                assert isinstance(key, bytes)
                self._ledgers.setdefault(ledger_id, LedgerInfo(key))
            elif kind == "entry":
                entry_id, body = record[2], record[3]
                assert isinstance(entry_id, int) and isinstance(body, bytes)
                self._entries.setdefault(ledger_id, {})[entry_id] = body
            elif kind == "fence":
                self._ledgers[ledger_id].fenced = True
            elif kind == "lac":
                body = record[2]
                assert isinstance(body, bytes)
                self._ledgers[ledger_id].explicit_lac = body

    def read_run(self, ledger_id: int) -> AbstractContextManager[None]:
        """Reads of the simulated disk share nothing."""
        return contextlib.nullcontext()

    def read_many(
        self, ledger_id: int, entry_ids: list[int], start: int, nowait: bool = False
    ) -> list[bytes]:
        """None together: each read of the simulated disk goes on its own (``read``), where the
        simulation decides how it fails."""
        return []

    def read_range(self, ledger_id: int, first: int, max_count: int, max_bytes: int) -> list[bytes]:
        """One ``read`` after another (each may fail as the simulation decides)."""
        return read_range_with(self.read, lambda *_: [], ledger_id, first, max_count, max_bytes)

    def write_journals_on(
        self,
        loop: asyncio.AbstractEventLoop,
        inline_ok: Callable[[], bool],
        call_on_loop: Callable[[Callable[[], Any]], Any],
    ) -> None:
        """The simulated journal is written and synced on the loop's clock already."""

    def stop(self) -> None:
        """A crash: queued records are never answered (the disk decides what survives)."""
        if self._sync_timer is not None:
            self._sync_timer.cancel()
            self._sync_timer = None
        self._tokens = []

    # -- the interface -------------------------------------------------------------------------

    def start(self) -> int:
        return 0

    def close(self) -> None:
        self.stop()

    @staticmethod
    def key_matches(info: LedgerInfo, master_key: bytes) -> bool:
        return hmac.compare_digest(info.master_key, master_key)

    def ledger(self, ledger_id: int) -> LedgerInfo | None:
        return self._ledgers.get(ledger_id)

    def create_ledger(self, ledger_id: int, master_key: bytes) -> LedgerInfo:
        info = self._ledgers[ledger_id] = LedgerInfo(master_key)
        self.disk.write(("key", ledger_id, master_key))
        return info

    def add_entry(
        self, ledger_id: int, entry_id: int, entry: bytes, token: Any, background: bool = False
    ) -> None:
        # (one journal, in order: the simulated disk has no lanes)
        self._entries.setdefault(ledger_id, {})[entry_id] = entry
        self._append(("entry", ledger_id, entry_id, entry), token)

    def add_entries(
        self, ledger_id: int, entry_ids: list[int], entries: list[bytes], token: Any
    ) -> None:
        last = len(entries) - 1
        for i, (entry_id, entry) in enumerate(zip(entry_ids, entries, strict=True)):
            self.add_entry(ledger_id, entry_id, entry, token if i == last else None)

    def fence(self, ledger_id: int, token: Any) -> None:
        self._ledgers[ledger_id].fenced = True
        self._append(("fence", ledger_id), token)

    def set_explicit_lac(self, ledger_id: int, body: bytes, token: Any) -> None:
        self._ledgers[ledger_id].explicit_lac = body
        self._append(("lac", ledger_id, body), token)

    def force(self, ledger_id: int, token: Any) -> None:
        if self._force_before_sync():  # the fault: answered as if the sync had happened
            self._synced([token], None)
            return
        self._append(None, token)

    def entry_ids(self, ledger_id: int) -> Iterator[int]:
        if ledger_id not in self._ledgers and ledger_id not in self._entries:
            raise NoLedgerError(f"ledger {ledger_id}")
        return iter(sorted(self._entries.get(ledger_id, {})))

    # A simulated disk never fills: the disk-space side of the interface has nothing to do.
    out_of_space = False

    def space_freed(self) -> None:
        pass

    def reclaim_journal_space(self, directories: Iterable[str]) -> None:
        pass

    def read(self, ledger_id: int, entry_id: int, nowait: bool = False) -> bytes:  # in memory
        if self.rng.random() < self._read_error_probability():
            if self._read_error() == StatusCode.ENOENTRY:
                raise NoEntryError(f"ledger {ledger_id} entry {entry_id}")  # the #2908 bug
            raise StorageIOError(f"simulated read error: ledger {ledger_id} entry {entry_id}")
        entries = self._entries.get(ledger_id)
        if entries is None:
            if ledger_id in self._ledgers:
                raise NoEntryError(f"ledger {ledger_id} holds no entries")
            raise NoLedgerError(f"ledger {ledger_id}")
        if entry_id == -1:
            if not entries:
                raise NoEntryError(f"ledger {ledger_id} holds no entries")
            entry_id = max(entries)
        body = entries.get(entry_id)
        if body is None:
            raise NoEntryError(f"ledger {ledger_id} entry {entry_id}")
        return body

    # -- group commit ----------------------------------------------------------------------------

    def _append(self, record: tuple[object, ...] | None, token: Any) -> None:
        if record is not None:
            self.disk.write(record)
        if token is not None:  # None: a record of a batch whose last record carries its token
            self._tokens.append(token)
        if self._sync_timer is None:
            self._sync_timer = self.loop.call_later(self.sync_delay_ms / 1000, self._sync)

    def _sync(self) -> None:
        self._sync_timer = None
        tokens, self._tokens = self._tokens, []
        error = None if self.disk.sync() else OSError("simulated fsync failure")
        self._synced(tokens, error)
