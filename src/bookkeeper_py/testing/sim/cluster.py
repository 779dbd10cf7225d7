"""A simulated cluster on the virtual-time loop: bookies, a metadata store, a network and real
clients (``BookKeeper`` over the simulated port), with the plumbing every kind of run shares:
starting a client's work as a task of its node, reporting a violation, scheduling at a virtual
time, restarting bookies and shutting everything down."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import replace
from typing import Any

from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.client.clock import LoopClock
from bookkeeper_py.client.config import ClientConfig
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.metadata.manager import BookieEndpoint
from bookkeeper_py.testing.sim.bookie import BOOKIE_PORT, BookieFaults, SimBookie
from bookkeeper_py.testing.sim.disk import Disk, DiskFaults
from bookkeeper_py.testing.sim.loop import SimulationStuck, VirtualTimeLoop, current_node
from bookkeeper_py.testing.sim.metadata import (
    InvariantViolation,
    MetadataFaults,
    SimMetadata,
    SimStore,
)
from bookkeeper_py.testing.sim.network import Network, NetworkFaults


class SimCluster:
    """``bookies`` simulated bookies (all registered writable), a store, and one client per
    name of ``clients``, each with its own metadata port and network node."""

    def __init__(
        self,
        rng: random.Random,
        *,
        bookies: int,
        clients: Iterable[str],
        config: ClientConfig,
        network: NetworkFaults,
        metadata_failure_probability: float = 0.0,
        read_error_probability: float = 0.0,
        sync_failure_probability: float = 0.0,
        bookie_faults: Callable[[BookieFaults], None] | None = None,
    ) -> None:
        self.rng = rng
        self.loop = VirtualTimeLoop()
        self.network = Network(self.loop, random.Random(rng.random()), network)
        self.loop.network = self.network
        self.store = SimStore(
            random.Random(rng.random()),
            MetadataFaults(failure_probability=metadata_failure_probability),
        )
        # A violation a store check finds is the run's, whatever the caller does with the error.
        self.store.on_violation = self._violated
        self.bookies: dict[str, SimBookie] = {}
        for index in range(bookies):
            name = f"bookie-{index}"
            faults = BookieFaults(read_error_probability=read_error_probability)
            if bookie_faults is not None:
                bookie_faults(faults)
            disk = Disk(random.Random(rng.random()), DiskFaults(sync_failure_probability))
            bookie = SimBookie(
                name, self.loop, random.Random(rng.random()), self.network, disk, faults
            )
            self.bookies[bookie.bookie_id] = bookie
            self.register(bookie)
        self.ports: dict[str, SimMetadata] = {}
        self.clients: dict[str, BookKeeper] = {}
        for name in clients:
            self.ports[name] = self.store.port(name)
            self.clients[name] = BookKeeper(
                self.ports[name],
                config,
                clock=LoopClock(self.loop),
                rng=random.Random(rng.random()),
            )
        self.violation: str | None = None
        self._done = self.loop.create_future()
        self._ended = False
        self._lost: set[str] = set()  # bookies that never come back
        self._tasks: set[asyncio.Task[None]] = set()

    def _start(self, node: str, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        context = contextvars.copy_context()
        context.run(current_node.set, node)
        task = self.loop.create_task(self._guarded(work), context=context)
        # held until done: a task waiting on a future nothing else holds (a dead node's
        # answer) would otherwise be collected, its coroutine closed in the middle
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _guarded(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except InvariantViolation as error:
            self._violated(str(error))
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._violated(f"{type(error).__name__}: {error}")

    def _violated(self, what: str) -> None:
        if self.violation is None:
            self.violation = what
        if not self._done.done():
            self._done.set_result(None)

    def _at(self, at_ms: float, callback: Callable[[], object]) -> None:
        def fire() -> None:
            if not self._ended:  # nothing new starts while the run winds down
                callback()

        self.loop.call_at(at_ms / 1000, fire)

    def register(self, bookie: SimBookie) -> None:
        """``bookie`` is in the registry (writable), as a bookie that started registers itself."""
        self.store.writable[bookie.bookie_id] = _endpoint(bookie)

    def unregister(self, bookie: SimBookie) -> None:
        """``bookie`` leaves the registry, as its registration ends with its session when it
        dies (the auditor sees it gone)."""
        self.store.writable.pop(bookie.bookie_id, None)

    def _crash_client(self, name: str) -> None:
        """A client process dies: its connections drop, its metadata calls never return."""
        self.network.crash(name, client=True)
        self.ports[name].crashed = True
        self.clients[name].pool.close()

    def _restart(self, bookie: SimBookie) -> Callable[[], None]:
        def restart() -> None:
            if not bookie.up:
                bookie.start()

        return restart

    def _partition(self, side: list[str], other: list[str]) -> Callable[[], None]:
        return lambda: self.network.partition(side, other)

    def _heal_faults(self, max_delay_ms: float) -> None:
        """The fault phase ends: the network heals, the store and the disks stop failing and
        every bookie not lost for good comes back."""
        self.network.heal()
        self.network.faults = NetworkFaults(0.1, max_delay_ms, 0.0)
        self.store.faults.failure_probability = 0.0
        self.store.faults.lost_answer_probability = 0.0
        for bookie in self.bookies.values():
            bookie.faults.read_error_probability = 0.0
            bookie.disk.faults.sync_failure_probability = 0.0
            if not bookie.up and bookie.bookie_id not in self._lost:
                bookie.start()

    def _run_checked(
        self, main: Coroutine[Any, Any, None], final_check: Callable[[], None]
    ) -> str | None:
        """Runs ``main`` on the loop, then ``final_check``; the violation found (None: none),
        the loop shut down either way. ``_after_iteration`` checks after every step."""
        loop = self.loop
        loop.after_iteration = self._after_iteration
        try:
            loop.run_until_complete(main)
            if self.violation is not None:
                raise InvariantViolation(self.violation)
            final_check()  # names what did not finish
        except InvariantViolation as error:
            return str(error)
        except SimulationStuck as error:
            return f"stuck: {error}"
        finally:
            loop.after_iteration = None
            self._shut_down()
        return None

    def _after_iteration(self) -> None:
        """Checked after every step of the loop (a run's invariants)."""

    def _shut_down(self) -> None:
        """Cancels what still runs and closes the loop (nothing is left for a collector to
        complain about)."""
        loop = self.loop
        self._ended = True
        # What is left unfinished at the end is dropped, not reported.
        loop.set_exception_handler(lambda _loop, _context: None)

        async def close_connections() -> None:  # on the loop: what fails may start tasks
            for client in self.clients.values():
                client.pool.close()

        try:
            with contextlib.suppress(SimulationStuck, RuntimeError):
                loop.run_until_complete(close_connections())
            # Cancelled tasks may start others as they end: again until none is left.
            for _ in range(20):
                tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
                if not tasks:
                    break
                for task in tasks:
                    task.cancel()
                try:
                    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                except (SimulationStuck, RuntimeError):
                    break
        finally:
            loop.close()


def write_set_of(metadata: LedgerMetadata, entry_id: int) -> list[str]:
    """The bookies that store ``entry_id`` by ``metadata``: its write set in its fragment."""
    ensemble = metadata.ensemble_at(entry_id)
    members = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum_size)
    return [ensemble[i] for i in members]


def sim_client_config(**overrides: Any) -> ClientConfig:
    """The clients' settings on the simulation's time scale (ms): short timeouts, speculative
    reads and a short memory of failed bookies; ``overrides`` are ``ClientConfig`` fields."""
    config = ClientConfig(
        connect_timeout_s=0.05,
        request_timeout_s=0.1,  # the add timeout
        speculative_read_timeout_ms=20,
        max_speculative_read_timeout_ms=40,
        speculative_read_lac_timeout_ms=20,
        max_speculative_read_lac_timeout_ms=40,
        bookie_failure_history_ms=1000,
    )
    return replace(config, **overrides)


def _endpoint(bookie: SimBookie) -> BookieEndpoint:
    return BookieEndpoint(bookie.bookie_id, bookie.name, BOOKIE_PORT)
