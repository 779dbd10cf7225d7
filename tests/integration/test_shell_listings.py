"""``shell listledgers`` with BookKeeper's ``-m`` (each ledger's metadata) and ``-bookieid``
(only the ledgers whose ensembles hold a bookie), over a real cluster, an unknown bookie being a
one-line error; ``shell listbookies`` with ``-a`` and host names; ``shell deleteledger`` over a
real cluster, whose bookie then drops the ledger in garbage collection, its refusals (an unknown
ledger, no ``-f`` off a terminal) one line that changes nothing."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from bookkeeper_py import BookKeeper
from bookkeeper_py.metadata.format import serialize
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.raw import recv_frame
from bookkeeper_py.testing.waiting import wait_for
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.status import StatusCode


def shell(uri: str, *args: str, command: str = "listledgers") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bookkeeper_py",
            "shell",
            command,
            "--metadata-uri",
            uri,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_listledgers_by_bookie_and_with_metadata(metadata_uri: str | None) -> None:
    with LocalCluster(3, metadata_uri=metadata_uri) as local:
        with BookKeeper(local.metadata_uri) as client:
            ledger_ids = []
            for _ in range(6):  # ensembles of two of the three bookies
                handle = client.create_ledger(2, 2, 2)
                handle.add_entry(b"x")
                handle.close()
                ledger_ids.append(handle.ledger_id)
        metadata = MetadataClient.connect(local.metadata_uri)
        try:
            holders = {
                ledger_id: set(metadata.read_ledger_metadata(ledger_id)[0].ensembles[0][1])
                for ledger_id in ledger_ids
            }
        finally:
            metadata.close()
        for bookie in local.bookie_ids:
            listed = shell(local.metadata_uri, "-bookieid", bookie)
            assert listed.returncode == 0, listed.stderr
            expected = sorted(ledger for ledger, held in holders.items() if bookie in held)
            assert sorted(map(int, listed.stdout.split())) == expected
        described = shell(local.metadata_uri, "-m")
        assert described.returncode == 0, described.stderr
        heads = re.findall(r"^ledger (\d+) \(metadata version", described.stdout, re.MULTILINE)
        assert sorted(map(int, heads)) == sorted(ledger_ids)
        assert described.stdout.count("  E=2 Qw=2 Qa=2 digest: CRC32C") == len(ledger_ids)
        unknown = shell(local.metadata_uri, "-bookieid", "10.0.0.9:3181")
        assert unknown.returncode == 1 and unknown.stdout == ""
        [line] = [line for line in unknown.stderr.splitlines() if line.strip()]
        assert line == (
            "error: bookie 10.0.0.9:3181 is unknown here (no cookie, not registered, in no "
            "ledger's ensemble); check the id (see listbookies)"
        )
        # A bookie gone for good (stopped, its cookie deleted) is still known by the ledgers
        # that name it: they are listed.
        gone = local.bookie_ids[0]
        local.stop_bookie(0)
        metadata = MetadataClient.connect(local.metadata_uri)
        try:
            metadata.delete_cookie(gone)
            assert gone not in metadata.writable_bookies() + metadata.readonly_bookies()
        finally:
            metadata.close()
        listed = shell(local.metadata_uri, "-bookieid", gone)
        assert listed.returncode == 0, listed.stderr
        named = sorted(ledger for ledger, held in holders.items() if gone in held)
        assert named and sorted(map(int, listed.stdout.split())) == named


def test_listbookies_all_and_with_host_names(metadata_uri: str | None) -> None:
    with LocalCluster(2, metadata_uri=metadata_uri) as local:
        every = shell(local.metadata_uri, "-a", command="listbookies")
        assert every.returncode == 0 and sorted(every.stdout.split()) == sorted(local.bookie_ids)
        assert shell(local.metadata_uri, "-ro", command="listbookies").stdout == ""
        named = shell(local.metadata_uri, "--hostnames", command="listbookies")
        assert sorted(named.stdout.splitlines()) == sorted(
            f"{bookie} host 127.0.0.1 port {bookie.rsplit(':', 1)[1]}"
            for bookie in local.bookie_ids
        )


def test_ledgermetadata_dumps_restores_and_updates(
    tmp_path: Path, metadata_uri: str | None
) -> None:
    with (
        LocalCluster(1, metadata_uri=metadata_uri) as local,
        BookKeeper(local.metadata_uri) as client,
    ):
        handle = client.create_ledger(1, 1, 1, custom_metadata={"k": b"v"})
        handle.add_entry(b"x")
        handle.close()
        ledger_id = handle.ledger_id
        stored = client.get_ledger_metadata(ledger_id)
        uri = local.metadata_uri
        dump = tmp_path / "ledger.meta"
        dumped = shell(uri, "-l", str(ledger_id), "-d", str(dump), command="ledgermetadata")
        assert dumped.returncode == 0, dumped.stderr
        assert dump.read_bytes() == serialize(stored)

        client.delete_ledger(ledger_id)
        restored = shell(uri, "-l", str(ledger_id), "-r", str(dump), command="ledgermetadata")
        assert restored.returncode == 0, restored.stderr
        assert client.get_ledger_metadata(ledger_id) == stored
        assert client.open_ledger(ledger_id).read_entries(0, 0)[0].data == b"x"

        garbage = tmp_path / "garbage"
        garbage.write_bytes(b"\x00not metadata")
        for args, wanted in (
            (["-r", str(dump)], "already has metadata; pass --update"),
            (["-r", str(garbage), "-u"], "is not a ledger's metadata"),
            (["-r", str(tmp_path / "missing")], "cannot read"),
            (["-u"], "--update goes with --restorefromfile"),
            (["-d", str(dump), "-r", str(dump)], "do not go together"),
        ):
            failed = shell(uri, "-l", str(ledger_id), *args, command="ledgermetadata")
            assert failed.returncode == 1 and wanted in failed.stderr, (args, failed.stderr)
            assert failed.stderr.count("\n") == 1
        assert client.get_ledger_metadata(ledger_id) == stored

        other = client.create_ledger(1, 1, 1)
        other.close()
        other_dump = tmp_path / "other.meta"
        shell(uri, "-l", str(other.ledger_id), "-d", str(other_dump), command="ledgermetadata")
        updated = shell(
            uri, "-l", str(ledger_id), "-r", str(other_dump), "-u", command="ledgermetadata"
        )
        assert updated.returncode == 0 and "written over" in updated.stdout
        assert client.get_ledger_metadata(ledger_id).custom_metadata == {}  # the other's
        back = shell(uri, "-l", str(ledger_id), "-r", str(dump), "-u", command="ledgermetadata")
        assert back.returncode == 0
        assert client.get_ledger_metadata(ledger_id) == stored


def test_shell_conf_gives_the_metadata_service_uri(tmp_path: Path) -> None:
    with LocalCluster(2) as local:
        conf = tmp_path / "bk_server.conf"
        conf.write_text(f"metadataServiceUri={local.metadata_uri}\n")
        listed = subprocess.run(
            [sys.executable, "-m", "bookkeeper_py", "shell", "--conf", str(conf), "listbookies"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert listed.returncode == 0, listed.stderr
        assert sorted(listed.stdout.split()) == sorted(local.bookie_ids)


def read_status(port: int, ledger_id: int, entry_id: int) -> StatusCode:
    """The status of a plain v2 read of the entry, asked of the bookie on ``port`` alone."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(v2.encode_read_request(ledger_id, entry_id))
        return v2.decode_response(recv_frame(connection)).status


def forced_gc_round(http_port: int) -> None:
    """Forces a garbage collection round on the bookie and returns once it ended (bounded)."""
    base = f"http://127.0.0.1:{http_port}/api/v1/bookie"

    def get(path: str) -> Any:
        with urllib.request.urlopen(base + path, timeout=30) as answer:
            return json.loads(answer.read())

    def rounds() -> int:
        details = get("/gc_details")[0]
        return int(details["majorCompactionCounter"]) + int(details["minorCompactionCounter"])

    before = rounds()
    request = urllib.request.Request(base + "/gc", method="PUT")  # no body: a major round
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200
    wait_for(
        lambda: get("/gc") == {"is_in_force_gc": "false"} and rounds() > before,
        60,
        "the forced garbage collection round to end",
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1 and result.stdout == "", (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def test_deleteledger_over_a_cluster(metadata_uri: str | None) -> None:
    with (
        LocalCluster(
            1, metadata_uri=metadata_uri, bookie_args=["--flush-interval-ms", "200"]
        ) as local,
        BookKeeper(local.metadata_uri) as client,
    ):
        uri, bookie = local.metadata_uri, local.bookies[0]
        deleted, kept = client.create_ledger(1, 1, 1), client.create_ledger(1, 1, 1)
        for handle in (deleted, kept):
            handle.add_entry(b"x")
            handle.close()
        ledger_id = deleted.ledger_id
        both = sorted([ledger_id, kept.ledger_id])
        assert read_status(bookie.port, ledger_id, 0) == StatusCode.EOK

        # Off a terminal (stdin is /dev/null) without -f: refused, the ledger still there.
        line = one_line_error(shell(uri, "-l", str(ledger_id), command="deleteledger"))
        assert f"deleting ledger {ledger_id} needs -f" in line
        assert client.list_ledgers() == both
        assert client.get_ledger_metadata(ledger_id).ledger_id == ledger_id

        gone = shell(uri, "-l", str(ledger_id), "-f", command="deleteledger")
        assert gone.returncode == 0 and gone.stderr == "", gone.stderr
        assert f"ledger {ledger_id} deleted" in gone.stdout
        assert client.list_ledgers() == [kept.ledger_id]

        # Again: the ledger is unknown; nothing else goes.
        line = one_line_error(shell(uri, "-l", str(ledger_id), "-f", command="deleteledger"))
        assert f"no ledger {ledger_id}" in line
        assert client.list_ledgers() == [kept.ledger_id]

        # The bookie drops the deleted ledger in a forced garbage collection round, only it. A
        # round sees the ledgers of the index, those of a checkpoint (every 200 ms here); the
        # bookie is read only between rounds.
        def dropped_after_a_round() -> bool:
            forced_gc_round(bookie.http_port)
            return read_status(bookie.port, ledger_id, 0) == StatusCode.ENOLEDGER

        wait_for(
            dropped_after_a_round, 60, f"bookie {bookie.bookie_id} dropping ledger {ledger_id}"
        )
        assert read_status(bookie.port, kept.ledger_id, 0) == StatusCode.EOK
        assert client.open_ledger(kept.ledger_id).read_entries(0, 0)[0].data == b"x"
