"""Long-poll reads (v3 READ_ENTRY with previousLAC / timeOut / ENTRY_PIGGYBACK): parked on the
bookie until the ledger's LAC passes previousLAC, woken by the writer's next add (issue 4)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.raw import recv_frame
from bookkeeper_py.wire import v3
from bookkeeper_py.wire.digest import DigestManager, master_key
from bookkeeper_py.wire.proto import bookkeeper_protocol_pb2 as pb


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1) as local:
        yield local


def long_poll(ledger_id: int, previous_lac: int, timeout_ms: int, txn: int) -> bytes:
    """Entry previous_lac + 1 piggybacked (the request names entry -1, as Java's client)."""
    return v3.encode(v3.long_poll_request(txn, ledger_id, previous_lac, timeout_ms))


def test_a_parked_reader_is_woken_by_the_next_add(cluster: LocalCluster) -> None:
    host, port = cluster.bookie_ids[0].rsplit(":", 1)
    with BookKeeper(cluster.metadata_uri) as client:
        writer = client.create_ledger(1, 1, 1, DigestType.CRC32C, b"lp")
        for i in range(5):
            writer.add_entry(b"entry %d" % i)  # entry 4 carries LAC 3
        digest = DigestManager(writer.ledger_id, DigestType.CRC32C, b"lp")
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(
                long_poll(writer.ledger_id, previous_lac=3, timeout_ms=20_000, txn=1)
            )
            connection.setblocking(False)
            time.sleep(0.3)
            with pytest.raises(BlockingIOError):
                connection.recv(1)  # parked: nothing answered while the LAC stays at 3
            connection.setblocking(True)
            writer.add_entry(b"entry 5")  # carries LAC 4: wakes the reader
            response = v3.decode_response(recv_frame(connection))
        read = response.readResponse
        assert (response.header.txnId, read.status, read.maxLAC) == (
            1,
            pb.EOK,
            4,
        )  # not the 20 s timeout
        assert digest.verify(read.body, 4).payload == b"entry 4"  # the next entry, piggybacked

        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(
                long_poll(writer.ledger_id, previous_lac=2, timeout_ms=20_000, txn=2)
            )
            already = v3.decode_response(recv_frame(connection)).readResponse  # LAC 4 > 2: at once
            connection.sendall(long_poll(writer.ledger_id, previous_lac=4, timeout_ms=200, txn=3))
            expired = v3.decode_response(
                recv_frame(connection)
            ).readResponse  # nothing new: times out
        assert (already.maxLAC, digest.verify(already.body, 3).payload) == (4, b"entry 3")
        assert (expired.status, expired.maxLAC, expired.HasField("body")) == (pb.EOK, 4, False)
        writer.close()


def test_an_explicit_lac_wakes_a_parked_reader(cluster: LocalCluster) -> None:
    host, port = cluster.bookie_ids[0].rsplit(":", 1)
    with BookKeeper(cluster.metadata_uri) as client:
        writer = client.create_ledger(1, 1, 1, DigestType.CRC32C, b"lp")
        for i in range(3):
            writer.add_entry(b"e%d" % i)  # the bookie's LAC is 1
        digest = DigestManager(writer.ledger_id, DigestType.CRC32C, b"lp")
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(
                long_poll(writer.ledger_id, previous_lac=1, timeout_ms=20_000, txn=7)
            )
            write_lac = pb.Request()
            write_lac.header.CopyFrom(v3.header(pb.WRITE_LAC, 8))
            body = write_lac.writeLacRequest
            body.ledgerId, body.lac = writer.ledger_id, 2
            body.masterKey = master_key(b"lp")
            body.body = digest.package_lac(2)
            connection.sendall(v3.encode(write_lac))
            answers = {}
            for _ in range(2):
                response = v3.decode_response(recv_frame(connection))
                answers[response.header.txnId] = response
        assert answers[8].writeLacResponse.status == pb.EOK
        assert answers[7].readResponse.maxLAC == 2  # woken by the explicit LAC, not the timeout
        assert digest.verify(answers[7].readResponse.body, 2).payload == b"e2"
        writer.close()


def test_a_java_style_long_poll_gets_the_entry_after_its_previous_lac_named_by_its_id(
    cluster: LocalCluster,
) -> None:
    """Issue 16, items 1 and 2: Java's client asks with entry -1 and ENTRY_PIGGYBACK (Java's
    bookie refuses any other entry id) and takes a piggybacked body only when the answer names
    the entry. Our bookie read entry -1 ("the last entry") and answered it under -1, so a Java
    reader got no entry from a long poll. The request below is built field by field, as Java's
    PerChannelBookieClient builds it."""
    host, port = cluster.bookie_ids[0].rsplit(":", 1)
    with BookKeeper(cluster.metadata_uri) as client:
        writer = client.create_ledger(1, 1, 1, DigestType.CRC32C, b"java")
        for i in range(10):
            writer.add_entry(b"entry %d" % i)  # the LAC is 8
        request = pb.Request()
        request.header.version = pb.VERSION_THREE
        request.header.operation = pb.READ_ENTRY
        request.header.txnId = 9
        read = request.readRequest
        read.ledgerId, read.entryId, read.previousLAC, read.timeOut = writer.ledger_id, -1, 4, 1000
        read.flag = pb.ReadRequest.ENTRY_PIGGYBACK
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(v3.encode(request))
            answer = v3.decode_response(recv_frame(connection)).readResponse
        digest = DigestManager(writer.ledger_id, DigestType.CRC32C, b"java")
        assert (answer.status, answer.maxLAC, answer.entryId) == (pb.EOK, 8, 5)
        assert digest.verify(answer.body, 5).payload == b"entry 5"
        writer.close()
