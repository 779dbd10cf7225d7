"""Scenarios the simulator could not express while it had executors of its own: a reader
tailing the ledger with long polls across a writer crash, and DEFERRED_SYNC writers whose
bookies crash before a force. Each runs a range of seeds over the real client and bookie code
and finds no violated invariant; the DEFERRED_SYNC one also finds the violation when a bookie
answers a force before its sync. A failure names the seed; ``run_scenario`` replays it."""

from __future__ import annotations

import random

from bookkeeper_py.testing.sim.bookie import BookieFaults
from bookkeeper_py.testing.sim.network import NetworkFaults
from bookkeeper_py.testing.sim.run import QUORUMS, RunResult, Scenario, run_scenario

SEEDS = range(40)


def sweep(make_scenario, bookie_faults=None) -> list[RunResult]:  # type: ignore[no-untyped-def]
    return [run_scenario(seed, make_scenario(random.Random(seed)), bookie_faults) for seed in SEEDS]


def violations(results: list[RunResult]) -> list[str]:
    return [f"seed {r.seed}: {r.violation}" for r in results if not r.ok]


def tail_across_writer_crash(rng: random.Random) -> Scenario:
    """A tailing reader follows from entry 0 while the writer writes, a bookie crashes (an
    ensemble change), the writer crashes and a recovering client closes the ledger: the reader
    delivers exactly the entries of the closed ledger, in order, none past the close."""
    crash = rng.uniform(30, 90)
    quorum = rng.choice(QUORUMS)
    return Scenario(
        quorum=quorum,
        entries=400,
        network=NetworkFaults(0.1, rng.uniform(0.5, 3.0)),
        crashes=[(rng.uniform(5, crash), rng.randrange(quorum[0] + 2), rng.uniform(20, 100))],
        writer_crash_at=crash,
        recovery_at=crash + rng.uniform(5, 60),
        max_in_flight=rng.randint(1, 20),
        tail=True,
    )


def test_a_tailing_reader_follows_across_a_writer_crash() -> None:
    results = sweep(tail_across_writer_crash)
    assert violations(results) == []
    # The reader was tailing a live writer (it read entries before the close) and the crash
    # left work for recovery.
    assert sum(r.tailed > 0 for r in results) == len(SEEDS)
    assert sum(r.ensemble_changes > 0 for r in results) >= len(SEEDS) // 4


def deferred_sync_crashes(rng: random.Random) -> Scenario:
    """A DEFERRED_SYNC writer forcing every few entries while two bookies of the ensemble
    crash (losing what they had not synced) and the writer may crash: every entry a force
    confirmed stays durable and inside the closed ledger."""
    quorum = rng.choice(QUORUMS)
    return Scenario(
        quorum=quorum,
        entries=200,
        network=NetworkFaults(0.1, rng.uniform(0.5, 3.0)),
        crashes=[
            (rng.uniform(5, 60), index, rng.uniform(10, 100))
            for index in rng.sample(range(quorum[0]), 2)
        ],
        writer_crash_at=rng.uniform(30, 90) if rng.random() < 0.5 else None,
        recovery_at=rng.uniform(60, 200),
        max_in_flight=rng.randint(1, 20),
        deferred_sync=True,
        force_every=rng.randint(3, 20),
    )


def test_deferred_sync_keeps_every_forced_entry_across_crashes_before_force() -> None:
    results = sweep(deferred_sync_crashes)
    assert violations(results) == []
    assert sum(r.forced >= 0 for r in results) >= len(SEEDS) // 2


def test_a_bookie_that_answers_force_before_its_sync_is_caught() -> None:
    """FORCE_LEDGER answered at once instead of after the journal sync: a crash then loses
    entries a force confirmed."""

    def force_before_sync(faults: BookieFaults) -> None:
        faults.force_before_sync = True

    buggy = violations(sweep(deferred_sync_crashes, force_before_sync))
    assert buggy and all("acknowledged" in v and "forced" in v for v in buggy), buggy


def failing_metadata_store(rng: random.Random) -> Scenario:
    """The metadata store fails a fifth of its calls while the writer writes and a client
    recovers: every metadata step of recovery may fail, and a failed recovery is retried."""
    return Scenario(
        quorum=rng.choice(QUORUMS),
        entries=100,
        network=NetworkFaults(0.1, rng.uniform(0.5, 3.0)),
        metadata_failure_probability=0.2,
        recovery_at=rng.uniform(5, 60),
        max_in_flight=rng.randint(1, 20),
    )


def test_recovery_ends_with_an_error_when_the_metadata_store_fails_and_is_retried() -> None:
    """A metadata step of recovery that failed used to be lost: open_ledger then waited for
    ever. Now recovery ends with the error, the client retries, and once the store answers
    the ledger closes with every acknowledged entry."""
    results = sweep(failing_metadata_store)
    assert violations(results) == []
    assert sum(r.recovery_attempts > 1 for r in results) >= len(SEEDS) // 4
