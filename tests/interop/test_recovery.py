"""Recovery and fencing across implementations: a ledger left open by one side's writer is
opened by the other side, which fences the bookies, recovers the entries past the LAC and closes
it; the writer's next add fails as fenced. Also opening without recovery reads an open ledger's
LAC from the bookies on both sides."""

from __future__ import annotations

import pytest

from bookkeeper_py import BookKeeper, DigestType, errors
from tests.interop.conftest import PASSWORD, InteropCluster
from tests.interop.javakit import JavaClient, JavaError, entry_data

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.java]

ENTRIES = 25
LEDGER_FENCED = -101  # BKException.Code.LedgerFencedException


def test_java_recovers_and_fences_a_ledger_our_writer_left_open(
    cluster: InteropCluster, java_client: JavaClient
) -> None:
    prefix = f"py-open-{cluster.name}"
    with BookKeeper(cluster.metadata_uri) as bk:
        writer = bk.create_ledger(3, 3, 2, digest_type=DigestType.CRC32C, password=PASSWORD)
        # One at a time, so that each entry carries the LAC of the one before.
        assert [writer.add_entry(entry_data(prefix, i)) for i in range(ENTRIES)] == list(
            range(ENTRIES)
        )

        # Without recovery, Java reads the LAC the bookies have: the last entry's LAC travels
        # with the next entry, so the bookies know up to ENTRIES - 2.
        _, opened = java_client.open_ledger(
            cluster.metadata_uri,
            writer.ledger_id,
            digest="CRC32C",
            password=PASSWORD,
            recovery=False,
        )
        assert not opened["closed"] and opened["lac"] == ENTRIES - 2

        recovered, opened = java_client.open_ledger(
            cluster.metadata_uri, writer.ledger_id, digest="CRC32C", password=PASSWORD
        )
        assert opened["closed"] and opened["lac"] == ENTRIES - 1
        assert java_client.read(recovered, 0, ENTRIES - 1) == [
            entry_data(prefix, i) for i in range(ENTRIES)
        ]

        with pytest.raises(errors.LedgerFencedError):
            writer.add_entry(b"after the fence")
        metadata = bk.get_ledger_metadata(writer.ledger_id)
        assert metadata.is_closed and metadata.last_entry_id == ENTRIES - 1
        with bk.open_ledger(writer.ledger_id, password=PASSWORD) as reader:
            assert [e.data for e in reader.read_entries(0, ENTRIES - 1)] == [
                entry_data(prefix, i) for i in range(ENTRIES)
            ]


def test_we_recover_and_fence_a_ledger_a_java_writer_left_open(
    cluster: InteropCluster, java_client: JavaClient
) -> None:
    prefix = f"java-open-{cluster.name}"
    writer, ledger_id = java_client.create_ledger(
        cluster.metadata_uri, digest="CRC32", password=PASSWORD, quorums=(3, 3, 2)
    )
    java_client.call("add", handle=writer, prefix=prefix, count=ENTRIES)

    with BookKeeper(cluster.metadata_uri) as bk:
        with bk.open_ledger_no_recovery(ledger_id, password=PASSWORD) as peek:
            assert not peek.is_closed and peek.last_add_confirmed == ENTRIES - 2
        with bk.open_ledger(ledger_id, password=PASSWORD) as reader:
            assert reader.is_closed and reader.last_add_confirmed == ENTRIES - 1
            assert [e.data for e in reader.read_entries(0, ENTRIES - 1)] == [
                entry_data(prefix, i) for i in range(ENTRIES)
            ]

    with pytest.raises(JavaError) as refused:
        java_client.call("add", handle=writer, prefix=prefix, first=ENTRIES, count=1)
    assert refused.value.code == LEDGER_FENCED, refused.value
    _, opened = java_client.open_ledger(
        cluster.metadata_uri, ledger_id, digest="CRC32", password=PASSWORD, recovery=False
    )
    assert opened["closed"] and opened["lac"] == ENTRIES - 1
