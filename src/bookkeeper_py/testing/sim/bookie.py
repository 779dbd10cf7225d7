"""A bookie of the simulation: the real ``server.bookie.Bookie`` (master keys, fencing, recovery
adds, the LAC it keeps, long polls, explicit LACs, DEFERRED_SYNC and FORCE_LEDGER) behind the
real ``server.connection.BookieConnection`` (frame decoding, v2/v3 detection, dispatch,
answers), over ``engine.SimEngine`` on a simulated ``Disk``, listening on the simulated network.

An add is answered once its record is synced (group commit), a fencing read once the fence
record is synced; a crash breaks the connections, forgets the memory (LAC cache, parked polls,
queued syncs) and keeps only what the disk kept; a restart replays the disk.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from bookkeeper_py.server.bookie import Bookie, BookieConfig
from bookkeeper_py.server.connection import BookieConnection
from bookkeeper_py.storage.engine import StorageConfig
from bookkeeper_py.testing.sim.disk import Disk
from bookkeeper_py.testing.sim.engine import SimEngine, SyncCallback
from bookkeeper_py.testing.sim.loop import current_node
from bookkeeper_py.testing.sim.network import Network
from bookkeeper_py.wire.status import StatusCode

BOOKIE_PORT = 3181


@dataclass
class BookieFaults:
    read_error_probability: float = 0.0
    # What a read that hit an I/O error answers: EIO. ENOENTRY models the bookies of BookKeeper
    # issue 2908, whose entry logger turned I/O errors into "no such entry".
    read_error_status: StatusCode = StatusCode.EIO
    sync_delay_ms: float = 1.0
    # A bookie that answers FORCE_LEDGER before its sync (a broken bookie, for tests).
    force_before_sync: bool = False


class SimBookie:
    """Bookie ``name`` (its node on the network; its id is ``name:3181``)."""

    def __init__(
        self,
        name: str,
        loop: asyncio.AbstractEventLoop,
        rng: random.Random,
        network: Network,
        disk: Disk,
        faults: BookieFaults,
    ) -> None:
        self.name = name
        self.bookie_id = f"{name}:{BOOKIE_PORT}"
        self.loop, self.rng, self.network, self.disk, self.faults = loop, rng, network, disk, faults
        self.up = False
        self.crashes = 0
        self._config = BookieConfig(
            storage=StorageConfig(
                journal_directory=f"/sim/{name}", ledger_directory=f"/sim/{name}"
            ),
            bookie_id=self.bookie_id,
        )
        self.bookie: Bookie | None = None
        self._engine: SimEngine | None = None
        self._connections: set[BookieConnection] = set()
        self.start()

    def _make_engine(self, _storage: object, synced: SyncCallback, _metrics: object) -> SimEngine:
        self._engine = SimEngine(
            self.loop,
            self.rng,
            self.disk,
            synced,
            sync_delay_ms=self.faults.sync_delay_ms,
            read_error_probability=lambda: self.faults.read_error_probability,
            read_error=lambda: self.faults.read_error_status,
            force_before_sync=lambda: self.faults.force_before_sync,
        )
        return self._engine

    def start(self) -> None:
        """Starts from what the disk holds (replay) and listens."""
        token = current_node.set(self.name)
        try:
            bookie = Bookie(self._config, self.loop, engine_factory=self._make_engine)
            self.bookie = bookie
            self.up = True
            self.network.listen(
                self.name,
                self.name,
                BOOKIE_PORT,
                lambda: BookieConnection(bookie, self._connections),
            )
        finally:
            current_node.reset(token)

    def crash(self) -> None:
        if not self.up:
            return
        self.up = False
        self.crashes += 1
        self.network.crash(self.name)
        if self._engine is not None:
            self._engine.stop()  # queued requests are never answered
        self.bookie = None
        self._connections.clear()
        self.disk.crash()

    def wipe(self) -> None:
        """Crashes and loses its disk: it comes back (``start``) empty, as on a new disk."""
        self.crash()
        self.disk.wipe()

    def holds_durably(self, ledger_id: int, entry_id: int) -> bool:
        """Whether a restart would bring the entry back."""
        return ("entry", ledger_id, entry_id) in self.disk.durable_keys

    def stored_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The entry as this bookie's disk holds it (synced or not), or None."""
        for record in (*self.disk.durable, *self.disk.unsynced):
            if record[:3] == ("entry", ledger_id, entry_id):
                body = record[3]
                assert isinstance(body, bytes)
                return body
        return None
