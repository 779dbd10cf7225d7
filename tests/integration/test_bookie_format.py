"""``shell --conf bk_server.conf bookieformat`` and ``initbookie`` on a real bookie: a running
bookie's directories are refused (its locks); stopped, its data (and with -d its cookie) goes,
after which initbookie agrees it can start as a new bookie, and it does. Without a configuration,
off a terminal without -f, or with data left: one-line errors, nothing changed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bookkeeper_py import BookKeeper
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.storage.disk import LOCK_FILE
from bookkeeper_py.testing import LocalCluster


def shell(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", "shell", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def contents(directory: str) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name != LOCK_FILE)


def test_bookieformat_and_initbookie(tmp_path: Path) -> None:
    with LocalCluster(1) as local:
        bookie = local.bookies[0]
        journal = bookie.journal_directory
        ledgers = os.path.join(bookie.directory, "ledgers")
        conf = tmp_path / "bk_server.conf"
        conf.write_text(
            f"metadataServiceUri={local.metadata_uri}\nadvertisedAddress=127.0.0.1\n"
            f"bookiePort={bookie.port}\njournalDirectories={journal}\nledgerDirectories={ledgers}\n"
        )
        with BookKeeper(local.metadata_uri) as client:
            handle = client.create_ledger(1, 1, 1)
            handle.add_entry(b"data")
            handle.close()

        def one_line_failure(*args: str) -> str:
            failed = shell(*args)
            assert failed.returncode == 1, (args, failed.stdout, failed.stderr)
            assert failed.stderr.count("\n") == 1, failed.stderr
            return failed.stderr

        assert "in use by" in one_line_failure("--conf", str(conf), "bookieformat", "-f")
        assert "is not empty" in one_line_failure("--conf", str(conf), "initbookie")
        assert "give shell --conf" in one_line_failure(
            "bookieformat", "-f", "--metadata-uri", local.metadata_uri
        )
        assert contents(journal) and contents(ledgers)  # nothing was deleted

        local.stop_bookie(0)
        assert "pass -f" in one_line_failure("--conf", str(conf), "bookieformat")
        formatted = shell("--conf", str(conf), "bookieformat", "-f")
        assert formatted.returncode == 0, formatted.stderr
        assert contents(journal) == [] and contents(ledgers) == []
        assert "cookie of bookie" in one_line_failure("--conf", str(conf), "initbookie")
        deleted = shell("--conf", str(conf), "bookieformat", "-n", "-d")
        assert deleted.returncode == 0 and "its cookie deleted" in deleted.stdout
        with MetadataClient.connect(local.metadata_uri) as metadata:
            assert metadata.read_cookie(bookie.bookie_id) is None

        ready = shell("--conf", str(conf), "initbookie")
        assert ready.returncode == 0, ready.stderr
        assert ready.stdout.strip() == f"bookie {bookie.bookie_id} can start as a new bookie"
        local.start_bookie(0)  # a new bookie on the emptied directories
        with BookKeeper(local.metadata_uri) as client:
            handle = client.create_ledger(1, 1, 1)
            assert handle.add_entry(b"again") == 0
            handle.close()
