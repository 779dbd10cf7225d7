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
from bookkeeper_py.metadata.driver import parse_uri
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


def test_bookieformat_and_initbookie(tmp_path: Path, metadata_uri: str | None) -> None:
    with LocalCluster(1, metadata_uri=metadata_uri) as local:
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
        kept = contents(journal), contents(ledgers)
        assert "pass -f" in one_line_failure("--conf", str(conf), "bookieformat")
        assert kept[0] and kept[1] and (contents(journal), contents(ledgers)) == kept
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


def test_updatecookie_lists_moves_to_a_new_id_and_deletes(
    tmp_path: Path, metadata_uri: str | None
) -> None:
    from bookkeeper_py.server.config import build, read_conf
    from bookkeeper_py.server.main import check_cookies
    from bookkeeper_py.storage.cookie import Cookie

    with LocalCluster(1, metadata_uri=metadata_uri) as local:
        bookie = local.bookies[0]
        journal = bookie.journal_directory
        ledgers = os.path.join(bookie.directory, "ledgers")
        base = (
            f"metadataServiceUri={local.metadata_uri}\nadvertisedAddress=127.0.0.1\n"
            f"bookiePort={bookie.port}\njournalDirectories={journal}\nledgerDirectories={ledgers}\n"
        )
        conf = tmp_path / "bk_server.conf"
        conf.write_text(base)
        listed = shell("--conf", str(conf), "updatecookie", "-l")
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines() == [
            os.path.join(journal, "current", "VERSION"),
            os.path.join(ledgers, "current", "VERSION"),
            f"{parse_uri(local.metadata_uri).root}/cookies/{bookie.bookie_id}",
        ]

        def stored_cookie(bookie_id: str) -> tuple[bytes, int] | None:
            with MetadataClient.connect(local.metadata_uri) as metadata:
                return metadata.read_cookie(bookie_id)

        def refused(*args: str, wanted: str) -> None:
            """A one-line refusal (with the old configuration) that changes no cookie, in the
            directories or the store."""
            failed = shell("--conf", str(conf), "updatecookie", *args)
            assert failed.returncode == 1 and wanted in failed.stderr, (args, failed.stderr)
            assert failed.stderr.startswith("error: ") and failed.stderr.count("\n") == 1
            assert shell("--conf", str(conf), "updatecookie", "-l").stdout == listed.stdout
            assert stored_cookie(bookie.bookie_id) == old_cookie
            assert directory_cookies() == old_directory_cookies

        def directory_cookies() -> list[bytes]:
            return [Path(path).read_bytes() for path in listed.stdout.splitlines()[:2]]

        old_cookie, old_directory_cookies = stored_cookie(bookie.bookie_id), directory_cookies()
        assert old_cookie is not None
        refused("-d", "force", wanted="in use by")  # it runs
        local.stop_bookie(0)

        renamed = tmp_path / "renamed.conf"
        new_id = f"renamed-bookie:{bookie.port}"
        renamed.write_text(base + f"bookieId={new_id}\n")
        refused("-b", bookie.bookie_id, wanted="is 127.0.0.1")  # the old conf: same id
        refused("-l", "-d", "force", wanted="give one of")
        refused("-e", wanted="would move every ledger")
        assert stored_cookie(new_id) is None
        moved = shell("--conf", str(renamed), "updatecookie", "-b", bookie.bookie_id)
        assert moved.returncode == 0, moved.stderr
        assert f"updateBookieInLedger -sb {bookie.bookie_id} -db {new_id}" in moved.stdout
        with MetadataClient.connect(local.metadata_uri) as metadata:
            assert metadata.read_cookie(bookie.bookie_id) is None
            stored = metadata.read_cookie(new_id)
            assert stored is not None
            assert Cookie.decode(stored[0], "metadata").bookie_id == new_id
            check_cookies(build(read_conf(str(renamed))), metadata)  # what the bookie checks
        moved_cookie = stored_cookie(new_id)
        moved_listing = shell("--conf", str(renamed), "updatecookie", "-l").stdout
        again = shell("--conf", str(renamed), "updatecookie", "-b", bookie.bookie_id)
        assert again.returncode == 1 and "no cookie of bookie" in again.stderr
        assert again.stderr.startswith("error: ") and again.stderr.count("\n") == 1
        assert stored_cookie(new_id) == moved_cookie and stored_cookie(bookie.bookie_id) is None
        assert shell("--conf", str(renamed), "updatecookie", "-l").stdout == moved_listing

        deleted = shell("--conf", str(renamed), "updatecookie", "-d", "force")
        assert deleted.returncode == 0 and deleted.stdout.count("deleted ") == 3
        assert shell("--conf", str(renamed), "updatecookie", "-l").stdout == ""
