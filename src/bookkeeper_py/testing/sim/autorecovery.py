"""Seeded runs of AutoRecovery on the simulated cluster: the real ``AutoRecovery`` services
(election, auditor, replication worker, ``Replicator``) over the simulated network and metadata
store, in virtual time, while bookies die for good or come back.

A run: six bookies. A writer writes a few ledgers (E/Qw/Qa 3/2/2) and closes them, then keeps
one more ledger open, adding to it slowly, sometimes pausing long enough for a worker's grace
for open ledgers to run out (the worker then fences and recovers the ledger under its writer).
Two or three AutoRecovery services, each its own node with its own client and metadata session
and polls of 50 ms, race for the auditor's election and for the ledgers' locks. The faults:

* bookies **lost for good**: crashed and gone from the registry (a second loss waits until no
  ledger names the first, so that no entry loses every copy at once, as an operator who replaces
  one bookie at a time);
* bookies that **leave and come back**: crashed, gone from the registry, started again on their
  disk and registered, at random or as soon as a worker begins copying one of their ledgers;
* in some runs a dead bookie's **registration outlives it** by 100 or 400 ms (its metadata
  session's timeout), while it refuses connections: the auditor and the workers must take the
  refusal for its death;
* the **auditor's node dies mid-mark**, after its n-th marker write: its vote and locks go with
  its session, another service takes over the election and finishes the audit;
* **sessions that expire** under a live service: its lock vanishes in the middle of a copy and
  another worker takes the same ledger, so two workers replicate it at once;
* the **writer dies**, its ledger left open for a worker to fence;
* a network that delays and resets, a metadata store that fails calls and loses the answers of
  writes; the writer's own ensemble changes race the workers' swaps.

Then everything but the lost bookies heals.

Invariants (each violation raises ``InvariantViolation``; the store's hooks report the ones found
inside the services' tasks):

* **Acknowledged entries keep Qa copies**: on every write of a ledger's metadata (every swap of
  replicated members among them) and at the end, each entry acknowledged to the writer is
  durable on at least Qa bookies of its write set by the new metadata, as the simulated disks
  hold it; at the end each of those copies is what the writer wrote; a closed ledger ends at or
  after every acknowledged entry.
* **Unmarked only when whole**: when a ledger's under-replication marker is deleted, its
  metadata names no bookie that had died (or left the registry) before the marker was last
  written and is not serving again (one that died since is the auditor's next mark, not this
  one's).
* **No bookie twice in an ensemble**, and earlier fragments change only by replacing members
  (the store's ``check_forward`` on every write).
* **Liveness once healed**: within the run's bound of virtual time every ledger names only
  registered bookies, no marker is left and the writer finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from dataclasses import dataclass, field

from bookkeeper_py import errors
from bookkeeper_py.autorecovery.auditor import AuditorOptions
from bookkeeper_py.autorecovery.service import AutoRecovery, AutoRecoveryOptions
from bookkeeper_py.autorecovery.worker import ReplicationWorker, WorkerOptions
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.metadata.underreplication import UnderReplication
from bookkeeper_py.testing.sim.bookie import SimBookie
from bookkeeper_py.testing.sim.cluster import SimCluster, sim_client_config, write_set_of
from bookkeeper_py.testing.sim.loop import current_node
from bookkeeper_py.testing.sim.metadata import InvariantViolation
from bookkeeper_py.testing.sim.network import NetworkFaults
from bookkeeper_py.wire.digest import DigestManager

BOOKIES = 6  # two may be lost for good: four stay, one more than an ensemble
WRITER = "writer"
SERVICES = ("autorecovery-0", "autorecovery-1", "autorecovery-2")
PASSWORD = b"sim"
POLL_S = 0.05  # every poll of the services: election, auditor, worker
FAULT_PHASE_MS = 1200.0
MAX_TIME_MS = 30_000.0  # after it, what is not settled is a liveness violation
MAX_ITERATIONS = 3_000_000
SETTLED_POLL_S = 0.02


def payload_of(ledger_id: int, entry_id: int) -> bytes:
    return f"ledger-{ledger_id}-entry-{entry_id}".encode() * (1 + entry_id % 3)


@dataclass
class AutoRecoveryScenario:
    """What happens in a run; ``random_autorecovery_scenario`` draws one from the seed. Times
    in virtual ms from the end of the set-up (the closed ledgers written); bookies and services
    by index."""

    closed_ledgers: int = 3
    closed_quorum: tuple[int, int, int] = (3, 2, 2)
    entries: int = 20  # in each closed ledger
    open_quorum: tuple[int, int, int] = (3, 2, 2)
    open_entries: int = 60
    append_pause_ms: float = 5.0  # between the open ledger's adds
    # (after this many entries, for how long): the writer adds nothing for a while
    writer_pause: tuple[int, float] | None = None
    writer_crash_at: float | None = None  # the writer's node dies, its ledger left open
    services: int = 3
    losses: list[tuple[float, int]] = field(default_factory=list)  # (at, bookie): for good
    # (at, bookie, downtime): it crashes, leaves the registry, restarts and registers again
    restarts: list[tuple[float, int, float]] = field(default_factory=list)
    # (after, downtime): once a worker first locks a ledger, a registered bookie of that ledger
    # leaves ``after`` ms later (in the middle of the copies) and comes back after ``downtime``
    copy_fault: tuple[float, float] | None = None
    auditor_crash_after: int | None = None  # the auditor's node dies after its n-th mark
    session_expiries: list[tuple[float, int]] = field(default_factory=list)  # (at, service)
    # once a worker first takes a ledger's lock, its session expires this many ms later: the
    # lock vanishes while it copies and another worker may take the ledger
    expire_mid_copy: float | None = None
    lost_bookie_delay_s: int = 0  # lostBookieRecoveryDelay
    # how long a dead bookie's registration outlives it (its session's timeout); meanwhile it
    # refuses connections
    registration_lag_ms: float = 0.0
    open_ledger_grace_s: float = 0.3  # openLedgerRereplicationGracePeriod
    network: NetworkFaults = field(default_factory=NetworkFaults)
    metadata_failure_probability: float = 0.0
    lost_answer_probability: float = 0.0  # a write of a plain node applied, its answer lost
    fault_phase_ms: float = FAULT_PHASE_MS


def random_autorecovery_scenario(rng: random.Random) -> AutoRecoveryScenario:
    services = rng.choice((2, 3, 3))
    scenario = AutoRecoveryScenario(
        closed_ledgers=rng.randint(2, 4),
        entries=rng.randint(5, 30),
        open_quorum=rng.choice(((3, 2, 2), (3, 3, 2))),
        open_entries=rng.randint(20, 100),
        append_pause_ms=rng.uniform(1.0, 8.0),
        services=services,
        auditor_crash_after=rng.randint(1, 3) if rng.random() < 0.4 else None,
        lost_bookie_delay_s=rng.choice((0, 0, 1)),
        open_ledger_grace_s=rng.uniform(0.1, 0.5),
        network=NetworkFaults(
            min_delay_ms=0.1,
            max_delay_ms=rng.uniform(0.5, 4.0),
            reset_probability=rng.choice((0.0, 0.0, 0.002, 0.01)),
        ),
        metadata_failure_probability=rng.choice((0.0, 0.0, 0.03)),
        lost_answer_probability=rng.choice((0.0, 0.0, 0.05)),
    )
    if rng.random() < 0.3:
        scenario.writer_pause = (rng.randrange(scenario.open_entries), rng.uniform(200, 800))
    if rng.random() < 0.25:
        scenario.writer_crash_at = rng.uniform(0, 800)
    lost = rng.sample(range(BOOKIES), rng.choice((1, 1, 2)))
    scenario.losses = [(rng.uniform(0, 600), index) for index in lost]
    others = [index for index in range(BOOKIES) if index not in lost]
    for _ in range(rng.randint(0, 2)):
        scenario.restarts.append((rng.uniform(0, 900), rng.choice(others), rng.uniform(20, 400)))
    if rng.random() < 0.3:
        scenario.copy_fault = (rng.uniform(0, 30), rng.uniform(50, 400))
    if rng.random() < 0.4:
        scenario.expire_mid_copy = rng.uniform(0, 20)
    for _ in range(rng.randint(0, 2)):
        scenario.session_expiries.append((rng.uniform(0, 900), rng.randrange(services)))
    scenario.registration_lag_ms = rng.choice((0.0, 0.0, 100.0, 400.0))
    return scenario


@dataclass
class AutoRecoveryRunResult:
    seed: int
    scenario: AutoRecoveryScenario
    violation: str | None
    steps: int  # iterations of the event loop
    virtual_ms: float
    acked: int  # entries acknowledged to the writer, in every ledger
    swaps: int  # metadata writes of a service that replaced members of a fragment
    # locks taken of a ledger whose previous lock vanished with its holder's session (a live
    # holder may still be copying: two workers on one ledger)
    takeovers: int
    unmarks: int  # markers deleted
    auditors: int  # services that wrote markers (more than one: the election moved)
    fenced: bool  # the open ledger was closed by a worker, not by its writer

    @property
    def ok(self) -> bool:
        return self.violation is None


def service_options(scenario: AutoRecoveryScenario) -> AutoRecoveryOptions:
    """The services' settings on the simulation's time scale."""
    return AutoRecoveryOptions(
        auditor=AuditorOptions(poll_s=POLL_S, initial_delay_s=scenario.lost_bookie_delay_s),
        worker=WorkerOptions(
            open_ledger_grace_s=scenario.open_ledger_grace_s, poll_s=POLL_S, retry_s=2 * POLL_S
        ),
        election_poll_s=POLL_S,
    )


class AutoRecoveryRun(SimCluster):
    def __init__(self, seed: int, scenario: AutoRecoveryScenario) -> None:
        self.seed = seed
        self.scenario = scenario
        self.service_names = SERVICES[: scenario.services]
        # calm until the closed ledgers are written; the scenario's faults start then
        super().__init__(
            random.Random(seed),
            bookies=BOOKIES,
            clients=(WRITER, *self.service_names),
            config=sim_client_config(),
            network=NetworkFaults(),
        )
        tree = UnderReplication(self.ports[WRITER])
        self.marker_prefix, self.lock_prefix = tree.ledgers + "/", tree.locks + "/"
        self.store.on_ledger_write = self._check_ledger_write
        self.store.on_node_write = self._note_node_write
        self.store.on_node_delete = self._note_node_delete
        self.acked: dict[int, list[int]] = {}  # ledger -> entries acknowledged to the writer
        self.open_ledger: int | None = None
        self.closed_by_writer = False
        self.writer_done = False
        self.writer_crashed = False
        self.services: dict[str, AutoRecovery] = {}
        self.crashed: set[str] = set()  # services whose node died
        self.healed = False
        self.swaps = 0
        self.unmarks = 0
        self.marks_by: dict[str, int] = {}  # node -> marker writes
        # Events in the order they happened: when each marker was last written, when each
        # bookie last died.
        self._events = 0
        self._marker_written: dict[str, int] = {}
        self._left: dict[str, int] = {}
        self._orphaned: set[str] = set()  # locks that vanished with their holder's session
        self.takeovers = 0
        self._lock_faults_struck = False

    def _tick(self) -> int:
        self._events += 1
        return self._events

    # -- the writer ----------------------------------------------------------------------------

    async def _set_up(self) -> None:
        """Writes the closed ledgers, then lets the faults and the services loose and writes
        the open ledger."""
        client = self.clients[WRITER]
        for _ in range(self.scenario.closed_ledgers):
            handle = await client.create_ledger(*self.scenario.closed_quorum, password=PASSWORD)
            ledger_id = handle.ledger_id
            futures = [
                handle.add_entry_async(payload_of(ledger_id, entry_id))
                for entry_id in range(self.scenario.entries)
            ]
            self.acked[ledger_id] = list(await asyncio.gather(*futures))
            await handle.close()
        self._schedule_faults()
        for name in self.service_names:
            self._start(name, self._serve(name))
        await self._write_open()

    async def _write_open(self) -> None:
        scenario = self.scenario
        client = self.clients[WRITER]
        handle = None
        for _ in range(100):
            try:
                handle = await client.create_ledger(*scenario.open_quorum, password=PASSWORD)
                break
            except errors.BKError:
                await asyncio.sleep(0.01)
        if handle is None:
            raise InvariantViolation("the writer could not create its ledger in 100 attempts")
        ledger_id = self.open_ledger = handle.ledger_id
        acked = self.acked[ledger_id] = []
        for entry_id in range(scenario.open_entries):
            if scenario.writer_pause is not None and entry_id == scenario.writer_pause[0]:
                await asyncio.sleep(scenario.writer_pause[1] / 1000)
            try:
                added = await handle.add_entry(payload_of(ledger_id, entry_id))
            except errors.BKError:
                break  # fenced by a worker whose grace ran out, or no bookie to change to
            if self.writer_crashed:
                return
            acked.append(added)
            await asyncio.sleep(scenario.append_pause_ms / 1000)
        with contextlib.suppress(errors.BKError):
            await handle.close()
            self.closed_by_writer = not self.writer_crashed
        self.writer_done = True

    def _crash_writer(self) -> None:
        """The writer's process dies: what it is told from now on is nobody's; its ledger stays
        open for a worker to fence once the grace for open ledgers ran out."""
        self.writer_crashed = self.writer_done = True
        self._crash_client(WRITER)

    # -- the services --------------------------------------------------------------------------

    async def _serve(self, name: str) -> None:
        client = self.clients[name]
        options = service_options(self.scenario)
        service = AutoRecovery(client, name, options)
        # The worker shuffles the marked ledgers: with a seeded source here, so a seed replays.
        service.worker = ReplicationWorker(
            client, service.markers, name, options.worker, rng=random.Random(self.rng.random())
        )
        self.services[name] = service
        for _ in range(100):
            try:
                await service.start()
                return
            except errors.BKError:
                await asyncio.sleep(POLL_S)
        raise InvariantViolation(f"{name} could not start in 100 attempts")

    def _crash_service(self, name: str) -> None:
        """The service's node dies: its connections and calls with it, and its session's
        ephemeral nodes (vote, locks) vanish."""
        if name in self.crashed:
            return
        self.crashed.add(name)
        self._crash_client(name)
        self._end_session(name)

    def _expire(self, name: str) -> None:
        """The service's session expires; the process lives on, unaware until it looks."""
        if name not in self.crashed:
            self._end_session(name)

    def _end_session(self, name: str) -> None:
        self._orphaned |= {
            path
            for path, owner in self.store.ephemeral.items()
            if owner == name and path.startswith(self.lock_prefix)
        }
        self.ports[name].end_session()

    # -- bookies -------------------------------------------------------------------------------

    def _die(self, bookie: SimBookie) -> None:
        """``bookie``'s process dies: it refuses connections at once, and its registration
        goes ``registration_lag_ms`` later (its metadata session's timeout), unless it is up
        again by then."""
        bookie.crash()
        self._left[bookie.bookie_id] = self._tick()
        lag = self.scenario.registration_lag_ms
        if lag <= 0:
            self.unregister(bookie)
            return

        def session_expired() -> None:
            if not bookie.up:
                self.unregister(bookie)

        self.loop.call_later(lag / 1000, session_expired)

    def _lost_still_named(self) -> bool:
        return any(metadata.bookies() & self._lost for metadata, _ in self.store.ledgers.values())

    def _lose(self, bookie: SimBookie) -> None:
        """``bookie`` dies for good, once no ledger names an earlier lost one."""
        if self.healed or self._ended or bookie.bookie_id in self._lost:
            return
        if self._lost_still_named():
            self.loop.call_later(POLL_S, self._lose, bookie)
            return
        self._lost.add(bookie.bookie_id)
        self._die(bookie)

    def _leave(self, bookie: SimBookie) -> None:
        if bookie.up and bookie.bookie_id not in self._lost and not self.healed:
            self._die(bookie)

    def _come_back(self, bookie: SimBookie) -> None:
        if bookie.bookie_id in self._lost:
            return
        if not bookie.up:
            bookie.start()
        self.register(bookie)

    def _lock_faults(self, node: str, ledger_id: int) -> None:
        """The scenario's ``copy_fault`` and ``expire_mid_copy``, at the first lock a worker
        takes."""
        scenario = self.scenario
        if self._lock_faults_struck or self.healed:
            return
        self._lock_faults_struck = True
        if scenario.expire_mid_copy is not None:
            self.loop.call_later(scenario.expire_mid_copy / 1000, self._expire, node)
        if scenario.copy_fault is None:
            return
        after, downtime = scenario.copy_fault
        metadata = self.store.metadata(ledger_id)
        members = sorted(b for b in metadata.bookies() if self._registered(b))
        if members:
            bookie = self.bookies[self.rng.choice(members)]
            self.loop.call_later(after / 1000, self._leave, bookie)
            self.loop.call_later((after + downtime) / 1000, self._come_back, bookie)

    # -- the schedule --------------------------------------------------------------------------

    def _schedule_faults(self) -> None:
        scenario = self.scenario
        self.network.faults = scenario.network
        self.store.faults.failure_probability = scenario.metadata_failure_probability
        self.store.faults.lost_answer_probability = scenario.lost_answer_probability
        start = self.loop.time() * 1000
        end = start + scenario.fault_phase_ms
        bookies = list(self.bookies.values())
        for at, index in scenario.losses:
            self._at(start + at, functools.partial(self._lose, bookies[index]))
        for at, index, downtime in scenario.restarts:
            self._at(start + at, functools.partial(self._leave, bookies[index]))
            self._at(
                min(start + at + downtime, end), functools.partial(self._come_back, bookies[index])
            )
        for at, index in scenario.session_expiries:
            self._at(start + at, functools.partial(self._expire, self.service_names[index]))
        if scenario.writer_crash_at is not None:
            self._at(start + scenario.writer_crash_at, self._crash_writer)
        self._at(end, self._heal)

    def _heal(self) -> None:
        self.healed = True
        self._heal_faults(self.scenario.network.max_delay_ms)
        for bookie in self.bookies.values():
            if bookie.up:
                self.register(bookie)
        self._start("monitor", self._await_settled())

    async def _await_settled(self) -> None:
        for _ in range(int(MAX_TIME_MS / 1000 / SETTLED_POLL_S)):
            if not self.unsettled():
                if not self._done.done():
                    self._done.set_result(None)
                return
            await asyncio.sleep(SETTLED_POLL_S)

    # -- invariants ----------------------------------------------------------------------------

    def _is_marker(self, path: str) -> bool:
        return path.startswith(self.marker_prefix) and path.rsplit("/", 1)[1].startswith("urL")

    def _registered(self, bookie: str) -> bool:
        return bookie in self.store.writable or bookie in self.store.readonly

    def _serving(self, bookie: str) -> bool:
        """Registered and up (a dead bookie's registration may outlive it for a while)."""
        return self._registered(bookie) and self.bookies[bookie].up

    def _check_ledger_write(self, old: LedgerMetadata | None, new: LedgerMetadata) -> None:
        if old is not None and current_node.get() in self.service_names:
            starts = dict(new.ensembles)
            if any(starts.get(first, members) != members for first, members in old.ensembles):
                self.swaps += 1
        self.check_copies(new)

    def check_copies(self, metadata: LedgerMetadata) -> None:
        """Every entry acknowledged to the writer is durable on Qa bookies of its write set by
        ``metadata``, and a closed ledger ends at or after each of them."""
        ledger_id = metadata.ledger_id
        acked = self.acked.get(ledger_id, [])
        quorum = metadata.ack_quorum_size
        for entry_id in acked:
            holders = write_set_of(metadata, entry_id)
            copies = [b for b in holders if self._holds(b, ledger_id, entry_id)]
            if len(copies) < quorum:
                raise InvariantViolation(
                    f"ledger {ledger_id} entry {entry_id} was acknowledged to its writer, but of "
                    f"its write set {holders} only {copies} hold it durably (Qa={quorum}): "
                    f"fragments {list(metadata.ensembles)}"
                )
        if metadata.is_closed and acked and max(acked) > metadata.last_entry_id:
            raise InvariantViolation(
                f"ledger {ledger_id} is closed at entry {metadata.last_entry_id}, but entry "
                f"{max(acked)} was acknowledged to its writer"
            )

    def _holds(self, bookie_id: str, ledger_id: int, entry_id: int) -> bool:
        bookie = self.bookies.get(bookie_id)
        return bookie is not None and bookie.holds_durably(ledger_id, entry_id)

    def _note_node_write(self, path: str, _old: bytes | None, _new: bytes) -> None:
        if path.startswith(self.lock_prefix):
            if path in self._orphaned:
                self._orphaned.discard(path)
                self.takeovers += 1
            self._lock_faults(current_node.get(), int(path.rsplit("/", 1)[1][3:]))
        if not self._is_marker(path):
            return
        self._marker_written[path] = self._tick()
        node = current_node.get()
        marks = self.marks_by[node] = self.marks_by.get(node, 0) + 1
        if (
            marks == self.scenario.auditor_crash_after
            and node in self.service_names
            and not self.crashed
        ):
            self.loop.call_soon(self._crash_service, node)  # once this write is done

    def _note_node_delete(self, path: str, _data: bytes) -> None:
        if self._is_marker(path):
            self.unmarks += 1
            self._check_unmark(path)

    def _check_unmark(self, path: str) -> None:
        """A marker is deleted only when its ledger's copies were made again: its metadata names
        no bookie that had died (or left the registry) before the marker was last written and
        is not serving again."""
        ledger_id = int(path.rsplit("/", 1)[1][3:])
        stored = self.store.ledgers.get(ledger_id)
        if stored is None:
            return  # deleted: nothing to copy
        marked_at = self._marker_written.get(path, 0)
        for first, members in stored[0].ensembles:
            for bookie in members:
                if not self._serving(bookie) and self._left.get(bookie, 0) < marked_at:
                    raise InvariantViolation(
                        f"ledger {ledger_id} was unmarked while its fragment at entry {first} "
                        f"names {bookie}, which had died or left the registry before the marker "
                        f"was last written: the copies on it were not made again "
                        f"({list(members)})"
                    )

    def unsettled(self) -> list[str]:
        """What keeps the cluster from being whole again (empty: settled)."""
        problems = [] if self.writer_done else ["the writer has not finished"]
        for ledger_id, (metadata, _) in sorted(self.store.ledgers.items()):
            gone = sorted(b for b in metadata.bookies() if not self._registered(b))
            if gone:
                problems.append(f"ledger {ledger_id} names {gone}, not registered")
        markers = sorted(
            path.rsplit("/", 1)[1] for path in self.store.nodes if self._is_marker(path)
        )
        if markers:
            problems.append(f"markers left: {markers}")
        return problems

    def final_check(self) -> None:
        problems = self.unsettled()
        if problems:
            raise InvariantViolation(
                f"not whole {MAX_TIME_MS / 1000:.0f} virtual s after the run began, although "
                f"healed with {BOOKIES - len(self._lost)} bookies: " + "; ".join(problems)
            )
        for metadata, _ in self.store.ledgers.values():
            self.check_copies(metadata)
            self._check_contents(metadata)

    def _check_contents(self, metadata: LedgerMetadata) -> None:
        """Every durable copy of an acknowledged entry in its write set is what the writer
        wrote (the copies were made of the stored bytes, digest and all)."""
        ledger_id = metadata.ledger_id
        digest = DigestManager(ledger_id, metadata.digest_type, metadata.password)
        stored = {
            bookie_id: {
                record[2]: record[3]
                for record in bookie.disk.durable
                if record[:2] == ("entry", ledger_id)
            }
            for bookie_id, bookie in self.bookies.items()
        }
        for entry_id in self.acked.get(ledger_id, []):
            for bookie_id in write_set_of(metadata, entry_id):
                body = stored.get(bookie_id, {}).get(entry_id)
                if body is None:
                    continue
                assert isinstance(body, bytes)
                try:
                    payload = digest.verify(body, entry_id).payload
                except errors.DigestMismatchError as error:
                    raise InvariantViolation(f"{bookie_id} holds a bad copy: {error}") from None
                if payload != payload_of(ledger_id, entry_id):
                    raise InvariantViolation(
                        f"{bookie_id} holds ledger {ledger_id} entry {entry_id} with other data "
                        "than the writer wrote"
                    )

    # -- the run -------------------------------------------------------------------------------

    async def _main(self) -> None:
        self._at(0, lambda: self._start(WRITER, self._set_up()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._done), MAX_TIME_MS / 1000)

    def _after_iteration(self) -> None:
        if self.violation is not None:
            raise InvariantViolation(self.violation)
        if self.loop.iterations >= MAX_ITERATIONS:
            raise InvariantViolation(f"not finished after {MAX_ITERATIONS} loop iterations")

    def run(self) -> AutoRecoveryRunResult:
        violation = self._run_checked(self._main(), self.final_check)
        loop = self.loop
        fenced = False
        if self.open_ledger is not None and self.open_ledger in self.store.ledgers:
            fenced = self.store.metadata(self.open_ledger).is_closed and not self.closed_by_writer
        return AutoRecoveryRunResult(
            seed=self.seed,
            scenario=self.scenario,
            violation=violation,
            steps=loop.iterations,
            virtual_ms=loop.time() * 1000,
            acked=sum(len(entries) for entries in self.acked.values()),
            swaps=self.swaps,
            takeovers=self.takeovers,
            unmarks=self.unmarks,
            auditors=sum(1 for node in self.marks_by if node in self.service_names),
            fenced=fenced,
        )


def run_autorecovery_seed(seed: int) -> AutoRecoveryRunResult:
    """The run of ``seed``: its scenario drawn from the seed."""
    return AutoRecoveryRun(seed, random_autorecovery_scenario(random.Random(seed))).run()
