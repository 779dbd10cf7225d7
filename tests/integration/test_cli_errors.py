"""What an operator's mistake gets from the ``bookkeeper`` command: one line on stderr,
``error: <what happened>; <what to do>``, a non-zero exit status, no traceback, and nothing
created or changed by a tool that only reads."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bookkeeper_py.testing.local_cluster import free_port


def bookkeeper(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def one_line_error(result: subprocess.CompletedProcess[str], status: int = 1) -> str:
    """The single stderr line of a failed command (asserting there is exactly one)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    return lines[0]


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_lastmark_on_a_missing_directory_fails_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "ledgers"
    line = one_line_error(bookkeeper("shell", "lastmark", "--ledger-dir", str(missing)))
    assert f"ledger directory {missing} does not exist" in line
    assert "ledgerDirectories" in line
    assert tree(tmp_path) == []


def test_readjournal_on_a_missing_or_foreign_directory(tmp_path: Path) -> None:
    line = one_line_error(bookkeeper("shell", "readjournal", "--journal-dir", str(tmp_path / "j")))
    assert "does not exist" in line and "journalDirectories" in line
    (tmp_path / "notes.txt").write_text("not a bookie's")
    line = one_line_error(bookkeeper("shell", "readjournal", "--journal-dir", str(tmp_path)))
    assert "holds no bookie data" in line
    assert tree(tmp_path) == ["notes.txt"]


def test_readlog_with_a_log_id_that_is_not_hexadecimal(tmp_path: Path) -> None:
    line = one_line_error(
        bookkeeper("shell", "readlog", "--ledger-dir", str(tmp_path), "-l", "zz"), status=2
    )
    assert "'zz' is not a hexadecimal file id" in line
    assert "bookkeeper shell readlog --help" in line


def test_readlog_of_an_entry_log_the_directory_does_not_hold(tmp_path: Path) -> None:
    from bookkeeper_py.storage.entry_log import log_name

    # the directory's one entry log: an empty file (the command goes by the names)
    (tmp_path / log_name(0)).write_bytes(b"")
    line = one_line_error(bookkeeper("shell", "readlog", "--ledger-dir", str(tmp_path), "-l", "7"))
    assert f"no entry log {log_name(7)} in {tmp_path}; its entry logs: 0" in line
    assert tree(tmp_path) == [log_name(0)]


def test_ledger_without_a_ledger_id(tmp_path: Path) -> None:
    line = one_line_error(bookkeeper("shell", "ledger", "--ledger-dir", str(tmp_path / "ledgers")))
    assert line == "error: which ledger? give -id LEDGER_ID"
    assert tree(tmp_path) == []


def test_autorecovery_enable_and_disable_together_is_a_usage_error(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'metadata.db'}"
    line = one_line_error(
        bookkeeper("shell", "autorecovery", "--metadata-uri", uri, "-e", "-d"), status=2
    )
    assert "not allowed with argument" in line
    assert "see 'bookkeeper shell autorecovery --help'" in line
    assert tree(tmp_path) == []  # no store created


def test_localconsistencycheck_on_a_mistyped_directory_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "ledgrs"
    line = one_line_error(bookkeeper("shell", "localconsistencycheck", "--ledger-dir", str(typo)))
    assert "does not exist" in line
    assert not typo.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    line = one_line_error(bookkeeper("shell", "localconsistencycheck", "--ledger-dir", str(empty)))
    assert "holds no bookie data" in line
    assert tree(empty) == []  # no index made there


def test_shell_command_without_a_metadata_uri() -> None:
    env = {k: v for k, v in os.environ.items() if k != "BOOKKEEPER_METADATA_URI"}
    line = one_line_error(bookkeeper("shell", "listledgers", env=env))
    assert line == (
        "error: no metadata service URI; pass --metadata-uri URI, set BOOKKEEPER_METADATA_URI, "
        "or give shell --conf bk_server.conf with metadataServiceUri (or zkServers)"
    )


def test_malformed_metadata_uri_names_the_accepted_schemes() -> None:
    line = one_line_error(bookkeeper("shell", "listbookies", "--metadata-uri", "localhost:2181"))
    assert "zk+hierarchical://" in line and "sqlite:///" in line and "memory://" in line


def test_missing_sqlite_store_says_how_to_make_one(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'none.db'}"
    line = one_line_error(bookkeeper("shell", "listledgers", "--metadata-uri", uri))
    assert "no metadata store" in line and "localbookie" in line
    assert tree(tmp_path) == []


@pytest.mark.slow
def test_unreachable_zookeeper_is_one_line_without_the_libraries_retry_logging() -> None:
    uri = f"zk+hierarchical://127.0.0.1:{free_port()}/ledgers"
    line = one_line_error(bookkeeper("shell", "listbookies", "--metadata-uri", uri, timeout=120))
    assert "could not connect to ZooKeeper" in line and "check that it runs" in line


def bookie(tmp_path: Path, journal: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return bookkeeper(
        "bookie",
        "--journal-dir",
        str(journal),
        "--ledger-dir",
        str(tmp_path / "ledgers"),
        "--port",
        str(free_port()),
        *extra,
    )


def test_a_bookie_without_a_metadata_service_refuses_to_serve_unseen(tmp_path: Path) -> None:
    line = one_line_error(bookie(tmp_path, tmp_path / "journal"))
    assert "no metadata service" in line and "--metadata-uri" in line and "--standalone" in line
    assert tree(tmp_path) == []


def test_a_file_in_the_way_of_the_journal_directory(tmp_path: Path) -> None:
    (tmp_path / "journal").write_text("a file")
    line = one_line_error(bookie(tmp_path, tmp_path / "journal", "--standalone"))
    assert f"journal directory (journalDirectories) {tmp_path / 'journal'} is a file" in line
    assert (tmp_path / "journal").read_text() == "a file"


def test_an_uncreatable_journal_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    journal = tmp_path / "file" / "journal"  # under a file: never creatable, even by root
    line = one_line_error(bookie(tmp_path, journal, "--standalone"))
    assert "cannot create the journal directory" in line and "name another path" in line
    assert (tmp_path / "file").read_text() == "x"


def test_a_journal_directory_on_a_read_only_file_system(tmp_path: Path) -> None:
    """A read-only bind mount in a mount namespace of the test's own (root ignores mode bits,
    so a chmod would prove nothing)."""
    readonly = tmp_path / "readonly"
    (readonly / "journal").mkdir(parents=True)
    command = (
        f"mount -o bind,ro {readonly} {readonly} && exec {sys.executable} -m bookkeeper_py "
        f"bookie --journal-dir {readonly / 'journal'} --ledger-dir {readonly / 'ledgers'} "
        f"--port {free_port()} --standalone"
    )
    result = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = one_line_error(result)
    assert "cannot write to the journal directory" in line
    assert "Read-only file system" in line and "writable file system" in line
    assert tree(readonly) == ["journal"]


def test_a_bookie_on_a_port_in_use_touches_nothing_on_disk(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = bookkeeper(
            "bookie",
            "--journal-dir",
            str(tmp_path / "journal"),
            "--ledger-dir",
            str(tmp_path / "ledgers"),
            "--port",
            str(port),
            "--standalone",
        )
    line = one_line_error(result)
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in line
    assert "--port" in line
    assert tree(tmp_path) == []
