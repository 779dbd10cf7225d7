"""The known protocol bugs of Apache BookKeeper (reference section 3.5) as simulations of the
real client and bookie code: each scenario runs a range of seeds with the bug put back (a
variant of a ``core`` machine patched into the client, or of the bookie model, defined here) and
finds a violated invariant, then runs the same seeds with our code and finds none. A failure
names the seed; ``run_scenario`` replays it."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from bookkeeper_py.client import ledger as client_ledger
from bookkeeper_py.client import recovery as client_recovery
from bookkeeper_py.core.lac import NEGATIVE_ANSWERS, LastConfirmed, LastConfirmedRead, ReadRequest
from bookkeeper_py.core.recovery import Instruction, LedgerRecovery
from bookkeeper_py.server.bookie import Bookie
from bookkeeper_py.testing.sim.bookie import BookieFaults
from bookkeeper_py.testing.sim.network import NetworkFaults
from bookkeeper_py.testing.sim.run import (
    FAULT_PHASE_MS,
    RunResult,
    Scenario,
    run_scenario,
    run_seed,
)
from bookkeeper_py.wire.digest import Entry
from bookkeeper_py.wire.status import StatusCode

SEEDS = range(60)


class UnfencedRecoveryReads(LedgerRecovery):
    """Recovery as before the #2614 fix: only the LAC reads fence; reading forward does not."""

    def _reads_for(self, entry_id: int) -> list[Instruction]:
        return [
            ReadRequest(r.bookie_index, r.bookie, r.entry_id, fence=False)
            for r in super()._reads_for(entry_id)
            if isinstance(r, ReadRequest)
        ]


class NoLacFloor(LedgerRecovery):
    """Recovery as before the #2615 fix: it starts right after the LAC the last ensemble
    reports, even when that is below the start of the last fragment."""

    def _start_after(self, lac: int) -> int:
        return lac


class ErrorsCountTowardsCoverage(LastConfirmedRead):
    """The LAC read's coverage as before BookKeeper's fix of #2273 / #2612 (PR 2333): a bookie
    that answered with an error counted as heard from."""

    def on_answer(
        self, index: int, status: StatusCode | None, entry: Entry | None, problem: str = ""
    ) -> LastConfirmed | None:
        errored = status is None or status not in (*NEGATIVE_ANSWERS, StatusCode.EOK)
        if errored and status != StatusCode.EUA and not self.done and index not in self._answered:
            self._coverage.add_known(index)
        return super().on_answer(index, status, entry, problem)


def sweep(
    make_scenario: Callable[[random.Random], Scenario],
    bookie_faults: Callable[[BookieFaults], None] | None = None,
) -> list[RunResult]:
    return [run_scenario(seed, make_scenario(random.Random(seed)), bookie_faults) for seed in SEEDS]


def violations(results: list[RunResult]) -> list[str]:
    return [f"seed {r.seed}: {r.violation}" for r in results if not r.ok]


# -- 2614: recovery reads must fence ---------------------------------------------------------


RECOVERY_FAR = (("recovery", "bookie-0"), ("recovery", "bookie-1"))


def lost_fence(rng: random.Random) -> Scenario:
    """E=3 Qw=2 Qa=2, a live writer whose adds reach bookie-2 late, and the recovering client's
    fencing LAC read to bookie-2 lost with its connection (the client, warmed up by an earlier
    read, had one open): bookie-0 and bookie-1 cover the ensemble, bookie-2 stays unfenced; a
    recovery read over a new connection then finds bookie-2 without an entry (its "no" arriving
    before the other replica's "yes": the client is far from bookie-0 and bookie-1) that the
    writer's late add will still get acknowledged there."""
    at = rng.uniform(20, 60)
    return Scenario(
        quorum=(3, 2, 2),
        entries=80,
        spare_bookies=0,
        network=NetworkFaults(0.1, 1.0),
        slow_links=[
            ("writer", "bookie-2", rng.uniform(5, 20)),
            # the recovering client is far from bookie-0 and bookie-1: bookie-2's answers,
            # over a new connection, still come first
            *((a, b, rng.uniform(2, 6)) for pair in RECOVERY_FAR for a, b in (pair, pair[::-1])),
        ],
        lost_sends=[(at, "recovery", "bookie-2")],
        recovery_warm_up_at=at - 10,
        recovery_at=at,
        max_in_flight=20,
    )


def test_2614_recovery_reads_without_fencing_lose_an_acknowledged_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert violations(sweep(lost_fence)) == []
    monkeypatch.setattr(client_recovery, "LedgerRecovery", UnfencedRecoveryReads)
    buggy = violations(sweep(lost_fence))
    assert buggy and all("was acknowledged to the writer" in v for v in buggy), buggy


# -- 2908: an I/O error is not an absence ------------------------------------------------------


def flaky_reads(rng: random.Random) -> Scenario:
    """E=3 Qw=3 Qa=2, reads failing with I/O errors a third of the time while a recovery runs
    after the writer crashed."""
    crash = rng.uniform(20, 80)
    return Scenario(
        quorum=(3, 3, 2),
        entries=60,
        network=NetworkFaults(0.1, 2.0),
        read_error_probability=0.3,
        writer_crash_at=crash,
        recovery_at=crash + rng.uniform(1, 20),
        max_in_flight=10,
    )


def answer_no_entry(faults: BookieFaults) -> None:
    faults.read_error_status = StatusCode.ENOENTRY


def test_2908_an_io_error_read_as_no_such_entry_truncates_the_ledger() -> None:
    buggy = violations(sweep(flaky_reads, bookie_faults=answer_no_entry))
    assert buggy and all("acknowledged" in v or "read" in v for v in buggy), buggy
    assert violations(sweep(flaky_reads)) == []


# -- 2615: recovery starts no earlier than the last fragment --------------------------------------


def empty_last_ensemble(rng: random.Random) -> Scenario:
    """E=3 Qw=2 Qa=2 on bookies 0-2, spares 3 and 4 unreachable from the writer. Bookie 0 loses
    its disk and bookies 1 and 2 go down for a while: the writer moves its ensemble onto the
    spares from LAC+1 and dies before any entry reaches them. The last ensemble knows nothing
    of the ledger (its LAC read says -1); the entries before it are in the first fragment, where
    bookie 0 now answers "no such entry"."""
    at = rng.uniform(20, 40)
    return Scenario(
        quorum=(3, 2, 2),
        entries=2000,
        spare_bookies=2,
        initial_ensemble=[0, 1, 2],
        network=NetworkFaults(0.1, 1.0),
        wipes=[(at, 0, rng.uniform(2, 10))],
        crashes=[(at, 1, 250.0), (at, 2, 250.0)],
        cuts=[(0, ["writer"], ["bookie-3", "bookie-4"], FAULT_PHASE_MS)],
        # after its ensemble change (the add timeout, then a change at once), before the heal
        writer_crash_at=at + rng.uniform(60, 100),
        recovery_at=at + 200,
        max_in_flight=10,
    )


def test_2615_recovery_reading_before_an_empty_last_ensemble_truncates_the_ledger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(client_recovery, "LedgerRecovery", NoLacFloor)
        buggy = violations(sweep(empty_last_ensemble))
    assert len(buggy) >= len(SEEDS) // 2, buggy
    assert all("the ledger is closed at entry" in v and "acknowledged" in v for v in buggy)
    ours = sweep(empty_last_ensemble)
    assert violations(ours) == []
    # The scenario did what it says: ensemble changes, and a close at the acknowledged end.
    assert sum(r.ensemble_changes > 0 for r in ours) >= len(SEEDS) // 2
    assert all(r.last_entry_id is not None and r.last_entry_id >= r.acked - 1 for r in ours)


# -- coverage: an error is not an answer (Qw > Qa, E > Qw) ----------------------------------------


def failing_lac_reads(rng: random.Random) -> Scenario:
    """E=5 Qw=3 Qa=2, a live writer, LAC reads every ms while bookies fail 30 % of reads."""
    at = rng.uniform(5, 20)
    return Scenario(
        quorum=(5, 3, 2),
        entries=400,
        spare_bookies=0,
        network=NetworkFaults(0.1, 1.0),
        read_error_probability=0.3,
        lac_reads=[at + 1 * i for i in range(60)],
        recovery_at=at + 61,  # after the LAC reads; the writer closes the ledger itself
        fault_phase_ms=at + 61,  # then the reads stop failing
        max_in_flight=10,
    )


def test_coverage_counting_errors_lets_a_lac_read_miss_acknowledged_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert violations(sweep(failing_lac_reads)) == []
    monkeypatch.setattr(client_ledger, "LastConfirmedRead", ErrorsCountTowardsCoverage)
    buggy = violations(sweep(failing_lac_reads))
    assert len(buggy) >= len(SEEDS) // 4, buggy
    assert all("a LAC read answered" in v for v in buggy), buggy


# -- the simulated bookies are the real request handling -------------------------------------------


def test_a_bookie_that_takes_adds_on_fenced_ledgers_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``server.bookie.Bookie`` with its fence check taken out (every add treated as a recovery
    add): the random sweep finds fenced writers still getting acks past the close."""
    monkeypatch.setattr(Bookie, "_fenced_for", staticmethod(lambda info, recovery: False))
    buggy = [r for r in (run_seed(seed) for seed in range(400)) if not r.ok]
    assert buggy and all("acknowledged" in (r.violation or "") for r in buggy), buggy[:3]
