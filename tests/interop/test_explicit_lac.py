"""The explicit LAC (WRITE_LAC / READ_LAC): a writer that went idle after its last add sends its
LAC to the bookies, so a reader on the other implementation learns that the last entry is
confirmed without waiting for a next entry or the close."""

from __future__ import annotations

import time

import pytest

from bookkeeper_py import BookKeeper, DigestType
from tests.interop.conftest import PASSWORD, InteropCluster
from tests.interop.javakit import JavaClient, entry_data

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.java]

ENTRIES = 10
INTERVAL_MS = 100
DEADLINE_S = 20.0


def eventually(read: object, expected: int) -> int:
    """Reads (``read()``) until it returns ``expected`` or the deadline passes; the last value."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = read()  # type: ignore[operator]
        if value == expected or time.monotonic() > deadline:
            return int(value)
        time.sleep(0.1)


@pytest.mark.parametrize("v3", [False, True], ids=["v2", "v3"])
def test_we_read_the_explicit_lac_of_an_idle_java_writer(
    cluster: InteropCluster, java_client: JavaClient, v3: bool
) -> None:
    writer, ledger_id = java_client.create_ledger(
        cluster.metadata_uri, digest="MAC", password=PASSWORD, v3=v3, explicit_lac_ms=INTERVAL_MS
    )
    java_client.call("add", handle=writer, prefix="explicit", count=ENTRIES)
    with (
        BookKeeper(cluster.metadata_uri, use_v3=v3) as bk,
        bk.open_ledger_no_recovery(ledger_id, password=PASSWORD) as reader,
    ):
        # Piggybacked on the entries, the bookies know up to the one before the last.
        assert reader.read_last_add_confirmed() == ENTRIES - 2
        assert eventually(reader.read_explicit_last_add_confirmed, ENTRIES - 1) == ENTRIES - 1
        assert reader.last_add_confirmed == ENTRIES - 1
        last = reader.read_entries(ENTRIES - 1, ENTRIES - 1)
        assert [e.data for e in last] == [entry_data("explicit", ENTRIES - 1)]
    java_client.call("close", handle=writer)


@pytest.mark.parametrize("v3", [False, True], ids=["v2", "v3"])
def test_java_reads_the_explicit_lac_of_our_idle_writer(
    cluster: InteropCluster, java_client: JavaClient, v3: bool
) -> None:
    with BookKeeper(
        cluster.metadata_uri, use_v3=v3, explicit_lac_interval_s=INTERVAL_MS / 1000
    ) as bk:
        writer = bk.create_ledger(3, 2, 2, digest_type=DigestType.MAC, password=PASSWORD)
        for i in range(ENTRIES):
            writer.add_entry(entry_data("explicit", i))
        reader, opened = java_client.open_ledger(
            cluster.metadata_uri,
            writer.ledger_id,
            digest="MAC",
            password=PASSWORD,
            recovery=False,
            v3=v3,
        )
        assert not opened["closed"]

        def explicit() -> int:
            return int(java_client.call("readExplicitLastConfirmed", handle=reader)["lac"])

        assert eventually(explicit, ENTRIES - 1) == ENTRIES - 1
        assert java_client.read(reader, ENTRIES - 1, ENTRIES - 1) == [
            entry_data("explicit", ENTRIES - 1)
        ]
        writer.close()
