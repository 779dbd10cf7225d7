"""Seed sweep of the simulator: ``python -m bookkeeper_py.testing.sim --seeds N``.

Runs seeds ``start`` .. ``start+N-1`` (E/Qw/Qa cycling through (3,3,2), (3,2,2), (5,3,2),
(4,4,3)) with random faults, in ``--jobs`` processes; prints every violation with its seed and
exits 1 if there was one. ``--seed S`` replays one run and prints what happened in it. With
``--logs`` the runs are of logs built from ledgers (``testing/sim/logs.py``): two writers, a
crash, tailing readers. With ``--autorecovery`` they are of AutoRecovery services re-replicating
the ledgers of lost bookies (``testing/sim/autorecovery.py``)."""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from bookkeeper_py.testing.sim.autorecovery import AutoRecoveryRunResult, run_autorecovery_seed
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


def _autorecovery_summary(result: AutoRecoveryRunResult) -> str:
    scenario = result.scenario
    return (
        f"seed {result.seed}: autorecovery services={scenario.services} "
        f"lost={len(scenario.losses)} restarts={len(scenario.restarts)} acked={result.acked} "
        f"swaps={result.swaps} unmarks={result.unmarks} takeovers={result.takeovers} "
        f"auditors={result.auditors} fenced={result.fenced} "
        f"steps={result.steps} virtual {result.virtual_ms:.0f} ms"
    )


# kind -> (the run of a seed, its one-line summary, what a sweep totals)
KINDS: dict[str, tuple[Callable[[int], Any], Callable[[Any], str], Callable[[list[Any]], str]]] = {
    "ledger": (
        run_seed,
        _summary,
        lambda results: (
            f"{sum(r.ensemble_changes for r in results)} ensemble changes, "
            f"{sum(r.recovery_attempts for r in results)} recovery attempts"
        ),
    ),
    "logs": (
        run_log_seed,
        _log_summary,
        lambda results: (
            f"{sum(r.opens for r in results)} writer opens, "
            f"{sum(r.segments for r in results)} segments"
        ),
    ),
    "autorecovery": (
        run_autorecovery_seed,
        _autorecovery_summary,
        lambda results: (
            f"{sum(r.swaps for r in results)} member swaps, "
            f"{sum(r.unmarks for r in results)} unmarks, "
            f"{sum(r.takeovers for r in results)} lock takeovers"
        ),
    ),
}


def sweep(start: int, count: int, jobs: int, kind: str = "ledger") -> list[Any]:
    """The results of seeds ``start`` .. ``start+count-1`` of runs of ``kind`` (``KINDS``)."""
    seeds = range(start, start + count)
    run = KINDS[kind][0]
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
    kinds = parser.add_mutually_exclusive_group()
    kinds.add_argument(
        "--logs", action="store_const", dest="kind", const="logs", help="runs of logs"
    )
    kinds.add_argument(
        "--autorecovery",
        action="store_const",
        dest="kind",
        const="autorecovery",
        help="runs of AutoRecovery re-replicating the ledgers of lost bookies",
    )
    args = parser.parse_args(argv)
    kind = args.kind or "ledger"
    run, summary, totals = KINDS[kind]
    if args.seed is not None:
        result = run(args.seed)
        print(summary(result))
        print(f"  violation: {result.violation}" if result.violation else "  no violation")
        return 0 if result.ok else 1
    started = time.monotonic()
    results = sweep(args.start, args.seeds, args.jobs, kind)
    failed = [r for r in results if not r.ok]
    flag = "" if kind == "ledger" else f" --{kind}"
    for result in failed:
        print(f"VIOLATION {summary(result)}\n  {result.violation}")
        print(f"  replay: python -m bookkeeper_py.testing.sim{flag} --seed {result.seed}")
    print(
        f"{len(results)} runs, {len(failed)} violations, {totals(results)}, "
        f"{sum(r.steps for r in results)} steps in {time.monotonic() - started:.1f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    _quiet()  # as a program only: a caller's logging is its own
    sys.exit(main())
