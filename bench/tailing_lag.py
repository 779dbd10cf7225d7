"""How far a tailing reader lags behind a live writer (issue 6; issue 7's target: p99 under 5 ms
at 10,000 adds/s).

A local cluster (separate bookie processes, embedded metadata store). A writer in this process
adds ``--entry-size`` entries at ``--rate`` adds/s (open loop) to a ledger E/Qw/Qa =
``--quorum``; a reader in another process opens the ledger without recovery and follows it
(``ReadHandle.follow``: long polls carrying the next entry). Lag per entry = the reader's receipt
- the writer's acknowledgement (CLOCK_MONOTONIC, shared by the processes), over ``--seconds`` of
adds; the writer goes on 0.2 s more, since an entry reaches readers through the LAC that later
entries carry (the last entries of a ledger are confirmed only by its close). With client,
reader and bookies on one small machine, the writer's own loop delays its ack timestamps, so a
few lags come out negative (counted, and recorded as the smallest value). The measuring code is
``bookkeeper bench reads --tail`` (``bookkeeper_py.admin.bench.run_tail``); this script runs it
``--runs`` times on one cluster and prints the medians.

    python bench/tailing_lag.py [--rate 10000] [--seconds 5] [--runs 3] [--quorum 3,2,2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

from bookkeeper_py.admin import bench
from bookkeeper_py.testing import LocalCluster


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=10_000)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--entry-size", type=int, default=1024)
    parser.add_argument("--quorum", default="3,2,2", help="E,Qw,Qa")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ensemble, write_quorum, ack_quorum = (int(x) for x in args.quorum.split(","))
    options = bench.build_arguments(
        [
            "reads",
            "--tail",
            f"--rate={args.rate}",
            f"--seconds={args.seconds}",
            f"--entry-size={args.entry_size}",
            f"-e={ensemble}",
            f"-w={write_quorum}",
            f"-a={ack_quorum}",
            "--quiet",
        ]
    )
    runs = []
    with LocalCluster(ensemble) as cluster:
        for run in range(args.runs):
            report = asyncio.run(bench.measure(cluster.metadata_uri, options))
            figures = {"adds_per_s": report.entries_per_s, **report.latency}
            runs.append(figures)
            if not args.json:
                print(f"run {run + 1}: " + ", ".join(f"{k} {v:,.2f}" for k, v in figures.items()))
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    if args.json:
        print(json.dumps({"runs": runs, "median": median}))
        return
    print(
        f"tailing reader lag, {args.entry_size} B entries at {args.rate:,.0f} adds/s target, "
        f"E/Qw/Qa {args.quorum}, median of {args.runs}: {median['adds_per_s']:,.0f} adds/s, "
        f"p50 {median['p50_ms']:.2f} ms, p95 {median['p95_ms']:.2f} ms, "
        f"p99 {median['p99_ms']:.2f} ms, max {median['max_ms']:.2f} ms"
    )


if __name__ == "__main__":
    main()
