"""ZooKeeper going away and coming back, and a bookie's session expiring: bookies register
again, writes resume, and no ledger metadata is lost or corrupted (issue 5)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.errors import MetadataUnavailableError
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


def test_client_operations_end_by_their_deadline_while_zookeeper_is_away() -> None:
    """Issue 15: every client operation has a deadline. With ZooKeeper gone, kazoo queues the
    requests until it is back, for ever: creating or closing a ledger hung. Each metadata request
    now ends after ``metadata_timeout_s`` with a one-line ``MetadataUnavailableError``; reads of a
    closed ledger need no metadata and go on; once ZooKeeper is back, so does everything."""
    with ZooKeeperServer() as zookeeper:
        uri = zookeeper.metadata_uri("/deadline")
        with (
            LocalCluster(3, metadata_uri=uri) as cluster,
            BookKeeper(uri, metadata_timeout_s=2) as client,
        ):
            closed = client.create_ledger(3, 2, 2, DigestType.CRC32C, b"deadline")
            closed.add_entry(b"before")
            closed.close()
            reader = client.open_ledger(closed.ledger_id, b"deadline")
            writer = client.create_ledger(3, 2, 2, DigestType.CRC32C, b"deadline")
            writer.add_entry(b"open")
            zookeeper.stop()
            # Each call runs in a thread waited on for 60 s: a hang fails the test, not CI.
            with ThreadPoolExecutor(1) as pool:
                try:
                    create = pool.submit(
                        client.create_ledger, 3, 2, 2, DigestType.CRC32C, b"deadline"
                    )
                    # Queued while kazoo reconnects (no answer by the deadline), or sent on the
                    # socket that just broke (its outcome unknown): either way one line, in time.
                    with pytest.raises(
                        MetadataUnavailableError,
                        match=r"no answer from ZooKeeper|outcome is unknown",
                    ):
                        create.result(60)
                    with pytest.raises(MetadataUnavailableError, match="outcome is unknown"):
                        pool.submit(writer.close).result(60)
                    read = pool.submit(reader.read_entries, 0, 0)
                    assert [e.data for e in read.result(60)] == [b"before"]
                finally:
                    zookeeper.start()
            with MetadataClient.connect(uri) as observer:
                wait_for(
                    lambda: len(observer.writable_bookies()) == 3, 60, "bookies registered again"
                )
            # The client's own session reconnects on its back-off (up to 2 s between tries): a
            # create may still find it reconnecting, and says so in one line; one soon works.
            created: list[object] = []

            def create() -> bool:
                try:
                    created.append(client.create_ledger(3, 2, 2, DigestType.CRC32C, b"deadline"))
                except MetadataUnavailableError:
                    return False
                return True

            wait_for(create, 60, "a ledger created once ZooKeeper is back")
            again = created[0]
            assert again.add_entry(b"after") == 0  # type: ignore[attr-defined]
            again.close()
            assert cluster.bookie_ids
