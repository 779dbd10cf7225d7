"""An asyncio event loop in virtual time: the simulator runs the client's and the bookie's real
asyncio code (handles, connections, timers, ``asyncio.wait_for``) on it, deterministically.

Nothing sleeps: when no callback is ready, time jumps to the next timer. There is no real I/O:
``create_connection`` and ``create_server`` go to the simulated ``network.Network`` (transports
carrying bytes between protocols), executors run their function at once, and a loop with
nothing ready and no timer is stuck for good (``SimulationStuck``), not waiting. Callbacks run
in asyncio's order (ready FIFO, then timers by time; timers due at the same time in the order
of asyncio's heap, which the same operations always rebuild the same way), so a seed replays
the same run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bookkeeper_py.testing.sim.network import Network

#: The simulated node the running code belongs to ("writer", "bookie-2"...): every task and
#: callback started under it inherits it, and the network names connections by it.
current_node: contextvars.ContextVar[str] = contextvars.ContextVar("sim_node", default="?")


class SimulationStuck(RuntimeError):
    """Nothing is ready and no timer is set: the awaited result can never come."""


class _VirtualSelector:
    """What the loop polls between iterations: no file descriptors; a poll with a timeout moves
    the clock to the next timer instead of sleeping."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        if timeout is None:
            raise SimulationStuck(
                f"nothing is ready and no timer is set at virtual {self._loop.time():.6f} s"
            )
        if timeout > 0:
            self._loop.advance_to_next_timer(timeout)
        return []

    def close(self) -> None:
        pass


class VirtualTimeLoop(asyncio.BaseEventLoop):
    """``asyncio.BaseEventLoop`` with a virtual clock (seconds from 0) and the simulated
    network for connections. ``after_iteration`` (if set) runs after every loop iteration: the
    simulator checks its invariants there."""

    def __init__(self, network: Network | None = None) -> None:
        super().__init__()
        self._now = 0.0
        self._clock_resolution = 1e-9
        self._selector = _VirtualSelector(self)
        self.network = network
        self.iterations = 0
        self.after_iteration: Callable[[], None] | None = None

    # -- the clock -----------------------------------------------------------------------------

    def time(self) -> float:
        return self._now

    def advance_to_next_timer(self, timeout: float) -> None:
        scheduled = self._scheduled  # type: ignore[attr-defined]
        target = scheduled[0]._when if scheduled else self._now + timeout
        self._now = max(self._now, target)

    def _run_once(self) -> None:
        super()._run_once()  # type: ignore[misc]
        self.iterations += 1
        if self.after_iteration is not None:
            self.after_iteration()

    def pending_timers(self) -> int:
        scheduled = self._scheduled  # type: ignore[attr-defined]
        return sum(1 for handle in scheduled if not handle.cancelled())

    # -- what BaseEventLoop leaves to its subclasses -------------------------------------------

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass  # call_soon_threadsafe: there are no other threads to wake us

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        """Runs ``func`` now, on the loop's thread: a real thread would run outside virtual
        time and in an order no seed decides."""
        future: asyncio.Future[Any] = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as error:
            future.set_exception(error)
        return future

    def set_default_executor(self, executor: concurrent.futures.Executor) -> None:
        raise RuntimeError("the simulation's loop runs executor work inline")

    # -- connections go to the simulated network -----------------------------------------------

    async def create_connection(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: str | None = None,
        port: int | None = None,
        **_options: Any,
    ) -> tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
        if self.network is None:
            raise ConnectionRefusedError("no simulated network on this loop")
        assert host is not None and port is not None
        return await self.network.connect(current_node.get(), host, port, protocol_factory)

    async def getaddrinfo(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError("the simulation has no name resolution; connect by simulated address")
