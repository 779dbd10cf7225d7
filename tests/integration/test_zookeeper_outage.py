"""ZooKeeper going away and coming back, and a bookie's session expiring: bookies register
again, writes resume, and no ledger metadata is lost or corrupted (issue 5)."""

from __future__ import annotations

import time

import pytest

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.waiting import wait_for
from bookkeeper_py.testing.zookeeper import ZooKeeperServer

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


def write_ledger(uri: str, entries: int) -> tuple[int, list[bytes]]:
    with BookKeeper(uri) as client:
        handle = client.create_ledger(3, 2, 2, DigestType.CRC32C, b"outage")
        data = [b"entry %d of ledger" % index for index in range(entries)]
        for item in data:
            handle.add_entry(item)
        handle.close()
        return handle.ledger_id, data


def read_ledger(uri: str, ledger_id: int, entries: int) -> list[bytes]:
    with BookKeeper(uri) as client, client.open_ledger(ledger_id, b"outage") as reader:
        return [entry.data for entry in reader.read_entries(0, entries - 1)]


def test_zookeeper_down_for_ten_seconds_then_back() -> None:
    with ZooKeeperServer() as zookeeper:
        uri = zookeeper.metadata_uri("/outage")
        with LocalCluster(3, metadata_uri=uri) as cluster:
            before, data = write_ledger(uri, 200)
            observer = MetadataClient.connect(uri)
            try:
                metadata_before = observer.read_ledger_metadata(before)
                zookeeper.stop()  # SIGKILL
                time.sleep(10)
                zookeeper.start()  # same port, same data
                wait_for(
                    lambda: sorted(observer.writable_bookies()) == sorted(cluster.bookie_ids),
                    60,
                    "every bookie registered again",
                )
                assert observer.read_ledger_metadata(before) == metadata_before
            finally:
                observer.close()
            after, more = write_ledger(uri, 200)  # writes resume
            assert read_ledger(uri, before, 200) == data
            assert read_ledger(uri, after, 200) == more


def test_an_expired_bookie_session_registers_again() -> None:
    with ZooKeeperServer() as zookeeper:
        uri = zookeeper.metadata_uri("/expiry")
        with LocalCluster(3, metadata_uri=uri) as cluster:
            observer = MetadataClient.connect(uri)
            try:
                frozen = cluster.bookie_ids[0]
                # Frozen past its 10 s session timeout, the bookie's session expires in ZooKeeper.
                cluster.pause_bookie(0)
                wait_for(
                    lambda: frozen not in observer.writable_bookies(), 60, "the session expired"
                )
                cluster.resume_bookie(0)
                wait_for(
                    lambda: frozen in observer.writable_bookies(), 60, "the bookie registered again"
                )
            finally:
                observer.close()
            ledger_id, data = write_ledger(uri, 100)
            assert read_ledger(uri, ledger_id, 100) == data
