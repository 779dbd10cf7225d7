"""Tailing a live writer with long polls across implementations (v3 READ_ENTRY with
ENTRY_PIGGYBACK: the reader names its previous LAC and the bookie answers with the entry after
it), and the explicit LAC an idle writer sends, read by the other side."""

from __future__ import annotations

import base64
import time

import pytest

from bookkeeper_py import BookKeeper, DigestType
from tests.interop.conftest import PASSWORD, InteropCluster
from tests.interop.javakit import JavaClient, entry_data

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.java]

FOLLOWED = 30
PAUSE_S = 0.02


def test_java_follows_our_writer_with_long_polls(
    cluster: InteropCluster, java_client: JavaClient
) -> None:
    prefix = f"py-tail-{cluster.name}"
    with BookKeeper(cluster.metadata_uri) as bk:
        writer = bk.create_ledger(3, 3, 2, digest_type=DigestType.CRC32C, password=PASSWORD)
        # Java's client gives up a long poll that every bookie answers ENOLEDGER (Java bookies
        # do for a ledger they hold nothing of): its first entry is written before it follows.
        writer.add_entry(entry_data(prefix, 0))
        tail = java_client.submit(
            "tail",
            uri=cluster.metadata_uri,
            digest="CRC32C",
            password=PASSWORD,
            ledgerId=writer.ledger_id,
            count=FOLLOWED,
        )
        time.sleep(0.5)  # let the reader park its first long poll
        # One more entry than followed: entry i is confirmed by the LAC entry i + 1 carries.
        for i in range(1, FOLLOWED + 1):
            writer.add_entry(entry_data(prefix, i))
            time.sleep(PAUSE_S)
        answer = JavaClient.result(tail)
        writer.close()
    assert [base64.b64decode(e["data"]) for e in answer["entries"]] == [
        entry_data(prefix, i) for i in range(FOLLOWED)
    ]
    # Each long poll brings its entry (previousLAC + 1) with it. On our bookies Java needed
    # about 1.3 calls an entry while they read entry -1 instead.
    assert answer["calls"] == FOLLOWED, answer["calls"]


@pytest.mark.parametrize("written_before", [0, 3], ids=["from-creation", "after-3-entries"])
def test_we_follow_a_java_writer_with_long_polls(
    cluster: InteropCluster, java_client: JavaClient, written_before: int
) -> None:
    """From creation, the first long polls meet bookies that hold nothing of the ledger (Java
    bookies answer ENOLEDGER at once) and wait for entries; after a few entries the bookies
    have the ledger and park the polls (Java bookies refused ours with EBADREQ while they named
    the entry instead of -1)."""
    prefix = f"java-tail-{cluster.name}-{written_before}"
    writer, ledger_id = java_client.create_ledger(
        cluster.metadata_uri, digest="CRC32C", password=PASSWORD, quorums=(3, 3, 2)
    )
    if written_before:
        java_client.call("add", handle=writer, prefix=prefix, count=written_before)
    followed: list[bytes] = []
    with BookKeeper(cluster.metadata_uri) as bk:
        reader = bk.open_ledger_no_recovery(ledger_id, password=PASSWORD)
        adds = java_client.submit(
            "add",
            handle=writer,
            prefix=prefix,
            first=written_before,
            count=FOLLOWED + 1 - written_before,
            pauseMs=int(PAUSE_S * 1000),
        )
        for entry in reader.follow(0, timeout_ms=10_000):
            followed.append(entry.data)
            if len(followed) == FOLLOWED:
                break
        JavaClient.result(adds)
        reader.close()
    assert followed == [entry_data(prefix, i) for i in range(FOLLOWED)]
    java_client.call("close", handle=writer)
