"""One seeded run of a simulated cluster, with the invariants checked after every step.

A run: E+2 bookies, one ledger written by a ``SimWriter`` (``count`` entries) while the network
delays, drops, duplicates and partitions, bookies crash (losing unsynced writes, tearing the last
one) and restart, syncs fail and reads hit I/O errors; the writer may crash; a recovering client
opens the ledger at a random moment (often while the writer is still adding); once the fault
phase ends everything heals and two readers read the closed ledger.

The invariants (after the TLA+ specification of BookKeeper by J. Vanlightly):

* **Durability**: every entry acknowledged to the writer is durable on at least Qa bookies of
  its write set, less one per bookie of that write set whose disk was lost (a scenario's
  ``wipes``): no acknowledged entry is lost while fewer than Qa bookies of its write set lost
  data.
* **Closed ledgers keep every ack**: once closed, the last entry is at or after every entry
  acknowledged to the writer — before or after the close, so a fenced writer gets no ack past it;
  and never before the start of the last fragment (valid metadata).
* **Metadata moves forward**: state OPEN -> IN_RECOVERY -> CLOSED only, a close is final,
  earlier fragments never change and the last fragment's start never decreases (checked on
  every metadata write).
* **LAC reads cover**: a LAC read (no fencing) answers at least the LAC carried by every entry
  of the last fragment acknowledged before it began.
* **Readers agree**: both readers read the same entries, which are exactly what the writer
  wrote, from 0 to the last entry (up to the first entry every copy of which was on lost disks).
* **Liveness once healed**: recovery finishes and the readers finish.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from bookkeeper_py.core.lac import LastConfirmedRead
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.core.recovery import LedgerRecovery
from bookkeeper_py.core.writer import LedgerWriter
from bookkeeper_py.testing.sim.actors import (
    BookieFaults,
    InvariantViolation,
    SimBookie,
    SimLacReader,
    SimMetadataStore,
    SimReader,
    SimRecovery,
    SimWriter,
    payload_of,
)
from bookkeeper_py.testing.sim.disk import Disk, DiskFaults
from bookkeeper_py.testing.sim.network import Network, NetworkFaults
from bookkeeper_py.testing.sim.scheduler import Simulation
from bookkeeper_py.wire.digest import DigestManager, DigestType

QUORUMS = ((3, 3, 2), (3, 2, 2), (5, 3, 2), (4, 4, 3))
LEDGER_ID = 1
FAULT_PHASE_MS = 400.0
MAX_TIME_MS = 60_000.0


@dataclass
class Scenario:
    """What happens in a run; ``random_scenario`` draws one from the seed."""

    quorum: tuple[int, int, int]
    entries: int = 40
    spare_bookies: int = 2
    network: NetworkFaults = field(default_factory=NetworkFaults)
    read_error_probability: float = 0.0
    sync_failure_probability: float = 0.0
    # (at, bookie index, downtime; None: the bookie never comes back)
    crashes: list[tuple[float, int, float | None]] = field(default_factory=list)
    # (at, bookie index, downtime): the bookie crashes and comes back on an empty disk
    wipes: list[tuple[float, int, float]] = field(default_factory=list)
    initial_ensemble: list[int] | None = None  # bookie indices; None: drawn from the seed
    lac_reads: list[float] = field(default_factory=list)  # when a reader reads the LAC
    # (at, these bookies, from these nodes, duration): the nodes are "writer", "recovery" or
    # bookie names; the default side is the clients
    partitions: list[tuple[float, list[int], float]] = field(default_factory=list)
    cuts: list[tuple[float, list[str], list[str], float]] = field(default_factory=list)
    slow_links: list[tuple[str, str, float]] = field(default_factory=list)  # source, dest, extra
    writer_crash_at: float | None = None
    recovery_at: float = 100.0
    max_in_flight: int = 10
    delay_ensemble_change: bool = False
    fault_phase_ms: float = FAULT_PHASE_MS


def random_scenario(rng: random.Random, quorum: tuple[int, int, int]) -> Scenario:
    ensemble_size = quorum[0]
    bookies = ensemble_size + 2
    scenario = Scenario(
        quorum=quorum,
        entries=rng.randint(10, 50),
        network=NetworkFaults(
            min_delay_ms=0.1,
            max_delay_ms=rng.uniform(1.0, 10.0),
            drop_probability=rng.choice([0.0, 0.0, 0.01, 0.03]),
            duplicate_probability=rng.choice([0.0, 0.02]),
        ),
        read_error_probability=rng.choice([0.0, 0.0, 0.05]),
        sync_failure_probability=rng.choice([0.0, 0.0, 0.02]),
        writer_crash_at=rng.uniform(0, 150) if rng.random() < 0.3 else None,
        recovery_at=rng.uniform(0, 300),
        max_in_flight=rng.randint(1, 20),
        delay_ensemble_change=rng.random() < 0.3,
    )
    for _ in range(rng.randint(0, 3)):
        scenario.crashes.append((rng.uniform(0, 300), rng.randrange(bookies), rng.uniform(5, 200)))
    if rng.random() < 0.3:
        side = rng.sample(range(bookies), rng.randint(1, 2))
        scenario.partitions.append((rng.uniform(0, 200), side, rng.uniform(20, 200)))
    scenario.lac_reads = [rng.uniform(0, 300) for _ in range(rng.randint(0, 3))]
    return scenario


@dataclass
class RunResult:
    seed: int
    scenario: Scenario
    violation: str | None
    steps: int
    virtual_ms: float
    acked: int
    last_entry_id: int | None
    ensemble_changes: int
    recovery_attempts: int

    @property
    def ok(self) -> bool:
        return self.violation is None


class Run:
    def __init__(
        self,
        seed: int,
        scenario: Scenario,
        make_recovery: Callable[[], LedgerRecovery] | None = None,
        bookie_faults: Callable[[BookieFaults], None] | None = None,
        make_lac_read: Callable[[LedgerMetadata], LastConfirmedRead] | None = None,
    ) -> None:
        self.seed = seed
        self.scenario = scenario
        self.sim = Simulation(seed)
        sim = self.sim
        ensemble_size, write_quorum, ack_quorum = scenario.quorum
        self.network = Network(sim, scenario.network)
        self.bookies: dict[str, SimBookie] = {}
        for index in range(ensemble_size + scenario.spare_bookies):
            name = f"bookie-{index}"
            faults = BookieFaults(read_error_probability=scenario.read_error_probability)
            if bookie_faults is not None:
                bookie_faults(faults)
            disk = Disk(
                random.Random(sim.random.random()), DiskFaults(scenario.sync_failure_probability)
            )
            self.bookies[name] = SimBookie(name, sim, self.network, disk, faults)
        names = list(self.bookies)
        metadata = LedgerMetadata(
            ledger_id=LEDGER_ID,
            ensemble_size=ensemble_size,
            write_quorum_size=write_quorum,
            ack_quorum_size=ack_quorum,
            digest_type=DigestType.CRC32C,
            password=b"sim",
            ensembles=(
                (
                    0,
                    tuple(sim.random.sample(names, ensemble_size))
                    if scenario.initial_ensemble is None
                    else tuple(names[i] for i in scenario.initial_ensemble),
                ),
            ),
        )
        self.store = SimMetadataStore(sim, metadata)
        digest = DigestManager(LEDGER_ID, DigestType.CRC32C, b"sim")
        self.writer = SimWriter(
            "writer",
            sim,
            self.network,
            self.store,
            self.bookies,
            digest,
            scenario.entries,
            LedgerWriter(
                metadata,
                max_in_flight=scenario.max_in_flight,
                add_timeout_ms=100,
                delay_ensemble_change=scenario.delay_ensemble_change,
                explicit_lac_interval_ms=50,
            ),
        )
        self.recovery = SimRecovery(
            "recovery",
            sim,
            self.network,
            self.store,
            digest,
            make_recovery or (lambda: LedgerRecovery(LEDGER_ID, read_window=4)),
            self.bookies,
        )
        self.readers = [
            SimReader(f"reader-{i}", sim, self.network, self.store, digest) for i in range(2)
        ]
        self.lac_reader = SimLacReader(
            "lac-reader",
            sim,
            self.network,
            self.store,
            digest,
            self.writer,
            make_lac_read or (lambda metadata: LastConfirmedRead(metadata, fence=False)),
        )
        self._checked = (-1, -1, -1)
        self._lost: set[str] = set()  # bookies that never come back
        self._wiped: set[str] = set()  # bookies that lost their disk at least once
        self._schedule()

    def _schedule(self) -> None:
        sim, scenario = self.sim, self.scenario
        names = list(self.bookies)
        self.writer.start()
        for at, index, downtime in scenario.crashes:
            bookie = self.bookies[names[index]]
            sim.call_at(at, bookie.crash)
            if downtime is None:
                self._lost.add(bookie.name)
            else:
                sim.call_at(min(at + downtime, scenario.fault_phase_ms), self._restart(bookie))
        for at, index, downtime in scenario.wipes:
            bookie = self.bookies[names[index]]
            sim.call_at(at, self._wipe(bookie))
            sim.call_at(min(at + downtime, scenario.fault_phase_ms), self._restart(bookie))
        cuts = [
            (at, [names[i] for i in side], ["writer", "recovery"], duration)
            for at, side, duration in scenario.partitions
        ]
        for at, side_nodes, other_nodes, duration in cuts + scenario.cuts:
            sim.call_at(at, self._partition(side_nodes, other_nodes))
            sim.call_at(min(at + duration, scenario.fault_phase_ms), self.network.heal)
        for source, destination, extra in scenario.slow_links:
            self.network.slow_down(source, destination, extra)
        if scenario.writer_crash_at is not None:
            sim.call_at(scenario.writer_crash_at, self.writer.crash)
        sim.call_at(scenario.recovery_at, self.recovery.start)
        for at in scenario.lac_reads:
            self.lac_reader.read_at(at)
        sim.call_at(scenario.fault_phase_ms, self._heal)
        for reader in self.readers:
            sim.call_at(0, reader.start)

    def _partition(self, side: list[str], other: list[str]) -> Callable[[], None]:
        return lambda: self.network.partition(side, other)

    def _wipe(self, bookie: SimBookie) -> Callable[[], None]:
        def wipe() -> None:
            self._wiped.add(bookie.name)
            bookie.wipe()

        return wipe

    def _restart(self, bookie: SimBookie) -> Callable[[], None]:
        def restart() -> None:
            if not bookie.up:
                bookie.start()

        return restart

    def _heal(self) -> None:
        self.network.heal()
        self.network.faults = NetworkFaults(0.1, self.scenario.network.max_delay_ms, 0.0, 0.0)
        for bookie in self.bookies.values():
            bookie.faults.read_error_probability = 0.0
            bookie.disk.faults.sync_failure_probability = 0.0
            if not bookie.up and bookie.name not in self._lost:
                bookie.start()

    # -- invariants ----------------------------------------------------------------------------

    def check(self) -> None:
        acked = self.writer.acked
        metadata = self.store.metadata
        synced = sum(b.disk.synced_records + b.crashes for b in self.bookies.values())
        state = (len(acked), self.store.version, synced)
        if state == self._checked:
            return
        self._checked = state
        qa = metadata.ack_quorum_size
        for entry_id in acked:
            holders = self._write_set_of(metadata, entry_id)
            copies = sum(1 for b in holders if self.bookies[b].holds_durably(LEDGER_ID, entry_id))
            # A lost disk may take a copy with it: Qa copies while no disk was lost, and at
            # least one while fewer than Qa of the write set lost theirs.
            needed = qa - sum(1 for b in holders if b in self._wiped)
            if copies < needed:
                raise InvariantViolation(
                    f"entry {entry_id} was acknowledged but is durable on {copies} bookies of its "
                    f"write set {holders} (Qa={qa}, lost disks: {sorted(self._wiped)})"
                )
        if metadata.is_closed and acked and acked[-1] > metadata.last_entry_id:
            raise InvariantViolation(
                f"the ledger is closed at entry {metadata.last_entry_id} but entry {acked[-1]} "
                "was acknowledged to the writer"
            )
        if metadata.is_closed and metadata.last_entry_id < metadata.last_ensemble[0] - 1:
            raise InvariantViolation(
                f"the ledger is closed at entry {metadata.last_entry_id}, before its last "
                f"fragment (from entry {metadata.last_ensemble[0]}): invalid metadata"
            )

    def _write_set_of(self, metadata: LedgerMetadata, entry_id: int) -> list[str]:
        ensemble = metadata.ensemble_at(entry_id)
        members = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum_size)
        return [ensemble[i] for i in members]

    def _lost_by_disks(self, metadata: LedgerMetadata, entry_id: int) -> bool:
        """No bookie of the entry's write set holds it, and one of them lost its disk."""
        holders = self._write_set_of(metadata, entry_id)
        return any(b in self._wiped for b in holders) and not any(
            self.bookies[b].holds_durably(LEDGER_ID, entry_id) for b in holders
        )

    def finished(self) -> bool:
        return self.recovery.done and all(r.entries is not None for r in self.readers)

    def final_check(self) -> None:
        metadata = self.store.metadata
        if not self.finished():
            raise InvariantViolation(
                f"not finished after healing: recovery done={self.recovery.done} "
                f"(failures: {self.recovery.failures[-3:]}), metadata state {metadata.state}, "
                f"readers {[r.entries is not None for r in self.readers]}"
            )
        expected = [payload_of(i) for i in range(metadata.last_entry_id + 1)]
        for reader in self.readers:
            if reader.missing and self._lost_by_disks(metadata, reader.missing[0]):
                # Lost with the disks: the readers can only agree on what came before.
                expected = expected[: reader.missing[0]]
            elif reader.missing:
                raise InvariantViolation(
                    f"{reader.name} could not read entry {reader.missing[0]} of the closed ledger"
                )
            if reader.entries != expected:
                raise InvariantViolation(
                    f"{reader.name} read {len(reader.entries or [])} entries, not the "
                    f"{len(expected)} the writer wrote up to the close"
                )

    def run(self) -> RunResult:
        violation = None
        try:
            self.sim.run(
                until=self.finished,
                max_steps=2_000_000,
                max_time_ms=MAX_TIME_MS,
                after_step=self.check,
            )
            self.final_check()  # names what did not finish
        except InvariantViolation as error:
            violation = str(error)
        metadata = self.store.metadata
        return RunResult(
            seed=self.seed,
            scenario=self.scenario,
            violation=violation,
            steps=self.sim.steps,
            virtual_ms=self.sim.now_ms,
            acked=len(self.writer.acked),
            last_entry_id=metadata.last_entry_id if metadata.is_closed else None,
            ensemble_changes=self.writer.writer.ensemble_changes,
            recovery_attempts=len(self.recovery.failures) + int(self.recovery.done),
        )


def run_scenario(
    seed: int,
    scenario: Scenario,
    make_recovery: Callable[[], LedgerRecovery] | None = None,
    bookie_faults: Callable[[BookieFaults], None] | None = None,
    make_lac_read: Callable[[LedgerMetadata], LastConfirmedRead] | None = None,
) -> RunResult:
    return Run(seed, scenario, make_recovery, bookie_faults, make_lac_read).run()


def run_seed(seed: int, quorum: tuple[int, int, int] | None = None) -> RunResult:
    """The run of ``seed``: the quorum cycles through ``QUORUMS`` unless given."""
    rng = random.Random(seed)
    scenario = random_scenario(rng, quorum or QUORUMS[seed % len(QUORUMS)])
    return Run(seed, scenario).run()
