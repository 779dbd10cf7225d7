"""Graceful shutdown: a stopping bookie answers what it took in, loses nothing it acknowledged,
and leaves no long poll hanging."""

from __future__ import annotations

import socket
import threading

from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.raw import frame, recv_frame
from bookkeeper_py.wire.proto import bookkeeper_protocol_pb2 as pb

KEY = bytes([0x55]) * 20
LEDGER = 9_200_000_001


def entry(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    """Reference 2.4 packaging with the DUMMY digest: ledger, entry, LAC, length, payload."""
    return (
        ledger_id.to_bytes(8, "big")
        + entry_id.to_bytes(8, "big")
        + (entry_id - 1).to_bytes(8, "big", signed=True)
        + (len(payload) * (entry_id + 1)).to_bytes(8, "big")
        + payload
    )


def stop_in_background(cluster: LocalCluster) -> threading.Thread:
    stopper = threading.Thread(target=cluster.stop_bookie, args=(0,))
    stopper.start()
    return stopper


def test_a_parked_long_poll_is_answered_before_the_bookie_stops() -> None:
    with LocalCluster(1) as cluster:
        host, port = cluster.bookie_ids[0].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(frame(bytes.fromhex("02010000") + KEY + entry(LEDGER, 0, b"e0")))
            assert recv_frame(connection)[4:8] == bytes(4)
        with socket.create_connection((host, int(port)), timeout=30) as connection:  # v3
            request = pb.Request()
            request.header.version = pb.VERSION_THREE
            request.header.operation = pb.READ_ENTRY
            request.header.txnId = 1
            read = request.readRequest
            read.ledgerId, read.entryId, read.previousLAC, read.timeOut = LEDGER, 1, 0, 60_000
            body = request.SerializeToString()
            connection.sendall(frame(body))
            stopper = stop_in_background(cluster)
            answer = pb.Response()
            answer.ParseFromString(recv_frame(connection))
            stopper.join(60)
            assert answer.status == pb.EOK and answer.readResponse.status == pb.EOK
            assert answer.readResponse.maxLAC == -1  # unchanged: answered as a timeout would be
            assert not answer.readResponse.HasField("body")
            assert connection.recv(1) == b""  # then closed


def test_adds_taken_in_are_answered_and_durable_across_a_graceful_stop() -> None:
    count = 3000
    payloads = [b"entry %d " % i * 20 for i in range(count)]
    with LocalCluster(1) as cluster:
        host, port = cluster.bookie_ids[0].rsplit(":", 1)
        answered: list[int] = []
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(
                b"".join(
                    frame(bytes.fromhex("02010000") + KEY + entry(LEDGER, i, payloads[i]))
                    for i in range(count)
                )
            )
            first = recv_frame(connection)
            stopper = stop_in_background(cluster)
            answers = [first]
            while True:
                try:
                    answers.append(recv_frame(connection))
                except ConnectionError:
                    break
            stopper.join(60)
        for answer in answers:
            assert answer[:8] == bytes.fromhex("0201000000000000")  # ADD_ENTRY, EOK
            assert answer[8:16] == LEDGER.to_bytes(8, "big")
            answered.append(int.from_bytes(answer[16:24], "big"))
        assert answered == list(range(len(answered)))  # one journal: answered in order
        cluster.start_bookie(0)
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            for entry_id in answered:
                connection.sendall(
                    frame(
                        bytes.fromhex("02020000")
                        + LEDGER.to_bytes(8, "big")
                        + entry_id.to_bytes(8, "big")
                    )
                )
                reply = recv_frame(connection)
                assert reply[4:8] == bytes(4), entry_id
                assert reply[24:] == entry(LEDGER, entry_id, payloads[entry_id])
