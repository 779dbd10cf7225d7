"""One seeded run of a simulated cluster, with the invariants checked after every step.

A run: E+2 bookies, one ledger written by the client's real ``LedgerHandle`` (``count``
entries) while the network delays, resets and partitions connections, bookies crash (losing
unsynced writes, tearing the last one) and restart, syncs fail and reads hit I/O errors; the
writer may crash; a recovering client opens the ledger (the real ``open_ledger``: fencing,
recovery, close) at a random moment, often while the writer is still adding; a reader reads the
LAC now and then; once the fault phase ends everything heals and two readers read the closed
ledger. Every client is a real ``BookKeeper`` over the simulated metadata port and network, on
the virtual-time loop: real frames, real codecs, real request matching and timeouts.

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

import asyncio
import contextlib
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from bookkeeper_py import errors
from bookkeeper_py.client.config import ClientConfig
from bookkeeper_py.client.ledger import LedgerHandle, ReadHandle
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.testing.sim.bookie import BookieFaults, SimBookie
from bookkeeper_py.testing.sim.cluster import SimCluster, sim_client_config, write_set_of
from bookkeeper_py.testing.sim.metadata import (
    InvariantViolation,
)
from bookkeeper_py.testing.sim.network import NetworkFaults
from bookkeeper_py.wire.digest import DigestType

QUORUMS = ((3, 3, 2), (3, 2, 2), (5, 3, 2), (4, 4, 3))
LEDGER_ID = 1
PASSWORD = b"sim"
FAULT_PHASE_MS = 400.0
MAX_TIME_MS = 60_000.0
MAX_ITERATIONS = 2_000_000
_LAC = struct.Struct(">q")  # at offset 16 of a packaged entry: the LAC it carries
CLIENTS = ("writer", "recovery", "reader-0", "reader-1", "lac-reader", "tailer")


def payload_of(entry_id: int) -> bytes:
    return f"entry-{entry_id}".encode() * (1 + entry_id % 3)


@dataclass
class Scenario:
    """What happens in a run; ``random_scenario`` draws one from the seed. Times in virtual ms."""

    quorum: tuple[int, int, int]
    entries: int = 40
    spare_bookies: int = 2
    network: NetworkFaults = field(default_factory=NetworkFaults)
    read_error_probability: float = 0.0
    sync_failure_probability: float = 0.0
    metadata_failure_probability: float = 0.0  # each metadata call may fail (store away)
    # (at, bookie index, downtime; None: the bookie never comes back)
    crashes: list[tuple[float, int, float | None]] = field(default_factory=list)
    # (at, bookie index, downtime): the bookie crashes and comes back on an empty disk
    wipes: list[tuple[float, int, float]] = field(default_factory=list)
    initial_ensemble: list[int] | None = None  # bookie indices; None: drawn from the seed
    lac_reads: list[float] = field(default_factory=list)  # when a reader reads the LAC
    # (at, these bookies, duration): cut from the writer and the recovering client
    partitions: list[tuple[float, list[int], float]] = field(default_factory=list)
    # (at, these nodes, from these nodes, duration): nodes are the clients' names (``CLIENTS``)
    # or bookie names ("bookie-2")
    cuts: list[tuple[float, list[str], list[str], float]] = field(default_factory=list)
    slow_links: list[tuple[str, str, float]] = field(default_factory=list)  # source, dest, extra
    # (at, source, destination): from then on, the next bytes sent that way are lost with their
    # connection (the client reconnects at once)
    lost_sends: list[tuple[float, str, str]] = field(default_factory=list)
    writer_crash_at: float | None = None
    recovery_at: float = 100.0
    # when the recovering client first reads the ledger without recovery (its connections to
    # the last ensemble are then open when the recovery begins); None: it does not
    recovery_warm_up_at: float | None = None
    reorder_read_sequence: bool = True  # the clients' ``reorder_read_sequence``
    tail: bool = False  # a reader follows the ledger with long polls from the start
    # The writer adds with DEFERRED_SYNC and forces every ``force_every`` entries (and at the
    # end): only forced entries are promised durable.
    deferred_sync: bool = False
    force_every: int = 10
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
            reset_probability=rng.choice([0.0, 0.0, 0.005, 0.02]),
        ),
        read_error_probability=rng.choice([0.0, 0.0, 0.05]),
        sync_failure_probability=rng.choice([0.0, 0.0, 0.02]),
        metadata_failure_probability=rng.choice([0.0, 0.0, 0.0, 0.05]),
        writer_crash_at=rng.uniform(0, 150) if rng.random() < 0.3 else None,
        recovery_at=rng.uniform(0, 300),
        max_in_flight=rng.randint(1, 20),
        delay_ensemble_change=rng.random() < 0.3,
        tail=rng.random() < 0.5,
        deferred_sync=rng.random() < 0.2,
        force_every=rng.randint(1, 15),
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
    steps: int  # iterations of the event loop
    virtual_ms: float
    acked: int
    last_entry_id: int | None
    ensemble_changes: int
    recovery_attempts: int
    lac_reads: int = 0
    tailed: int = 0  # entries the tailing reader delivered
    forced: int = -1  # the largest LAC a force returned

    @property
    def ok(self) -> bool:
        return self.violation is None


def client_config(scenario: Scenario) -> ClientConfig:
    """The clients' settings, on the simulation's time scale (ms)."""
    return sim_client_config(
        throttle=scenario.max_in_flight,
        delay_ensemble_change=scenario.delay_ensemble_change,
        explicit_lac_interval_s=0.05,
        reorder_read_sequence=scenario.reorder_read_sequence,
    )


class _Reader:
    """Reads the whole closed ledger once it is closed (retrying while faults last)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.entries: list[bytes] | None = None
        self.missing: list[int] = []


class Run(SimCluster):
    def __init__(
        self,
        seed: int,
        scenario: Scenario,
        bookie_faults: Callable[[BookieFaults], None] | None = None,
    ) -> None:
        self.seed = seed
        self.scenario = scenario
        rng = random.Random(seed)
        ensemble_size, write_quorum, ack_quorum = scenario.quorum
        super().__init__(
            rng,
            bookies=ensemble_size + scenario.spare_bookies,
            clients=CLIENTS,
            config=client_config(scenario),
            network=scenario.network,
            metadata_failure_probability=scenario.metadata_failure_probability,
            read_error_probability=scenario.read_error_probability,
            sync_failure_probability=scenario.sync_failure_probability,
            bookie_faults=bookie_faults,
        )
        ids = list(self.bookies)
        ensemble = (
            tuple(rng.sample(ids, ensemble_size))
            if scenario.initial_ensemble is None
            else tuple(ids[i] for i in scenario.initial_ensemble)
        )
        self.store.put(
            LedgerMetadata(
                ledger_id=LEDGER_ID,
                ensemble_size=ensemble_size,
                write_quorum_size=write_quorum,
                ack_quorum_size=ack_quorum,
                digest_type=DigestType.CRC32C,
                password=PASSWORD,
                ensembles=((0, ensemble),),
            )
        )
        self.acked: list[int] = []
        self.forced = -1  # the largest LAC a force returned (DEFERRED_SYNC)
        self.tailed: list[bytes] = []  # what the tailing reader delivered, in order
        self.tail_done = not scenario.tail
        self.writer_crashed = False
        self.writer: LedgerHandle | None = None
        self.recovered = False
        self.recovery_failures: list[str] = []
        self.readers = [_Reader("reader-0"), _Reader("reader-1")]
        self.lac_reads = 0
        self._checked: tuple[int, int, int] = (-1, -1, 0)  # metadata version, wipes, acks
        self._wiped: set[str] = set()  # bookies that lost their disk at least once

    async def _write(self) -> None:
        client = self.clients["writer"]
        metadata = self.store.metadata(LEDGER_ID)
        deferred = self.scenario.deferred_sync
        handle = LedgerHandle(client, metadata, PASSWORD, deferred_sync=deferred)
        self.writer = handle
        # An application with a window of adds in flight: each entry is added (and packaged,
        # with the LAC it carries) when a slot frees, as a throttled BookKeeper client does.
        window = asyncio.Semaphore(self.scenario.max_in_flight)
        futures = []
        for entry_id in range(self.scenario.entries):
            await window.acquire()
            try:
                future = handle.add_entry_async(payload_of(entry_id))
            except errors.BKError:
                break  # the writer failed (fenced): nothing more is taken
            future.add_done_callback(self._acknowledged)
            future.add_done_callback(lambda _future: window.release())
            futures.append(future)
            if deferred and (entry_id + 1) % self.scenario.force_every == 0:
                await self._force(handle)
        await asyncio.gather(*futures, return_exceptions=True)
        if deferred:
            await self._force(handle)
        if not self.writer_crashed:
            try:
                await handle.close()
            except errors.BKError:
                pass  # fenced, or failed: recovery closes it

    async def _force(self, handle: LedgerHandle) -> None:
        try:
            lac = await handle.force()
        except errors.BKError:
            return
        if not self.writer_crashed:
            self.forced = max(self.forced, lac)

    async def _tail(self) -> None:
        """Follows the ledger with long polls from entry 0 until it is closed, reopening after
        a failure; every entry it delivers must be in the closed ledger."""
        client = self.clients["tailer"]
        handle = ReadHandle(client, self.store.metadata(LEDGER_ID), PASSWORD)
        for _ in range(1000):
            try:
                async for entry in handle.follow(len(self.tailed), timeout_ms=50):
                    self.tailed.append(entry.data)
                    self._check_tail()
                self.tail_done = True
                self._maybe_done()
                return
            except errors.BKError:
                await asyncio.sleep(0.01)

    def _check_tail(self) -> None:
        entry_id = len(self.tailed) - 1
        if self.tailed[-1] != payload_of(entry_id):
            raise InvariantViolation(f"the tailing reader read wrong data for entry {entry_id}")
        metadata = self.store.metadata(LEDGER_ID)
        if metadata.is_closed and entry_id > metadata.last_entry_id:
            raise InvariantViolation(
                f"the tailing reader read entry {entry_id}, past the close at "
                f"{metadata.last_entry_id}"
            )

    def _acknowledged(self, future: asyncio.Future[int]) -> None:
        if self.writer_crashed or future.cancelled() or future.exception() is not None:
            return
        self.acked.append(future.result())

    def _crash_writer(self) -> None:
        self.writer_crashed = True
        self._crash_client("writer")

    async def _warm_up(self) -> None:
        with contextlib.suppress(errors.BKError):
            await self.clients["recovery"].open_ledger_no_recovery(LEDGER_ID, PASSWORD)

    async def _recover(self) -> None:
        client = self.clients["recovery"]
        for _ in range(1000):
            try:
                await client.open_ledger(LEDGER_ID, PASSWORD)
                self.recovered = True
                self._maybe_done()
                return
            except errors.BKError as error:
                self.recovery_failures.append(str(error))
                await asyncio.sleep(0.02)

    async def _read(self, reader: _Reader) -> None:
        client = self.clients[reader.name]
        for _ in range(10_000):
            try:
                metadata = await client.get_ledger_metadata(LEDGER_ID)
            except errors.BKError:
                await asyncio.sleep(0.01)
                continue
            if metadata.is_closed:
                break
            await asyncio.sleep(0.01)
        else:
            return
        handle = ReadHandle(client, metadata, PASSWORD)
        last = metadata.last_entry_id
        healed_attempts = 0
        while True:
            try:
                entries = await handle.read_entries(0, last) if last >= 0 else []
                reader.entries = [entry.data for entry in entries]
                break
            except errors.BKError:
                if self.loop.time() * 1000 >= self.scenario.fault_phase_ms:
                    healed_attempts += 1
                if healed_attempts >= 20:
                    reader.missing = await self._unreadable(handle, last)
                    reader.entries = []
                    break
                await asyncio.sleep(0.02)
        self._maybe_done()

    @staticmethod
    async def _unreadable(handle: ReadHandle, last: int) -> list[int]:
        missing = []
        for entry_id in range(last + 1):
            try:
                await handle.read_entry(entry_id)
            except errors.BKError:
                missing.append(entry_id)
        return missing

    async def _read_lac(self) -> None:
        """A LAC read without fencing; checks the guarantee of a covering read (BookKeeper
        issues 2273 / 2612): the answer is at least the LAC carried by every entry of the last
        fragment acknowledged before the read began."""
        client = self.clients["lac-reader"]
        try:
            metadata = await client.get_ledger_metadata(LEDGER_ID)
        except errors.BKError:
            return
        if metadata.is_closed:
            return
        first_of_last = metadata.last_ensemble[0]
        # One writer packages its entries in order with a LAC that only grows: the last
        # acknowledged entry of the last fragment carries the largest.
        last_acked = max(self.acked, default=-1)
        floor = self._carried_lac(metadata, last_acked) if last_acked >= first_of_last else -1
        handle = ReadHandle(client, metadata, PASSWORD)
        try:
            lac = await handle.read_last_add_confirmed()
        except errors.BKError:
            return  # not enough bookies answered: no answer, not a wrong one
        self.lac_reads += 1
        if lac < floor:
            raise InvariantViolation(
                f"a LAC read answered {lac}, but an entry of the last fragment acknowledged "
                f"before it began carried LAC {floor}"
            )

    def _carried_lac(self, metadata: LedgerMetadata, entry_id: int) -> int:
        """The LAC the writer packaged into ``entry_id`` (read from a stored copy)."""
        for bookie_id in self._write_set_of(metadata, entry_id):
            body = self.bookies[bookie_id].stored_entry(LEDGER_ID, entry_id)
            if body is not None:
                return int(_LAC.unpack_from(body, 16)[0])
        return -1

    def _maybe_done(self) -> None:
        if self.finished() and not self._done.done():
            self._done.set_result(None)

    # -- the schedule --------------------------------------------------------------------------

    def _schedule(self) -> None:
        scenario = self.scenario
        ids = list(self.bookies)
        self._at(0, lambda: self._start("writer", self._write()))
        for at, index, downtime in scenario.crashes:
            bookie = self.bookies[ids[index]]
            self._at(at, bookie.crash)
            if downtime is None:
                self._lost.add(bookie.bookie_id)
            else:
                self._at(min(at + downtime, scenario.fault_phase_ms), self._restart(bookie))
        for at, index, downtime in scenario.wipes:
            bookie = self.bookies[ids[index]]
            self._at(at, self._wipe(bookie))
            self._at(min(at + downtime, scenario.fault_phase_ms), self._restart(bookie))
        cuts = [
            (at, [self.bookies[ids[i]].name for i in side], ["writer", "recovery"], duration)
            for at, side, duration in scenario.partitions
        ]
        for at, side_nodes, other_nodes, duration in cuts + scenario.cuts:
            self._at(at, self._partition(side_nodes, other_nodes))
            self._at(min(at + duration, scenario.fault_phase_ms), self.network.heal)
        for source, destination, extra in scenario.slow_links:
            self.network.slow_down(source, destination, extra)
        for at, source, destination in scenario.lost_sends:
            self._at(at, self._lose_next(source, destination))
        if scenario.writer_crash_at is not None:
            self._at(scenario.writer_crash_at, self._crash_writer)
        if scenario.recovery_warm_up_at is not None:
            self._at(scenario.recovery_warm_up_at, lambda: self._start("recovery", self._warm_up()))
        self._at(scenario.recovery_at, lambda: self._start("recovery", self._recover()))
        for at in scenario.lac_reads:
            self._at(at, lambda: self._start("lac-reader", self._read_lac()))
        self._at(scenario.fault_phase_ms, self._heal)
        for reader in self.readers:
            self._at(0, self._reader_starter(reader))
        if scenario.tail:
            self._at(0, lambda: self._start("tailer", self._tail()))

    def _reader_starter(self, reader: _Reader) -> Callable[[], object]:
        return lambda: self._start(reader.name, self._read(reader))

    def _lose_next(self, source: str, destination: str) -> Callable[[], None]:
        return lambda: self.network.lose_next.add((source, destination))

    def _wipe(self, bookie: SimBookie) -> Callable[[], None]:
        def wipe() -> None:
            self._wiped.add(bookie.bookie_id)
            bookie.wipe()

        return wipe

    def _heal(self) -> None:
        self._heal_faults(self.scenario.network.max_delay_ms)

    # -- invariants ----------------------------------------------------------------------------

    def check(self) -> None:
        if self.violation is not None:
            raise InvariantViolation(self.violation)
        metadata, version = self.store.ledgers[LEDGER_ID]
        acked = self.acked
        # Copies of an acknowledged entry only go with a lost disk, and write sets only with a
        # metadata change: all acknowledged entries are checked again after either, new ones
        # as they come.
        wipes = sum(b.disk.wipes for b in self.bookies.values())
        state = (version, wipes)
        if state == self._checked[:2] and len(acked) == self._checked[2]:
            return
        start = self._checked[2] if state == self._checked[:2] else 0
        self._checked = (version, wipes, len(self._promised(acked)))
        qa = metadata.ack_quorum_size
        promised = self._promised(acked)
        for entry_id in promised[start:]:
            holders = self._write_set_of(metadata, entry_id)
            copies = sum(1 for b in holders if self.bookies[b].holds_durably(LEDGER_ID, entry_id))
            # A lost disk may take a copy with it: Qa copies while no disk was lost, and at
            # least one while fewer than Qa of the write set lost theirs.
            needed = qa - sum(1 for b in holders if b in self._wiped)
            if copies < needed:
                raise InvariantViolation(
                    f"entry {entry_id} was acknowledged"
                    + (" and forced" if self.scenario.deferred_sync else "")
                    + f" but is durable on {copies} bookies of its "
                    f"write set {holders} (Qa={qa}, lost disks: {sorted(self._wiped)})"
                )
        if metadata.is_closed and promised and max(promised) > metadata.last_entry_id:
            raise InvariantViolation(
                f"the ledger is closed at entry {metadata.last_entry_id} but entry "
                f"{max(promised)} was acknowledged to the writer"
                + (" and forced" if self.scenario.deferred_sync else "")
            )
        if metadata.is_closed and len(self.tailed) - 1 > metadata.last_entry_id:
            raise InvariantViolation(
                f"the tailing reader read entry {len(self.tailed) - 1}, past the close at "
                f"{metadata.last_entry_id}"
            )
        if metadata.is_closed and metadata.last_entry_id < metadata.last_ensemble[0] - 1:
            raise InvariantViolation(
                f"the ledger is closed at entry {metadata.last_entry_id}, before its last "
                f"fragment (from entry {metadata.last_ensemble[0]}): invalid metadata"
            )

    def _promised(self, acked: list[int]) -> list[int]:
        """The acknowledged entries promised durable: all of them, or with DEFERRED_SYNC those
        a force confirmed."""
        if not self.scenario.deferred_sync:
            return acked
        return [entry_id for entry_id in acked if entry_id <= self.forced]

    def _write_set_of(self, metadata: LedgerMetadata, entry_id: int) -> list[str]:
        return write_set_of(metadata, entry_id)

    def _lost_by_disks(self, metadata: LedgerMetadata, entry_id: int) -> bool:
        """No bookie of the entry's write set holds it, and one of them lost its disk."""
        holders = self._write_set_of(metadata, entry_id)
        return any(b in self._wiped for b in holders) and not any(
            self.bookies[b].holds_durably(LEDGER_ID, entry_id) for b in holders
        )

    def finished(self) -> bool:
        return (
            self.recovered and self.tail_done and all(r.entries is not None for r in self.readers)
        )

    def final_check(self) -> None:
        metadata = self.store.metadata(LEDGER_ID)
        if not self.finished():
            raise InvariantViolation(
                f"not finished after healing: recovered={self.recovered} "
                f"(failures: {self.recovery_failures[-3:]}), metadata state {metadata.state}, "
                f"readers {[r.entries is not None for r in self.readers]}, "
                f"tailer done={self.tail_done}"
            )
        expected = [payload_of(i) for i in range(metadata.last_entry_id + 1)]
        for reader in self.readers:
            if reader.missing and self._lost_by_disks(metadata, reader.missing[0]):
                # Lost with the disks: the readers can only agree on what came before.
                expected = expected[: reader.missing[0]]
                reader.entries = expected
            elif reader.missing:
                raise InvariantViolation(
                    f"{reader.name} could not read entry {reader.missing[0]} of the closed ledger"
                )
            if reader.entries != expected:
                raise InvariantViolation(
                    f"{reader.name} read {len(reader.entries or [])} entries, not the "
                    f"{len(expected)} the writer wrote up to the close"
                )
        if self.scenario.tail and self.tailed != expected:
            raise InvariantViolation(
                f"the tailing reader read {len(self.tailed)} entries, not the {len(expected)} "
                "of the closed ledger"
            )

    # -- the run -------------------------------------------------------------------------------

    async def _main(self) -> None:
        self._schedule()
        try:
            await asyncio.wait_for(asyncio.shield(self._done), MAX_TIME_MS / 1000)
        except TimeoutError:
            pass

    def run(self) -> RunResult:
        violation = self._run_checked(self._main(), self.final_check)
        loop = self.loop
        metadata = self.store.metadata(LEDGER_ID)
        return RunResult(
            seed=self.seed,
            scenario=self.scenario,
            violation=violation,
            steps=loop.iterations,
            virtual_ms=loop.time() * 1000,
            acked=len(self.acked),
            last_entry_id=metadata.last_entry_id if metadata.is_closed else None,
            ensemble_changes=self.writer.ensemble_changes if self.writer else 0,
            recovery_attempts=len(self.recovery_failures) + int(self.recovered),
            lac_reads=self.lac_reads,
            tailed=len(self.tailed),
            forced=self.forced,
        )

    def _after_iteration(self) -> None:
        self.check()
        if self.loop.iterations >= MAX_ITERATIONS:
            raise InvariantViolation(f"not finished after {MAX_ITERATIONS} loop iterations")


def run_scenario(
    seed: int,
    scenario: Scenario,
    bookie_faults: Callable[[BookieFaults], None] | None = None,
) -> RunResult:
    return Run(seed, scenario, bookie_faults).run()


def run_seed(seed: int, quorum: tuple[int, int, int] | None = None) -> RunResult:
    """The run of ``seed``: the quorum cycles through ``QUORUMS`` unless given."""
    rng = random.Random(seed)
    scenario = random_scenario(rng, quorum or QUORUMS[seed % len(QUORUMS)])
    return Run(seed, scenario).run()
