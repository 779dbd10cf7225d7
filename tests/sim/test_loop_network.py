"""The simulator's loop and network: virtual time, determinism per seed, byte streams between
protocols in order, and the faults they inject."""

from __future__ import annotations

import asyncio
import contextvars
import random

import pytest

from bookkeeper_py.testing.sim import Network, NetworkFaults, SimulationStuck, VirtualTimeLoop
from bookkeeper_py.testing.sim.loop import current_node


class Recorder(asyncio.Protocol):
    """Keeps what arrives, with the virtual time of its arrival; answers every chunk with
    ``echo`` when asked."""

    def __init__(self, loop: VirtualTimeLoop, echo: bool = False) -> None:
        self.loop, self.echo = loop, echo
        self.received: list[tuple[float, bytes]] = []
        self.lost: list[Exception | None] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received.append((self.loop.time(), data))
        if self.echo and self.transport is not None:
            self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)

    @property
    def stream(self) -> bytes:
        return b"".join(data for _, data in self.received)


def setup(seed: int, faults: NetworkFaults) -> tuple[VirtualTimeLoop, Network, list[Recorder]]:
    loop = VirtualTimeLoop()
    network = Network(loop, random.Random(seed), faults)
    loop.network = network
    servers: list[Recorder] = []

    def factory() -> Recorder:
        servers.append(Recorder(loop, echo=True))
        return servers[-1]

    network.listen("server", "server", 1, factory)
    return loop, network, servers


def run_as(loop: VirtualTimeLoop, node: str, coroutine) -> object:  # type: ignore[no-untyped-def]
    context = contextvars.copy_context()
    context.run(current_node.set, node)
    return loop.run_until_complete(loop.create_task(coroutine, context=context))


def exchange(seed: int, faults: NetworkFaults) -> list[tuple[float, bytes]]:
    loop, _, _ = setup(seed, faults)
    client = Recorder(loop)

    async def talk() -> None:
        transport, _ = await loop.create_connection(lambda: client, "server", 1)
        for i in range(100):
            transport.write(b"%03d" % i)
            await asyncio.sleep(0.0001)
        await asyncio.sleep(1)

    run_as(loop, "client", talk())
    loop.close()
    return client.received


def test_virtual_time_jumps_and_timers_keep_their_order() -> None:
    loop = VirtualTimeLoop()
    order: list[str] = []
    loop.call_at(5, order.append, "5a")
    loop.call_at(1, order.append, "1")
    loop.call_at(5, order.append, "5b")
    loop.call_at(3, order.append, "never").cancel()

    async def wait() -> float:
        await asyncio.sleep(3600)  # an hour, at once
        return loop.time()

    assert loop.run_until_complete(wait()) == 3600
    assert order[0] == "1" and sorted(order[1:]) == ["5a", "5b"]
    loop.close()


def test_a_loop_with_nothing_to_do_is_stuck_not_waiting() -> None:
    loop = VirtualTimeLoop()
    with pytest.raises(SimulationStuck):
        loop.run_until_complete(loop.create_future())
    loop.close()


def test_bytes_arrive_in_order_and_a_seed_replays_the_same_run() -> None:
    faults = NetworkFaults(min_delay_ms=0.1, max_delay_ms=5.0)
    received = exchange(42, faults)
    assert b"".join(data for _, data in received) == b"".join(b"%03d" % i for i in range(100))
    times = [at for at, _ in received]
    assert times == sorted(times)
    assert received == exchange(42, faults)
    assert received != exchange(43, faults)


def test_resets_break_connections_and_lose_what_was_in_flight() -> None:
    received = exchange(7, NetworkFaults(reset_probability=0.05))
    stream = b"".join(data for _, data in received)
    assert len(stream) < 300  # broken before the end
    assert stream == b"".join(b"%03d" % i for i in range(len(stream) // 3))  # a prefix


def test_a_partition_loses_what_crosses_it_and_connects_wait_for_the_heal() -> None:
    loop, network, servers = setup(1, NetworkFaults())
    client = Recorder(loop)

    async def scenario() -> list[str]:
        events = []
        transport, _ = await loop.create_connection(lambda: client, "server", 1)
        transport.write(b"before")
        await asyncio.sleep(0.01)
        network.partition(["client"], ["server"])
        transport.write(b"across")
        await asyncio.sleep(0.01)
        events.append(f"lost: {type(client.lost[0]).__name__}")
        connecting = asyncio.ensure_future(
            loop.create_connection(lambda: Recorder(loop), "server", 1)
        )
        await asyncio.sleep(0.5)
        events.append(f"connected during the cut: {connecting.done()}")
        network.heal()
        await connecting
        events.append("connected after the heal")
        return events

    events = run_as(loop, "client", scenario())
    assert events == [
        "lost: ConnectionResetError",
        "connected during the cut: False",
        "connected after the heal",
    ]
    assert servers[0].stream == b"before" and client.stream == b"before"
    loop.close()


def test_a_crashed_node_refuses_connections_and_breaks_its_own() -> None:
    loop, network, servers = setup(3, NetworkFaults())
    client = Recorder(loop)

    async def scenario() -> None:
        await loop.create_connection(lambda: client, "server", 1)
        network.crash("server")
        await asyncio.sleep(0.01)
        with pytest.raises(ConnectionRefusedError):
            await loop.create_connection(lambda: Recorder(loop), "server", 1)

    run_as(loop, "client", scenario())
    assert isinstance(client.lost[0], ConnectionResetError)
    assert isinstance(servers[0].lost[0], ConnectionResetError)
    loop.close()


def test_slow_links_add_their_delay_one_way() -> None:
    loop, network, _ = setup(5, NetworkFaults(min_delay_ms=1.0, max_delay_ms=1.0))
    network.slow_down("client", "server", 10.0)
    client = Recorder(loop)

    async def scenario() -> float:
        transport, _ = await loop.create_connection(lambda: client, "server", 1)
        sent = loop.time()
        transport.write(b"ping")
        await asyncio.sleep(0.1)
        return client.received[0][0] - sent

    round_trip = run_as(loop, "client", scenario())
    assert round_trip == pytest.approx(0.012, abs=0.0015)  # 11 ms there, 1 ms back
    loop.close()
