"""``localbookie --data-dir DIR`` keeps its bookie ids and ports in DIR and restarts on it, serving
everything written before; a second one on the same DIR is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bookkeeper_py import BookKeeper
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.local_cluster import LAYOUT_FILE, LocalClusterError
from bookkeeper_py.testing.waiting import interrupt

from .test_cli_errors import bookkeeper, one_line_error

PASSWORD = b"pw"


def write_ledger(uri: str, entries: int, tag: bytes) -> int:
    with BookKeeper(uri) as bk:
        writer = bk.create_ledger(3, 2, 2, password=PASSWORD)
        futures = [writer.add_entry_async(tag + b"-%d" % i) for i in range(entries)]
        assert [future.result() for future in futures] == list(range(entries))
        writer.close()
        return writer.ledger_id


def read_ledger(uri: str, ledger_id: int) -> list[bytes]:
    with BookKeeper(uri) as bk:
        reader = bk.open_ledger(ledger_id, password=PASSWORD)
        return [entry.data for entry in reader.read_entries(0, reader.last_add_confirmed)]


@pytest.mark.slow
def test_a_cluster_restarts_on_its_directory_with_its_ids_and_data(tmp_path: Path) -> None:
    with LocalCluster(3, base_directory=str(tmp_path)) as first:
        uri, ids = first.metadata_uri, first.bookie_ids
        ledger = write_ledger(uri, 500, b"before")
    layout = json.loads((tmp_path / LAYOUT_FILE).read_text())
    assert [bookie["bookie_id"] for bookie in layout["bookies"]] == ids
    with LocalCluster(3, base_directory=str(tmp_path)) as second:
        assert (second.metadata_uri, second.bookie_ids) == (uri, ids)
        assert read_ledger(uri, ledger) == [b"before-%d" % i for i in range(500)]
        after = write_ledger(uri, 10, b"after")
        assert read_ledger(uri, after) == [b"after-%d" % i for i in range(10)]
    with LocalCluster(4, base_directory=str(tmp_path)) as grown:  # one bookie more: added
        assert grown.bookie_ids[:3] == ids and len(set(grown.bookie_ids)) == 4
        assert read_ledger(uri, ledger)[-1] == b"before-499"
    with pytest.raises(LocalClusterError, match="holds a cluster of 4 bookies; start it with 4"):
        LocalCluster(3, base_directory=str(tmp_path))


def test_a_damaged_layout_file_is_refused_and_kept(tmp_path: Path) -> None:
    (tmp_path / LAYOUT_FILE).write_text('{"version": 1, "bookies": [{"port": "x"}]}')
    with pytest.raises(LocalClusterError, match=f"{LAYOUT_FILE} is damaged"):
        LocalCluster(3, base_directory=str(tmp_path))
    assert (tmp_path / LAYOUT_FILE).read_text().startswith('{"version": 1')


def start_localbookie(directory: Path) -> tuple[subprocess.Popen[str], str]:
    """``bookkeeper localbookie 3 --data-dir DIR`` and the metadata URI it prints once serving."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bookkeeper_py", "localbookie", "3", "--data-dir", str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    uri = ""
    deadline = time.monotonic() + 120
    for line in process.stdout:  # ends when the process exits
        if line.startswith("metadata service URI: "):
            uri = line.split(": ", 1)[1].strip()
        if line.startswith("cluster is up") or time.monotonic() > deadline:
            break
    if not uri or process.poll() is not None:
        process.kill()
        _, err = process.communicate(timeout=30)
        pytest.fail(f"localbookie did not come up: {err[-2000:]}")
    return process, uri


def stop(process: subprocess.Popen[str]) -> None:
    """Ctrl-C: the cluster stops cleanly, status 0."""
    _, err = interrupt(process)
    assert process.returncode == 0, err[-2000:]


@pytest.mark.slow
def test_the_localbookie_command_restarts_on_its_data_directory(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    process, uri = start_localbookie(data)
    try:
        ledger = write_ledger(uri, 1000, b"entry")
        line = one_line_error(bookkeeper("localbookie", "3", "--data-dir", str(data)))
        assert "in use by another local cluster" in line and f"pid {process.pid}" in line
        assert read_ledger(uri, ledger)[-1] == b"entry-999"  # the first one still serves
    finally:
        stop(process)
    process, again = start_localbookie(data)
    try:
        assert again == uri
        assert read_ledger(uri, ledger) == [b"entry-%d" % i for i in range(1000)]
    finally:
        stop(process)


def test_a_data_directory_that_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "data"
    path.write_text("mine")
    line = one_line_error(bookkeeper("localbookie", "1", "--data-dir", str(path)))
    assert line == (
        f"error: the cluster directory (--data-dir) {path} is a file, not a directory; move the "
        "file away or name another directory"
    )
    assert path.read_text() == "mine" and os.listdir(tmp_path) == ["data"]
