"""Seed sweep of the simulator: ``python -m bookkeeper_py.testing.sim --seeds N``.

Runs seeds ``start`` .. ``start+N-1`` (E/Qw/Qa cycling through (3,3,2), (3,2,2), (5,3,2),
(4,4,3)) with random faults, in ``--jobs`` processes; prints every violation with its seed and
exits 1 if there was one. ``--seed S`` replays one run and prints what happened in it. With
``--logs`` the runs are of logs built from ledgers (``testing/sim/logs.py``): two writers, a
crash, tailing readers."""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import sys
import time
from typing import Any

from bookkeeper_py.testing.sim.logs import LogRunResult, run_log_seed
from bookkeeper_py.testing.sim.run import RunResult, run_seed


def _summary(result: RunResult) -> str:
    scenario = result.scenario
    return (
        f"seed {result.seed}: E/Qw/Qa={scenario.quorum} entries={scenario.entries} "
        f"acked={result.acked} closed at {result.last_entry_id} "
        f"ensemble changes={result.ensemble_changes} recovery attempts={result.recovery_attempts} "
        f"crashes={len(scenario.crashes)} writer crash={scenario.writer_crash_at is not None} "
        f"steps={result.steps} virtual {result.virtual_ms:.0f} ms"
    )


def _quiet() -> None:
    """The simulated bookies are real ones: they log every injected fault. Not here."""
    logging.getLogger("bookkeeper_py").setLevel(logging.CRITICAL)


def _log_summary(result: LogRunResult) -> str:
    scenario = result.scenario
    return (
        f"seed {result.seed}: logs E/Qw/Qa={scenario.quorum} acked={result.acked} "
        f"records={result.records} segments={result.segments} opens={result.opens} "
        f"steps={result.steps} virtual {result.virtual_ms:.0f} ms"
    )


def sweep(start: int, count: int, jobs: int, logs: bool = False) -> list[Any]:
    seeds = range(start, start + count)
    run = run_log_seed if logs else run_seed
    if jobs <= 1:
        return [run(seed) for seed in seeds]
    with concurrent.futures.ProcessPoolExecutor(jobs, initializer=_quiet) as pool:
        return list(pool.map(run, seeds, chunksize=25))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bookkeeper_py.testing.sim", description=__doc__
    )
    parser.add_argument("--seeds", type=int, default=2000, help="how many seeded runs")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, help="replay this one seed and describe it")
    parser.add_argument("--logs", action="store_true", help="runs of logs, not of one ledger")
    args = parser.parse_args(argv)
    summary: Any = _log_summary if args.logs else _summary
    if args.seed is not None:
        result = run_log_seed(args.seed) if args.logs else run_seed(args.seed)
        print(summary(result))
        print(f"  violation: {result.violation}" if result.violation else "  no violation")
        return 0 if result.ok else 1
    started = time.monotonic()
    results = sweep(args.start, args.seeds, args.jobs, args.logs)
    failed = [r for r in results if not r.ok]
    flag = " --logs" if args.logs else ""
    for result in failed:
        print(f"VIOLATION {summary(result)}\n  {result.violation}")
        print(f"  replay: python -m bookkeeper_py.testing.sim{flag} --seed {result.seed}")
    counts = (
        f"{sum(r.opens for r in results)} writer opens, {sum(r.segments for r in results)} segments"
        if args.logs
        else f"{sum(r.ensemble_changes for r in results)} ensemble changes, "
        f"{sum(r.recovery_attempts for r in results)} recovery attempts"
    )
    print(
        f"{len(results)} runs, {len(failed)} violations, {counts}, "
        f"{sum(r.steps for r in results)} steps in {time.monotonic() - started:.1f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    _quiet()  # as a program only: a caller's logging is its own
    sys.exit(main())
