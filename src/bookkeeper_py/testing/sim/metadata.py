"""A simulated metadata store and its port (``metadata.port.MetadataPort``) in virtual time.

One ``SimStore`` holds the cluster's ledgers (versioned, compare-and-swap), the ledger id counter
and the bookie registry; each simulated client reaches it through its own ``SimMetadata``, whose
every call takes a random virtual delay (a round trip), may fail (``MetadataUnavailableError``,
as a store that is away) and fails for good once its node crashed. Every write is checked:
metadata only moves forward.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from bookkeeper_py import errors
from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.metadata.driver import (
    ANY_VERSION,
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    parent_of,
    sequence_suffix,
)
from bookkeeper_py.metadata.manager import BookieEndpoint, parse_bookie_id


class InvariantViolation(AssertionError):
    """A safety property of the protocol does not hold."""


STATE_RANK = {LedgerState.OPEN: 0, LedgerState.IN_RECOVERY: 1, LedgerState.CLOSED: 2}


def check_forward(old: LedgerMetadata, new: LedgerMetadata) -> None:
    """Metadata state only moves forward, a close is final and fragment starts only grow."""
    if STATE_RANK[new.state] < STATE_RANK[old.state]:
        raise InvariantViolation(f"metadata state went back from {old.state} to {new.state}")
    if old.is_closed and (new.last_entry_id, new.length) != (old.last_entry_id, old.length):
        raise InvariantViolation(
            f"a closed ledger changed its end from {old.last_entry_id} to {new.last_entry_id}"
        )
    if new.ensembles[: len(old.ensembles) - 1] != old.ensembles[:-1]:
        raise InvariantViolation(f"earlier fragments changed: {old.ensembles} -> {new.ensembles}")
    if new.last_ensemble[0] < old.last_ensemble[0]:
        raise InvariantViolation(
            f"the last fragment start went back: {old.ensembles} -> {new.ensembles}"
        )


@dataclass
class MetadataFaults:
    """Delays of a round trip in virtual ms; the probability that a call fails; the
    probability that a write of a plain node is applied and its answer lost (ZooKeeper's
    "outcome unknown": the caller gets a failure for a write that happened)."""

    min_delay_ms: float = 0.5
    max_delay_ms: float = 3.0
    failure_probability: float = 0.0
    lost_answer_probability: float = 0.0


@dataclass
class SimStore:
    """The store itself: what every client's ``SimMetadata`` reads and writes."""

    rng: random.Random
    faults: MetadataFaults = field(default_factory=MetadataFaults)
    ledgers: dict[int, tuple[LedgerMetadata, int]] = field(default_factory=dict)
    history: dict[int, list[LedgerMetadata]] = field(default_factory=dict)
    writable: dict[str, BookieEndpoint] = field(default_factory=dict)
    readonly: dict[str, BookieEndpoint] = field(default_factory=dict)
    next_id: int = 1
    nodes: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # plain versioned nodes
    ephemeral: dict[str, str] = field(default_factory=dict)  # path -> the node whose session
    counters: dict[str, int] = field(default_factory=dict)  # parent -> next sequential suffix
    # called with (path, old data or None, new data) before a node is written: raises
    # ``InvariantViolation`` for a write the run's invariants forbid
    on_node_write: Callable[[str, bytes | None, bytes], None] | None = None
    writes: int = 0  # successful writes, of any kind
    failures: int = 0  # calls failed by the fault model

    def port(self, node: str) -> SimMetadata:
        return SimMetadata(self, node)

    def put(self, metadata: LedgerMetadata) -> None:
        """Stores a ledger directly (set-up of a scenario)."""
        self.ledgers[metadata.ledger_id] = (metadata, 0)
        self.history[metadata.ledger_id] = [metadata]
        self.next_id = max(self.next_id, metadata.ledger_id + 1)

    def metadata(self, ledger_id: int) -> LedgerMetadata:
        return self.ledgers[ledger_id][0]


class SimMetadata:
    """``MetadataPort`` for one simulated node."""

    def __init__(self, store: SimStore, node: str) -> None:
        self.store = store
        self.node = node
        self.crashed = False
        self._session_listeners: list[Callable[[], None]] = []
        self._never: list[asyncio.Future[None]] = []

    async def _round_trip(self, what: str) -> None:
        store = self.store
        faults = store.faults
        await asyncio.sleep(store.rng.uniform(faults.min_delay_ms, faults.max_delay_ms) / 1000)
        if self.crashed:
            # A dead client's calls never come back (kept here: a task waiting on nothing
            # would be collected as garbage, and asyncio would complain).
            never = asyncio.get_running_loop().create_future()
            self._never.append(never)
            await never
        if store.rng.random() < faults.failure_probability:
            store.failures += 1
            raise errors.MetadataUnavailableError(f"simulated metadata store failure ({what})")

    async def generate_ledger_id(self) -> int:
        await self._round_trip("generate id")
        ledger_id = self.store.next_id
        self.store.next_id += 1
        return ledger_id

    async def create_ledger_metadata(self, metadata: LedgerMetadata) -> int:
        await self._round_trip("create")
        if metadata.ledger_id in self.store.ledgers:
            raise errors.LedgerExistsError(f"ledger {metadata.ledger_id} exists")
        self.store.put(metadata)
        self.store.writes += 1
        return 0

    async def read_ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        await self._round_trip("read")
        try:
            return self.store.ledgers[ledger_id]
        except KeyError:
            raise errors.NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None

    async def write_ledger_metadata(self, metadata: LedgerMetadata, version: int) -> int:
        await self._round_trip("write")
        store = self.store
        stored = store.ledgers.get(metadata.ledger_id)
        if stored is None:
            raise errors.NoSuchLedgerError(f"ledger {metadata.ledger_id} was deleted")
        old, current = stored
        if version != current:
            raise BadVersionError(f"version {version} is stale: {current}")
        check_forward(old, metadata)
        store.ledgers[metadata.ledger_id] = (metadata, current + 1)
        store.history[metadata.ledger_id].append(metadata)
        store.writes += 1
        return current + 1

    async def delete_ledger_metadata(self, ledger_id: int, version: int = ANY_VERSION) -> None:
        await self._round_trip("delete")
        stored = self.store.ledgers.get(ledger_id)
        if stored is None:
            raise errors.NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        if version != ANY_VERSION and version != stored[1]:
            raise BadVersionError(f"version {version} is stale: {stored[1]}")
        del self.store.ledgers[ledger_id]
        self.store.writes += 1

    async def list_ledgers(self) -> list[int]:
        await self._round_trip("list")
        return sorted(self.store.ledgers)

    async def writable_bookies(self) -> list[str]:
        await self._round_trip("bookies")
        return sorted(self.store.writable)

    async def readonly_bookies(self) -> list[str]:
        await self._round_trip("bookies")
        return sorted(self.store.readonly)

    async def bookies_now(self) -> tuple[list[str], list[str]]:
        await self._round_trip("bookies")
        return sorted(self.store.writable), sorted(self.store.readonly)

    async def bookie_endpoint(self, bookie_id: str) -> BookieEndpoint:
        await self._round_trip("endpoint")
        store = self.store
        endpoint = store.writable.get(bookie_id) or store.readonly.get(bookie_id)
        if endpoint is not None:
            return endpoint
        host, port = parse_bookie_id(bookie_id)
        return BookieEndpoint(bookie_id, host, port)

    async def register_bookie(
        self,
        bookie_id: str,
        host: str,
        port: int,
        *,
        readonly: bool,
        incarnation: str,
        predecessors: Collection[str],
    ) -> None:
        await self._round_trip("register")
        registry = self.store.readonly if readonly else self.store.writable
        registry[bookie_id] = BookieEndpoint(bookie_id, host, port)

    async def unregister_bookie(
        self, bookie_id: str, *, readonly: bool, incarnation: str | None = None
    ) -> None:
        await self._round_trip("unregister")
        registry = self.store.readonly if readonly else self.store.writable
        registry.pop(bookie_id, None)

    def on_session_replaced(self, callback: Callable[[], None]) -> None:
        self._session_listeners.append(callback)

    @property
    def ledgers_root(self) -> str:
        return "/ledgers"

    async def get_node(self, path: str) -> tuple[bytes, int]:
        await self._round_trip("get")
        try:
            return self.store.nodes[path]
        except KeyError:
            raise NoNodeError(f"{path} does not exist") from None

    async def create_ephemeral(self, path: str, data: bytes, sequential: bool = False) -> str:
        await self._round_trip("create")
        if sequential:
            parent = parent_of(path)
            counter = self.store.counters.get(parent, 0)
            self.store.counters[parent] = counter + 1
            path = f"{path}{sequence_suffix(counter)}"
        self._create(path, data)
        self.store.ephemeral[path] = self.node
        return path

    def end_session(self) -> None:
        """This node's session ended (it crashed, or its session expired): its ephemeral nodes
        vanish, as ZooKeeper removes them."""
        for path, owner in list(self.store.ephemeral.items()):
            if owner == self.node:
                del self.store.ephemeral[path]
                self.store.nodes.pop(path, None)

    async def create_node(self, path: str, data: bytes) -> int:
        await self._round_trip("create")
        self._create(path, data)
        return 0

    def _create(self, path: str, data: bytes) -> None:
        nodes = self.store.nodes
        if path in nodes:
            raise NodeExistsError(f"{path} exists")
        parent = parent_of(path)
        while parent != "/" and parent not in nodes:
            nodes[parent] = (b"", 0)
            parent = parent_of(parent)
        if self.store.on_node_write is not None:
            self.store.on_node_write(path, None, bytes(data))
        nodes[path] = (bytes(data), 0)
        self.store.writes += 1

    async def set_node(self, path: str, data: bytes, version: int) -> int:
        await self._round_trip("set")
        stored = self.store.nodes.get(path)
        if stored is None:
            raise NoNodeError(f"{path} does not exist")
        if version not in (ANY_VERSION, stored[1]):
            raise BadVersionError(f"{path}: version {version} is stale: {stored[1]}")
        if self.store.on_node_write is not None:
            self.store.on_node_write(path, stored[0], bytes(data))
        self.store.nodes[path] = (bytes(data), stored[1] + 1)
        self.store.writes += 1
        self._answer_lost("set")
        return stored[1] + 1

    def _answer_lost(self, what: str) -> None:
        store = self.store
        if store.rng.random() < store.faults.lost_answer_probability:
            store.failures += 1
            raise errors.MetadataUnavailableError(
                f"simulated metadata store failure after the write ({what}): outcome unknown"
            )

    async def delete_node(self, path: str, version: int = ANY_VERSION) -> None:
        await self._round_trip("delete")
        nodes = self.store.nodes
        stored = nodes.get(path)
        if stored is None:
            raise NoNodeError(f"{path} does not exist")
        if version not in (ANY_VERSION, stored[1]):
            raise BadVersionError(f"{path}: version {version} is stale: {stored[1]}")
        if self._children(path):
            raise NotEmptyError(f"{path} has children")
        del nodes[path]
        self.store.ephemeral.pop(path, None)
        self.store.writes += 1

    async def node_children(
        self, path: str, after: str | None = None, limit: int = 1000
    ) -> list[str]:
        await self._round_trip("children")
        if path not in self.store.nodes:
            raise NoNodeError(f"{path} does not exist")
        names = self._children(path)
        return [name for name in names if after is None or name > after][:limit]

    def _children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted(
            {
                p[len(prefix) :]
                for p in self.store.nodes
                if p.startswith(prefix) and "/" not in p[len(prefix) :]
            }
        )

    async def close(self) -> None:
        pass
