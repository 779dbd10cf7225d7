"""A bookie whose disk fills up: run by tests/integration/test_full_disk.py as root, or inside a
user and mount namespace (``unshare --user --map-root-user --mount``), because it mounts a small
tmpfs for the bookie's data. Prints a line per step; exits non-zero on any failed check.

    python full_disk_scenario.py WORK_DIRECTORY threshold|enospc|journal

``threshold``: the usage threshold (0.6) turns the bookie read-only long before the disk is full.
``enospc``: thresholds of 0.99 let writes run into a really full disk (ENOSPC) first.
``journal``: only the journal is on a small disk; it must keep giving its space back.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.errors import NotEnoughBookiesError, WriteError, WriteOnReadOnlyBookieError
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.raw import recv_frame
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.digest import DigestManager, master_key
from bookkeeper_py.wire.status import StatusCode

PASSWORD = b"full"
ENTRY = 64 * 1024
PER_LEDGER = 40
THRESHOLDS = {
    "threshold": ["--disk-usage-threshold", "0.6", "--disk-usage-warn-threshold", "0.5"],
    "enospc": ["--disk-usage-threshold", "0.99", "--disk-usage-warn-threshold", "0.98"],
}
# fmt: off
BOOKIE_ARGS = [
    "--disk-check-interval-ms", "100", "--disk-usage-lwm-threshold", "0.45",
    "--journal-max-size-mb", "2", "--log-size-limit-mb", "2", "--write-cache-mb", "8",
    "--flush-interval-ms", "100", "--gc-wait-time-ms", "200",
    "--minor-compaction-interval-s", "1", "--major-compaction-interval-s", "1",
]
# fmt: on


def check(condition: bool, what: str) -> None:
    if not condition:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def raw_add(bookie_id: str, ledger_id: int, entry_id: int, recovery: bool) -> StatusCode:
    host, port = bookie_id.rsplit(":", 1)
    entry = DigestManager(ledger_id, DigestType.CRC32C, PASSWORD).package(entry_id, -1, 1, b"r")
    flags = v2.FLAG_RECOVERY_ADD if recovery else v2.FLAG_NONE
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(v2.encode_add_request(master_key(PASSWORD), entry, flags))
        return v2.decode_response(recv_frame(connection)).status


def read_back(client: BookKeeper, acked: dict[int, int]) -> None:
    """Every acknowledged entry (``acked``: ledger -> count), without fencing."""
    for ledger_id, count in acked.items():
        if count:
            reader = client.open_ledger_no_recovery(ledger_id, PASSWORD)
            entries = reader.read_unconfirmed_entries(0, count - 1)
            if [e.data for e in entries] != [bytes([i]) * ENTRY for i in range(count)]:
                check(False, f"ledger {ledger_id}: acknowledged entries read back")
    check(True, f"all {sum(acked.values())} acknowledged entries read back")


def wait_until(condition, seconds: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def fill_until_refused(client: BookKeeper, acked: dict[int, int]) -> Exception | None:
    """Writes ledgers of 40 x 64 KiB until an add is refused; counts acknowledged entries. The
    bookie may turn read-only between two ledgers: then the refusal is the create's (no writable
    bookie registered)."""
    for _ in range(100):  # at most 100 ledgers x 40 x 64 KiB = 250 MiB: far more than the disk
        try:
            handle = client.create_ledger(1, 1, 1, DigestType.CRC32C, PASSWORD)
        except NotEnoughBookiesError as error:
            return error
        acked[handle.ledger_id] = 0
        try:
            for entry_id in range(PER_LEDGER):
                handle.add_entry(bytes([entry_id]) * ENTRY)
                acked[handle.ledger_id] = entry_id + 1
            handle.close()
        except (WriteOnReadOnlyBookieError, WriteError) as error:
            return error
    return None


def journal_disk(work: str) -> None:
    """Only the journal is on a small disk (64 MiB), with the default thresholds and the
    default 16 MiB preallocation. Three times the disk is written through it: adds are never
    answered EIO (they used to be from 84 % usage on, for ever, while the bookie stayed
    registered writable); the journal gives its space back (a new file, then a checkpoint
    deletes the old one); any refusal is EREADONLY while registered read-only, and passes."""
    base = os.path.join(work, "cluster")
    journal = os.path.join(base, "bookie-0", "journal")
    os.makedirs(journal)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", journal], check=True)
    try:
        uri = f"sqlite:///{os.path.join(work, 'metadata.db')}"
        args = ["--disk-check-interval-ms", "100"]
        with LocalCluster(1, metadata_uri=uri, base_directory=base, bookie_args=args) as cluster:
            bookie = cluster.bookie_ids[0]
            metadata = MetadataClient.connect(uri)
            written: dict[int, int] = {}
            refusals = 0
            total = 0
            with BookKeeper(uri) as client:
                while total < 3 * 64 * 1024 * 1024:
                    handle = client.create_ledger(1, 1, 1, DigestType.CRC32C, PASSWORD)
                    written[handle.ledger_id] = 0
                    try:
                        for entry_id in range(PER_LEDGER):
                            handle.add_entry(bytes([entry_id]) * ENTRY)
                            written[handle.ledger_id] = entry_id + 1
                            total += ENTRY
                        handle.close()
                    except (WriteOnReadOnlyBookieError, WriteError) as error:
                        check("EIO" not in str(error), f"refused without EIO ({error})")
                        refusals += 1
                        check(refusals <= 20, "refused at most 20 times")
                        check(
                            wait_until(lambda: metadata.writable_bookies() == [bookie], 30),
                            "writable again once the journal gave its space back",
                        )
                check(True, f"{total >> 20} MiB written through a 64 MiB journal disk")
                usage = shutil.disk_usage(journal)
                check(usage.used < 0.95 * usage.total, f"journal disk at {usage.used >> 20} MiB")
                read_back(client, written)
            metadata.close()
    except BaseException:
        log = os.path.join(base, "bookie-0", "bookie.log")
        if os.path.exists(log):
            with open(log, errors="replace") as handle:
                print("".join(handle.readlines()[-60:]), flush=True)
        raise
    finally:
        subprocess.run(["umount", "-l", journal], check=False)
    print("SCENARIO PASSED", flush=True)


def main() -> None:
    work, mode = sys.argv[1], sys.argv[2]
    if mode == "journal":
        journal_disk(work)
        return
    disk = os.path.join(work, "disk")
    os.makedirs(disk, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", disk], check=True)
    try:
        uri = f"sqlite:///{os.path.join(work, 'metadata.db')}"
        args = BOOKIE_ARGS + THRESHOLDS[mode]
        with LocalCluster(1, metadata_uri=uri, base_directory=disk, bookie_args=args) as cluster:
            bookie = cluster.bookie_ids[0]
            metadata = MetadataClient.connect(uri)
            acked: dict[int, int] = {}
            with BookKeeper(uri) as client:
                failure = fill_until_refused(client, acked)
                check(failure is not None, "adds stop when the disk fills")
                between_ledgers = isinstance(failure, NotEnoughBookiesError)
                if mode == "threshold":
                    check(
                        "EREADONLY" in str(failure) or between_ledgers,
                        f"refused with EREADONLY before the disk is full ({failure})",
                    )
                else:
                    check(
                        "EREADONLY" in str(failure) or "EIO" in str(failure) or between_ledgers,
                        f"refused ({failure})",
                    )
                check(
                    wait_until(lambda: metadata.readonly_bookies() == [bookie], 10),
                    "registered as read-only",
                )
                check(metadata.writable_bookies() == [], "no longer registered as writable")
                last = max(acked)
                check(
                    raw_add(bookie, last, 10_000, recovery=False) == StatusCode.EREADONLY,
                    "normal add: EREADONLY",
                )
                if mode == "threshold":  # with room left, recovery adds are still taken
                    check(
                        raw_add(bookie, last, 10_001, recovery=True) == StatusCode.EOK,
                        "recovery add still works",
                    )
                # Reads need no space: every acknowledged entry, without fencing (a fence must be
                # journaled, which a really full disk cannot do until space is freed).
                read_back(client, acked)
                for ledger_id in list(acked)[:-1]:
                    client.delete_ledger(ledger_id)
                writable = wait_until(lambda: metadata.writable_bookies() == [bookie], 60)
                if not writable:
                    subprocess.run(["df", "-h", disk], check=False)
                    subprocess.run(
                        [
                            "sh",
                            "-c",
                            f"ls -la {disk}/bookie-0/*; tail -30 {disk}/bookie-0/bookie.log",
                        ],
                        check=False,
                    )
                check(writable, "writable again once garbage collection freed the space")
                recovered = client.open_ledger(last, PASSWORD)
                check(
                    recovered.last_add_confirmed >= acked[last] - 1,
                    "the unclosed ledger recovers with every ack",
                )
                handle = client.create_ledger(1, 1, 1, DigestType.CRC32C, PASSWORD)
                check(handle.add_entry(b"after") == 0, "new adds succeed")
                handle.close()
            metadata.close()
    except BaseException:
        log = os.path.join(disk, "bookie-0", "bookie.log")
        if os.path.exists(log):
            print("---- bookie log (last 60 lines) ----", flush=True)
            with open(log, errors="replace") as handle:
                print("".join(handle.readlines()[-60:]), flush=True)
        raise
    finally:
        subprocess.run(["umount", "-l", disk], check=False)
    print("SCENARIO PASSED", flush=True)


if __name__ == "__main__":
    main()
