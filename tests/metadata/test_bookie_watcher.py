"""The client's bookie list: read once, kept current by watches, and watched again after the
metadata session is replaced (issue 5: "clients re-watch")."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from bookkeeper_py.metadata.bookie_watcher import BookieWatcher
from bookkeeper_py.metadata.driver import parse_uri
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing.waiting import wait_for
from bookkeeper_py.testing.zookeeper import expire_session


class CountingClient(MetadataClient):
    """Counts the reads of the bookie list, to show that the cache serves unchanged lists."""

    reads = 0

    def writable_bookies(self) -> list[str]:
        self.reads += 1
        return super().writable_bookies()


@pytest.fixture
def clients(uri: str) -> Iterator[tuple[CountingClient, MetadataClient]]:
    with MetadataClient.connect(uri, create=True) as setup:
        setup.init_cluster()
    watched = CountingClient.connect(uri)
    bookie = MetadataClient.connect(uri)
    assert isinstance(watched, CountingClient)
    try:
        yield watched, bookie
    finally:
        bookie.close()
        watched.close()


def test_the_list_is_cached_until_a_bookie_comes_or_goes(
    clients: tuple[CountingClient, MetadataClient],
) -> None:
    watched, bookie = clients
    watcher = BookieWatcher(watched)
    assert watcher.snapshot() == ([], [])
    bookie.register_bookie("a:1", "127.0.0.1", 1)
    wait_for(lambda: watcher.writable() == ["a:1"], 10, "the watch reported a:1")
    reads = watched.reads
    assert [watcher.writable() for _ in range(100)] == [["a:1"]] * 100
    assert watched.reads == reads  # served from the cache
    bookie.register_bookie("b:2", "127.0.0.1", 2, readonly=True)
    wait_for(lambda: watcher.readonly() == ["b:2"], 10, "the watch reported read-only b:2")
    bookie.unregister_bookie("a:1")
    wait_for(lambda: watcher.writable() == [], 10, "the watch reported a:1 gone")
    watcher.close()


def replace_session(uri: str, client: MetadataClient) -> None:
    address = parse_uri(uri)
    if address.scheme == "zk":
        expire_session(client.store)
    else:  # as if the process had stalled past its lease
        with sqlite3.connect(address.location) as other:
            session = client.store._session  # type: ignore[attr-defined]
            other.execute("UPDATE sessions SET expires_ms = 0 WHERE id = ?", (session,))


def test_after_a_session_replacement_the_list_is_watched_again(shared_uri: str) -> None:
    with MetadataClient.connect(shared_uri, create=True) as setup:
        setup.init_cluster()
    with (
        MetadataClient.connect(shared_uri) as watched,
        MetadataClient.connect(shared_uri) as bookie,
    ):
        watcher = BookieWatcher(watched)
        replaced: list[bool] = []
        watched.store.add_session_listener(lambda: replaced.append(True))
        bookie.register_bookie("a:1", "127.0.0.1", 1)
        wait_for(lambda: watcher.writable() == ["a:1"], 10, "a:1 seen")
        replace_session(shared_uri, watched)
        wait_for(lambda: bool(replaced), 30, "the watched client's session was replaced")
        # Changes after the new session are still seen, without restarting anything.
        bookie.register_bookie("b:2", "127.0.0.1", 2)
        wait_for(lambda: watcher.writable() == ["a:1", "b:2"], 10, "b:2 seen on the new session")
        bookie.unregister_bookie("a:1")
        wait_for(lambda: watcher.writable() == ["b:2"], 10, "a:1 gone on the new session")
        watcher.close()
