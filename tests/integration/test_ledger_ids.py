"""Issue 16, item 3: ledger ids when another kind of client allocates them too. Java's flat
layout counts ids under ``<root>/ID-`` (we used ``<root>/idgen/ID-``, so both kinds of client
handed out the same ids), and a generated id found taken is followed by the next one, as
BookKeeper's LedgerCreateOp does (we failed with LedgerExistsError)."""

from __future__ import annotations

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.zookeeper import ZooKeeperServer


def test_a_generated_id_found_taken_is_followed_by_the_next_one() -> None:
    with LocalCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as client:
        with MetadataClient.connect(cluster.metadata_uri) as metadata:
            first = metadata.generate_ledger_id()
        for taken in (first + 1, first + 2, first + 3):  # as if another generator made them
            client.create_ledger_adv(3, 2, 2, DigestType.CRC32C, b"ids", ledger_id=taken).close()
        handle = client.create_ledger(3, 2, 2, DigestType.CRC32C, b"ids")
        assert handle.ledger_id == first + 4
        assert handle.add_entry(b"x") == 0
        handle.close()


def java_flat_ledger_id(metadata: MetadataClient) -> int:
    """An id allocated as Java's FlatLedgerManagerFactory does: the sequence number of an
    ephemeral sequential ``<root>/ID-`` node, deleted at once."""
    path = metadata.store.create(f"{metadata.root}/ID-", ephemeral=True, sequential=True)
    metadata.store.delete(path)
    return int(path.rsplit("ID-", 1)[1])


def test_flat_layout_ids_are_drawn_from_javas_counter(zookeeper: ZooKeeperServer) -> None:
    uri = zookeeper.metadata_uri("/flat-ids").replace("zk+hierarchical", "zk+flat")
    with LocalCluster(3, metadata_uri=uri) as cluster, BookKeeper(uri) as client:
        with MetadataClient.connect(cluster.metadata_uri) as metadata:
            ids = []
            for _ in range(20):  # a Java client and ours, taking turns
                java_id = java_flat_ledger_id(metadata)
                client.create_ledger_adv(
                    3, 2, 2, DigestType.CRC32C, b"ids", ledger_id=java_id
                ).close()
                ours = client.create_ledger(3, 2, 2, DigestType.CRC32C, b"ids")
                ours.close()
                ids += [java_id, ours.ledger_id]
        assert len(set(ids)) == 40
        assert sorted(client.list_ledgers()) == sorted(ids)
