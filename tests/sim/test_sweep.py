"""The seed sweep of issue 6: 2,000 seeded runs with random faults over E/Qw/Qa in
{(3,3,2), (3,2,2), (5,3,2), (4,4,3)} and zero invariant violations; a seed replays exactly."""

from __future__ import annotations

from bookkeeper_py.testing.sim.__main__ import main, sweep
from bookkeeper_py.testing.sim.run import QUORUMS, run_seed


def test_two_thousand_seeds_violate_no_invariant() -> None:
    results = sweep(0, 2000, jobs=2)
    failed = [f"seed {r.seed}: {r.violation}" for r in results if not r.ok]
    assert failed == []
    assert {r.scenario.quorum for r in results} == set(QUORUMS)
    # The faults really happened: ensemble changes, recoveries racing a live writer, crashes.
    assert sum(r.ensemble_changes for r in results) > 200
    assert sum(1 for r in results if r.scenario.crashes) > 1000
    assert sum(1 for r in results if r.last_entry_id is not None and r.acked) > 1500


def test_a_seed_replays_the_same_run() -> None:
    first, again = run_seed(1234), run_seed(1234)
    assert (first.steps, first.virtual_ms, first.acked, first.last_entry_id) == (
        again.steps,
        again.virtual_ms,
        again.acked,
        again.last_entry_id,
    )
    assert run_seed(1235).steps != first.steps


def test_the_command_line_reports_a_sweep(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--seeds", "20", "--jobs", "1"]) == 0
    assert "20 runs, 0 violations" in capsys.readouterr().out
    assert main(["--seed", "7"]) == 0
    assert "seed 7: E/Qw/Qa=" in capsys.readouterr().out
