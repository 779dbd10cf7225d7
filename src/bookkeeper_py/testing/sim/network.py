"""A simulated network of byte streams, for the virtual-time loop: connections carry the real
v2/v3 frames between the client's and the bookie's real protocols (``asyncio.Protocol``), so
both codecs, the request matching and the timeouts run under the faults.

A connection behaves as TCP does: bytes arrive in order, after a random delay per write, never
duplicated. The faults are TCP's:

* **resets**: any write may break its connection (``reset_probability``); what was in flight
  is lost and both ends see the connection lost;
* **partitions** between named nodes: what is sent across the cut (or arrives while it
  lasts) is lost and breaks its connection; new connections across it wait until it heals (or
  the client's connect timeout);
* **slow links**: extra delay from one node to another;
* **a lost send**: the next bytes from one node to another are lost with their connection
  (``lose_next``), to aim a reset at one request;
* **crashes**: a node's connections break and its listeners go (connecting is refused).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import itertools
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bookkeeper_py.testing.sim.loop import current_node


@dataclass(slots=True)
class NetworkFaults:
    """How badly the network behaves: delays in virtual ms, probabilities per write."""

    min_delay_ms: float = 0.1
    max_delay_ms: float = 2.0
    reset_probability: float = 0.0


class _End:
    """One end of a connection: its node, its protocol and the transport handed to it."""

    __slots__ = ("held", "inbox", "lost", "node", "paused", "protocol", "transport")

    def __init__(self, node: str) -> None:
        self.node = node
        self.protocol: asyncio.Protocol | None = None
        self.transport: SimTransport | None = None
        self.paused = False
        self.held: list[bytes] = []  # arrived while reading was paused
        self.lost = False  # connection_lost delivered
        # On the way here, in order: bytes, or the loss of the connection (an exception or
        # None). Each has a timer; whichever fires takes the oldest, so ties keep the order.
        self.inbox: collections.deque[bytes | BaseException | None] = collections.deque()


class Connection:
    """Two ends; bytes from each end arrive at the other in order."""

    def __init__(self, network: Network, number: int, client: _End, server: _End) -> None:
        self.network = network
        self.number = number
        self.ends = (client, server)
        self.broken = False
        self._last_arrival = [0.0, 0.0]  # per direction (index of the receiving end)

    def other(self, end: _End) -> _End:
        return self.ends[1] if end is self.ends[0] else self.ends[0]

    def arrival(self, receiver: _End, extra_ms: float = 0.0) -> float:
        """When bytes sent now reach ``receiver``: never before earlier bytes (TCP's order)."""
        index = self.ends.index(receiver)
        network = self.network
        delay = network.rng.uniform(network.faults.min_delay_ms, network.faults.max_delay_ms)
        delay += network.slowness(self.other(receiver).node, receiver.node) + extra_ms
        at = max(self._last_arrival[index], network.loop.time() + delay / 1000)
        self._last_arrival[index] = at
        return at

    def send(self, sender: _End, data: bytes) -> None:
        network = self.network
        if self.broken:
            return
        if network.rng.random() < network.faults.reset_probability:
            network.resets += 1
            self.break_(ConnectionResetError("simulated connection reset"))
            return
        receiver = self.other(sender)
        if (sender.node, receiver.node) in network.lose_next:
            network.lose_next.discard((sender.node, receiver.node))
            network.resets += 1
            self.break_(ConnectionResetError("simulated connection reset"))
            return
        if not network.connected(sender.node, receiver.node):
            network.resets += 1
            self.break_(ConnectionResetError("network partition"))
            return
        network.bytes_sent += len(data)
        self._post(receiver, data)

    def _post(self, receiver: _End, item: bytes | BaseException | None) -> None:
        """``item`` (bytes, or the connection's loss) reaches ``receiver`` after a network
        delay, after everything posted to it before."""
        receiver.inbox.append(item)
        network = self.network
        network.loop.call_at(
            self.arrival(receiver), self._arrive, receiver, context=network.context(receiver)
        )

    def _arrive(self, receiver: _End) -> None:
        item = receiver.inbox.popleft()
        if not isinstance(item, bytes):
            self._lose(receiver, item if isinstance(item, Exception) else None)
            return
        data = item
        if self.broken or receiver.lost or receiver.protocol is None:
            return
        if not self.network.connected(self.other(receiver).node, receiver.node):
            self.break_(ConnectionResetError("network partition"))  # lost on the way
            return
        if receiver.paused:
            receiver.held.append(data)
            return
        receiver.protocol.data_received(data)

    def resume(self, end: _End) -> None:
        end.paused = False
        while end.held and not end.paused and not self.broken and end.protocol is not None:
            end.protocol.data_received(end.held.pop(0))

    def close_from(self, end: _End) -> None:
        """A graceful close: the other end gets what was sent, then the end of the stream."""
        if self.broken:
            return
        other = self.other(end)
        network = self.network
        network.loop.call_soon(self._lose, end, None, context=network.context(end))
        self._post(other, None)
        network.forget(self)

    def break_(self, error: Exception | None) -> None:
        """Both ends lose the connection (each after a network delay); what was in flight is
        gone."""
        if self.broken:
            return
        self.broken = True
        network = self.network
        for end in self.ends:
            self._post(end, error)
        network.forget(self)

    def abort_from(self, end: _End) -> None:
        if self.broken:
            return
        self.broken = True
        network = self.network
        network.loop.call_soon(self._lose, end, None, context=network.context(end))
        self._post(self.other(end), ConnectionResetError("reset by peer"))
        network.forget(self)

    def _lose(self, end: _End, error: Exception | None) -> None:
        if end.lost or end.protocol is None:
            return
        end.lost = True
        end.held.clear()
        end.protocol.connection_lost(error)


class SimTransport(asyncio.Transport):
    """The transport one end's protocol writes to."""

    def __init__(self, connection: Connection, end: _End) -> None:
        super().__init__()
        self._connection = connection
        self._end = end
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing and data:
            self._connection.send(self._end, bytes(data))

    def writelines(self, list_of_data: Iterable[Any]) -> None:
        self.write(b"".join(list_of_data))

    def is_closing(self) -> bool:
        return self._closing or self._connection.broken

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._connection.close_from(self._end)

    def abort(self) -> None:
        self._closing = True
        self._connection.abort_from(self._end)

    def pause_reading(self) -> None:
        self._end.paused = True

    def resume_reading(self) -> None:
        if self._end.paused:
            network = self._connection.network
            network.loop.call_soon(
                self._connection.resume, self._end, context=network.context(self._end)
            )

    def is_reading(self) -> bool:
        return not self._end.paused

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return (self._connection.other(self._end).node, self._connection.number)
        if name == "sockname":
            return (self._end.node, self._connection.number)
        return default


ProtocolFactory = Callable[[], asyncio.BaseProtocol]


class Network:
    """Listeners by (host, port), each on a named node; connections between nodes."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, rng: random.Random, faults: NetworkFaults
    ) -> None:
        self.loop = loop
        self.rng = rng
        self.faults = faults
        self._listeners: dict[tuple[str, int], tuple[str, ProtocolFactory]] = {}
        self._connections: dict[int, Connection] = {}
        self._numbers = itertools.count(1)
        self._cut: set[frozenset[str]] = set()
        self._slow: dict[tuple[str, str], float] = {}
        self._dead: set[str] = set()  # client nodes that crashed: they connect no more
        self._healed: asyncio.Future[None] | None = None  # set when the cuts heal
        self._contexts: dict[str, contextvars.Context] = {}
        # (source, destination): the next bytes sent that way are lost with their connection
        self.lose_next: set[tuple[str, str]] = set()
        self.connects = self.refused = self.resets = self.bytes_sent = 0

    # -- listeners and connections -------------------------------------------------------------

    def listen(self, node: str, host: str, port: int, factory: ProtocolFactory) -> None:
        self._listeners[(host, port)] = (node, factory)

    def stop_listening(self, host: str, port: int) -> None:
        self._listeners.pop((host, port), None)

    async def connect(
        self, source: str, host: str, port: int, factory: ProtocolFactory
    ) -> tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
        self.connects += 1
        listener = self._listeners.get((host, port))
        destination = listener[0] if listener else host
        # The SYN, and the SYN-ACK: a round trip.
        delay_ms = 2 * self.rng.uniform(self.faults.min_delay_ms, self.faults.max_delay_ms)
        delay_ms += self.slowness(source, destination) + self.slowness(destination, source)
        await asyncio.sleep(delay_ms / 1000)
        if source in self._dead:
            raise ConnectionAbortedError(f"{source} is down")
        while not self.connected(source, destination):
            # A partition: the SYN is sent again until it passes (or the caller's timeout).
            if self._healed is None or self._healed.done():
                self._healed = self.loop.create_future()
            await asyncio.shield(self._healed)
        listener = self._listeners.get((host, port))
        if listener is None:
            self.refused += 1
            raise ConnectionRefusedError(f"nothing listens on {host}:{port}")
        client, server = _End(source), _End(listener[0])
        connection = Connection(self, next(self._numbers), client, server)
        self._connections[connection.number] = connection
        server_protocol = listener[1]()
        assert isinstance(server_protocol, asyncio.Protocol)
        client_protocol = factory()
        assert isinstance(client_protocol, asyncio.Protocol)
        for end, protocol in ((server, server_protocol), (client, client_protocol)):
            end.protocol = protocol
            end.transport = SimTransport(connection, end)
            protocol.connection_made(end.transport)
        return client.transport, client_protocol  # type: ignore[return-value]

    def context(self, end: _End) -> contextvars.Context:
        """What runs for ``end`` (its protocol's callbacks, and everything they start) runs as
        its node: a client reconnecting from a callback connects from where it is."""
        context = self._contexts.get(end.node)
        if context is None:
            context = contextvars.Context()
            context.run(current_node.set, end.node)
            self._contexts[end.node] = context
        return context

    def forget(self, connection: Connection) -> None:
        self._connections.pop(connection.number, None)

    def connections_of(self, node: str) -> list[Connection]:
        return [c for c in self._connections.values() if any(e.node == node for e in c.ends)]

    # -- faults --------------------------------------------------------------------------------

    def crash(self, node: str, client: bool = False) -> None:
        """``node`` dies: its connections break, its listeners go; a client node (``client``)
        stays dead and connects no more."""
        for address, (owner, _) in list(self._listeners.items()):
            if owner == node:
                del self._listeners[address]
        for connection in self.connections_of(node):
            connection.break_(ConnectionResetError(f"{node} crashed"))
        if client:
            self._dead.add(node)

    def partition(self, side: Iterable[str], other_side: Iterable[str]) -> None:
        """No byte passes between a node of ``side`` and one of ``other_side``: a connection
        across breaks when it carries one, new ones wait for ``heal``."""
        other = list(other_side)
        for a in side:
            for b in other:
                if a != b:
                    self._cut.add(frozenset((a, b)))

    def heal(self) -> None:
        self._cut.clear()
        if self._healed is not None and not self._healed.done():
            self._healed.set_result(None)

    def connected(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self._cut

    def slow_down(self, source: str, destination: str, extra_ms: float) -> None:
        """Bytes from ``source`` to ``destination`` take ``extra_ms`` longer (0: normal)."""
        if extra_ms > 0:
            self._slow[(source, destination)] = extra_ms
        else:
            self._slow.pop((source, destination), None)

    def slowness(self, source: str, destination: str) -> float:
        return self._slow.get((source, destination), 0.0)
