"""Ledgers written by one implementation's client are read by the other's, on Java bookies, on
ours and on ensembles of both: every digest type, protocols v2 and v3."""

from __future__ import annotations

import pytest

from bookkeeper_py import BookKeeper, DigestType
from tests.interop.conftest import PASSWORD, InteropCluster
from tests.interop.javakit import JavaClient, entry_data

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.java]

DIGESTS = ("CRC32", "MAC", "CRC32C", "DUMMY")
ENTRIES = 40


def check_ensemble(cluster: InteropCluster, bookies: tuple[str, ...]) -> None:
    """The ledger is on the kind of bookies the cluster is for."""
    java = set(bookies) & cluster.java_bookie_ids
    if cluster.name == "java":
        assert java == set(bookies)
    elif cluster.name == "python":
        assert not java
    else:
        assert java and java != set(bookies)


def java_writes(
    java: JavaClient, cluster: InteropCluster, *, v3: bool, digest: str, prefix: str, count: int
) -> int:
    handle, ledger_id = java.create_ledger(
        cluster.metadata_uri, digest=digest, password=PASSWORD, v3=v3
    )
    assert java.call("add", handle=handle, prefix=prefix, count=count)["lastEntryId"] == count - 1
    closed = java.call("close", handle=handle)
    assert closed["closed"] and closed["lac"] == count - 1
    return ledger_id


def java_reads(
    java: JavaClient, cluster: InteropCluster, ledger_id: int, *, v3: bool, digest: str
) -> list[bytes]:
    handle, opened = java.open_ledger(
        cluster.metadata_uri, ledger_id, digest=digest, password=PASSWORD, v3=v3
    )
    assert opened["closed"]
    return java.read(handle, 0, opened["lac"])


@pytest.mark.parametrize("v3", [False, True], ids=["v2", "v3"])
@pytest.mark.parametrize("digest", DIGESTS)
def test_java_reads_what_our_client_wrote(
    cluster: InteropCluster, java_client: JavaClient, digest: str, v3: bool
) -> None:
    prefix = f"py-{cluster.name}-{digest}-{v3}"
    with BookKeeper(cluster.metadata_uri, use_v3=v3) as bk:
        with bk.create_ledger(3, 2, 2, digest_type=DigestType[digest], password=PASSWORD) as lh:
            futures = [lh.add_entry_async(entry_data(prefix, i)) for i in range(ENTRIES)]
            assert [future.result() for future in futures] == list(range(ENTRIES))
        check_ensemble(cluster, lh.metadata.ensembles[0][1])
    entries = java_reads(java_client, cluster, lh.ledger_id, v3=v3, digest=digest)
    assert entries == [entry_data(prefix, i) for i in range(ENTRIES)]


@pytest.mark.parametrize("v3", [False, True], ids=["v2", "v3"])
@pytest.mark.parametrize("digest", DIGESTS)
def test_our_client_reads_what_java_wrote(
    cluster: InteropCluster, java_client: JavaClient, digest: str, v3: bool
) -> None:
    prefix = f"java-{cluster.name}-{digest}-{v3}"
    ledger_id = java_writes(
        java_client, cluster, v3=v3, digest=digest, prefix=prefix, count=ENTRIES
    )
    with (
        BookKeeper(cluster.metadata_uri, use_v3=v3) as bk,
        bk.open_ledger(ledger_id, password=PASSWORD) as rh,
    ):
        assert rh.is_closed and rh.last_add_confirmed == ENTRIES - 1
        assert rh.metadata.digest_type == DigestType[digest]
        check_ensemble(cluster, rh.metadata.ensembles[0][1])
        assert rh.length == sum(len(entry_data(prefix, i)) for i in range(ENTRIES))
        entries = rh.read_entries(0, ENTRIES - 1)
    assert [entry.data for entry in entries] == [entry_data(prefix, i) for i in range(ENTRIES)]
