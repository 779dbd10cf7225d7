"""Real bookie processes refuse to start with an emptied disk, swapped directories or the wrong
cluster, and say why (issue 3, reference section 1.10)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.storage.cookie import Cookie
from bookkeeper_py.testing import LocalCluster


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(2) as local:
        yield local


def ledger_dir(cluster: LocalCluster, index: int) -> str:
    return os.path.join(cluster.bookies[index].directory, "ledgers")


def test_cookies_are_written_to_every_directory_and_the_metadata_store(
    cluster: LocalCluster,
) -> None:
    bookie = cluster.bookies[0]
    metadata = MetadataClient.connect(cluster.metadata_uri)
    try:
        stored = metadata.read_cookie(bookie.bookie_id)
        assert stored is not None
        remote = Cookie.decode(stored[0], "metadata")
        assert remote.bookie_id == bookie.bookie_id and remote.instance_id == metadata.instance_id()
    finally:
        metadata.close()
    for directory in (bookie.journal_directory, ledger_dir(cluster, 0)):
        with open(os.path.join(directory, "current", "VERSION"), "rb") as handle:
            assert Cookie.decode(handle.read(), directory) == remote


def test_an_emptied_ledger_disk_stops_the_bookie(cluster: LocalCluster) -> None:
    cluster.stop_bookie(0)
    shutil.rmtree(ledger_dir(cluster, 0))
    os.makedirs(ledger_dir(cluster, 0))  # a new, empty disk mounted in its place
    with pytest.raises(
        RuntimeError, match=r"exited while starting: .*has no cookie.*empty or was replaced"
    ):
        cluster.start_bookie(0)


def test_swapped_journal_directories_stop_both_bookies(cluster: LocalCluster) -> None:
    cluster.stop_bookie(0)
    cluster.stop_bookie(1)
    first, second = cluster.bookies[0].journal_directory, cluster.bookies[1].journal_directory
    os.rename(first, first + ".swap")
    os.rename(second, first)
    os.rename(first + ".swap", second)
    for index in (0, 1):
        with pytest.raises(
            RuntimeError, match=r"exited while starting: the cookie in .* belongs elsewhere"
        ):
            cluster.start_bookie(index)


def test_a_bookie_pointed_at_another_cluster_stops(cluster: LocalCluster, tmp_path: object) -> None:
    cluster.stop_bookie(0)
    other = f"sqlite:///{tmp_path}/other-cluster.db"
    with LocalCluster(0, metadata_uri=other) as foreign:  # a second, empty cluster
        cluster.metadata_uri, original = foreign.metadata_uri, cluster.metadata_uri
        try:
            with pytest.raises(
                RuntimeError, match=r"exited while starting: .*metadata store has none"
            ):
                cluster.start_bookie(0)
        finally:
            cluster.metadata_uri = original
    cluster.start_bookie(0)  # back in its own cluster it starts
