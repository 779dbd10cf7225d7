"""The actors of a simulated cluster: bookies on simulated disks, the metadata store, a writer
driving ``core.writer.LedgerWriter``, recovering clients driving ``core.recovery.LedgerRecovery``
and readers. Messages go through ``Network``; metadata calls take a random virtual delay.

A bookie is the real ``bookkeeper_py.server.bookie.Bookie`` (master keys, fencing, recovery adds, the
LAC it keeps, explicit LACs) over ``engine.SimEngine`` on a ``Disk``: an add is answered once its
record is synced (group commit), a fencing read once the fence record is synced, and a crash
keeps only what the disk kept; the bookie restarts by replaying the disk."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from bookkeeper_py import errors
from bookkeeper_py.core.lac import LastConfirmedRead, ReadRequest
from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.core.placement import RandomPlacement
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.core.recovery import (
    CloseInRecovery,
    LedgerRecovery,
    MarkInRecovery,
    RecoveryAdd,
    RecoveryDone,
    RecoveryFailed,
    ReplaceInRecovery,
)
from bookkeeper_py.core.writer import (
    ChangeEnsemble,
    Completed,
    Failed,
    LedgerWriter,
    SendAdd,
    WriteLac,
    change_ensemble,
)
from bookkeeper_py.server.bookie import Bookie, BookieConfig
from bookkeeper_py.storage.engine import StorageConfig, StorageEngine
from bookkeeper_py.testing.sim.disk import Disk
from bookkeeper_py.testing.sim.engine import SimEngine, SimLoop, SyncCallback
from bookkeeper_py.testing.sim.network import Network
from bookkeeper_py.testing.sim.scheduler import Simulation, Timer
from bookkeeper_py.wire.digest import DigestManager, Entry, master_key
from bookkeeper_py.wire.status import StatusCode

# -- messages ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AddRequest:
    source: str
    ledger_id: int
    entry_id: int
    body: bytes
    recovery: bool


@dataclass(frozen=True, slots=True)
class AddResponse:
    bookie: str
    entry_id: int
    status: StatusCode


@dataclass(frozen=True, slots=True)
class ReadRequestMessage:
    source: str
    request_id: int
    ledger_id: int
    entry_id: int
    fence: bool


@dataclass(frozen=True, slots=True)
class ReadResponse:
    request_id: int
    status: StatusCode
    body: bytes


@dataclass(frozen=True, slots=True)
class WriteLacRequest:
    source: str
    ledger_id: int
    body: bytes  # the digest-packaged LAC


class InvariantViolation(AssertionError):
    """A safety property of the protocol does not hold."""


# -- bookie ------------------------------------------------------------------------------------


@dataclass
class BookieFaults:
    read_error_probability: float = 0.0
    # What a read that hit an I/O error answers: EIO. ENOENTRY models the bookies of BookKeeper
    # issue 2908, whose entry logger turned I/O errors into "no such entry".
    read_error_status: StatusCode = StatusCode.EIO
    sync_delay_ms: float = 1.0


SIM_MASTER_KEY = master_key(b"sim")  # every client of the simulation uses one password


class SimBookie:
    """A bookie of the simulation: the real ``server.bookie.Bookie`` request handling over
    ``SimEngine`` (a simulated disk and clock), behind the simulated network."""

    def __init__(
        self, name: str, sim: Simulation, network: Network, disk: Disk, faults: BookieFaults
    ) -> None:
        self.name = name
        self.sim = sim
        self.network = network
        self.disk = disk
        self.faults = faults
        self.up = False
        self.crashes = 0
        self._loop = SimLoop(sim)
        self._config = BookieConfig(
            storage=StorageConfig(
                journal_directory=f"/sim/{name}", ledger_directory=f"/sim/{name}"
            ),
            bookie_id=name,
        )
        self.bookie: Bookie | None = None
        self._engine: SimEngine | None = None
        self.start()

    # -- life ----------------------------------------------------------------------------------

    def _make_engine(self, _storage: object, synced: SyncCallback, _metrics: object) -> SimEngine:
        self._engine = SimEngine(
            self.sim,
            self.disk,
            synced,
            sync_delay_ms=self.faults.sync_delay_ms,
            read_error_probability=lambda: self.faults.read_error_probability,
            read_error=lambda: self.faults.read_error_status,
        )
        return self._engine

    def start(self) -> None:
        """Starts from what the disk holds (replay)."""
        self.bookie = Bookie(
            self._config,
            cast(asyncio.AbstractEventLoop, self._loop),
            engine_factory=cast(Callable[..., StorageEngine], self._make_engine),
        )
        self.up = True
        self.network.register(self.name, self._receive)

    def crash(self) -> None:
        if not self.up:
            return
        self.up = False
        self.crashes += 1
        self.network.unregister(self.name)
        if self._engine is not None:
            self._engine.stop()  # queued requests are never answered
        self.bookie = None  # its memory (LAC cache, parked polls) is gone
        self.disk.crash()

    def wipe(self) -> None:
        """Crashes and loses its disk: it comes back (``start``) empty, as on a new disk."""
        self.crash()
        self.disk.wipe()

    def holds_durably(self, ledger_id: int, entry_id: int) -> bool:
        """Whether a restart would bring the entry back."""
        return ("entry", ledger_id, entry_id) in self.disk.durable_keys

    # -- requests ------------------------------------------------------------------------------

    def _receive(self, message: object) -> None:
        bookie = self.bookie
        if bookie is None:
            return
        if isinstance(message, AddRequest):
            bookie.add_entry(
                message.ledger_id,
                message.entry_id,
                SIM_MASTER_KEY,
                message.body,
                message.recovery,
                self._answer_add(bookie, message),
            )
        elif isinstance(message, ReadRequestMessage):
            bookie.read_entry(
                message.ledger_id,
                message.entry_id,
                message.fence,
                SIM_MASTER_KEY if message.fence else None,
                self._answer_read(bookie, message),
            )
        elif isinstance(message, WriteLacRequest):
            bookie.write_lac(message.ledger_id, SIM_MASTER_KEY, message.body, lambda _s: None)

    def _answer_add(self, bookie: Bookie, request: AddRequest) -> Callable[[StatusCode], None]:
        def answer(status: StatusCode) -> None:
            if self.bookie is bookie:  # not from before a crash
                self.network.send(
                    self.name, request.source, AddResponse(self.name, request.entry_id, status)
                )

        return answer

    def _answer_read(
        self, bookie: Bookie, request: ReadRequestMessage
    ) -> Callable[[StatusCode, bytes], None]:
        def answer(status: StatusCode, body: bytes) -> None:
            if self.bookie is bookie:
                self.network.send(
                    self.name, request.source, ReadResponse(request.request_id, status, body)
                )

        return answer


# -- metadata ----------------------------------------------------------------------------------


class SimMetadataStore:
    """One ledger's metadata with versions; every call answers after a random delay. Checks on
    every write that metadata only moves forward."""

    def __init__(self, sim: Simulation, metadata: LedgerMetadata) -> None:
        self.sim = sim
        self.metadata = metadata
        self.version = 0
        self.history = [metadata]

    def _later(self, callback: Callable[[], None]) -> None:
        self.sim.call_later(self.sim.random.uniform(0.5, 3.0), callback)

    def read(self, answer: Callable[[LedgerMetadata, int], None]) -> None:
        self._later(lambda: answer(self.metadata, self.version))

    def cas(
        self, new: LedgerMetadata, version: int, answer: Callable[[LedgerMetadata | None], None]
    ) -> None:
        def apply() -> None:
            if version != self.version:
                answer(None)
                return
            check_forward(self.metadata, new)
            self.metadata, self.version = new, self.version + 1
            self.history.append(new)
            answer(new)

        self._later(apply)


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


def update(
    store: SimMetadataStore,
    transform: Callable[[LedgerMetadata], LedgerMetadata | None],
    done: Callable[[LedgerMetadata | None, errors.BKError | None], None],
    attempts: int = 20,
) -> None:
    """The metadata update loop: read, transform (None: nothing to change; may raise), CAS,
    retry on a version conflict."""

    def read(metadata: LedgerMetadata, version: int) -> None:
        try:
            new = transform(metadata)
        except errors.BKError as error:
            done(None, error)
            return
        if new is None:
            done(metadata, None)
            return

        def written(stored: LedgerMetadata | None) -> None:
            if stored is not None:
                done(stored, None)
            elif attempts > 1:
                update(store, transform, done, attempts - 1)
            else:
                done(None, errors.MetadataVersionError("too many version conflicts"))

        store.cas(new, version, written)

    store.read(read)


# -- clients -----------------------------------------------------------------------------------


def _close_in_recovery(
    close: CloseInRecovery,
) -> Callable[[LedgerMetadata], LedgerMetadata | None]:
    def transform(current: LedgerMetadata) -> LedgerMetadata | None:
        if current.state == LedgerState.IN_RECOVERY:
            return close.closed(current)
        return None  # closed by someone else: theirs stands

    return transform


def payload_of(entry_id: int) -> bytes:
    return f"entry-{entry_id}".encode() * (1 + entry_id % 3)


class SimWriter:
    """Adds ``count`` entries through ``LedgerWriter``, then closes the ledger (unless crashed
    or fenced). ``acked`` holds every entry id acknowledged to it, in order."""

    def __init__(
        self,
        name: str,
        sim: Simulation,
        network: Network,
        store: SimMetadataStore,
        bookies: dict[str, SimBookie],
        digest: DigestManager,
        count: int,
        writer: LedgerWriter,
    ) -> None:
        self.name, self.sim, self.network, self.store = name, sim, network, store
        self.bookies, self.digest, self.count, self.writer = bookies, digest, count, writer
        self.placement = RandomPlacement(sim.random)
        self.acked: list[int] = []
        self.bodies: dict[int, bytes] = {}
        self.carried_lac: dict[int, int] = {}  # the LAC piggybacked on each entry
        self.crashed = self.finished = False
        self.error: errors.BKError | None = None
        self._ticker: Timer | None = None
        network.register(name, self._receive)

    def start(self) -> None:
        for i in range(self.count):
            self.sim.call_later(i * self.sim.random.uniform(0.0, 2.0), self._add)
        self._tick()

    def crash(self) -> None:
        self.crashed = True
        self.network.unregister(self.name)
        if self._ticker is not None:
            self._ticker.cancel()

    def _now(self) -> int:
        return int(self.sim.now_ms)

    def _add(self) -> None:
        if self.crashed or self.writer.error is not None or self.finished:
            return
        entry_id = self.writer.last_add_pushed + 1
        data = payload_of(entry_id)
        accepted = self.writer.add(len(data), self._now())
        self.bodies[accepted.entry_id] = self.digest.package(
            accepted.entry_id, accepted.last_add_confirmed, accepted.length, data
        )
        self.carried_lac[accepted.entry_id] = accepted.last_add_confirmed
        self._execute(accepted.instructions)

    def _tick(self) -> None:
        if self.crashed or self.finished:
            return
        self._execute(self.writer.tick(self._now()))
        self._ticker = self.sim.call_later(10, self._tick)

    def _receive(self, message: object) -> None:
        if self.crashed or not isinstance(message, AddResponse):
            return
        ensemble = self.writer.metadata.ensemble_at(message.entry_id)
        for index, bookie in enumerate(ensemble):
            if bookie == message.bookie:
                self._execute(
                    self.writer.on_add_answer(
                        message.entry_id, index, bookie, message.status, self._now()
                    )
                )

    def _execute(self, instructions: Sequence[object]) -> None:
        for instruction in instructions:
            if self.crashed:
                return
            if isinstance(instruction, SendAdd):
                body = self.bodies[instruction.entry_id]
                for _, bookie in instruction.targets:
                    self.network.send(
                        self.name,
                        bookie,
                        AddRequest(
                            self.name, self.digest.ledger_id, instruction.entry_id, body, False
                        ),
                    )
            elif isinstance(instruction, Completed):
                self.acked.extend(range(instruction.first, instruction.last + 1))
                if self.acked and self.acked[-1] == self.count - 1:
                    self._close()
            elif isinstance(instruction, Failed):
                self.error = instruction.error
            elif isinstance(instruction, ChangeEnsemble):
                self._change(instruction)
            elif isinstance(instruction, WriteLac):
                for _, bookie in instruction.targets:
                    self.network.send(
                        self.name,
                        bookie,
                        WriteLacRequest(
                            self.name,
                            self.digest.ledger_id,
                            self.digest.package_lac(instruction.lac),
                        ),
                    )

    def _change(self, change: ChangeEnsemble) -> None:
        writable = [name for name, bookie in self.bookies.items() if bookie.up]
        try:
            ensemble = self.placement.replace(change.ensemble, change.failed, writable)
        except errors.NotEnoughBookiesError as error:
            failure: errors.BKError = error
            self.sim.call_later(1, lambda: self._changed(None, failure))
            return
        based_on = (change.based_on_start, change.ensemble)
        update(
            self.store,
            lambda current: change_ensemble(current, change.first_entry, based_on, ensemble),
            self._changed,
        )

    def _changed(self, metadata: LedgerMetadata | None, error: errors.BKError | None) -> None:
        if self.crashed:
            return
        if metadata is not None:
            self._execute(self.writer.on_ensemble_changed(metadata, self._now()))

        else:
            assert error is not None
            self._execute(self.writer.on_ensemble_change_failed(error, self._now()))

    def _close(self) -> None:
        last, length, failures = self.writer.close()
        self.finished = True
        self._execute(failures)

        def closing(current: LedgerMetadata) -> LedgerMetadata | None:
            if current.state == LedgerState.OPEN:
                return current.closed_at(last, length)
            return None  # closed or being recovered: theirs stands

        update(self.store, closing, lambda metadata, error: None)


class SimRecovery:
    """Opens the ledger with recovery (``LedgerRecovery``), retrying a failed attempt later."""

    def __init__(
        self,
        name: str,
        sim: Simulation,
        network: Network,
        store: SimMetadataStore,
        digest: DigestManager,
        make_recovery: Callable[[], LedgerRecovery],
        bookies: dict[str, SimBookie],
        timeout_ms: float = 100.0,
        max_attempts: int = 40,
    ) -> None:
        self.name, self.sim, self.network, self.store, self.digest = (
            name,
            sim,
            network,
            store,
            digest,
        )
        self.make_recovery = make_recovery
        self.bookies = bookies
        self.placement = RandomPlacement(sim.random)
        self.timeout_ms = timeout_ms
        self.attempts_left = max_attempts
        self.done = False
        self.failures: list[str] = []
        self.machine: LedgerRecovery | None = None
        self._requests = itertools.count()
        self._reads: dict[int, tuple[LedgerRecovery, ReadRequest, Timer]] = {}
        self._adds: dict[tuple[str, int], tuple[LedgerRecovery, int, Timer]] = {}
        network.register(name, self._receive)

    def start(self) -> None:
        self.attempts_left -= 1
        self.machine = self.make_recovery()
        self._execute(self.machine, self.machine.start())

    def _execute(self, machine: LedgerRecovery, instructions: Sequence[object]) -> None:
        if machine is not self.machine:
            return  # an earlier attempt's late answer
        for instruction in instructions:
            if isinstance(instruction, MarkInRecovery):

                def mark(current: LedgerMetadata) -> LedgerMetadata | None:
                    if current.state == LedgerState.OPEN:
                        return current.with_state(LedgerState.IN_RECOVERY)
                    return None

                update(self.store, mark, lambda m, e: self._on_metadata(machine, m, e))
            elif isinstance(instruction, ReadRequest):
                self._send_read(machine, instruction)
            elif isinstance(instruction, RecoveryAdd):
                self._send_add(machine, instruction)
            elif isinstance(instruction, CloseInRecovery):
                update(
                    self.store,
                    _close_in_recovery(instruction),
                    lambda m, e: self._on_metadata(machine, m, e),
                )
            elif isinstance(instruction, ReplaceInRecovery):
                self._replace(machine, instruction)
            elif isinstance(instruction, RecoveryDone):
                self.done = True
            elif isinstance(instruction, RecoveryFailed):
                self.failures.append(str(instruction.error))
                if isinstance(instruction.error, errors.UnauthorizedAccessError):
                    raise InvariantViolation(f"recovery refused: {instruction.error}")
                if self.attempts_left > 0:
                    self.sim.call_later(self.sim.random.uniform(50, 150), self.start)

    def _on_metadata(
        self, machine: LedgerRecovery, metadata: LedgerMetadata | None, error: errors.BKError | None
    ) -> None:
        if metadata is None:
            self.failures.append(f"metadata: {error}")
            if machine is self.machine and self.attempts_left > 0:
                self.machine = None
                self.sim.call_later(50, self.start)
            return
        self._execute(machine, machine.on_metadata(metadata))

    def _replace(self, machine: LedgerRecovery, request: ReplaceInRecovery) -> None:
        writable = [name for name, bookie in self.bookies.items() if bookie.up]
        try:
            ensemble = self.placement.replace(request.ensemble, request.failed, writable)
        except errors.NotEnoughBookiesError as error:
            failure: errors.BKError = error
            self.sim.call_later(
                1, lambda: self._execute(machine, machine.on_replacement_failed(failure))
            )
            return
        self.sim.call_later(1, lambda: self._execute(machine, machine.on_replacement(ensemble)))

    def _send_read(self, machine: LedgerRecovery, request: ReadRequest) -> None:
        request_id = next(self._requests)

        def timed_out() -> None:
            if self._reads.pop(request_id, None) is not None:
                self._execute(
                    machine,
                    machine.on_read(
                        request.bookie_index, request.entry_id, None, problem="timeout"
                    ),
                )

        timer = self.sim.call_later(self.timeout_ms, timed_out)
        self._reads[request_id] = (machine, request, timer)
        self.network.send(
            self.name,
            request.bookie,
            ReadRequestMessage(
                self.name, request_id, self.digest.ledger_id, request.entry_id, request.fence
            ),
        )

    def _send_add(self, machine: LedgerRecovery, add: RecoveryAdd) -> None:
        key = (add.bookie, add.entry_id)

        def timed_out() -> None:
            if self._adds.pop(key, None) is not None:
                self._execute(
                    machine,
                    machine.on_add(add.bookie_index, add.entry_id, None, "timeout", add.bookie),
                )

        previous = self._adds.pop(key, None)
        if previous is not None:
            previous[2].cancel()
        timer = self.sim.call_later(self.timeout_ms, timed_out)
        self._adds[key] = (machine, add.bookie_index, timer)
        self.network.send(
            self.name,
            add.bookie,
            AddRequest(self.name, self.digest.ledger_id, add.entry_id, add.payload, True),
        )

    def _receive(self, message: object) -> None:
        if isinstance(message, ReadResponse):
            pending = self._reads.pop(message.request_id, None)
            if pending is None:
                return
            machine, request, timer = pending
            timer.cancel()
            entry: Entry | None = None
            status: StatusCode | None = message.status
            if status == StatusCode.EOK:
                try:
                    entry = self.digest.verify_read(message.body, request.entry_id)
                except (errors.DigestMismatchError, ValueError):
                    status = None
            self._execute(
                machine,
                machine.on_read(
                    request.bookie_index, request.entry_id, status, entry, message.body
                ),
            )
        elif isinstance(message, AddResponse):
            pending_add = self._adds.pop((message.bookie, message.entry_id), None)
            if pending_add is None:
                return
            machine, index, timer = pending_add
            timer.cancel()
            self._execute(
                machine,
                machine.on_add(index, message.entry_id, message.status, "", message.bookie),
            )


@dataclass
class SimReader:
    """Reads a closed ledger entry by entry, each from one replica, the next on an error."""

    name: str
    sim: Simulation
    network: Network
    store: SimMetadataStore
    digest: DigestManager
    timeout_ms: float = 100.0
    entries: list[bytes] | None = None
    missing: list[int] = field(default_factory=list)
    _requests: itertools.count = field(default_factory=itertools.count)  # type: ignore[type-arg]
    _pending: dict[int, Callable[[StatusCode | None, bytes], None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.network.register(self.name, self._receive)

    def start(self) -> None:
        self.store.read(self._on_metadata)

    def _on_metadata(self, metadata: LedgerMetadata, _version: int) -> None:
        if not metadata.is_closed:
            self.sim.call_later(20, self.start)
            return
        self._read_all(metadata, [], 0)

    def _read_all(self, metadata: LedgerMetadata, got: list[bytes], attempt: int) -> None:
        entry_id = len(got)
        if entry_id > metadata.last_entry_id:
            self.entries = got
            return
        ensemble = metadata.ensemble_at(entry_id)
        members = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum_size)
        self._try(metadata, got, entry_id, [ensemble[i] for i in members], 0, attempt)

    def _try(
        self,
        metadata: LedgerMetadata,
        got: list[bytes],
        entry_id: int,
        replicas: list[str],
        position: int,
        attempt: int,
    ) -> None:
        if position == len(replicas):
            if attempt >= 50:
                self.missing.append(entry_id)
                self.entries = got
                return
            self.sim.call_later(
                30, lambda: self._try(metadata, got, entry_id, replicas, 0, attempt + 1)
            )
            return
        request_id = next(self._requests)

        def answered(status: StatusCode | None, body: bytes) -> None:
            if status == StatusCode.EOK:
                try:
                    entry = self.digest.verify(body, entry_id)
                except (errors.DigestMismatchError, ValueError):
                    entry = None
                if entry is not None:
                    got.append(bytes(entry.payload))
                    self._read_all(metadata, got, 0)
                    return
            self._try(metadata, got, entry_id, replicas, position + 1, attempt)

        def timed_out() -> None:
            if self._pending.pop(request_id, None) is not None:
                answered(None, b"")

        self._pending[request_id] = answered
        self.sim.call_later(self.timeout_ms, timed_out)
        self.network.send(
            self.name,
            replicas[position],
            ReadRequestMessage(self.name, request_id, self.digest.ledger_id, entry_id, False),
        )

    def _receive(self, message: object) -> None:
        if isinstance(message, ReadResponse):
            callback = self._pending.pop(message.request_id, None)
            if callback is not None:
                callback(message.status, message.body)


class SimLacReader:
    """Reads the LAC without fencing (``core.lac.LastConfirmedRead``, as
    ``read_last_add_confirmed``) at the given moments while the writer is live, and checks the
    guarantee of a covering read (BookKeeper issues 2273 / 2612): the answer is at least the
    LAC carried by every entry of the last fragment acknowledged before the read began (an
    acknowledged entry is on Qa bookies of its write set, and a covered ensemble includes one
    of them). An error is not an answer: counting it as one lets a reader conclude a ledger is
    emptier than it is."""

    def __init__(
        self,
        name: str,
        sim: Simulation,
        network: Network,
        store: SimMetadataStore,
        digest: DigestManager,
        writer: SimWriter,
        make_read: Callable[[LedgerMetadata], LastConfirmedRead],
        timeout_ms: float = 50.0,
    ) -> None:
        self.name, self.sim, self.network, self.store = name, sim, network, store
        self.digest, self.writer, self.make_read, self.timeout_ms = (
            digest,
            writer,
            make_read,
            timeout_ms,
        )
        self.reads = 0  # LAC reads that ended with an answer
        self.failed = 0  # LAC reads that ended without one (not enough bookies answered)
        self._requests = itertools.count()
        self._pending: dict[int, Callable[[StatusCode | None, bytes], None]] = {}
        network.register(name, self._receive)

    def read_at(self, at: float) -> None:
        self.sim.call_at(at, lambda: self.store.read(self._start))

    def _start(self, metadata: LedgerMetadata, _version: int) -> None:
        if metadata.is_closed:
            return
        first_of_last = metadata.last_ensemble[0]
        floor = max(
            (self.writer.carried_lac[e] for e in self.writer.acked if e >= first_of_last),
            default=-1,
        )
        read = self.make_read(metadata)
        finished = [False]

        def answered(index: int, status: StatusCode | None, body: bytes) -> None:
            if finished[0]:
                return
            entry = None
            if status == StatusCode.EOK:
                try:
                    entry = self.digest.verify_read(body, -1)
                except (errors.DigestMismatchError, ValueError):
                    status = None
            try:
                outcome = read.on_answer(index, status, entry, "failed" if status is None else "")
            except errors.BKError:
                finished[0] = True
                self.failed += 1
                return
            if outcome is None:
                return
            finished[0] = True
            self.reads += 1
            if outcome.lac < floor:
                raise InvariantViolation(
                    f"a LAC read answered {outcome.lac}, but an entry of the last fragment "
                    f"acknowledged before it began carried LAC {floor}"
                )

        for request in read.start():
            self._send(request.bookie, request.bookie_index, answered)

    def _send(
        self,
        bookie: str,
        index: int,
        answered: Callable[[int, StatusCode | None, bytes], None],
    ) -> None:
        request_id = next(self._requests)

        def on_answer(status: StatusCode | None, body: bytes) -> None:
            answered(index, status, body)

        def timed_out() -> None:
            if self._pending.pop(request_id, None) is not None:
                answered(index, None, b"")

        self._pending[request_id] = on_answer
        self.sim.call_later(self.timeout_ms, timed_out)
        self.network.send(
            self.name,
            bookie,
            ReadRequestMessage(self.name, request_id, self.digest.ledger_id, -1, False),
        )

    def _receive(self, message: object) -> None:
        if isinstance(message, ReadResponse):
            callback = self._pending.pop(message.request_id, None)
            if callback is not None:
                callback(message.status, message.body)
