"""A simulated network that delays, drops, duplicates and reorders messages, and partitions any
set of nodes. Messages are opaque objects handed to the receiver's callback."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bookkeeper_py.testing.sim.scheduler import Simulation

Deliver = Callable[[object], None]


@dataclass(slots=True)
class NetworkFaults:
    """How badly the network behaves. Probabilities per message; delays in virtual ms."""

    min_delay_ms: float = 0.1
    max_delay_ms: float = 2.0  # a spread of delays reorders messages
    drop_probability: float = 0.0
    duplicate_probability: float = 0.0


class Network:
    """Nodes are named; ``send`` delivers to the destination's registered receiver after a
    random delay, unless the message is dropped or the two nodes are partitioned (when it is
    sent or when it would arrive)."""

    def __init__(self, simulation: Simulation, faults: NetworkFaults | None = None) -> None:
        self.simulation = simulation
        self.faults = faults or NetworkFaults()
        self._receivers: dict[str, Deliver] = {}
        self._cut: set[frozenset[str]] = set()
        self._slow: dict[tuple[str, str], float] = {}  # (source, destination) -> extra delay
        self.sent = self.delivered = self.dropped = self.duplicated = 0

    def register(self, node: str, receiver: Deliver) -> None:
        self._receivers[node] = receiver

    def unregister(self, node: str) -> None:
        """The node is down: messages to it vanish."""
        self._receivers.pop(node, None)

    def partition(self, side: Iterable[str], other_side: Iterable[str]) -> None:
        """No message passes between a node of ``side`` and one of ``other_side``."""
        for a in side:
            for b in other_side:
                if a != b:
                    self._cut.add(frozenset((a, b)))

    def heal(self) -> None:
        self._cut.clear()

    def slow_down(self, source: str, destination: str, extra_ms: float) -> None:
        """Messages from ``source`` to ``destination`` take ``extra_ms`` longer (0: back to normal)."""
        if extra_ms > 0:
            self._slow[(source, destination)] = extra_ms
        else:
            self._slow.pop((source, destination), None)

    def connected(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self._cut

    def send(self, source: str, destination: str, message: object) -> None:
        self.sent += 1
        random = self.simulation.random
        faults = self.faults
        if not self.connected(source, destination) or random.random() < faults.drop_probability:
            self.dropped += 1
            return
        copies = 2 if random.random() < faults.duplicate_probability else 1
        self.duplicated += copies - 1
        for _ in range(copies):
            delay = random.uniform(faults.min_delay_ms, faults.max_delay_ms)
            delay += self._slow.get((source, destination), 0.0)
            self.simulation.call_later(delay, lambda: self._arrive(source, destination, message))

    def _arrive(self, source: str, destination: str, message: object) -> None:
        receiver = self._receivers.get(destination)
        if receiver is None or not self.connected(source, destination):
            self.dropped += 1
            return
        self.delivered += 1
        receiver(message)
