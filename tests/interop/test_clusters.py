"""Clusters made by either side's shell serve the other side's bookies and shells, and on every
ledger layout (flat, hierarchical, long hierarchical) both kinds of client allocate ledger ids
from the same counter and read each other's ledgers."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.metadata.manager import MetadataClient
from tests.interop.conftest import PASSWORD, InteropCluster
from tests.interop.javakit import JavaClient, JavaKit, entry_data

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.java]

FACTORIES = {
    "java": "org.apache.bookkeeper.meta.FlatLedgerManagerFactory:1",
    "python": "org.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory:1",
    "mixed": "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1",
}
ROUNDS = 3
# Ids from two different counters (ours on the flat layout used <root>/idgen/, Java's <root>/ID-)
# meet once one side has made as many ledgers as the other's first id: the root's child count.
OURS_PER_ROUND = 4
ENTRIES = 5


def our_shell(uri: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", "shell", *args, "--metadata-uri", uri],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_each_sides_shell_sees_every_bookie_and_the_same_instance(
    cluster: InteropCluster, java_kit: JavaKit
) -> None:
    java_listing = java_kit.shell(cluster.metadata_uri, "listbookies", "-rw")
    assert set(re.findall(r"BookieID:(\S+?),", java_listing)) == set(cluster.bookie_ids)
    assert set(our_shell(cluster.metadata_uri, "listbookies", "-rw").split()) == set(
        cluster.bookie_ids
    )
    java_instance = re.search(
        r"InstanceId: (\S+)", java_kit.shell(cluster.metadata_uri, "whatisinstanceid")
    )
    assert java_instance is not None
    assert java_instance.group(1) in our_shell(cluster.metadata_uri, "whatisinstanceid")


def test_both_clients_allocate_ledger_ids_from_one_counter_and_read_each_others_ledgers(
    cluster: InteropCluster, java_client: JavaClient, java_kit: JavaKit
) -> None:
    with MetadataClient.connect(cluster.metadata_uri) as metadata:
        # Whichever shell made the cluster wrote the layout its URI names, in Java's format.
        layout, _ = metadata.store.get(f"{metadata.root}/LAYOUT")
        assert layout.decode().splitlines() == ["2", FACTORIES[cluster.name]]
    java_ledgers: list[int] = []
    our_ledgers: list[int] = []
    with BookKeeper(cluster.metadata_uri) as bk:
        for round_ in range(ROUNDS):
            handle, ledger_id = java_client.create_ledger(
                cluster.metadata_uri, digest="CRC32C", password=PASSWORD
            )
            java_ledgers.append(ledger_id)
            java_client.call("add", handle=handle, prefix=f"java-id-{round_}", count=ENTRIES)
            java_client.call("close", handle=handle)
            for _ in range(OURS_PER_ROUND):
                with bk.create_ledger(3, 2, 2, DigestType.CRC32C, PASSWORD) as lh:
                    for i in range(ENTRIES):
                        lh.add_entry(entry_data(f"py-id-{len(our_ledgers)}", i))
                our_ledgers.append(lh.ledger_id)
        everyone = java_ledgers + our_ledgers
        assert len(set(everyone)) == len(everyone), (java_ledgers, our_ledgers)
        assert set(everyone) <= set(bk.list_ledgers())
        for round_, ledger_id in enumerate(java_ledgers):
            with bk.open_ledger(ledger_id, password=PASSWORD) as rh:
                assert [e.data for e in rh.read_entries(0, ENTRIES - 1)] == [
                    entry_data(f"java-id-{round_}", i) for i in range(ENTRIES)
                ]
    for number, ledger_id in enumerate(our_ledgers):
        handle, _ = java_client.open_ledger(
            cluster.metadata_uri, ledger_id, digest="CRC32C", password=PASSWORD
        )
        assert java_client.read(handle, 0, ENTRIES - 1) == [
            entry_data(f"py-id-{number}", i) for i in range(ENTRIES)
        ]
    java_listed = {
        int(i)
        for i in re.findall(r"ledgerID: (\d+)", java_kit.shell(cluster.metadata_uri, "listledgers"))
    }
    assert set(everyone) <= java_listed
    assert set(everyone) <= {int(i) for i in our_shell(cluster.metadata_uri, "listledgers").split()}


def test_each_sides_simpletest_writes_ledgers_the_other_side_reads(
    cluster: InteropCluster, java_client: JavaClient, java_kit: JavaKit
) -> None:
    # Java's simpletest: 100 entries of 100 zero bytes, CRC32C, empty password, closed.
    output = java_kit.shell(
        cluster.metadata_uri, "simpletest", "-ensemble", "3", "-writeQuorum", "2", "-ackQuorum", "2",
        "-numEntries", "100",
    )  # fmt: skip
    written = re.search(r"100 entries written to ledger (\d+)", output)
    assert written is not None, output[-3000:]
    with (
        BookKeeper(cluster.metadata_uri) as bk,
        bk.open_ledger(int(written.group(1)), password=b"") as rh,
    ):
        assert rh.is_closed and rh.last_add_confirmed == 99
        assert [e.data for e in rh.read_entries(0, 99)] == [bytes(100)] * 100
    # Ours reads back and verifies what it wrote; then Java reads it too.
    ours = our_shell(cluster.metadata_uri, "simpletest", "-n", "100", "--entry-size", "64")
    ledger = re.search(r"ledger (\d+): wrote 100 entries", ours)
    assert ledger is not None, ours
    handle, opened = java_client.open_ledger(
        cluster.metadata_uri,
        int(ledger.group(1)),
        digest="CRC32C",
        password="simpletest",  # our simpletest's password (Java's has none)
    )
    assert opened["closed"] and opened["lac"] == 99
    assert [len(entry) for entry in java_client.read(handle, 0, 99)] == [64] * 100
