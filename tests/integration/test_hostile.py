"""Hostile or broken peers: a client that never reads its answers, and 10,000 connections opened
and dropped with garbage. The bookie keeps serving others, its memory stays bounded and it leaks
no file descriptors (issue 4)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import psutil
import pytest

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.wire import v2


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1) as local:
        yield local


def bookie_process(cluster: LocalCluster) -> psutil.Process:
    process = cluster.bookies[0].process
    assert process is not None
    return psutil.Process(process.pid)


def served(cluster: LocalCluster) -> bool:
    with BookKeeper(cluster.metadata_uri) as client:
        handle = client.create_ledger(1, 1, 1, DigestType.CRC32C, b"ok")
        handle.add_entry(b"still serving")
        handle.close()
        return (
            client.open_ledger(handle.ledger_id, b"ok").read_entries(0, 0)[0].data
            == b"still serving"
        )


@pytest.mark.slow
def test_a_client_that_never_reads_cannot_grow_the_bookie(cluster: LocalCluster) -> None:
    with BookKeeper(cluster.metadata_uri) as client:
        handle = client.create_ledger(1, 1, 1, DigestType.CRC32C, b"big")
        handle.add_entry(b"x" * 65536)
        handle.close()
    process = bookie_process(cluster)
    baseline = process.memory_info().rss
    host, port = cluster.bookie_ids[0].rsplit(":", 1)
    flood = (
        v2.encode_read_request(handle.ledger_id, 0) * 30_000
    )  # ~2 GB of answers if all were queued
    with socket.create_connection((host, int(port)), timeout=10) as greedy:
        greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        greedy.setblocking(False)
        sent = 0
        for _ in range(2000):  # push requests until the bookie stops reading them
            try:
                sent += greedy.send(flood[sent : sent + 65536])
            except BlockingIOError:
                time.sleep(0.005)
            if sent >= len(flood):
                break
        time.sleep(1.0)
        grown = process.memory_info().rss - baseline
        assert served(cluster)  # others are served while the greedy client is stuck
    assert grown < 256 * 1024 * 1024, (
        f"the bookie grew by {grown / 1e6:.0f} MB for a client that never reads"
    )
    assert served(cluster)


@pytest.mark.slow
def test_ten_thousand_connections_opened_and_dropped(cluster: LocalCluster) -> None:
    process = bookie_process(cluster)
    baseline_fds = process.num_fds()
    host, port = cluster.bookie_ids[0].rsplit(":", 1)
    garbage = [
        b"",
        b"\x00\x00",
        b"\xff\xff\xff\xff",
        b"\x00\x00\x00\x08garbage!",
        b"\x00\x00\x00\x04\x02\x63\x00\x00",
    ]
    for index in range(10_000):
        with socket.create_connection((host, int(port)), timeout=10) as connection:
            payload = garbage[index % len(garbage)]
            if payload:
                connection.sendall(payload)
    assert served(cluster)
    for _ in range(100):  # closes are processed asynchronously; give them up to 10 s
        if process.num_fds() <= baseline_fds + 10:
            break
        time.sleep(0.1)
    assert process.num_fds() <= baseline_fds + 10


@pytest.mark.slow
def test_idle_connections_are_closed() -> None:
    with LocalCluster(1, bookie_args=["--idle-timeout-s", "1"]) as local:
        host, port = local.bookie_ids[0].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as idle:
            assert idle.recv(1) == b""  # closed by the bookie, well before the 30 s socket timeout
        assert served(local)  # and it still serves new connections


@pytest.mark.slow
def test_a_writer_past_a_connections_bound_is_slowed_not_refused() -> None:
    """The client's throttle below the bookie's bound of unanswered requests per connection, and
    above it: either way every add is acknowledged, in order (past the bound the bookie stops
    reading the connection until half are answered, rather than answering ETOOMANYREQUESTS)."""
    with LocalCluster(1, bookie_args=["--max-pending-per-connection", "20"]) as local:
        for throttle in (10, 50):
            with BookKeeper(local.metadata_uri, throttle=throttle) as client:
                writer = client.create_ledger(1, 1, 1, DigestType.CRC32C, b"t")
                futures = [writer.add_entry_async(b"%d" % i) for i in range(1000)]
                assert [future.result() for future in futures] == list(range(1000))
                writer.close()
                with client.open_ledger(writer.ledger_id, b"t") as reader:
                    assert reader.last_add_confirmed == 999


def test_truncated_frames_close_only_their_connection_and_lose_nothing(
    cluster: LocalCluster,
) -> None:
    with BookKeeper(cluster.metadata_uri) as client:
        handle = client.create_ledger(1, 1, 1, DigestType.CRC32C, b"keep")
        stored = [b"stored %d" % index for index in range(50)]
        for data in stored:
            handle.add_entry(data)
        handle.close()
    host, port = cluster.bookie_ids[0].rsplit(":", 1)
    ledger = handle.ledger_id.to_bytes(8, "big")
    cut_inside_a_frame = [
        b"\x02\x02\x00\x00" + ledger,  # a v2 read without its entry id
        b"\x02\x01\x00\x00" + b"k" * 20 + ledger,  # a v2 add whose entry stops after the ledger id
        b"\x02\x02\x00\x01" + ledger + bytes(8) + b"key",  # a fencing read with 3 of 20 key bytes
        bytes.fromhex("0a0608"),  # a v3 header cut short
    ]
    for body in cut_inside_a_frame:
        with socket.create_connection((host, int(port)), timeout=10) as connection:
            connection.sendall(len(body).to_bytes(4, "big") + body)
            assert connection.recv(1) == b""  # closed by the bookie
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall((100).to_bytes(4, "big") + b"ten bytes.")  # then hang up mid-frame
    assert served(cluster)
    with BookKeeper(cluster.metadata_uri) as client:
        reader = client.open_ledger(handle.ledger_id, b"keep")
        assert [entry.data for entry in reader.read_entries(0, 49)] == stored
