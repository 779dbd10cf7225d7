"""The advanced API over real bookies (issue 6): caller-chosen entry and ledger ids
(``create_ledger_adv``), DEFERRED_SYNC with ``force()``, custom metadata, rack-aware placement."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bookkeeper_py import BookKeeper, DigestType, LedgerState, errors
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.testing import LocalCluster

from .workloads import payload


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(4) as local:
        yield local


def test_caller_chosen_entry_ids_in_any_order(cluster: LocalCluster) -> None:
    with BookKeeper(cluster.metadata_uri) as client:
        writer = client.create_ledger_adv(3, 2, 2, DigestType.CRC32C, b"adv")
        ids = [4, 1, 0, 3, 2, 7, 6, 5]
        futures = {i: writer.add_entry_async(i, payload(i, 50)) for i in ids}
        assert {i: f.result(30) for i, f in futures.items()} == {i: i for i in ids}
        with pytest.raises(errors.DuplicateEntryIdError):
            writer.add_entry(3, b"again")
        writer.close()
        reader = client.open_ledger(writer.ledger_id, b"adv")
        assert [e.data for e in reader.read_entries(0, 7)] == [payload(i, 50) for i in range(8)]


def test_a_chosen_ledger_id_is_used_once(cluster: LocalCluster) -> None:
    with BookKeeper(cluster.metadata_uri) as client:
        chosen = 2**40 + 17
        writer = client.create_ledger_adv(2, 2, 2, password=b"id", ledger_id=chosen)
        assert writer.ledger_id == chosen
        writer.add_entry(0, b"first")
        with pytest.raises(errors.LedgerExistsError, match=str(chosen)):
            client.create_ledger_adv(2, 2, 2, password=b"id", ledger_id=chosen)
        writer.close()
        assert client.get_ledger_metadata(chosen).last_entry_id == 0


def test_deferred_sync_entries_are_confirmed_by_force(cluster: LocalCluster) -> None:
    with BookKeeper(cluster.metadata_uri) as client:
        writer = client.create_ledger(3, 3, 2, DigestType.CRC32C, b"ds", deferred_sync=True)
        for future in [writer.add_entry_async(payload(i, 30)) for i in range(100)]:
            future.result(30)
        assert writer.last_add_confirmed == -1  # acknowledged, not yet forced
        reader = client.open_ledger_no_recovery(writer.ledger_id, b"ds")
        assert reader.read_last_add_confirmed() == -1  # every entry carried LAC -1
        assert writer.force() == 99
        assert writer.last_add_confirmed == 99
        writer.add_entry(b"after the force")  # carries LAC 99
        assert reader.read_last_add_confirmed() == 99
        writer.add_entry(b"closed with a force")
        writer.close()  # forces first: both later entries are in the closed ledger
        metadata = client.get_ledger_metadata(writer.ledger_id)
        assert metadata.state == LedgerState.CLOSED and metadata.last_entry_id == 101
        entries = client.open_ledger(writer.ledger_id, b"ds").read_entries(0, 101)
        assert entries[100].data == b"after the force" and entries[42].data == payload(42, 30)


def test_custom_metadata_and_rack_aware_placement(cluster: LocalCluster) -> None:
    racks = {bookie: f"/rack{i % 2}" for i, bookie in enumerate(cluster.bookie_ids)}
    with BookKeeper(cluster.metadata_uri, placement="rackaware", network_topology=racks) as client:
        for _ in range(10):
            writer = client.create_ledger(
                4, 2, 2, password=b"rk", custom_metadata={"owner": b"test", "bin": b"\x00\xff"}
            )
            ((_, ensemble),) = writer.metadata.ensembles
            for first in range(4):
                quorum = [ensemble[i] for i in write_set(first, 4, 2)]
                assert {racks[b] for b in quorum} == {"/rack0", "/rack1"}
            writer.close()
            stored = client.get_ledger_metadata(writer.ledger_id)
            assert stored.custom_metadata == {"owner": b"test", "bin": b"\x00\xff"}
