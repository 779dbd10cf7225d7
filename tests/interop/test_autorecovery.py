"""Re-replication across implementations, on the cluster of Java bookies and ours: our ``recover``
moves a Java-written ledger's copies off a Java bookie (reading from Java and our bookies,
writing with RECOVERY_ADD), and the Java client reads the ledger back through the metadata we
changed; the Java shell reads the under-replication markers and delay our side writes."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from bookkeeper_py.client.client import BookKeeper as AsyncBookKeeper
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.metadata.port import MetadataPort, run_blocking
from bookkeeper_py.metadata.underreplication import UnderReplication
from bookkeeper_py.wire.status import StatusCode
from tests.interop.conftest import InteropCluster
from tests.interop.javakit import JavaClient, JavaKit, entry_data
from tests.interop.test_entries import java_reads, java_writes

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.java]

ENTRIES = 30


@pytest.mark.parametrize("digest", ["CRC32C", "MAC"])
def test_our_recover_moves_a_java_ledger_off_a_java_bookie(
    interop_clusters: dict[str, InteropCluster], java_client: JavaClient, digest: str
) -> None:
    cluster = interop_clusters["mixed"]
    prefix = f"ar-{digest}"
    ledger_id = java_writes(
        java_client, cluster, v3=True, digest=digest, prefix=prefix, count=ENTRIES
    )
    with MetadataClient.connect(cluster.metadata_uri) as metadata:
        before, _ = metadata.read_ledger_metadata(ledger_id)
    ((_, ensemble),) = before.ensembles
    leaving = next(bookie for bookie in ensemble if bookie in cluster.java_bookie_ids)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bookkeeper_py",
            "shell",
            "recover",
            leaving,
            "-l",
            str(ledger_id),
            "--metadata-uri",
            cluster.metadata_uri,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and "recovered 1 of 1 ledgers" in done.stdout, done.stderr
    with MetadataClient.connect(cluster.metadata_uri) as metadata:
        after, _ = metadata.read_ledger_metadata(ledger_id)
    ((_, moved),) = after.ensembles
    assert leaving not in moved and len(set(moved) - set(ensemble)) == 1
    assert asyncio.run(replica_problems(cluster.metadata_uri, ledger_id, moved)) == []
    # The Java client reads it back through the changed metadata.
    assert java_reads(java_client, cluster, ledger_id, v3=True, digest=digest) == [
        entry_data(prefix, i) for i in range(ENTRIES)
    ]


async def replica_problems(uri: str, ledger_id: int, ensemble: tuple[str, ...]) -> list[str]:
    """Every replica the ensemble names holds each entry, the same bytes on each (asked one
    bookie at a time, no failover)."""
    problems = []
    async with AsyncBookKeeper(uri) as client:
        for entry_id in range(ENTRIES):
            copies = set()
            for index in write_set(entry_id, 3, 2):
                status, body = await client.bookie_client.read_entry(
                    ensemble[index], ledger_id, entry_id
                )
                if status != StatusCode.EOK:
                    problems.append(f"entry {entry_id} on {ensemble[index]}: {status.name}")
                copies.add(bytes(body))
            if len(copies) != 1:
                problems.append(f"entry {entry_id}: replicas differ")
    return problems


def test_the_java_shell_reads_our_markers_and_delay(
    interop_clusters: dict[str, InteropCluster], java_kit: JavaKit
) -> None:
    cluster = interop_clusters["mixed"]
    marked = 987_654_321

    async def write(port: MetadataPort) -> None:
        markers = await UnderReplication(port).ensure_layout()
        await markers.mark(marked, ["127.0.0.1:3181"])
        await markers.set_lost_bookie_recovery_delay(42)

    async def clear(port: MetadataPort) -> None:
        markers = await UnderReplication(port).ensure_layout()
        await markers.unmark(marked)
        await markers.set_lost_bookie_recovery_delay(0)

    with MetadataClient.connect(cluster.metadata_uri) as metadata:
        run_blocking(metadata, write)
        try:
            listed = java_kit.shell(cluster.metadata_uri, "listunderreplicated")
            assert str(marked) in listed
            delay = java_kit.shell(cluster.metadata_uri, "lostbookierecoverydelay", "-get")
            assert "42" in delay
        finally:
            run_blocking(metadata, clear)
