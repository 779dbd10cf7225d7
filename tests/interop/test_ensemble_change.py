"""Ensemble changes across implementations, on the mixed cluster (two Java bookies, two of ours,
ensembles of three): a writer whose bookie of the other kind stops replaces it with the spare,
and the other side's client reads both fragments."""

from __future__ import annotations

import pytest

from bookkeeper_py import BookKeeper, DigestType
from tests.interop.conftest import PASSWORD, InteropCluster
from tests.interop.javakit import JavaClient, entry_data

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.java]

HALF = 20


@pytest.fixture
def mixed(interop_clusters: dict[str, InteropCluster]) -> InteropCluster:
    return interop_clusters["mixed"]


def test_our_writer_replaces_a_stopped_java_bookie_and_java_reads_both_fragments(
    mixed: InteropCluster, java_client: JavaClient
) -> None:
    prefix = "py-change"
    with BookKeeper(mixed.metadata_uri) as bk:
        writer = bk.create_ledger(3, 2, 2, digest_type=DigestType.CRC32, password=PASSWORD)
        for i in range(HALF):
            writer.add_entry(entry_data(prefix, i))
        (java_member,) = [
            b for b in mixed.java_bookies if b.bookie_id in writer.metadata.ensembles[0][1]
        ][:1]
        java_member.stop()
        try:
            for i in range(HALF, 2 * HALF):
                writer.add_entry(entry_data(prefix, i))
            writer.close()
            ensembles = bk.get_ledger_metadata(writer.ledger_id).ensembles
        finally:
            java_member.start()
    assert len(ensembles) >= 2 and java_member.bookie_id not in ensembles[-1][1]
    handle, opened = java_client.open_ledger(
        mixed.metadata_uri, writer.ledger_id, digest="CRC32", password=PASSWORD
    )
    assert opened["lac"] == 2 * HALF - 1
    assert java_client.read(handle, 0, 2 * HALF - 1) == [
        entry_data(prefix, i) for i in range(2 * HALF)
    ]
    with BookKeeper(mixed.metadata_uri) as bk:
        java_member.wait_registered(bk.client.metadata)


def test_a_java_writer_replaces_a_stopped_bookie_of_ours_and_we_read_both_fragments(
    mixed: InteropCluster, java_client: JavaClient
) -> None:
    assert mixed.python is not None
    prefix = "java-change"
    writer, ledger_id = java_client.create_ledger(
        mixed.metadata_uri, digest="CRC32", password=PASSWORD
    )
    java_client.call("add", handle=writer, prefix=prefix, count=HALF)
    with BookKeeper(mixed.metadata_uri) as bk:
        first = bk.get_ledger_metadata(ledger_id).ensembles[0][1]
        (ours,) = [b for b in mixed.python.bookies if b.bookie_id in first][:1]
        mixed.python.stop_bookie(ours.index)
        try:
            java_client.call("add", handle=writer, prefix=prefix, first=HALF, count=HALF)
            assert java_client.call("close", handle=writer)["lac"] == 2 * HALF - 1
        finally:
            mixed.python.start_bookie(ours.index)
        ensembles = bk.get_ledger_metadata(ledger_id).ensembles
        assert len(ensembles) >= 2 and ours.bookie_id not in ensembles[-1][1]
        with bk.open_ledger(ledger_id, password=PASSWORD) as rh:
            assert [e.data for e in rh.read_entries(0, 2 * HALF - 1)] == [
                entry_data(prefix, i) for i in range(2 * HALF)
            ]
