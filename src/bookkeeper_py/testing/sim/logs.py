"""Seeded runs of logs built from ledgers on the simulated cluster: the real ``LogWriter`` and
``LogReader`` over the simulated network and metadata store, in virtual time.

A run: two writers that both think they lead the same log (the second opens at a random
moment, often while the first is appending and rolling; a fenced writer opens again, up to a
bound, as a leader that lost and won an election would), the first writer may crash (in the
middle of an open, an append or a roll), bookies crash and restart, the network delays, resets
and partitions, the store fails calls and answers CAS conflicts; two readers tail the log from
its start, reopening after their position when a read fails. Once the fault phase ends
everything heals, the second writer ends the stream, and the readers read to its end.

Invariants:

* **Segment lists only grow**: no write of a log's value drops a ledger that was not
  truncated, ledger ids increase along the list, and at most two segments are open.
* **One writer after a fence**: every record acknowledged to a writer is in the log at the
  position it was acknowledged with; a writer's records acknowledged after another writer
  opened the log come before that writer's first record.
* **Readers get every acknowledged record exactly once and in order**: each reader's records
  are the log's, in position order, without gaps or repeats.
* **Numbers increase**: sequence numbers are 0, 1, 2... across segments; transaction ids
  strictly increase.
* **Liveness once healed**: the last writer ends the stream and the readers reach its end.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass, field

from bookkeeper_py import errors
from bookkeeper_py.client.config import ClientConfig
from bookkeeper_py.log.format import (
    EndOfStreamError,
    LogConfig,
    LogRecord,
    Position,
    SegmentState,
    decode_log,
)
from bookkeeper_py.log.namespace import LogNamespace
from bookkeeper_py.log.reader import LogReader
from bookkeeper_py.log.writer import LogWriter
from bookkeeper_py.testing.sim.cluster import SimCluster, sim_client_config
from bookkeeper_py.testing.sim.metadata import InvariantViolation
from bookkeeper_py.testing.sim.network import NetworkFaults

WRITERS = ("writer-a", "writer-b")
READERS = ("reader-0", "reader-1")
LOG = "log"
FAULT_PHASE_MS = 600.0
MAX_TIME_MS = 60_000.0
MAX_ITERATIONS = 3_000_000
REOPENS = 3  # a fenced writer takes the log back at most this many times


@dataclass
class LogScenario:
    quorum: tuple[int, int, int] = (3, 2, 2)
    records: int = 60  # each writer's
    roll_records: int = 15
    batch_bytes: int = 200  # a few records per entry
    network: NetworkFaults = field(default_factory=NetworkFaults)
    metadata_failure_probability: float = 0.0
    lost_answer_probability: float = 0.0  # a log write applied, its answer lost
    crashes: list[tuple[float, int, float]] = field(default_factory=list)  # at, bookie, downtime
    partitions: list[tuple[float, list[int], float]] = field(default_factory=list)
    writer_a_crash_at: float | None = None
    writer_b_at: float = 100.0
    append_pause_ms: float = 2.0  # between a writer's appends
    fault_phase_ms: float = FAULT_PHASE_MS


def random_log_scenario(rng: random.Random) -> LogScenario:
    quorum = rng.choice(((3, 3, 2), (3, 2, 2), (4, 3, 2)))
    bookies = quorum[0] + 1
    scenario = LogScenario(
        quorum=quorum,
        records=rng.randint(20, 80),
        roll_records=rng.randint(5, 30),
        batch_bytes=rng.choice((64, 200, 1000)),
        network=NetworkFaults(
            min_delay_ms=0.1,
            max_delay_ms=rng.uniform(1.0, 8.0),
            reset_probability=rng.choice([0.0, 0.0, 0.005, 0.02]),
        ),
        metadata_failure_probability=rng.choice([0.0, 0.0, 0.05]),
        lost_answer_probability=rng.choice([0.0, 0.0, 0.05]),
        writer_a_crash_at=rng.uniform(0, 300) if rng.random() < 0.4 else None,
        writer_b_at=rng.uniform(0, 400),
        append_pause_ms=rng.uniform(0.2, 4.0),
    )
    for _ in range(rng.randint(0, 2)):
        scenario.crashes.append((rng.uniform(0, 400), rng.randrange(bookies), rng.uniform(5, 150)))
    if rng.random() < 0.3:
        side = rng.sample(range(bookies), 1)
        scenario.partitions.append((rng.uniform(0, 300), side, rng.uniform(20, 150)))
    return scenario


@dataclass
class LogRunResult:
    seed: int
    scenario: LogScenario
    violation: str | None
    steps: int
    virtual_ms: float
    acked: int
    records: int  # in the log at the end
    segments: int
    opens: int  # writer opens that succeeded

    @property
    def ok(self) -> bool:
        return self.violation is None


def log_client_config() -> ClientConfig:
    return sim_client_config(throttle=50)


class LogRun(SimCluster):
    def __init__(self, seed: int, scenario: LogScenario) -> None:
        self.seed = seed
        self.scenario = scenario
        super().__init__(
            random.Random(seed),
            bookies=scenario.quorum[0] + 1,
            clients=(*WRITERS, *READERS, "checker"),
            config=log_client_config(),
            network=scenario.network,
            metadata_failure_probability=scenario.metadata_failure_probability,
        )
        self.namespaces = {
            name: LogNamespace(client, "sim") for name, client in self.clients.items()
        }
        self.store.on_node_write = self._check_segments
        self.store.faults.lost_answer_probability = scenario.lost_answer_probability
        self.log_ended = False  # a writer found the log ended
        # (writer, index) -> position acknowledged; and when each writer's opens finished
        self.acked: dict[tuple[str, int], Position] = {}
        self.opened: list[tuple[str, int]] = []  # (writer, its first ledger) of every open
        self.read: dict[str, list[LogRecord]] = {r: [] for r in READERS}
        self.readers_done: set[str] = set()
        self.ended = False
        self.crashed_a = False
        self.opens = 0
        self.final: list[LogRecord] = []

    # -- invariants on every write of the log's value ------------------------------------------

    def _check_segments(self, path: str, old: bytes | None, new: bytes) -> None:
        if not path.endswith(f"/sim/{LOG}"):
            return
        after = decode_log(new, path)
        ledgers = [s.ledger_id for s in after.segments]
        if ledgers != sorted(set(ledgers)):
            raise InvariantViolation(f"the segment list's ledger ids do not increase: {ledgers}")
        if sum(1 for s in after.segments if s.is_open) > 2:
            raise InvariantViolation(f"more than two open segments: {after.segments}")
        if old is None:
            return
        before = decode_log(old, path)
        kept = set(ledgers)
        for segment in before.segments:
            if segment.state != SegmentState.TRUNCATED and segment.ledger_id not in kept:
                raise InvariantViolation(
                    f"a write of the log dropped ledger {segment.ledger_id}, never truncated"
                )

    # -- the writers ---------------------------------------------------------------------------

    async def _open(self, name: str) -> LogWriter | None:
        namespace = self.namespaces[name]
        for _ in range(1000):
            try:
                writer = await namespace.open_writer(LOG, batch_bytes=self.scenario.batch_bytes)
            except EndOfStreamError:
                self.log_ended = True
                return None
            except (errors.BKError, OSError):
                await asyncio.sleep(0.01)
                continue
            self.opens += 1
            self.opened.append((name, writer.ledger_id))
            return writer
        return None

    async def _write(self, name: str) -> None:
        pending: list[asyncio.Future[Position]] = []
        try:
            await self._append_all(name, pending)
        finally:  # what was not acknowledged failed; nobody else asks
            await asyncio.gather(*pending, return_exceptions=True)

    async def _append_all(self, name: str, pending: list[asyncio.Future[Position]]) -> None:
        writer = await self._open(name)
        reopens = 0
        index = 0
        while writer is not None and index < self.scenario.records:
            try:
                appended = writer.append(f"{name}-{index}".encode())
            except errors.BKError:
                appended = None
            if appended is not None:
                session = max(i for i, (who, _) in enumerate(self.opened) if who == name)
                pending.append(asyncio.ensure_future(self._ack(name, index, appended, session)))
                index += 1
                await asyncio.sleep(self.scenario.append_pause_ms / 1000)
                continue
            # fenced, or failed: a leader that lost takes the log back (writer-a a bounded
            # number of times; writer-b, which ends the stream, until it can)
            if name == "writer-a" and (reopens >= REOPENS or self.crashed_a):
                return
            reopens += 1
            writer = await self._open(name)
        if writer is None:
            return
        await asyncio.gather(*pending, return_exceptions=True)
        if name == "writer-b":
            await self._end(writer)
        else:
            try:
                await writer.close()
            except errors.BKError:
                pass

    async def _ack(self, name: str, index: int, appended: object, session: int) -> Position:
        """Notes an acknowledgement to the writer whose open was ``opened[session]``."""
        position: Position = await appended  # type: ignore[misc]
        if name == "writer-a" and self.crashed_a:
            return position  # a dead process learns of nothing
        self.acked[(name, index)] = position
        for other, first_ledger in self.opened[session + 1 :]:  # the opens that fenced it
            if other != name and position.ledger_id >= first_ledger:
                self._violated(
                    f"{name} got an acknowledgement at {position} after {other} had opened the "
                    f"log and begun ledger {first_ledger}"
                )
        return position

    async def _end(self, writer: LogWriter) -> None:
        """The last writer ends the stream (after the faults, taking the log back if it lost
        it), so that the readers can finish."""
        await asyncio.sleep(max(0.0, self.scenario.fault_phase_ms / 1000 - self.loop.time()))
        for _ in range(1000):
            try:
                await writer.mark_end_of_stream()
                self.ended = True
                self._maybe_done()
                return
            except (errors.BKError, OSError):
                await asyncio.sleep(0.01)
                reopened = await self._open("writer-b")
                if reopened is None:
                    # ended by the call whose answer was lost
                    self.ended = self.log_ended
                    self._maybe_done()
                    return
                writer = reopened

    # -- the readers ---------------------------------------------------------------------------

    async def _tail(self, name: str) -> None:
        namespace = self.namespaces[name]
        records = self.read[name]
        for _ in range(10_000):
            start: Position | str = "earliest"
            if records:
                last = records[-1]
                start = Position(last.ledger_id, last.entry_id, last.slot + 1)
            try:
                reader = await namespace.open_reader(LOG, start, poll_timeout_ms=50)  # type: ignore[arg-type]
                try:
                    while True:
                        batch = await reader.read_batch()
                        if not batch:
                            self.readers_done.add(name)
                            self._maybe_done()
                            return
                        records.extend(batch)
                finally:
                    await reader.close()
            except (errors.BKError, OSError):
                await asyncio.sleep(0.01)

    def _maybe_done(self) -> None:
        if self.readers_done == set(READERS) and self.ended and not self._done.done():
            self._done.set_result(None)

    # -- the schedule --------------------------------------------------------------------------

    async def _create(self) -> None:
        namespace = self.namespaces["checker"]
        config = LogConfig(*self.scenario.quorum, roll_records=self.scenario.roll_records)
        for _ in range(1000):
            try:
                await namespace.create_log(LOG, config)
                break
            except (errors.BKError, OSError):
                if await self._exists(namespace):
                    break
                await asyncio.sleep(0.005)
        self._start("writer-a", self._write("writer-a"))
        self._at(
            self.scenario.writer_b_at, lambda: self._start("writer-b", self._write("writer-b"))
        )
        for reader in READERS:
            self._start(reader, self._tail(reader))

    @staticmethod
    async def _exists(namespace: LogNamespace) -> bool:
        try:
            await namespace.read_log(LOG)
            return True
        except (errors.BKError, OSError):
            return False

    def _schedule(self) -> None:
        scenario = self.scenario
        ids = list(self.bookies)
        self._at(0, lambda: self._start("checker", self._create()))
        for at, index, downtime in scenario.crashes:
            bookie = self.bookies[ids[index]]
            self._at(at, bookie.crash)
            self._at(min(at + downtime, scenario.fault_phase_ms), self._restart(bookie))
        for at, side, duration in scenario.partitions:
            nodes = [self.bookies[ids[i]].name for i in side]
            self._at(at, self._partition(nodes, list(WRITERS)))
            self._at(min(at + duration, scenario.fault_phase_ms), self.network.heal)
        if scenario.writer_a_crash_at is not None:
            self._at(scenario.writer_a_crash_at, self._crash_a)
        self._at(scenario.fault_phase_ms, lambda: self._heal_faults(scenario.network.max_delay_ms))

    def _crash_a(self) -> None:
        self.crashed_a = True
        self._crash_client("writer-a")

    # -- the end -------------------------------------------------------------------------------

    async def _read_final(self) -> None:
        reader = await LogReader.open(self.namespaces["checker"], LOG, follow=False)
        try:
            while batch := await reader.read_batch():
                self.final.extend(batch)
        finally:
            await reader.close()

    def final_check(self) -> None:
        if not (self.ended and self.readers_done == set(READERS)):
            raise InvariantViolation(
                f"not finished after healing: ended={self.ended}, readers done "
                f"{sorted(self.readers_done)}"
            )
        final = self.final
        positions = [r.position for r in final]
        if positions != sorted(set(positions)):
            raise InvariantViolation("the log's records are not in strictly increasing positions")
        if [r.sequence for r in final] != list(range(len(final))):
            raise InvariantViolation("sequence numbers are not 0, 1, 2... across the log")
        txids = [r.txid for r in final]
        if any(b <= a for a, b in itertools.pairwise(txids)):
            raise InvariantViolation("transaction ids do not strictly increase")
        at = {r.position: r.data for r in final}
        for (name, index), position in self.acked.items():
            if at.get(position) != f"{name}-{index}".encode():
                raise InvariantViolation(
                    f"{name}'s record {index} was acknowledged at {position}, but the log holds "
                    f"{at.get(position)!r} there"
                )
        for name, records in self.read.items():
            if [r.position for r in records] != positions or [r.data for r in records] != [
                r.data for r in final
            ]:
                raise InvariantViolation(
                    f"{name} read {len(records)} records, not exactly the log's {len(final)} in "
                    "order"
                )

    async def _main(self) -> None:
        self._schedule()
        try:
            await asyncio.wait_for(asyncio.shield(self._done), MAX_TIME_MS / 1000)
        except TimeoutError:
            return
        if self.violation is None:
            await self._read_final()

    def run(self) -> LogRunResult:
        violation = self._run_checked(self._main(), self.final_check)
        loop = self.loop
        metadata = self.store.nodes.get(f"/ledgers-logs/sim/{LOG}")
        segments = len(decode_log(metadata[0]).segments) if metadata else 0
        return LogRunResult(
            self.seed,
            self.scenario,
            violation,
            loop.iterations,
            loop.time() * 1000,
            len(self.acked),
            len(self.final),
            segments,
            self.opens,
        )

    def _after_iteration(self) -> None:
        if self.violation is not None:
            raise InvariantViolation(self.violation)
        if self.loop.iterations >= MAX_ITERATIONS:
            raise InvariantViolation(f"not finished after {MAX_ITERATIONS} loop iterations")


def run_log_seed(seed: int) -> LogRunResult:
    return LogRun(seed, random_log_scenario(random.Random(seed))).run()
