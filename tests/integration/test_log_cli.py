"""``bookkeeper log`` as an operator uses it: real bookie processes (``LocalCluster``), the
command run as a subprocess, records through stdin and stdout, errors in one line.

Every test works in a namespace of its own, so that listings see only its logs; every
subprocess has a timeout."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bookkeeper_py.log import Position
from bookkeeper_py.testing import LocalCluster

from .test_cli_errors import one_line_error

pytestmark = pytest.mark.slow  # dozens of command processes against a cluster of three bookies

TIMEOUT_S = 60
ENV = {
    k: v
    for k, v in os.environ.items()
    if k not in ("BOOKKEEPER_METADATA_URI", "BOOKKEEPER_LOG_PASSWORD")
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3) as local:
        yield local


def command(cluster: LocalCluster, namespace: str, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "bookkeeper_py", "log", *args,
        "--metadata-uri", cluster.metadata_uri, "--namespace", namespace,
    ]  # fmt: skip


def log(
    cluster: LocalCluster, namespace: str, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(cluster, namespace, *args),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=ENV,
    )


def log_bytes(
    cluster: LocalCluster, namespace: str, *args: str, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        command(cluster, namespace, *args),
        input=stdin,
        capture_output=True,
        timeout=TIMEOUT_S,
        env=ENV,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """The output of a command that must succeed without a word on stderr."""
    assert (result.returncode, result.stderr) == (0, ""), (result.returncode, result.stderr)
    return result.stdout


def describe(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(ok(log(cluster, namespace, "describe", name, "--json")))  # type: ignore[no-any-return]


def framed(records: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(record)) + record for record in records)


def test_create_list_and_describe(cluster: LocalCluster) -> None:
    ns = "t-create"
    out = ok(
        log(
            cluster, ns, "create", "orders", "-e", "3", "-w", "3", "-a", "2",
            "--digest", "crc32", "--roll-records", "100", "--retention-bytes", "4096",
            "--max-entry-bytes", "65536",
        )
    )  # fmt: skip
    assert out.startswith("created log t-create/orders: E=3 Qw=3 Qa=2 digest CRC32;")
    ok(log(cluster, ns, "create", "audit"))
    assert ok(log(cluster, ns, "list")).split() == ["audit", "orders"]
    page = log(cluster, ns, "list", "--limit", "1")
    assert page.stdout.split() == ["audit"] and "--after audit" in page.stderr
    assert ok(log(cluster, ns, "list", "--after", "audit")).split() == ["orders"]

    described = describe(cluster, ns, "orders")
    assert described["config"] == {
        "ensemble_size": 3,
        "write_quorum_size": 3,
        "ack_quorum_size": 2,
        "digest_type": "crc32",
        "roll_bytes": 256 * 1024 * 1024,
        "roll_age_ms": 2 * 60 * 60 * 1000,
        "roll_records": 100,
        "retention_age_ms": 0,
        "retention_bytes": 4096,
        "max_entry_bytes": 65536,
        "placement": "",
    }
    assert (described["segments"], described["record_count"], described["subscriptions"]) == (
        [],
        0,
        [],
    )
    text = ok(log(cluster, ns, "describe", "orders"))
    assert "log t-create/orders" in text and "no segments" in text and "no subscriptions" in text

    ok(log(cluster, ns, "append", "orders", stdin="a\nb\nc\n"))
    text = ok(log(cluster, ns, "describe", "orders"))
    header, row = [line.split() for line in text.splitlines()[3:5]]
    assert header == [
        "SEQ", "LEDGER", "STATE", "FIRST", "LAST", "RECORDS", "BYTES", "TXIDS", "TIMESTAMPS"
    ]  # fmt: skip
    ledger = describe(cluster, ns, "orders")["segments"][0]["ledger_id"]
    assert row[:6] == ["1", str(ledger), "CLOSED", f"{ledger}:0:0", f"{ledger}:0:2", "3"]
    assert row[7] == "0..2"
    assert "records: 3 (sequence numbers 0..2); next sequence number 3" in text

    line = one_line_error(log(cluster, ns, "create", "orders"))
    assert "exists already" in line and "bookkeeper log delete" in line
    line = one_line_error(log(cluster, ns, "create", "bad", "-e", "2", "-w", "3"), status=2)
    assert "ensemble >= write quorum >= ack quorum" in line
    assert ok(log(cluster, ns, "list")).split() == ["audit", "orders"]  # nothing made


def test_append_lines_then_read_them_back(cluster: LocalCluster) -> None:
    ns = "t-lines"
    ok(log(cluster, ns, "create", "events"))
    lines = ["first", "", "caf\u00e9 \u2615", "tab\there", "last"]
    last = ok(log(cluster, ns, "append", "events", stdin="\n".join(lines) + "\n")).strip()
    assert ok(log(cluster, ns, "read", "events")).split("\n")[:-1] == lines

    shown = ok(log(cluster, ns, "read", "events", "--show-position")).splitlines()
    positions = [entry.split("\t", 1)[0] for entry in shown]
    assert [entry.split("\t", 1)[1] for entry in shown] == lines
    assert positions[-1] == last
    # a last line without its newline is a record too; --verbose prints every position
    each = ok(log(cluster, ns, "append", "events", "--verbose", stdin="six\nseven")).split()
    assert len(each) == 2 and Position.parse(each[0]) > Position.parse(last)

    assert ok(log(cluster, ns, "read", "events", "--max", "2")).split("\n")[:-1] == lines[:2]
    middle = log(cluster, ns, "read", "events", "--from", positions[1], "--to", positions[3])
    assert ok(middle).split("\n")[:-1] == lines[1:4]
    assert ok(log(cluster, ns, "read", "events", "--txid", "5")).split() == ["six", "seven"]
    recent = log(
        cluster, ns, "read", "events", "--timestamp", str(int(time.time() * 1000) + 60_000)
    )
    assert ok(recent) == ""
    assert ok(log(cluster, ns, "read", "events", "--from", "latest")) == ""
    assert describe(cluster, ns, "events")["record_count"] == 7


def test_append_binary_records_then_read_them_back(cluster: LocalCluster) -> None:
    ns = "t-binary"
    ok(log(cluster, ns, "create", "blobs"))
    records = [b"", b"two\nlines", bytes(range(256)), b"\xff" * 70_000, b"\n"]
    appended = log_bytes(
        cluster, ns, "append", "blobs", "--format", "binary", stdin=framed(records)
    )
    assert appended.returncode == 0, appended.stderr
    read = log_bytes(cluster, ns, "read", "blobs", "--format", "binary")
    assert (read.returncode, read.stderr) == (0, b"")
    assert read.stdout == framed(records)

    # stdin cut inside a record: the records before it are appended, the error says so
    cut = framed([b"whole", b"cut short"])[:-3]
    result = log_bytes(cluster, ns, "append", "blobs", "--format", "binary", stdin=cut)
    stderr = result.stderr.decode()
    assert result.returncode == 1 and stderr.count("\n") == 1, stderr
    assert "stdin ended inside record 2 (6 of its 9 bytes)" in stderr
    assert f"1 record before it appended, the last at {result.stdout.decode().strip()}" in stderr
    read = log_bytes(cluster, ns, "read", "blobs", "--format", "binary")
    assert read.stdout == framed([*records, b"whole"])
    # a length over what the log takes is refused before its bytes are read
    huge = log_bytes(cluster, ns, "append", "blobs", "--format", "binary", stdin=b"\xff" * 4)
    stderr = huge.stderr.decode()
    assert huge.returncode == 1 and stderr.count("\n") == 1, stderr
    assert "record 1 of stdin is 4294967295 bytes" in stderr and "nothing before it" in stderr


def test_an_idempotent_writer_skips_what_it_appended_before(cluster: LocalCluster) -> None:
    ns = "t-idempotent"
    ok(log(cluster, ns, "create", "loads"))
    first = "".join(f"r{i}\n" for i in range(3))
    ok(log(cluster, ns, "append", "loads", "--writer-id", "loader-1", stdin=first))
    # the same input again, and more: only what is new is appended
    again = log(cluster, ns, "append", "loads", "--writer-id", "loader-1", stdin=first + "r3\n")
    assert again.returncode == 0
    assert "3 of 4 records were appended before by writer 'loader-1'" in again.stderr
    assert ok(log(cluster, ns, "read", "loads")).split() == ["r0", "r1", "r2", "r3"]
    more = log(
        cluster, ns, "append", "loads", "--writer-id", "loader-1", "--first-sequence", "4",
        stdin="r4\n",
    )  # fmt: skip
    ok(more)
    assert ok(log(cluster, ns, "read", "loads")).split() == ["r0", "r1", "r2", "r3", "r4"]
    assert describe(cluster, ns, "loads")["writers"] == {"loader-1": 4}


def test_tail_follows_records_appended_after_it_started(cluster: LocalCluster) -> None:
    ns = "t-tail"
    ok(log(cluster, ns, "create", "feed"))
    ok(log(cluster, ns, "append", "feed", stdin="old-1\nold-2\n"))
    tail = subprocess.Popen(
        command(cluster, ns, "tail", "feed", "--from", "earliest", "--max", "5"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert tail.stdout is not None
        assert [tail.stdout.readline(), tail.stdout.readline()] == ["old-1\n", "old-2\n"]
        ok(log(cluster, ns, "append", "feed", stdin="new-1\nnew-2\n"))
        ok(log(cluster, ns, "append", "feed", stdin="new-3\nnew-4\n"))
        out, err = tail.communicate(timeout=TIMEOUT_S)
    finally:
        tail.kill()
        tail.wait(TIMEOUT_S)
    assert (tail.returncode, err) == (0, "")
    assert out.split() == ["new-1", "new-2", "new-3"]  # --max 5 in all


def test_tail_starts_at_the_latest_record(cluster: LocalCluster) -> None:
    """Without --from, tail prints what is appended once it runs: the test appends until it
    has printed three records, which must follow each other with none of the earlier ones."""
    ns = "t-latest"
    ok(log(cluster, ns, "create", "feed"))
    ok(log(cluster, ns, "append", "feed", stdin="before\n"))
    tail = subprocess.Popen(
        command(cluster, ns, "tail", "feed", "--max", "3", "--show-position"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        sent = 0
        deadline = time.monotonic() + TIMEOUT_S
        while tail.poll() is None and time.monotonic() < deadline:
            ok(log(cluster, ns, "append", "feed", stdin=f"n{sent}\n"))
            sent += 1
        out, err = tail.communicate(timeout=TIMEOUT_S)
    finally:
        tail.kill()
        tail.wait(TIMEOUT_S)
    assert (tail.returncode, err) == (0, "")
    printed = [line.split("\t")[1] for line in out.splitlines()]
    first = int(printed[0][1:])
    assert printed == [f"n{first}", f"n{first + 1}", f"n{first + 2}"]


def test_tail_ends_quietly_on_ctrl_c(cluster: LocalCluster) -> None:
    ns = "t-interrupt"
    ok(log(cluster, ns, "create", "feed"))
    ok(log(cluster, ns, "append", "feed", stdin="one\n"))
    # Ctrl-C at its default: a test run started in the background (``nohup pytest &``) has
    # SIGINT ignored, its children inherit that, and Python then installs no Ctrl-C handler
    # (the tail would go on, as a background job should). Faulthandler: if it hangs anyway,
    # SIGABRT makes it print where each of its threads is.
    with subprocess.Popen(
        command(cluster, ns, "tail", "feed", "--from", "earliest"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**ENV, "PYTHONFAULTHANDLER": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as tail:
        try:
            assert tail.stdout is not None
            assert tail.stdout.readline() == "one\n"  # it is following the log now
            tail.send_signal(signal.SIGINT)
            out, err = tail.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            tail.send_signal(signal.SIGABRT)
            _, stacks = tail.communicate(timeout=TIMEOUT_S)
            raise AssertionError(f"tail did not end on Ctrl-C; its threads:\n{stacks}") from None
        finally:
            tail.kill()
            tail.wait(TIMEOUT_S)
    assert (tail.returncode, out, err) == (0, "", "")


def test_subscriptions_are_created_read_from_and_deleted(cluster: LocalCluster) -> None:
    ns = "t-subscriptions"
    ok(log(cluster, ns, "create", "jobs"))
    ok(log(cluster, ns, "append", "jobs", stdin="j1\nj2\nj3\nj4\nj5\n"))
    created = ok(log(cluster, ns, "subscriptions", "jobs", "--create", "workers"))
    assert created == "subscription workers of log t-subscriptions/jobs created at nothing yet\n"
    latest = ok(log(cluster, ns, "subscriptions", "jobs", "--create", "audit", "--at-latest"))
    assert "created at" in latest and "nothing yet" not in latest

    def lags() -> dict[str, int]:
        rows = ok(log(cluster, ns, "subscriptions", "jobs")).splitlines()
        assert rows[0].split() == ["NAME", "CONSUMED", "UP", "TO", "LAG", "UPDATED"]
        return {row.split()[0]: int(row.split()[-2]) for row in rows[1:]}

    assert lags() == {"audit": 0, "workers": 5}
    # --max may stop inside a batch (an entry of several records): the commit stops there too
    read = log(cluster, ns, "read", "jobs", "--subscription", "workers", "--max", "2")
    assert ok(read).split() == ["j1", "j2"]
    assert lags() == {"audit": 0, "workers": 3}
    assert ok(log(cluster, ns, "read", "jobs", "--subscription", "workers")).split() == [
        "j3",
        "j4",
        "j5",
    ]
    ok(log(cluster, ns, "append", "jobs", stdin="j6\n"))
    assert lags() == {"audit": 1, "workers": 1}
    subscriptions = describe(cluster, ns, "jobs")["subscriptions"]
    assert [(s["name"], s["lag"]) for s in subscriptions] == [("audit", 1), ("workers", 1)]

    deleted = ok(log(cluster, ns, "subscriptions", "jobs", "--delete", "audit"))
    assert deleted == "subscription audit of log t-subscriptions/jobs deleted\n"
    assert lags() == {"workers": 1}
    line = one_line_error(log(cluster, ns, "subscriptions", "jobs", "--delete", "audit"))
    assert "no subscription 'audit'" in line and "bookkeeper log subscriptions jobs" in line
    line = one_line_error(log(cluster, ns, "subscriptions", "jobs", "--at-latest"), status=2)
    assert "--at-latest goes with --create" in line


def test_truncate_before_a_position_and_by_retention(cluster: LocalCluster) -> None:
    ns = "t-truncate"
    ok(log(cluster, ns, "create", "history"))
    ok(log(cluster, ns, "append", "history", stdin="a1\na2\n"))  # each writer: a segment
    second = ok(log(cluster, ns, "append", "history", "--verbose", stdin="b1\nb2\n")).split()
    ok(log(cluster, ns, "subscriptions", "history", "--create", "slow"))
    line = one_line_error(log(cluster, ns, "truncate", "history", "--before", second[0]))
    assert "subscription 'slow' has not consumed" in line and "--force" in line
    assert ok(log(cluster, ns, "read", "history")).split() == ["a1", "a2", "b1", "b2"]

    out = ok(log(cluster, ns, "truncate", "history", "--before", second[0], "--force"))
    assert out == f"truncated log t-truncate/history before {second[0]}: 1 ledger deleted\n"
    assert ok(log(cluster, ns, "read", "history")).split() == ["b1", "b2"]
    described = describe(cluster, ns, "history")
    assert (len(described["segments"]), described["record_count"]) == (1, 2)

    ok(log(cluster, ns, "create", "capped", "--retention-bytes", "1"))
    ok(log(cluster, ns, "append", "capped", stdin="c1\n"))
    ok(log(cluster, ns, "append", "capped", stdin="c2\n"))
    out = ok(log(cluster, ns, "truncate", "capped", "--retention"))
    assert out == "applied the retention policy of log t-truncate/capped: 2 ledgers deleted\n"
    assert ok(log(cluster, ns, "read", "capped")) == ""
    line = one_line_error(log(cluster, ns, "truncate", "capped"), status=2)
    assert "one of the arguments --before --retention is required" in line


def test_delete_says_what_it_deleted(cluster: LocalCluster) -> None:
    ns = "t-delete"
    ok(log(cluster, ns, "create", "keep"))
    ok(log(cluster, ns, "create", "scratch"))
    ok(log(cluster, ns, "append", "scratch", stdin="x\ny\n"))
    ok(log(cluster, ns, "subscriptions", "scratch", "--create", "reader"))
    ledger = describe(cluster, ns, "scratch")["segments"][0]["ledger_id"]
    out = ok(log(cluster, ns, "delete", "scratch"))
    assert out == (
        f"deleted log t-delete/scratch: 2 records, 1 ledger ({ledger}), 1 subscription (reader)\n"
    )
    assert ok(log(cluster, ns, "list")).split() == ["keep"]
    line = one_line_error(log(cluster, ns, "delete", "scratch"))
    assert "no log 'scratch'" in line and "bookkeeper log list" in line
    line = one_line_error(log(cluster, ns, "describe", "scratch"))
    assert "no log 'scratch'" in line and "bookkeeper log create" in line


def test_errors_are_one_line(cluster: LocalCluster) -> None:
    ns = "t-errors"
    ok(log(cluster, ns, "create", "present", "--max-entry-bytes", "4096"))
    for args in (("read", "absent"), ("tail", "absent"), ("append", "absent")):
        line = one_line_error(log(cluster, ns, *args))
        assert "no log 'absent' in namespace 't-errors'" in line, args
    line = one_line_error(log(cluster, "t-nothing-here", "list"))
    assert "no namespace 't-nothing-here'" in line

    usage = [
        (("read", "present", "--from", "12:0"), "invalid start '12:0'"),
        (("read", "present", "--to", "a:b:c"), "invalid position 'a:b:c'"),
        (("truncate", "present", "--before=-1:0:0"), "invalid position '-1:0:0'"),
        (("read", "present", "--from", "1:0:0", "--txid", "3"), "not allowed with argument"),
        (("read", "present", "--subscription", "s", "--txid", "3"), "--subscription reads"),
        (("read", "present", "--show-position", "--format", "binary"), "--show-position"),
        (("read", "present", "--max", "0"), "'0' is below 1"),
        (("append", "present", "--first-sequence", "1"), "add --writer-id"),
        (("create", "a/b"), "invalid log name 'a/b'"),
        (("create", "new", "--max-entry-bytes", "100"), "max_entry_bytes is between"),
    ]
    for args, expected in usage:
        line = one_line_error(log(cluster, ns, *args), status=2)
        assert expected in line and f"bookkeeper log {args[0]} --help" in line, (args, line)

    line = one_line_error(log(cluster, ns, "append", "present", stdin="small\n" + "x" * 5000))
    assert "record 2 of stdin is more than" in line and "--max-entry-bytes" in line
    assert "1 record before it appended" in line
    assert ok(log(cluster, ns, "read", "present")) == "small\n"

    no_uri = subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", "log", "list"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=ENV,
    )
    assert "no metadata service URI" in one_line_error(no_uri)


def test_a_writer_taken_over_fails_in_one_line(cluster: LocalCluster) -> None:
    """An append still reading stdin when another append takes the log over: its next record
    fails with the fencing, said in one line (no log lines of the client around it)."""
    ns = "t-fenced"
    ok(log(cluster, ns, "create", "contended"))
    first = subprocess.Popen(
        command(cluster, ns, "append", "contended"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not describe(cluster, ns, "contended")["segments"]:  # its writer is open
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.1)
        ok(log(cluster, ns, "append", "contended", stdin="taken over\n"))
        out, err = first.communicate("too late\n", timeout=TIMEOUT_S)
    finally:
        first.kill()
        first.wait(TIMEOUT_S)
    result = subprocess.CompletedProcess(first.args, first.returncode, out, err)
    line = one_line_error(result)
    assert "another writer took the log over" in line
    assert ok(log(cluster, ns, "read", "contended")).split("\n")[:-1] == ["taken over"]
