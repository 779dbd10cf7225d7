"""A simulated metadata store and its port (``metadata.port.MetadataPort``) in virtual time.

One ``SimStore`` holds the cluster's ledgers (versioned, compare-and-swap), the ledger id counter
and the bookie registry; each simulated client reaches it through its own ``SimMetadata``, whose
every call takes a random virtual delay (a round trip), may fail (``MetadataUnavailableError``,
as a store that is away) and fails for good once its node crashed. Every write is checked:
metadata only moves forward, and no ensemble names a bookie twice. A run adds its own checks
through the store's hooks (``on_ledger_write``, ``on_node_write``, ``on_node_delete``); a check
that fails raises ``InvariantViolation`` to the caller and reports it (``on_violation``), so a
violation found in a task nobody awaits (an AutoRecovery service's) still ends the run.
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
    """Metadata state only moves forward, a close is final, and fragments keep their place:
    every fragment but the last keeps its start (and, by ``LedgerMetadata``'s own rule, its
    size) and changes members only by replacing them (re-replication): each changed member
    becomes a bookie that was not in the fragment, never one moved from another index. The last
    fragment's start never decreases; its members are its writer's (or a recovery's) to change,
    several replacements at once among them."""
    if STATE_RANK[new.state] < STATE_RANK[old.state]:
        raise InvariantViolation(f"metadata state went back from {old.state} to {new.state}")
    if old.is_closed and (new.last_entry_id, new.length) != (old.last_entry_id, old.length):
        raise InvariantViolation(
            f"a closed ledger changed its end from {old.last_entry_id} to {new.last_entry_id}"
        )
    check_ensembles(new)
    earlier = old.ensembles[:-1]
    if [first for first, _ in new.ensembles[: len(earlier)]] != [first for first, _ in earlier]:
        raise InvariantViolation(
            f"ledger {old.ledger_id}: earlier fragments moved or went: {old.ensembles} -> "
            f"{new.ensembles}"
        )
    if new.last_ensemble[0] < old.last_ensemble[0]:
        raise InvariantViolation(
            f"the last fragment start went back: {old.ensembles} -> {new.ensembles}"
        )
    for (first, members), (_, changed) in zip(earlier, new.ensembles, strict=False):
        _check_replaced(old.ledger_id, first, members, changed)


def _check_replaced(
    ledger_id: int, first: int, before: tuple[str, ...], after: tuple[str, ...]
) -> None:
    for index, (was, now) in enumerate(zip(before, after, strict=True)):
        if was != now and now in before:
            raise InvariantViolation(
                f"ledger {ledger_id}: the fragment at entry {first} changed {list(before)} -> "
                f"{list(after)}: {now} moved to index {index}; a member may only be replaced by "
                "a bookie that was not in the fragment"
            )


def check_ensembles(metadata: LedgerMetadata) -> None:
    """No ensemble names a bookie twice (a write set would hold one copy where it counts two)."""
    for first, members in metadata.ensembles:
        if len(set(members)) != len(members):
            twice = sorted({bookie for bookie in members if members.count(bookie) > 1})
            raise InvariantViolation(
                f"ledger {metadata.ledger_id}: the fragment at entry {first} names {twice} "
                f"twice: {list(members)}"
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
    # Checks of a run, each raising ``InvariantViolation`` for a change its invariants forbid:
    # called with (path, old data or None, new data) before a node is written;
    on_node_write: Callable[[str, bytes | None, bytes], None] | None = None
    # with (path, its data) before a client deletes a node (not when a session ends);
    on_node_delete: Callable[[str, bytes], None] | None = None
    # with (old metadata or None when created, new metadata) before a ledger's metadata is written
    on_ledger_write: Callable[[LedgerMetadata | None, LedgerMetadata], None] | None = None
    # told of every violation a check found, before it is raised to the caller
    on_violation: Callable[[str], None] | None = None
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

    def checked(self, check: Callable[[], None]) -> None:
        """Runs ``check``; a violation it raises is reported (``on_violation``) and raised."""
        try:
            check()
        except InvariantViolation as error:
            if self.on_violation is not None:
                self.on_violation(str(error))
            raise

    def check_ledger_write(self, old: LedgerMetadata | None, new: LedgerMetadata) -> None:
        def check() -> None:
            if old is None:
                check_ensembles(new)
            else:
                check_forward(old, new)
            if self.on_ledger_write is not None:
                self.on_ledger_write(old, new)

        self.checked(check)


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
        self.store.check_ledger_write(None, metadata)
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
        store.check_ledger_write(old, metadata)
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
        http: tuple[str, int, str] | None = None,
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
        self._check_node_write(path, None, data)
        nodes[path] = (bytes(data), 0)
        self.store.writes += 1

    async def set_node(self, path: str, data: bytes, version: int) -> int:
        await self._round_trip("set")
        stored = self.store.nodes.get(path)
        if stored is None:
            raise NoNodeError(f"{path} does not exist")
        if version not in (ANY_VERSION, stored[1]):
            raise BadVersionError(f"{path}: version {version} is stale: {stored[1]}")
        self._check_node_write(path, stored[0], data)
        self.store.nodes[path] = (bytes(data), stored[1] + 1)
        self.store.writes += 1
        self._answer_lost("set")
        return stored[1] + 1

    def _check_node_write(self, path: str, old: bytes | None, data: bytes) -> None:
        hook = self.store.on_node_write
        if hook is not None:
            self.store.checked(lambda: hook(path, old, bytes(data)))

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
        hook = self.store.on_node_delete
        if hook is not None:
            self.store.checked(lambda: hook(path, stored[0]))
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
