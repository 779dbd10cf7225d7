"""How far a tailing reader lags behind a live writer (issue 6; issue 7's target: p99 under 5 ms
at 10,000 adds/s).

A local cluster (separate bookie processes, embedded metadata store). A writer in this process
adds ``--entry-size`` entries at ``--rate`` adds/s (open loop: adds are issued on schedule, not
when the previous one returns) to a ledger E/Qw/Qa = ``--quorum``; a reader in another process
opens the ledger without recovery and follows it (``ReadHandle.follow``: long polls carrying
the next entry). For every entry, lag = the time the reader got it - the time the writer's add
was acknowledged (both CLOCK_MONOTONIC, shared by the processes), over ``--seconds`` of adds;
the writer goes on for 0.2 s more, since an entry reaches readers through the LAC that later
entries carry (the last entries of a ledger are confirmed only by its close). With client,
reader and bookies on one small machine, the writer's own loop delays its ack timestamps, so
a few lags come out negative. Prints, per run and as the
median of the runs: the rate reached, and lag p50 / p90 / p99 / max.

    python bench/tailing_lag.py [--rate 10000] [--seconds 5] [--runs 3] [--quorum 3,2,2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from bookkeeper import aio
from bookkeeper.testing import LocalCluster


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _follow(uri: str, ledger_id: int, count: int, pipe: Connection) -> None:
    client = await aio.BookKeeper.connect(uri)
    try:
        handle = await client.open_ledger_no_recovery(ledger_id, b"tail")
        pipe.send("ready")
        seen = [0.0] * count
        got = 0
        async for entry in handle.follow(0, timeout_ms=1000):
            seen[entry.entry_id] = time.monotonic()
            got += 1
            if got == count:
                break
        pipe.send(seen)
    finally:
        await client.close()


def reader_process(uri: str, ledger_id: int, count: int, pipe: Connection) -> None:
    asyncio.run(_follow(uri, ledger_id, count, pipe))


async def write(
    uri: str,
    rate: float,
    count: int,
    size: int,
    quorum: tuple[int, int, int],
    reader_for: Callable[[int], None],
) -> tuple[list[float], float]:
    """Adds ``count`` entries on schedule once ``reader_for(ledger_id)`` started the reader;
    (ack time of each entry, seconds from the first add to the last ack)."""
    client = await aio.BookKeeper.connect(uri, throttle=100_000)
    try:
        handle = await client.create_ledger(*quorum, password=b"tail")
        reader_for(handle.ledger_id)
        acked = [0.0] * count
        payload = bytes(size)
        futures = []
        start = time.monotonic()
        issued = 0
        while issued < count:
            due = min(count, int((time.monotonic() - start) * rate) + 1)
            while issued < due:
                future = handle.add_entry_async(payload)
                future.add_done_callback(
                    lambda _f, e=issued: acked.__setitem__(e, time.monotonic())
                )
                futures.append(future)
                issued += 1
            await asyncio.sleep(max(0.0, start + issued / rate - time.monotonic()))
        await asyncio.gather(*futures)
        elapsed = time.monotonic() - start
        await handle.close()
        return acked, elapsed
    finally:
        await client.close()


def one_run(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, float]:
    measured = int(args.rate * args.seconds)
    # The writer goes on for 0.2 s past the measured entries: an entry is confirmed to readers by
    # the LAC a later entry carries, and the last ones would otherwise wait for the close.
    count = measured + int(args.rate * 0.2) + 1
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    readers: list[Any] = []

    def reader_for(ledger_id: int) -> None:
        process = context.Process(
            target=reader_process,
            args=(cluster.metadata_uri, ledger_id, count, theirs),
            daemon=True,
        )
        process.start()
        readers.append(process)
        if not ours.poll(60) or ours.recv() != "ready":
            raise RuntimeError("the tailing reader did not start within 60 s")

    a, b, c = (int(x) for x in args.quorum.split(","))
    acked, elapsed = asyncio.run(
        write(cluster.metadata_uri, args.rate, count, args.entry_size, (a, b, c), reader_for)
    )
    if not ours.poll(120):
        raise RuntimeError("the tailing reader did not see every entry within 120 s")
    seen = ours.recv()
    readers[0].join(30)
    lags = [(seen[i] - acked[i]) * 1000 for i in range(measured)]
    return {
        "adds_per_s": count / elapsed,
        "lag_p50_ms": percentile(lags, 0.50),
        "lag_p90_ms": percentile(lags, 0.90),
        "lag_p99_ms": percentile(lags, 0.99),
        "lag_max_ms": max(lags),
        "entries": measured,
    }


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
    quorum = [int(x) for x in args.quorum.split(",")]
    runs = []
    with LocalCluster(quorum[0]) as cluster:
        for run in range(args.runs):
            result = one_run(cluster, args)
            runs.append(result)
            if not args.json:
                print(
                    f"run {run + 1}: {result['adds_per_s']:,.0f} adds/s, lag p50 "
                    f"{result['lag_p50_ms']:.2f} ms, p90 {result['lag_p90_ms']:.2f} ms, p99 "
                    f"{result['lag_p99_ms']:.2f} ms, max {result['lag_max_ms']:.2f} ms"
                )
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    if args.json:
        print(json.dumps({"runs": runs, "median": median}))
        return
    print(
        f"tailing reader lag, {args.entry_size} B entries at {args.rate:,.0f} adds/s target, "
        f"E/Qw/Qa {args.quorum}, median of {args.runs}: {median['adds_per_s']:,.0f} adds/s, "
        f"p50 {median['lag_p50_ms']:.2f} ms, p90 {median['lag_p90_ms']:.2f} ms, "
        f"p99 {median['lag_p99_ms']:.2f} ms, max {median['lag_max_ms']:.2f} ms"
    )


if __name__ == "__main__":
    main()
