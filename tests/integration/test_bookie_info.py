"""``shell bookieinfo`` and ``/api/v1/bookie/list_bookie_info``: every bookie's disk space as it
answers GET_BOOKIE_INFO (protocol v3), with BookKeeper's lines and JSON strings; a stopped bookie
is left out, and with none answering the shell says so in one line (exit 1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request

from bookkeeper_py.admin.bookie_info import readable
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.storage.entry_log import log_name
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.local_cluster import free_port


def bookieinfo(
    uri: str, command: str = "bookieinfo", *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", "shell", command, "--metadata-uri", uri, *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def get(port: int, path: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as answer:
        return dict(json.loads(answer.read()))


LINE = re.compile(
    r"^BookieID:(\S+), IP:127\.0\.0\.1, Port:(\d+), Hostname:127\.0\.0\.1:"
    r"\tFree: (\d+)(\(.*\))?\tTotal: (\d+)(\(.*\))?$",
    re.MULTILINE,
)


def test_bookieinfo_and_list_bookie_info(metadata_uri: str | None) -> None:
    with LocalCluster(2, metadata_uri=metadata_uri) as local:
        totals = {
            bookie_id: int(str(get(bookie.http_port, "/api/v1/bookie/info")["totalSpace"]))
            for bookie_id, bookie in zip(local.bookie_ids, local.bookies, strict=True)
        }
        shown = bookieinfo(local.metadata_uri)
        assert shown.returncode == 0, shown.stderr
        lines = LINE.findall(shown.stdout)
        assert sorted(line[0] for line in lines) == sorted(local.bookie_ids)
        for bookie_id, port, free, free_readable, total, total_readable in lines:
            assert bookie_id.endswith(f":{port}")
            assert int(total) == totals[bookie_id] and 0 < int(free) <= int(total)
            assert (free_readable, total_readable) == (readable(int(free)), readable(int(total)))
        assert shown.stdout.startswith("Free disk space info:\n")
        assert f"Total disk capacity in the cluster:\t{sum(totals.values())}" in shown.stdout

        answer = get(local.bookies[0].http_port, "/api/v1/bookie/list_bookie_info")
        assert list(answer)[-1] == "ClusterInfo: "
        assert sorted(list(answer)[:-1]) == sorted(local.bookie_ids)
        for bookie_id in local.bookie_ids:
            assert re.fullmatch(
                r": \{Free: \d+(\(.*\))?, Total: " + str(totals[bookie_id]) + r"(\(.*\))?\},",
                str(answer[bookie_id]),
            ), answer[bookie_id]
        assert str(answer["ClusterInfo: "]).endswith(
            f"Total: {sum(totals.values())}{readable(sum(totals.values()))}}}"
        )

        endpoint = bookieinfo(local.metadata_uri, "endpointinfo", "-b", local.bookie_ids[1])
        assert endpoint.returncode == 0, endpoint.stderr
        port = local.bookie_ids[1].rsplit(":", 1)[1]
        assert endpoint.stdout.splitlines()[0] == f"BookieId: {local.bookie_ids[1]}"
        for line in ("Endpoint: bookie", "Protocol: bookie-rpc", f"Address: 127.0.0.1 : {port}"):
            assert line in endpoint.stdout.splitlines(), endpoint.stdout

        local.stop_bookie(1)
        gone = bookieinfo(local.metadata_uri, "endpointinfo", "-b", local.bookie_ids[1])
        assert gone.returncode == 1 and gone.stdout == ""
        assert "is not registered" in gone.stderr and gone.stderr.count("\n") == 1
        answer = get(local.bookies[0].http_port, "/api/v1/bookie/list_bookie_info")
        assert list(answer) == [local.bookie_ids[0], "ClusterInfo: "]
        local.stop_bookie(0)
        none = bookieinfo(local.metadata_uri)
        assert none.returncode == 1 and none.stdout == ""
        assert "no bookie gave its disk space" in none.stderr and none.stderr.count("\n") == 1


def test_readable_sizes_as_bookkeeper_prints_them() -> None:
    assert [readable(v) for v in (0, 999, 1000, 1500, 1234567, 10**9, 5 * 10**15)] == [
        "", "", "(1KB)", "(1.5KB)", "(1.234MB)", "(1GB)", "(5000TB)",
    ]  # fmt: skip


def test_activeledgers_keeps_only_the_ledgers_the_metadata_still_holds(
    metadata_uri: str | None,
) -> None:
    from bookkeeper_py import BookKeeper

    with LocalCluster(1, metadata_uri=metadata_uri) as local:
        with BookKeeper(local.metadata_uri) as client:
            kept, deleted = client.create_ledger(1, 1, 1), client.create_ledger(1, 1, 1)
            for handle in (kept, deleted):
                for _ in range(4):
                    handle.add_entry(b"payload of the entry")
                handle.close()
            client.delete_ledger(deleted.ledger_id)
        local.stop_bookie(0)  # its close checkpoints: the entries are in entry log 0
        ledgers = os.path.join(local.bookies[0].directory, "ledgers")
        shown = bookieinfo(local.metadata_uri, "activeledgers", "--ledger-dir", ledgers, "-l", "0")
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0] == f"Active ledgers on entry log 0 ({log_name(0)}) as follow:"
        assert [line.split()[0] for line in lines[1:-1]] == [str(kept.ledger_id)]
        assert lines[-1].startswith("remaining size: ") and "usage: 0.5" in lines[-1]
        missing = bookieinfo(
            local.metadata_uri, "activeledgers", "--ledger-dir", ledgers, "-l", "99"
        )
        assert missing.returncode == 1 and f"no entry log {log_name(99)}" in missing.stderr


def test_bookiesanity_over_the_shell_and_http(metadata_uri: str | None) -> None:
    from bookkeeper_py import BookKeeper

    with LocalCluster(2, metadata_uri=metadata_uri) as local:
        uri = local.metadata_uri
        everyone = bookieinfo(uri, "bookiesanity")
        assert everyone.returncode == 0, everyone.stderr
        lines = everyone.stdout.splitlines()
        assert len(lines) == 2 and all("sanity test succeeded" in line for line in lines)
        assert {line.split()[1].rstrip(":") for line in lines} == set(local.bookie_ids)
        assert get(local.bookies[0].http_port, "/api/v1/bookie/sanity") == {
            "passed": True,
            "readOnly": False,
        }
        with BookKeeper(uri) as client:
            assert client.list_ledgers() == []  # every test ledger deleted

        request = urllib.request.Request(
            f"http://127.0.0.1:{local.bookies[1].http_port}/api/v1/bookie/state/readonly",
            data=b'{"readOnly": true}',
            method="PUT",
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert json.loads(answer.read()) == {"readOnly": True}
        assert get(local.bookies[1].http_port, "/api/v1/bookie/sanity") == {
            "passed": False,
            "readOnly": True,
        }
        for bookie_id in (local.bookie_ids[1], "127.0.0.1:1"):
            failed = bookieinfo(uri, "bookiesanity", "-b", bookie_id)
            assert failed.returncode == 1, failed.stdout
            assert failed.stdout.startswith(f"bookie {bookie_id}: sanity test FAILED: ")
            assert "is not writable" in failed.stdout
            assert failed.stdout.count("\n") == 1 and failed.stderr == "", failed
            with BookKeeper(uri) as client:
                assert client.list_ledgers() == []  # no test ledger left behind
        # A registered bookie that does not answer (nothing listens on its port): the test
        # ledger is made, its writes fail, and it is deleted all the same.
        port = free_port()
        silent = f"127.0.0.1:{port}"
        with MetadataClient.connect(uri) as metadata:
            metadata.register_bookie(silent, "127.0.0.1", port)
            failed = bookieinfo(uri, "bookiesanity", "-b", silent)
        assert failed.returncode == 1, failed.stdout
        [verdict] = failed.stdout.splitlines()
        assert verdict.startswith(
            f"bookie {silent}: sanity test FAILED: failed writing 10 entries to ledger "
        ), verdict
        assert "Traceback" not in failed.stderr and "error:" not in failed.stderr
        with BookKeeper(uri) as client:
            assert client.list_ledgers() == []
