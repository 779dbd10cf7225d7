"""The known protocol bugs of Apache BookKeeper (reference section 3.5) as simulations: each
scenario runs a range of seeds with the bug put back (a variant of the recovery machine or of
the bookie model, defined here) and finds a violated invariant, then runs the same seeds with our
code and finds none. A failure names the seed; ``Run``/``run_scenario`` replays it."""

from __future__ import annotations

import random
from collections.abc import Callable

from bookkeeper.core.lac import ReadRequest
from bookkeeper.core.recovery import Instruction, LedgerRecovery
from bookkeeper.testing.sim.actors import BookieFaults
from bookkeeper.testing.sim.network import NetworkFaults
from bookkeeper.testing.sim.run import LEDGER_ID, RunResult, Scenario, run_scenario
from bookkeeper.wire.status import StatusCode

SEEDS = range(60)


class UnfencedRecoveryReads(LedgerRecovery):
    """Recovery as before the #2614 fix: only the LAC reads fence; reading forward does not."""

    def _reads_for(self, entry_id: int) -> list[Instruction]:
        return [
            ReadRequest(r.bookie_index, r.bookie, r.entry_id, fence=False)
            for r in super()._reads_for(entry_id)
            if isinstance(r, ReadRequest)
        ]


def sweep(
    make_scenario: Callable[[random.Random], Scenario],
    recovery: type[LedgerRecovery] = LedgerRecovery,
    bookie_faults: Callable[[BookieFaults], None] | None = None,
) -> list[RunResult]:
    results = []
    for seed in SEEDS:
        scenario = make_scenario(random.Random(seed))
        results.append(
            run_scenario(seed, scenario, lambda: recovery(LEDGER_ID, read_window=4), bookie_faults)
        )
    return results


def violations(results: list[RunResult]) -> list[str]:
    return [f"seed {r.seed}: {r.violation}" for r in results if not r.ok]


# -- 2614: recovery reads must fence ---------------------------------------------------------


def lost_fence(rng: random.Random) -> Scenario:
    """E=3 Qw=2 Qa=2, a live writer whose adds reach bookie-2 late, and the recovering client's
    fencing LAC read to bookie-2 lost: bookie-0 and bookie-1 cover the ensemble, bookie-2 stays
    unfenced; a recovery read then finds bookie-2 without an entry that the writer's late add
    will still get acknowledged there."""
    at = rng.uniform(20, 60)
    return Scenario(
        quorum=(3, 2, 2),
        entries=80,
        spare_bookies=0,
        network=NetworkFaults(0.1, 1.0),
        slow_links=[("writer", "bookie-2", rng.uniform(5, 20))],
        cuts=[(at, ["recovery"], ["bookie-2"], rng.uniform(1, 4))],
        recovery_at=at,
        max_in_flight=20,
    )


def test_2614_recovery_reads_without_fencing_lose_an_acknowledged_entry() -> None:
    buggy = violations(sweep(lost_fence, UnfencedRecoveryReads))
    assert buggy and all("was acknowledged to the writer" in v for v in buggy), buggy
    assert violations(sweep(lost_fence)) == []


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
