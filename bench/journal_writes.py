"""What a journal group's write and sync cost the kernel, by the way they are made: the CPU
(user and system) and the time of each group, with no bookie code at all.

A journal writes each group of records at the end of the last and makes it durable before any
record of it is acknowledged. Three ways, each over a file written through once at the start (as
a journal's zeros ahead leave it), groups of ``--group-bytes`` one after another:

- ``buffered`` (the journal today): ``pwrite`` into the page cache, ``fdatasync``, and the synced
  whole pages dropped a megabyte at a time (``posix_fadvise(DONTNEED)``,
  ``journalRemoveFromPageCache``), as the journal does;
- ``direct``: ``O_DIRECT`` writes from an aligned buffer, which starts with the last partial
  block already written (written again, with the group after it, zeros to the next block), then
  ``fdatasync`` for the disk's cache;
- ``direct-dsync``: the same writes with ``O_DSYNC``: each is durable when it returns (a write
  with FUA, or a write and a flush, as the device allows), with no ``fdatasync``.

The copy of a group into the aligned buffer is not counted (a C framing would make it): the CPU
figures are of the calls alone, in this process (the system CPU is the kernel's work for them).
One thread makes every call here; in a bookie the loop writes and a syncer thread syncs, and
there direct writes measured no gain (``docs/performance.md``, step 83: the write's wait for the
disk moves onto the loop, and the CPU only moves between the two threads).

    python bench/journal_writes.py [--groups 3000] [--group-bytes 61761] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import tempfile
import time
from array import array
from typing import Any

from log_bench import percentiles_ms  # bench/, beside this script

MODES = ("buffered", "direct", "direct-dsync")
ALIGN = 4096
DROP_EVERY = 1024 * 1024  # the journal's _DROP_EVERY


def run(directory: str, mode: str, groups: int, group_bytes: int) -> dict[str, Any]:
    """``groups`` groups written and synced the ``mode`` way; CPU (µs a group) and latency."""
    path = os.path.join(directory, f"journal-{mode}")
    size = groups * group_bytes + 2 * ALIGN
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        block = bytes(1 << 20)
        for offset in range(0, size, len(block)):
            os.pwrite(fd, block, offset)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    flags = os.O_WRONLY
    if mode != "buffered":
        flags |= os.O_DIRECT
    if mode == "direct-dsync":
        flags |= os.O_DSYNC
    fd = os.open(path, flags)
    payload = os.urandom(group_bytes)
    buffer = mmap.mmap(-1, group_bytes + 2 * ALIGN)  # page-aligned, as O_DIRECT needs
    view = memoryview(buffer)
    times = array("d")
    user = system = 0.0
    position = 0
    dropped = 0  # the page cache's pages dropped up to here (buffered)
    try:
        for _ in range(groups):
            start = position - position % ALIGN
            if mode != "buffered":  # (not counted) the group framed after the kept tail
                head = position - start
                buffer[head : head + group_bytes] = payload
                end = position + group_bytes
                padded = end + (-end % ALIGN)
                buffer[end - start : padded - start] = bytes(padded - end)
            before = resource.getrusage(resource.RUSAGE_SELF)
            began = time.monotonic()
            if mode == "buffered":
                os.pwrite(fd, payload, position)
                os.fdatasync(fd)
                whole = (position + group_bytes) // ALIGN * ALIGN
                if whole - dropped >= DROP_EVERY:
                    os.posix_fadvise(fd, dropped, whole - dropped, os.POSIX_FADV_DONTNEED)
                    dropped = whole
            else:
                with view[: padded - start] as written:
                    os.pwrite(fd, written, start)
                if mode == "direct":
                    os.fdatasync(fd)
            ended = time.monotonic()
            after = resource.getrusage(resource.RUSAGE_SELF)
            times.append(ended - began)
            user += after.ru_utime - before.ru_utime
            system += after.ru_stime - before.ru_stime
            position += group_bytes
            if mode != "buffered":  # (not counted) the last partial block kept for the next
                keep = position - position % ALIGN
                buffer[: position - keep] = buffer[keep - start : position - start]
    finally:
        view.release()
        buffer.close()
        os.close(fd)
        os.unlink(path)
    latency = percentiles_ms(times)
    return {
        "mode": mode,
        "groups": groups,
        "group_bytes": group_bytes,
        "cpu_us": (user + system) / groups * 1e6,
        "system_us": system / groups * 1e6,
        "p50_ms": latency["p50_ms"],
        "p99_ms": latency["p99_ms"],
        "max_ms": latency["max_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=3000)
    parser.add_argument(
        "--group-bytes", type=int, default=61761, help="a group (default: 58 records of 1 KiB)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="the modes in turn, this often")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--directory", help="where to write (default: a temporary directory)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.groups < 1 or args.group_bytes < 1 or args.rounds < 1:
        parser.error("--groups, --group-bytes and --rounds must be positive")
    results = []
    with tempfile.TemporaryDirectory(prefix="journal-writes-", dir=args.directory) as directory:
        for _ in range(args.rounds):
            for mode in args.modes:
                try:
                    result = run(directory, mode, args.groups, args.group_bytes)
                except OSError as error:
                    raise SystemExit(
                        f"journal_writes: {mode} writes failed in {directory}: {error} (a file "
                        "system without O_DIRECT, such as tmpfs? give --directory on a disk)"
                    ) from None
                results.append(result)
                if not args.json:
                    print(
                        f"{mode:<13} CPU {result['cpu_us']:6.1f} µs a group (system "
                        f"{result['system_us']:6.1f}), p50 {result['p50_ms']:.3f}  p99 "
                        f"{result['p99_ms']:.3f}  max {result['max_ms']:.1f} ms",
                        flush=True,
                    )
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
