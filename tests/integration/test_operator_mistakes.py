"""Operator mistakes that used to destroy acknowledged data are refused in one line, touching
nothing: a second bookie on a live bookie's directories, or under a live bookie's id."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bookkeeper_py import BookKeeper
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.local_cluster import free_port
from bookkeeper_py.testing.raw import recv_frame
from bookkeeper_py.testing.zookeeper import ZooKeeperServer
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.status import StatusCode

from .test_cli_errors import bookkeeper, one_line_error

PASSWORD = b"pw"


def snapshot(directory: str) -> dict[str, tuple[int, str]]:
    """(size, SHA-256) of every file under ``directory``. Contents, not modification times: the
    live bookie's idle journal writes zeros ahead of its records over preallocated zeros, which
    moves the file's mtime and changes no byte."""
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as file:
                digest = hashlib.file_digest(file, "sha256").hexdigest()
            found[os.path.relpath(path, directory)] = (os.path.getsize(path), digest)
    return found


def registration(uri: str, bookie_id: str) -> bytes:
    metadata = MetadataClient.connect(uri)
    try:
        return metadata.store.get(f"{metadata.root}/available/{bookie_id}")[0]
    finally:
        metadata.close()


def write(uri: str, entries: int) -> int:
    with BookKeeper(uri) as bk:
        writer = bk.create_ledger(3, 3, 3, password=PASSWORD)
        futures = [writer.add_entry_async(b"entry-%d" % i) for i in range(entries)]
        assert [future.result() for future in futures] == list(range(entries))
        return writer.ledger_id  # left open: the live bookie's journal holds its only copies


@pytest.mark.slow
def test_a_second_bookie_on_a_live_bookies_directories_is_refused_and_loses_nothing(
    tmp_path: Path,
) -> None:
    with LocalCluster(3, base_directory=str(tmp_path)) as cluster:
        uri = cluster.metadata_uri
        live = cluster.bookies[0]
        ledger = write(uri, 200)
        registered = registration(uri, live.bookie_id)
        ledger_directory = os.path.join(live.directory, "ledgers")
        before = snapshot(live.directory)
        result = bookkeeper(
            "bookie", "--metadata-uri", uri, "--host", "127.0.0.1",
            "--port", str(free_port()), "--bookie-id", live.bookie_id,
            "--journal-dir", live.journal_directory, "--ledger-dir", ledger_directory,
        )  # fmt: skip
        error = one_line_error(result)
        assert f"journal directory (journalDirectories) {live.journal_directory} is in use" in error
        assert f"pid {live.process.pid}" in error and live.bookie_id in error  # type: ignore[union-attr]
        after = snapshot(live.directory)
        for name in ("bookie.log",):  # the live bookie may log meanwhile
            before.pop(name, None), after.pop(name, None)
        assert after == before  # no .txn added or deleted, no lastMark moved
        assert registration(uri, live.bookie_id) == registered
        # The live bookie kept every entry it acknowledged, across a SIGKILL and a restart.
        cluster.kill_bookie(0)
        cluster.start_bookie(0)
        for index in (1, 2):
            cluster.stop_bookie(index)
        with BookKeeper(uri) as bk:
            reader = bk.open_ledger_no_recovery(ledger, password=PASSWORD)
            assert [e.data for e in reader.read_unconfirmed_entries(0, 199)] == [
                b"entry-%d" % i for i in range(200)
            ]


@pytest.mark.slow
def test_a_copy_of_a_live_bookie_under_its_id_is_refused(tmp_path: Path) -> None:
    """A copy of a live bookie's directories, seen at the same paths (as on another machine with
    the same configuration): its cookies match and its locks are free, but the bookie id is
    registered by a live process. It waits the session timeout, then refuses, changing nothing."""
    with LocalCluster(3, base_directory=str(tmp_path / "cluster")) as cluster:
        uri = cluster.metadata_uri
        live = cluster.bookies[1]
        write(uri, 50)
        registered = registration(uri, live.bookie_id)
        copy = tmp_path / "copy"
        shutil.copytree(live.directory, copy)  # the lock file too, naming the live process
        ledgers = os.path.join(live.directory, "ledgers")
        command = (
            f"mount --bind {copy} {live.directory} && exec {sys.executable} -m bookkeeper_py "
            f"bookie --metadata-uri {uri} --host 127.0.0.1 --port {free_port()} "
            f"--bookie-id {live.bookie_id} --journal-dir {live.journal_directory} "
            f"--ledger-dir {ledgers}"
        )
        result = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", command],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        error = one_line_error(result)
        assert f"bookie id {live.bookie_id} is registered by another live process" in error
        assert f"127.0.0.1:{live.port}" in error
        assert registration(uri, live.bookie_id) == registered
        assert live.running


@pytest.mark.slow
def test_a_killed_bookie_restarts_at_once_though_its_registration_lingers(
    tmp_path: Path, zookeeper: ZooKeeperServer
) -> None:
    uri = zookeeper.metadata_uri("/restart-at-once")
    with LocalCluster(3, metadata_uri=uri, base_directory=str(tmp_path)) as cluster:
        live = cluster.bookies[2]
        first = registration(uri, live.bookie_id)
        os.kill(live.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
        live.process.wait(10)  # type: ignore[union-attr]
        assert registration(uri, live.bookie_id) == first  # the session outlives the process
        started = time.monotonic()
        cluster.start_bookie(2)  # replaced at once: the free directory lock proved it dead
        waited = time.monotonic() - started
        assert registration(uri, live.bookie_id) != first  # a new incarnation
        assert waited < 9.0, waited  # not the 11 s a stranger's registration is waited on


def entry_bytes(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    """An entry as a v2 client sends it (the bookie reads only the two ids at its head)."""
    return struct.pack(">qqqq", ledger_id, entry_id, -1, len(payload)) + payload


def ask(connection: socket.socket, request: bytes) -> v2.Response:
    connection.sendall(request)
    return v2.decode_response(recv_frame(connection))


@pytest.mark.slow
def test_negative_entry_ids_are_refused_on_every_path(tmp_path: Path) -> None:
    """An add of entry -5 used to be stored: after a checkpoint a read of entry -1 ("the last
    entry") answered ENOENTRY although entries 0..4 existed."""
    ledger, key = 7_000_001, b"k" * 20
    with LocalCluster(1, base_directory=str(tmp_path)) as cluster:
        address = ("127.0.0.1", cluster.bookies[0].port)
        with socket.create_connection(address, timeout=10) as connection:
            for entry_id in range(5):
                add = v2.encode_add_request(key, entry_bytes(ledger, entry_id, b"x%d" % entry_id))
                assert ask(connection, add).status == StatusCode.EOK
            negative = v2.encode_add_request(key, entry_bytes(ledger, -5, b"bad"))
            assert ask(connection, negative).status == StatusCode.EBADREQ
            recovery = v2.encode_add_request(
                key, entry_bytes(ledger, -2, b"bad"), v2.FLAG_RECOVERY_ADD
            )
            assert ask(connection, recovery).status == StatusCode.EBADREQ
            assert ask(connection, v2.encode_read_request(ledger, -2)).status == (
                StatusCode.EBADREQ
            )
            assert ask(connection, v2.encode_read_request(-3, 0)).status == StatusCode.EBADREQ
            batch = v2.encode_batch_read_request(ledger, -4, 1, 10, 1 << 20)
            assert ask(connection, batch).status == StatusCode.EBADREQ
        cluster.restart_bookie(0)  # a checkpoint on the way down, the index read back on start
        with socket.create_connection(address, timeout=10) as connection:
            last = ask(connection, v2.encode_read_request(ledger, -1))
            assert last.status == StatusCode.EOK
            assert struct.unpack_from(">qq", last.body) == (ledger, 4)  # the entry's own ids
            assert last.body.endswith(b"x4")
