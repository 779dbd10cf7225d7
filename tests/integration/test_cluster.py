"""End-to-end tests over real bookie processes on loopback (``LocalCluster``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bookkeeper_py import BookKeeper, DigestType, LedgerState
from bookkeeper_py.errors import (
    IncorrectParameterError,
    LedgerFencedError,
    MetadataUnavailableError,
    NoSuchEntryError,
    NotEnoughBookiesError,
    UnauthorizedAccessError,
)
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.local_cluster import free_port
from bookkeeper_py.testing.raw import recv_frame
from bookkeeper_py.testing.zookeeper import ZooKeeperServer
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.digest import DigestManager, master_key
from bookkeeper_py.wire.status import StatusCode

from .workloads import mixed_sizes, payload

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3) as local:
        yield local


@pytest.fixture(scope="module")
def zk_cluster(zookeeper: ZooKeeperServer) -> Iterator[LocalCluster]:
    with LocalCluster(3, metadata_uri=zookeeper.metadata_uri("/cluster-tests")) as local:
        yield local


def write_read_back(
    uri: str, digest_type: DigestType, *, use_v3: bool = False, entries: int = 10_000
) -> None:
    """E=3 Qw=2 Qa=2, ``entries`` entries of 0 B to 1 MiB all in flight at once, closed, then
    reopened by another client and read back byte for byte with digests verified."""
    sizes = mixed_sizes(entries, seed=int(digest_type))
    payloads = [payload(i, size, seed=int(digest_type)) for i, size in enumerate(sizes)]
    password = b"secret-" + digest_type.name.encode()
    with BookKeeper(uri, use_v3=use_v3) as writer_client:
        writer = writer_client.create_ledger(
            3, 2, 2, digest_type, password, custom_metadata={"test": b"yes"}
        )
        futures = [writer.add_entry_async(data) for data in payloads]
        assert [future.result() for future in futures] == list(range(entries))
        assert writer.last_add_confirmed == entries - 1
        writer.close()
        ledger_id = writer.ledger_id
    with BookKeeper(uri, use_v3=use_v3) as reader_client:
        metadata = reader_client.get_ledger_metadata(ledger_id)
        assert metadata.state == LedgerState.CLOSED
        assert (metadata.last_entry_id, metadata.length) == (entries - 1, sum(sizes))
        assert metadata.digest_type == digest_type
        assert metadata.custom_metadata == {"test": b"yes"}
        assert len(metadata.ensembles[0][1]) == 3
        reader = reader_client.open_ledger(ledger_id, password)
        assert (reader.last_add_confirmed, reader.length) == (entries - 1, sum(sizes))
        read = reader.read_entries(0, entries - 1)
        assert [entry.entry_id for entry in read] == list(range(entries))
        for entry, data in zip(read, payloads, strict=True):
            assert entry.data == data, f"entry {entry.entry_id} differs"


@pytest.mark.slow
@pytest.mark.parametrize("digest_type", list(DigestType), ids=lambda d: d.name)
def test_ten_thousand_mixed_entries_on_sqlite_metadata(
    cluster: LocalCluster, digest_type: DigestType
) -> None:
    write_read_back(cluster.metadata_uri, digest_type)


@pytest.mark.slow
@pytest.mark.zookeeper
@pytest.mark.parametrize("digest_type", list(DigestType), ids=lambda d: d.name)
def test_ten_thousand_mixed_entries_on_zookeeper_metadata(
    zk_cluster: LocalCluster, digest_type: DigestType
) -> None:
    write_read_back(zk_cluster.metadata_uri, digest_type)


def test_v3_protocol_client_end_to_end(cluster: LocalCluster) -> None:
    write_read_back(cluster.metadata_uri, DigestType.CRC32C, use_v3=True, entries=500)


@pytest.mark.slow
def test_ledger_of_a_killed_writer_is_recovered_with_every_acked_entry(
    cluster: LocalCluster,
) -> None:
    password = "recover-me"
    writer = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "writer_process.py"), cluster.metadata_uri, password],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    acked: list[int] = []
    try:
        assert writer.stdout is not None
        first = writer.stdout.readline().split()
        assert first[0] == b"ledger"
        ledger_id = int(first[1])
        while len(acked) < 3000:
            line = writer.stdout.readline()
            assert line, "the writer died before it was killed"
            acked.append(int(line.split()[1]))
        os.kill(writer.pid, 9)
        writer.wait()
        acked.extend(
            int(line.split()[1])
            for line in writer.stdout.read().splitlines()
            if line.startswith(b"acked")
        )
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        if writer.stdout is not None:
            writer.stdout.close()
    assert acked == list(range(len(acked)))
    with BookKeeper(cluster.metadata_uri) as client:
        assert client.get_ledger_metadata(ledger_id).state == LedgerState.OPEN
        reader = client.open_ledger(ledger_id, password.encode())
        metadata = client.get_ledger_metadata(ledger_id)
        assert metadata.state == LedgerState.CLOSED
        assert metadata.last_entry_id == reader.last_add_confirmed >= acked[-1]
        entries = reader.read_entries(0, reader.last_add_confirmed)
        for entry in entries:
            assert entry.data == payload(entry.entry_id, 100 + entry.entry_id % 900)
        assert metadata.length == sum(len(entry.data) for entry in entries)
        # A second recovery open changes nothing: the ledger is closed.
        again = client.open_ledger(ledger_id, password.encode())
        assert again.last_add_confirmed == reader.last_add_confirmed


def test_wrong_password_is_refused_and_changes_nothing(cluster: LocalCluster) -> None:
    with BookKeeper(cluster.metadata_uri) as client:
        writer = client.create_ledger(3, 2, 2, DigestType.MAC, b"right")
        for i in range(10):
            writer.add_entry(b"entry %d" % i)
        with pytest.raises(UnauthorizedAccessError, match="wrong password"):
            client.open_ledger(writer.ledger_id, b"wrong")
        with pytest.raises(UnauthorizedAccessError):
            client.open_ledger_no_recovery(writer.ledger_id, b"wrong")
        metadata = client.get_ledger_metadata(writer.ledger_id)
        assert metadata.state == LedgerState.OPEN  # no recovery started
        assert writer.add_entry(b"still writable") == 10  # nothing was fenced

        # A raw add with the wrong master key straight to a bookie of the ensemble: EUA, and the
        # entry is not stored.
        bookie = metadata.ensembles[0][1][0]
        host, port = bookie.rsplit(":", 1)
        entry = DigestManager(writer.ledger_id, DigestType.MAC, b"wrong").package(
            11, 10, 999, b"intruder"
        )
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(v2.encode_add_request(master_key(b"wrong"), entry))
            answer = v2.decode_response(recv_frame(raw))
            assert (answer.status, answer.ledger_id, answer.entry_id) == (
                StatusCode.EUA,
                writer.ledger_id,
                11,
            )
            raw.sendall(v2.encode_read_request(writer.ledger_id, 11))
            assert v2.decode_response(recv_frame(raw)).status == StatusCode.ENOENTRY
        writer.close()


def test_a_legacy_v1_ledger_is_read_recovered_and_written_back_as_v1(
    zk_cluster: LocalCluster,
) -> None:
    """Metadata in format v1 (no password, no digest type stored): the opener names both,
    recovery closes it, and the metadata stays v1 for the legacy clients that wrote it."""
    with BookKeeper(zk_cluster.metadata_uri) as client:
        writer = client.create_ledger(3, 2, 2, DigestType.CRC32, b"legacy")
        for i in range(20):
            writer.add_entry(b"old entry %d" % i)
        ensemble = writer.metadata.ensembles[0][1]
        legacy = "BookieMetadataFormatVersion\t1\n2\n3\n0\n0\t" + "\t".join(ensemble) + "\n"
        with MetadataClient.connect(zk_cluster.metadata_uri) as metadata:
            path = metadata._path(writer.ledger_id)
            metadata.store.set(path, legacy.encode())
            assert client.get_ledger_metadata(writer.ledger_id).stores_password is False
            with pytest.raises(UnauthorizedAccessError):
                client.open_ledger(writer.ledger_id, b"not-the-password", DigestType.CRC32)
            reader = client.open_ledger(writer.ledger_id, b"legacy", DigestType.CRC32)
            assert reader.last_add_confirmed == 19
            assert [entry.data for entry in reader.read_entries(0, 19)] == [
                b"old entry %d" % i for i in range(20)
            ]
            stored, _ = metadata.store.get(path)
        length = sum(len(b"old entry %d" % i) for i in range(20))
        assert stored == (legacy.replace("\n0\n0\t", f"\n{length}\n0\t", 1) + "19\tCLOSED").encode()
        with pytest.raises(LedgerFencedError):
            writer.add_entry(b"too late")


@pytest.mark.parametrize(("e", "qw", "qa"), [(2, 3, 2), (3, 2, 3), (3, 3, 0)])
def test_bad_quorums_are_refused_at_create(cluster: LocalCluster, e: int, qw: int, qa: int) -> None:
    with BookKeeper(cluster.metadata_uri) as client, pytest.raises(IncorrectParameterError):
        client.create_ledger(e, qw, qa)


def test_an_ensemble_larger_than_the_cluster_is_refused(cluster: LocalCluster) -> None:
    with (
        BookKeeper(cluster.metadata_uri) as client,
        pytest.raises(NotEnoughBookiesError, match="need 5"),
    ):
        client.create_ledger(5, 2, 2)


def test_reads_stop_at_the_last_add_confirmed(cluster: LocalCluster) -> None:
    with BookKeeper(cluster.metadata_uri) as client:
        writer = client.create_ledger(3, 3, 2, DigestType.CRC32, b"")
        for i in range(20):
            writer.add_entry(b"%d" % i)
        tail = client.open_ledger_no_recovery(writer.ledger_id)
        # Read from the bookies at open, as Java's openLedgerNoRecovery: the last entry
        # carries LAC 18.
        assert tail.last_add_confirmed >= 18
        assert tail.read_last_add_confirmed() >= 18
        with pytest.raises(NoSuchEntryError, match="beyond the last add confirmed"):
            tail.read_entries(0, 19 + 5)
        assert [e.data for e in tail.read_unconfirmed_entries(19, 19)] == [b"19"]
        assert (
            client.get_ledger_metadata(writer.ledger_id).state == LedgerState.OPEN
        )  # never fenced
        writer.close()
        client.delete_ledger(writer.ledger_id)
        assert writer.ledger_id not in client.list_ledgers()


@pytest.mark.timeout(120)
@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_a_local_cluster_s_bookies_run_every_thread_under_sched_batch(
    cluster: LocalCluster,
) -> None:
    """A local cluster's bookies share the CPUs with their clients: each bookie process, and
    every thread it started (its loop, journal syncers, checkpoints, metadata), runs under
    SCHED_BATCH (cpuSchedulingPolicy=batch); this test process is left as it was."""
    with BookKeeper(cluster.metadata_uri) as client:  # the bookies' threads at work
        ledger = client.create_ledger(3, 2, 2, DigestType.CRC32C, b"p")
        ledger.add_entry(b"x")
        ledger.close()
    for bookie in cluster.bookies:
        assert bookie.process is not None
        pid = bookie.process.pid
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
        assert len(threads) > 1
        assert {os.sched_getscheduler(tid) for tid in threads} == {os.SCHED_BATCH}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_missing_metadata_store_is_a_clear_error_not_a_hang(tmp_path: object) -> None:
    with pytest.raises(MetadataUnavailableError, match="no metadata store"):
        BookKeeper(f"sqlite:///{tmp_path}/absent/metadata.db")
    with pytest.raises(MetadataUnavailableError, match="could not connect to ZooKeeper"):
        BookKeeper(f"zk+hierarchical://127.0.0.1:{free_port()}/ledgers", metadata_timeout_s=2)


@pytest.mark.slow
def test_a_bookie_killed_and_restarted_serves_what_it_acknowledged() -> None:
    with LocalCluster(2) as local, BookKeeper(local.metadata_uri) as client:
        writer = client.create_ledger(2, 2, 2, DigestType.CRC32C, b"pw")
        for i in range(200):
            writer.add_entry(payload(i, 500))
        local.kill_bookie(0)
        local.start_bookie(0)
        local.pause_bookie(1)
        local.resume_bookie(1)
        reader = client.open_ledger(writer.ledger_id, b"pw")  # recovers: the writer never closed
        assert reader.last_add_confirmed == 199
        assert [e.data for e in reader.read_entries(0, 199)] == [
            payload(i, 500) for i in range(200)
        ]
        with pytest.raises(LedgerFencedError, match="EFENCED"):
            writer.add_entry(b"after recovery")


@pytest.mark.slow
def test_a_killed_bookie_leaves_the_registry_and_returns_on_restart() -> None:
    with LocalCluster(2) as local:
        metadata = MetadataClient.connect(local.metadata_uri)
        try:
            assert sorted(metadata.writable_bookies()) == sorted(local.bookie_ids)
            local.kill_bookie(1)
            for _ in range(200):  # the SQLite lease is 5 s; give it up to 20 s
                if local.bookie_ids[1] not in metadata.writable_bookies():
                    break
                time.sleep(0.1)
            assert metadata.writable_bookies() == [local.bookie_ids[0]]
            local.start_bookie(1)
            assert sorted(metadata.writable_bookies()) == sorted(local.bookie_ids)
            local.stop_bookie(0)  # a clean stop unregisters at once
            assert metadata.writable_bookies() == [local.bookie_ids[1]]
        finally:
            metadata.close()


def test_simpletest_command_against_a_local_cluster(cluster: LocalCluster) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bookkeeper_py",
            "shell",
            "simpletest",
            "--metadata-uri",
            cluster.metadata_uri,
            "-n",
            "300",
            "-e",
            "3",
            "-w",
            "2",
            "-a",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "read and verified them" in result.stdout
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "bookkeeper_py",
            "shell",
            "listbookies",
            "--metadata-uri",
            cluster.metadata_uri,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert sorted(listed.stdout.split()) == sorted(cluster.bookie_ids)


def test_simpletest_with_a_larger_ensemble_than_the_bookies_leaves_nothing(
    cluster: LocalCluster,
) -> None:
    with BookKeeper(cluster.metadata_uri) as client:
        before = client.list_ledgers()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "bookkeeper_py",
                "shell",
                "simpletest",
                "--metadata-uri",
                cluster.metadata_uri,
                "-n",
                "10",
                "-e",
                "5",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert result.returncode == 1 and result.stdout == "", (result.stdout, result.stderr)
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
        assert "Traceback" not in result.stderr
        assert "need 5 writable bookies for the ensemble" in result.stderr, result.stderr
        assert client.list_ledgers() == before  # no ledger left behind


def test_bookies_stop_cleanly_when_the_process_that_started_them_is_killed(
    tmp_path: object,
) -> None:
    """A LocalCluster's bookies do not outlive the process that started them: killed without
    a chance to stop them (SIGKILL), it leaves none running (each watches it, --stop-with-pid)."""
    import psutil

    script = (
        "import sys, time\n"
        "from bookkeeper_py.testing import LocalCluster\n"
        f"cluster = LocalCluster(2, base_directory={str(tmp_path)!r})\n"
        "cluster.start()\n"
        "print(' '.join(str(b.process.pid) for b in cluster.bookies), flush=True)\n"
        "time.sleep(600)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
    ) as starter:
        try:
            assert starter.stdout is not None
            pids = [int(pid) for pid in starter.stdout.readline().split()]
            assert len(pids) == 2
            bookies = [psutil.Process(pid) for pid in pids]
        finally:
            starter.kill()
            starter.wait(30)

    def running(process: psutil.Process) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    for _ in range(300):  # each stops within a second or two; 30 s at most
        if not any(map(running, bookies)):
            break
        time.sleep(0.1)
    left = [b.pid for b in bookies if running(b)]
    for pid in left:  # the test's own processes: not left behind even when it fails
        os.kill(pid, 9)
    assert not left, f"bookies {left} outlived the process that started them"
