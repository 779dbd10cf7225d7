"""Garbage collection over real bookie processes: after deleting half the ledgers of filled
bookies, their entry logs shrink and every remaining entry is still readable (issue 3)."""

from __future__ import annotations

import os
import time

import pytest

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.testing import LocalCluster

from .workloads import payload

LEDGERS = 10
ENTRIES = 1000
GC_ARGS = [
    "--log-size-limit-mb",
    "1",
    "--flush-interval-ms",
    "200",
    "--gc-wait-time-ms",
    "300",
    "--minor-compaction-interval-s",
    "1",
    "--major-compaction-interval-s",
    "1",
]


def entry_log_bytes(cluster: LocalCluster) -> int:
    total = 0
    for bookie in cluster.bookies:
        directory = os.path.join(bookie.directory, "ledgers")
        total += sum(
            os.path.getsize(os.path.join(directory, f))
            for f in os.listdir(directory)
            if f.endswith(".log")
        )
    return total


@pytest.mark.slow
def test_deleting_half_the_ledgers_shrinks_the_bookies_and_keeps_the_rest() -> None:
    with (
        LocalCluster(3, bookie_args=GC_ARGS) as cluster,
        BookKeeper(cluster.metadata_uri) as client,
    ):
        handles = [client.create_ledger(3, 2, 2, DigestType.CRC32C, b"gc") for _ in range(LEDGERS)]
        futures = [
            handle.add_entry_async(payload(entry_id, 1024, seed=handle.ledger_id))
            for entry_id in range(ENTRIES)
            for handle in handles  # interleaved: every entry log holds every ledger
        ]
        for future in futures:
            future.result()
        for handle in handles:
            handle.close()
        time.sleep(1)  # a checkpoint moves the last entries from the write caches to entry logs
        before = entry_log_bytes(cluster)
        deleted = [handle.ledger_id for handle in handles[::2]]
        kept = [handle.ledger_id for handle in handles[1::2]]
        for ledger_id in deleted:
            client.delete_ledger(ledger_id)
        after = before
        for _ in range(300):  # up to 60 s for GC and compaction to run on every bookie
            after = entry_log_bytes(cluster)
            if after < before * 0.7:
                break
            time.sleep(0.2)
        assert after < before * 0.7, f"entry logs went from {before} to {after} bytes only"
        for ledger_id in kept:
            reader = client.open_ledger(ledger_id, b"gc")
            entries = reader.read_entries(0, ENTRIES - 1)
            assert [e.data for e in entries] == [
                payload(i, 1024, seed=ledger_id) for i in range(ENTRIES)
            ]
        cluster.restart_bookie(0)  # and GC's work survives a restart
        for ledger_id in kept:
            reader = client.open_ledger(ledger_id, b"gc")
            assert reader.read_entries(ENTRIES - 1, ENTRIES - 1)[0].data == payload(
                ENTRIES - 1, 1024, seed=ledger_id
            )
