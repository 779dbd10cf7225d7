"""The least a replicated write costs on this machine: ``ideal_cluster.c``, three C "bookies"
and a C client doing only what every add needs (send each entry to two of three bookies on an
open-loop schedule; a bookie appends what arrived to a file written ahead, fdatasyncs it and
acknowledges it; an add is done at its second acknowledgement). No protocol, checksum, index,
event loop library or interpreter.

Each bookie also writes every entry a second time, to an entry log, as every BookKeeper bookie
does (its journal for the acknowledgement, its entry logs for reading): the entries it stores
are kept in memory and a thread of its own writes them a megabyte at a time with ``O_DIRECT``,
each megabyte synced, steadily as they come (the least that second write can cost: no index,
no checkpoint's bursts). On one disk the two writes share its bandwidth and its queue: at
94,000 adds/s each bookie writes ~64 MB/s to its journal and as much to its entry log. Without
it (``--no-entry-logs``), the cluster writes half the bytes a real one must.

Beside ``bench writes --rate=R --local 3`` at the same rate, it says how much of that run's
latency and CPU any bookie and client on this machine would pay (the disk's syncs, the wake-ups
of processes and of the machine's virtual CPUs, loopback TCP), and so how much is ours. The
schedule is ``bench writes``' own: adds fall due evenly and are sent at least a millisecond apart
(``PACE_TICK_S``), so that due adds go out together.

With ``--cpu-per-entry CLIENT BOOKIE`` (microseconds, as ``bench writes`` reports its "CPU per
entry": per add, for the client and for each bookie), each process also spends at least that much
CPU per add in a busy loop: the ideal structure with a real cluster's CPU. The latency it then
shows is what that much CPU costs on this machine whatever the design (the wait for a core among
busy processes), so a real run near it has no latency of its own design left to remove but its
CPU (``docs/performance.md``, the half-rate row).

    python bench/ideal_cluster.py --rate 45000 [--seconds 5] [--warmup 1] [--runs 3] [--json]
    python bench/ideal_cluster.py --in-flight 1        # closed loop: one add outstanding
    python bench/ideal_cluster.py --rate 87000 --cpu-per-entry 5.0 3.9
    python bench/ideal_cluster.py --rate 94000 --no-entry-logs    # the journals' writes only

Needs a C compiler (``cc``), as the speedups' build does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from bookkeeper_py.admin.bench import PACE_TICK_S

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ideal_cluster.c")
RING = 16 * 1024 * 1024  # each bookie's file: written once, then overwritten in a ring
LOG_RING = 32 * 1024 * 1024  # each bookie's entry log (the same, for its second write)
BOOKIES, WRITE_QUORUM = 3, 2  # ideal_cluster.c's striping: a bookie stores 2 of every 3 adds


def build(directory: str) -> str:
    """Compiles ``ideal_cluster.c`` into ``directory``; the program's path."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise SystemExit("ideal_cluster: no C compiler (cc) found; install one (gcc) and rerun")
    program = os.path.join(directory, "ideal_cluster")
    result = subprocess.run(
        [compiler, "-O2", "-pthread", "-o", program, SOURCE],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"ideal_cluster: the C build failed:\n{result.stderr}")
    return program


def run(
    program: str,
    directory: str,
    rate: float,
    seconds: float,
    warmup: float = 1.0,
    entry_size: int = 1024,
    in_flight: int = 0,
    cpu_per_entry: tuple[float, float] = (0.0, 0.0),
    entry_logs: bool = True,
) -> dict[str, Any]:
    """One run: three bookies started, the client run to the end, the bookies stopped. With
    ``rate`` 0, ``in_flight`` adds are kept outstanding instead (closed loop). ``cpu_per_entry``:
    the least CPU (µs) per add the client and each bookie spend (0: only what they need).
    ``entry_logs``: each bookie also writes every entry a second time, to its entry log."""
    client_us, bookie_us = cpu_per_entry
    per_copy_us = bookie_us * BOOKIES / WRITE_QUORUM  # a bookie's figure is per add of the run
    bookies = [
        subprocess.Popen(
            [
                program,
                "bookie",
                os.path.join(directory, f"bookie-{b}"),
                str(RING),
                str(entry_size),
                str(per_copy_us),
                str(LOG_RING if entry_logs else 0),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for b in range(3)
    ]
    try:
        ports = []
        for bookie in bookies:
            assert bookie.stdout is not None
            line = bookie.stdout.readline().split()
            if line[:1] != ["ready"]:
                raise SystemExit(f"ideal_cluster: a bookie did not start (it said {line})")
            ports.append(line[1])
        tick_us = str(round(PACE_TICK_S * 1e6))
        client = subprocess.run(
            [
                program,
                "client",
                str(rate),
                str(in_flight),
                str(seconds),
                str(warmup),
                str(entry_size),
                tick_us,
                str(client_us),
                *ports,
            ],
            capture_output=True,
            text=True,
            timeout=warmup + seconds + 120,
            check=False,
        )
        if client.returncode != 0:
            raise SystemExit(f"ideal_cluster: the client failed: {client.stderr.strip()}")
        adds, sent, p50, p99, worst, client_cpu = client.stdout.split()
        bookie_cpu, logged, stored = [], [], []
        for bookie in bookies:
            try:
                out, _ = bookie.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                raise SystemExit(
                    "ideal_cluster: a bookie did not stop within 60 s of its client's end"
                ) from None
            words = out.splitlines()[-1].split() if out.strip() else []
            if bookie.returncode != 0 or words[::2] != ["cpu", "logged", "stored"]:
                raise SystemExit(f"ideal_cluster: a bookie failed (exit {bookie.returncode})")
            bookie_cpu.append(float(words[1]))
            logged.append(int(words[3]))
            stored.append(int(words[5]))
    finally:
        for bookie in bookies:
            if bookie.poll() is None:
                bookie.kill()
                bookie.wait()
    added = int(sent)  # the CPU figures cover the whole run
    return {
        "rate": rate,
        "in_flight": in_flight,
        "adds": int(adds),
        "p50_ms": float(p50),
        "p99_ms": float(p99),
        "max_ms": float(worst),
        "entry_logs": entry_logs,
        "entry_log_bytes": logged,  # per bookie: written to its entry log
        "stored_bytes": stored,  # per bookie: of the entries it stored
        "cpu_spent_per_entry_us": {"client": client_us, "bookie": bookie_us},
        "cpu_per_entry_us": {
            "client": float(client_cpu) / added * 1e6,
            "bookie": statistics.mean(bookie_cpu) / added * 1e6,
        },
    }


def measure(
    rate: float,
    seconds: float,
    warmup: float = 1.0,
    runs: int = 1,
    entry_size: int = 1024,
    in_flight: int = 0,
    cpu_per_entry: tuple[float, float] = (0.0, 0.0),
    entry_logs: bool = True,
) -> list[dict[str, Any]]:
    """``runs`` runs at ``rate`` (or, with ``rate`` 0, with ``in_flight`` adds outstanding),
    in a temporary directory (compiled there once)."""
    with tempfile.TemporaryDirectory(prefix="ideal-cluster-") as directory:
        program = build(directory)
        return [
            run(
                program,
                directory,
                rate,
                seconds,
                warmup,
                entry_size,
                in_flight,
                cpu_per_entry,
                entry_logs,
            )
            for _ in range(runs)
        ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=0.0, help="adds/s, open loop")
    parser.add_argument(
        "--in-flight", type=int, default=0, help="adds outstanding, closed loop (without --rate)"
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--entry-size", type=int, default=1024)
    parser.add_argument(
        "--cpu-per-entry",
        type=float,
        nargs=2,
        default=(0.0, 0.0),
        metavar=("CLIENT", "BOOKIE"),
        help="µs of CPU per add the client and each bookie spend at least (bench's figures)",
    )
    parser.add_argument(
        "--no-entry-logs",
        action="store_true",
        help="the bookies write each entry once, to their journals only (no entry logs)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if (args.rate > 0) == (args.in_flight > 0) or args.rate < 0 or args.in_flight < 0:
        parser.error("give either --rate (open loop) or --in-flight (closed loop), positive")
    if args.seconds <= 0 or args.warmup < 0 or args.runs < 1:
        parser.error("--seconds and --runs must be positive, --warmup not negative")
    if min(args.cpu_per_entry) < 0:
        parser.error("--cpu-per-entry takes two figures of 0 or more (µs per add)")
    if args.entry_size < 8:
        parser.error("--entry-size must be at least 8 (an entry carries its id)")
    if not sys.platform.startswith("linux"):
        parser.error("ideal_cluster runs on Linux only")
    results = measure(
        args.rate,
        args.seconds,
        args.warmup,
        args.runs,
        args.entry_size,
        args.in_flight,
        tuple(args.cpu_per_entry),
        not args.no_entry_logs,
    )
    if args.json:
        print(json.dumps(results))
        return
    for result in results:
        cpu = result["cpu_per_entry_us"]
        print(
            f"{result['adds']:,} adds "
            + (f"at {args.rate:,.0f}/s" if args.rate else f"{args.in_flight} in flight")
            + f", ideal C cluster: p50 "
            f"{result['p50_ms']:.3f}  p99 {result['p99_ms']:.3f}  max {result['max_ms']:.1f} ms; "
            f"CPU per entry (us): client {cpu['client']:.1f}, bookie {cpu['bookie']:.1f}"
        )


if __name__ == "__main__":
    main()
