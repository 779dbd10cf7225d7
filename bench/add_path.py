"""The fixed cost of a bookie's add path, without the machine's noise: one bookie in this process
takes batches of plain v2 adds on one connection (a transport that keeps what is written), and
each batch is answered before the next is given: ``data_received``, the checks, the write cache,
the journal's group written and synced (on a RAM-backed file system where there is one, so the
sync costs nothing), the answers encoded and written; the bookie keeps its metrics as a bookie
process does.

Three figures per batch size, medians of ``--runs`` runs:

- **hot**: the time per batch when batches follow each other, the caches warm;
- **cold**: the same with ``--pollute`` MiB of memory written between batches, as the other
  processes on a CPU evict the bookie's working set between its wake-ups on a busy machine (a
  bookie at 10,000 adds/s wakes ~2,000 times a second, each time after others ran);
- **calls**: the function calls the interpreter makes per batch (to Python functions and into
  C; the harness's few loop passes included), and those to the package's own Python functions:
  counts that do not move with the machine;
- **instructions** (with ``--instructions BATCHES``, where valgrind is installed): the machine
  instructions per batch in the process's own code, interpreter and libraries included, counted
  by callgrind. Timings on this machine move by a third from one run to the next; this count
  moves by under 1 %, so it shows what a change to the path saves.

``bench writes --in-flight=1`` on a local cluster shows the same path's time in a live bookie
between the read of an add and the journal's write (``perf trace``: ~50 us on 2026-12-07) and
from the sync's end to the answer's write (~27 us); this benchmark says how much of that is the
interpreter's work and how much the cold caches add, and counts the calls a compiled path would
remove.

    python bench/add_path.py [--batch 1] [--batch 8] [--adds 20000] [--pollute 16] [--runs 3]
                             [--instructions 1000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bookkeeper_py import loop as event_loop
from bookkeeper_py.prometheus import PrometheusMetrics
from bookkeeper_py.server.bookie import Bookie, BookieConfig
from bookkeeper_py.server.connection import BookieConnection
from bookkeeper_py.storage import index
from bookkeeper_py.storage.engine import StorageConfig
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.digest import DigestManager, DigestType
from bookkeeper_py.wire.status import StatusCode

KEY = b"k" * 20
WARMUP_BATCHES = 500


class _KeptTransport(asyncio.Transport):
    """A connection's transport that keeps the byte count of what is written, and wakes whoever
    waits for a number of bytes (``until``) once they are all written."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self._target = 0
        self._reached: asyncio.Future[None] | None = None

    def write(self, data: Any) -> None:
        self.written += len(data)
        if self._reached is not None and self.written >= self._target:
            self._reached.set_result(None)
            self._reached = None

    def until(self, target: int) -> asyncio.Future[None]:
        """Done once ``target`` bytes in all have been written."""
        reached = asyncio.get_running_loop().create_future()
        if self.written >= target:
            reached.set_result(None)
        else:
            self._target, self._reached = target, reached
        return reached

    def is_closing(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _directory() -> str:
    """RAM-backed where the machine has it: the journal's sync is not what is measured."""
    shm = "/dev/shm"
    return tempfile.mkdtemp(prefix="pbk-add-path-", dir=shm if os.access(shm, os.W_OK) else None)


async def _run(
    batches: int,
    batch: int,
    pollute_bytes: int,
    count_calls: bool,
    generated: int = 0,
    close: bool = True,
) -> dict[str, float]:
    """Serves ``batches`` batches after the warm-up ones; ``generated``: how many batches' requests
    are made beforehand (at least those served), so that two runs serving different numbers
    of batches can do the same work besides. ``close=False`` leaves the bookie as a crash
    would, without its final checkpoint (whose work grows with the entries served: not the add
    path's)."""
    directory = _directory()
    storage = StorageConfig(
        os.path.join(directory, "journal"),
        os.path.join(directory, "ledgers"),
        flush_interval_s=3600,
    )
    # With the metrics a bookie process keeps (its latency histograms are on the path).
    bookie = Bookie(BookieConfig(storage), asyncio.get_running_loop(), PrometheusMetrics())
    bookie.start()
    try:
        connection = BookieConnection(bookie, set())
        transport = _KeptTransport()
        connection.connection_made(transport)
        digest = DigestManager(7, DigestType.CRC32C, b"")
        payload = b"x" * 1024
        total = WARMUP_BATCHES + batches
        made = WARMUP_BATCHES + max(batches, generated)
        requests = [
            v2.encode_add_request(KEY, digest.package(entry_id, entry_id - 1, 0, payload))
            for entry_id in range(made * batch)
        ]
        chunks = [b"".join(requests[i * batch : (i + 1) * batch]) for i in range(total)]
        junk = bytearray(pollute_bytes or 1)
        stride = bytes(len(junk[::64]))

        answer_bytes = batch * len(v2.encode_add_responses(StatusCode.EOK, 7, [0]))

        async def serve(chunk: bytes) -> None:
            connection.data_received(chunk)
            # Until the batch's answers are written: a few loop passes (the journal's step, the
            # answers' flush), or the syncer thread's sync when the journal hands it one, which
            # the loop waits for in its poll. (A loop spinning with sleep(0) meanwhile ran
            # ~8,000 instructions a pass, as many passes as the sync took under valgrind.)
            answered = transport.until(transport.written + answer_bytes)
            if answered.done():
                return
            late = asyncio.get_running_loop().call_later(10, answered.cancel)
            try:
                await answered
            except asyncio.CancelledError:
                raise SystemExit("add_path: a batch was not answered within 10 s") from None
            late.cancel()

        for chunk in chunks[:WARMUP_BATCHES]:
            await serve(chunk)
        calls = ours = 0
        package = os.path.dirname(sys.modules["bookkeeper_py"].__file__ or "")

        def counter(frame: Any, event: str, arg: Any) -> None:
            nonlocal calls, ours
            if event in ("call", "c_call"):
                calls += 1
                if event == "call" and frame.f_code.co_filename.startswith(package):
                    ours += 1

        spent = 0.0
        for chunk in chunks[WARMUP_BATCHES:]:
            if pollute_bytes:
                junk[::64] = stride  # one write per cache line: another working set
            started = time.perf_counter()
            if count_calls:
                sys.setprofile(counter)
            await serve(chunk)
            if count_calls:
                sys.setprofile(None)
            spent += time.perf_counter() - started
        expected = total * answer_bytes
        if transport.written != expected:
            raise SystemExit(f"add_path: {transport.written} bytes of answers, {expected} expected")
        return {
            "us_per_batch": spent / batches * 1e6,
            "calls_per_batch": calls / batches,
            "our_calls_per_batch": ours / batches,
        }
    finally:
        if close:
            bookie.close()
        shutil.rmtree(directory, ignore_errors=True)


def measure(batch: int, adds: int, pollute_mib: int, runs: int) -> dict[str, Any]:
    """Medians of ``runs`` runs of ``adds`` adds in batches of ``batch``."""
    batches = max(1, adds // batch)
    event_loop.run(_run(batches, batch, 0, False))  # not counted: the process's first run
    hot: list[float] = []
    cold: list[float] = []
    for _ in range(runs):  # alternated, so that a slower stretch of the machine hits both
        hot.append(event_loop.run(_run(batches, batch, 0, False))["us_per_batch"])
        polluted = _run(batches, batch, pollute_mib * 1024 * 1024, False)
        cold.append(event_loop.run(polluted)["us_per_batch"])
    counted = event_loop.run(_run(min(batches, 2000), batch, 0, True))
    return {
        "batch": batch,
        "hot_us_per_batch": statistics.median(hot),
        "hot_runs": hot,
        "cold_us_per_batch": statistics.median(cold),
        "cold_runs": cold,
        "pollute_mib": pollute_mib,
        "calls_per_batch": counted["calls_per_batch"],
        "our_calls_per_batch": counted["our_calls_per_batch"],
    }


def instructions(batch: int, batches: int) -> float:
    """The machine instructions per batch, counted by valgrind's callgrind in this process's
    code (the interpreter, the libraries, ours; not the kernel's): the difference between two
    runs that serve ``batches`` and ``2 * batches`` batches after the same set-up, divided by
    ``batches`` (the bookie then stopped as by a crash: its final checkpoint, which would write
    every entry served to the entry log, is not counted). The same code gives the same count
    within a fraction of a percent, on any machine of the same architecture and Python build,
    however busy."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit(
            "add_path: --instructions counts with valgrind, which is not installed here "
            "(apt-get install valgrind)"
        )
    counts = []
    for served in (batches, 2 * batches):
        command = [
            valgrind,
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            os.path.abspath(__file__),
            *("--serve", str(served), "--generate", str(2 * batches), "--batch", str(batch)),
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
        found = re.search(r"Collected : (\d+)", result.stderr)
        if result.returncode != 0 or found is None:
            raise SystemExit(f"add_path: the run under valgrind failed: {result.stderr[-2000:]}")
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / batches


def _serve_only(batches: int, batch: int, generated: int) -> None:
    """The child of ``instructions``: serves and exits. Valgrind's address space is smaller
    than the ledger index's usual reservation (``storage.index.MAP_SIZE``)."""
    index.MAP_SIZE = 1 << 28
    event_loop.run(_run(batches, batch, 0, False, generated, close=False))
    sys.stdout.flush()
    os._exit(0)  # the bookie's threads left as they are: the count ends here


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, action="append", help="adds per batch (repeat)")
    parser.add_argument("--adds", type=int, default=20000)
    parser.add_argument("--pollute", type=int, default=16, help="MiB written between batches")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--instructions",
        type=int,
        default=0,
        metavar="BATCHES",
        help="also count the instructions per batch under valgrind, over this many batches",
    )
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--generate", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = args.batch or [1, 8]
    if min(sizes) < 1 or args.adds < 1 or args.runs < 1 or args.pollute < 0:
        parser.error("--batch, --adds and --runs must be at least 1, --pollute at least 0")
    if args.instructions < 0:
        parser.error("--instructions must be at least 0 (0: not counted)")
    if args.serve:
        _serve_only(args.serve, sizes[0], args.generate)
        return 0
    results = [measure(size, args.adds, args.pollute, args.runs) for size in sizes]
    for result in results:
        if args.instructions:
            result["instructions_per_batch"] = instructions(result["batch"], args.instructions)
    if args.json:
        out(json.dumps(results))
        return 0
    for result in results:
        size = result["batch"]
        out(
            f"bookie add path, batches of {size}: hot {result['hot_us_per_batch']:.1f} us "
            f"({result['hot_us_per_batch'] / size:.1f} per add), cold ({result['pollute_mib']} "
            f"MiB between batches) {result['cold_us_per_batch']:.1f} us, "
            f"{result['calls_per_batch']:.0f} calls per batch ({result['our_calls_per_batch']:.0f} "
            "of them to the package's Python functions)"
            + (
                f", {result['instructions_per_batch']:,.0f} instructions per batch"
                if "instructions_per_batch" in result
                else ""
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
