"""One conformance suite for every metadata driver: memory, SQLite and a real ZooKeeper."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.errors import LedgerExistsError, MetadataUnavailableError, NoSuchLedgerError
from bookkeeper_py.metadata.driver import (
    BadVersionError,
    CheckOp,
    CreateOp,
    DeleteOp,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SetOp,
    open_store,
)
from bookkeeper_py.metadata.manager import INCARNATION_PROPERTY, MetadataClient
from bookkeeper_py.metadata.port import ThreadedMetadata, update_ledger_metadata

from .samples import sample

Opener = Callable[[], MetadataClient]


@pytest.fixture
def opener(uri: str) -> Iterator[Opener]:
    opened: list[MetadataClient] = []

    def open_client() -> MetadataClient:
        client = MetadataClient.connect(uri, create=True)
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        try:
            client.close()
        except Exception:
            pass


def test_node_operations(opener: Opener) -> None:
    store = opener().store
    root = "/conformance"
    assert store.create(f"{root}/a/b", b"x") == f"{root}/a/b"
    assert store.get(f"{root}/a/b") == (b"x", 0)
    with pytest.raises(NodeExistsError):
        store.create(f"{root}/a/b")
    assert store.set(f"{root}/a/b", b"y", 0) == 1
    with pytest.raises(BadVersionError):
        store.set(f"{root}/a/b", b"z", 0)
    with pytest.raises(NotEmptyError):
        store.delete(f"{root}/a")
    with pytest.raises(BadVersionError):
        store.delete(f"{root}/a/b", 0)
    store.delete(f"{root}/a/b", 1)
    assert store.exists(f"{root}/a/b") is None
    with pytest.raises(NoNodeError):
        store.get(f"{root}/a/b")
    store.create(f"{root}/a/c")
    store.create(f"{root}/a/d")
    assert store.children(f"{root}/a") == ["c", "d"]
    first = store.create(f"{root}/seq/n-", sequential=True)
    second = store.create(f"{root}/seq/n-", sequential=True)
    assert first.endswith("n-0000000000") and second.endswith("n-0000000001")


def test_ephemeral_nodes_end_with_their_session(opener: Opener) -> None:
    owner, observer = opener(), opener()
    owner.init_cluster()
    owner.register_bookie("127.0.0.1:9999", "127.0.0.1", 9999)
    assert observer.writable_bookies() == ["127.0.0.1:9999"]
    assert observer.bookie_endpoint("127.0.0.1:9999").port == 9999
    owner.close()
    deadline = time.monotonic() + 15
    while observer.writable_bookies() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert observer.writable_bookies() == []


def test_a_registered_bookies_service_info_is_read_back_whole(opener: Opener) -> None:
    """What ``endpointinfo`` and the client's bookie address read: the endpoint and properties
    a bookie registered, writable or read-only, seen from another session."""
    owner, observer = opener(), opener()
    owner.init_cluster()
    owner.register_bookie("bookie-a:3181", "127.0.0.1", 3181, incarnation="run-1")
    owner.register_bookie(
        "127.0.0.1:3182", "127.0.0.2", 3182, readonly=True, http=("127.0.0.2", 8000, "http")
    )
    info = observer.bookie_service_info("bookie-a:3181")
    assert info is not None and dict(info.properties) == {INCARNATION_PROPERTY: "run-1"}
    assert [(e.id, e.protocol, e.host, e.port) for e in info.endpoints] == [
        ("bookie", "bookie-rpc", "127.0.0.1", 3181)
    ]
    read_only = observer.bookie_service_info("127.0.0.1:3182")
    assert read_only is not None and dict(read_only.properties) == {}
    assert [(e.id, e.protocol, e.host, e.port) for e in read_only.endpoints] == [
        ("bookie", "bookie-rpc", "127.0.0.2", 3182),
        ("httpserver", "http", "127.0.0.2", 8000),  # its HTTP endpoint, as Java's bookie has
    ]
    assert observer.bookie_endpoint("127.0.0.1:3182").host == "127.0.0.2"  # not the id's host
    assert observer.bookie_service_info("127.0.0.1:3183") is None
    owner.unregister_bookie("bookie-a:3181")
    assert observer.bookie_service_info("bookie-a:3181") is None


def test_ledger_metadata_create_read_cas_delete_list(opener: Opener) -> None:
    client = opener()
    client.init_cluster()
    ids = [client.generate_ledger_id() for _ in range(5)]
    assert len(set(ids)) == 5
    for ledger_id in ids:
        client.create_ledger_metadata(sample(ledger_id))
    with pytest.raises(LedgerExistsError):
        client.create_ledger_metadata(sample(ids[0]))
    assert list(client.list_ledgers()) == sorted(ids)
    stored, version = client.read_ledger_metadata(ids[0])
    assert stored == sample(ids[0])
    closed = stored.closed_at(4, 100)
    new_version = client.write_ledger_metadata(closed, version)
    with pytest.raises(BadVersionError):
        client.write_ledger_metadata(stored, version)
    assert client.read_ledger_metadata(ids[0]) == (closed, new_version)
    client.delete_ledger_metadata(ids[1])
    with pytest.raises(NoSuchLedgerError):
        client.read_ledger_metadata(ids[1])
    assert ids[1] not in list(client.list_ledgers())


def test_update_loop_lets_exactly_one_racer_win(opener: Opener) -> None:
    client = opener()
    client.init_cluster()
    ledger_id = client.generate_ledger_id()
    client.create_ledger_metadata(sample(ledger_id))
    ports = [ThreadedMetadata(opener()) for _ in range(4)]
    winners: list[int] = []

    async def recover(index: int) -> None:
        # Each racer moves OPEN -> IN_RECOVERY only if nobody did it first.
        def transform(current: LedgerMetadata) -> LedgerMetadata:
            winners.append(index)
            return current.with_state(LedgerState.IN_RECOVERY)

        await update_ledger_metadata(
            ports[index], ledger_id, lambda m: m.state == LedgerState.OPEN, transform
        )

    async def race() -> None:
        await asyncio.gather(*(recover(index) for index in range(4)))
        for port in ports:
            await port.close()

    asyncio.run(race())
    final, version = client.read_ledger_metadata(ledger_id)
    assert final.state == LedgerState.IN_RECOVERY
    assert version == 1  # exactly one CAS landed
    assert winners  # and a racer's transform made it


def _create_ids(uri: str, count: int, queue: multiprocessing.Queue[list[int]]) -> None:
    client = MetadataClient.connect(uri)
    try:
        queue.put([client.generate_ledger_id() for _ in range(count)])
    finally:
        client.close()


def test_ledger_ids_are_unique_across_processes(shared_uri: str) -> None:
    uri = shared_uri
    setup = MetadataClient.connect(uri, create=True)
    setup.init_cluster()
    setup.close()
    context = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[list[int]] = context.Queue()
    processes = [context.Process(target=_create_ids, args=(uri, 25, queue)) for _ in range(8)]
    for process in processes:
        process.start()
    results = [queue.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(60)
    ids = [i for chunk in results for i in chunk]
    assert len(ids) == 200 and len(set(ids)) == 200


def test_sqlite_registration_expires_when_its_process_is_killed(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'metadata.db'}"
    observer = MetadataClient.connect(uri, create=True)
    observer.init_cluster()
    script = textwrap.dedent(f"""
        import time
        from bookkeeper_py.metadata.manager import INCARNATION_PROPERTY, MetadataClient
        client = MetadataClient.connect({uri!r})
        client.register_bookie("127.0.0.1:7777", "127.0.0.1", 7777)
        print("registered", flush=True)
        time.sleep(600)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"registered"
        assert observer.writable_bookies() == ["127.0.0.1:7777"]
        os.kill(holder.pid, 9)
        holder.wait()
        deadline = time.monotonic() + 20
        while observer.writable_bookies() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert observer.writable_bookies() == []
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
        observer.close()


def test_missing_sqlite_store_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MetadataUnavailableError, match="no metadata store at"):
        open_store(f"sqlite:///{tmp_path / 'absent.db'}")


@pytest.mark.timeout(60)  # a hang fails the test; the error itself must come back
def test_unreachable_zookeeper_is_a_clear_error_not_a_hang() -> None:
    from bookkeeper_py.testing.local_cluster import free_port

    with pytest.raises(MetadataUnavailableError, match="could not connect to ZooKeeper"):
        open_store(f"zk+hierarchical://127.0.0.1:{free_port()}/ledgers", connect_timeout_s=2)


class Changes:
    """Counts a watch's callbacks; waits (bounded) for the next one."""

    def __init__(self) -> None:
        self.count = 0
        self._condition = threading.Condition()

    def __call__(self) -> None:
        with self._condition:
            self.count += 1
            self._condition.notify_all()

    def wait_past(self, seen: int, timeout_s: float = 15.0) -> int:
        with self._condition:
            assert self._condition.wait_for(lambda: self.count > seen, timeout_s), (
                f"no change reported within {timeout_s} s"
            )
            return self.count


def test_children_pages(opener: Opener) -> None:
    store = opener().store
    names = [f"n{index:05d}" for index in range(2500)]
    store.multi([CreateOp("/pages")] + [CreateOp(f"/pages/{name}") for name in names])
    assert store.children_page("/pages", None, 10) == names[:10]
    assert store.children_page("/pages", "n00009", 3) == names[10:13]
    assert store.children_page("/pages", "n02499", 10) == []
    assert list(store.iter_children("/pages", page_size=1000)) == names
    with pytest.raises(NoNodeError):
        store.children_page("/absent")


def test_multi_applies_everything_or_nothing(opener: Opener) -> None:
    store = opener().store
    store.create("/multi/kept", b"v0")
    with pytest.raises(BadVersionError):
        store.multi([CreateOp("/multi/new", b"n"), SetOp("/multi/kept", b"v1", version=7)])
    assert store.exists("/multi/new") is None and store.get("/multi/kept") == (b"v0", 0)
    with pytest.raises(NodeExistsError):
        store.multi([DeleteOp("/multi/kept"), CreateOp("/multi/new"), CreateOp("/multi/new")])
    assert store.get("/multi/kept") == (b"v0", 0)
    with pytest.raises(BadVersionError):
        store.multi([CheckOp("/multi/kept", 3), DeleteOp("/multi/kept")])
    results = store.multi(
        [
            CheckOp("/multi/kept", 0),
            SetOp("/multi/kept", b"v1", 0),
            CreateOp("/multi/new", b"n"),
            DeleteOp("/multi/new"),
        ]
    )
    assert results == [None, 1, "/multi/new", None]
    assert store.get("/multi/kept") == (b"v1", 1) and store.exists("/multi/new") is None


def test_watches_report_data_and_children_changes(opener: Opener) -> None:
    writer, watcher = opener().store, opener().store
    writer.create("/watched/dir")
    data, children = Changes(), Changes()
    data_watch = watcher.watch("/watched/node", data)
    watcher.watch("/watched/dir", children, children=True)
    with pytest.raises(NoNodeError):
        watcher.watch("/watched/absent", Changes(), children=True)
    seen = 0
    for change in (
        lambda: writer.create("/watched/node", b"a"),
        lambda: writer.set("/watched/node", b"b"),
        lambda: writer.delete("/watched/node"),
    ):
        change()
        seen = data.wait_past(seen)
    seen = 0
    for change in (
        lambda: writer.create("/watched/dir/child"),
        lambda: writer.create("/watched/dir/other", ephemeral=True),
        lambda: writer.delete("/watched/dir/child"),
    ):
        change()
        seen = children.wait_past(seen)
    data_watch.cancel()
    writer.create("/watched/node", b"after cancel")
    writer.close()  # its ephemeral child goes with its session
    children.wait_past(seen)
    assert watcher.children("/watched/dir") == []
    time.sleep(0.5)  # a stray callback after cancel would have been counted by now
    assert data.count == 3


def _create_node_later(uri: str, path: str) -> None:
    store, _ = open_store(uri)
    try:
        time.sleep(0.5)
        store.create(path, b"from another process")
    finally:
        store.close()


def test_watches_see_other_processes_promptly(shared_uri: str) -> None:
    watcher, _ = open_store(shared_uri, create=True)
    try:
        watcher.create("/xproc")
        changes = Changes()
        watcher.watch("/xproc", changes, children=True)
        context = multiprocessing.get_context("spawn")
        writer = context.Process(target=_create_node_later, args=(shared_uri, "/xproc/child"))
        writer.start()
        changes.wait_past(0, timeout_s=60)
        writer.join(60)
        assert watcher.children("/xproc") == ["child"]
    finally:
        watcher.close()


def test_an_expired_sqlite_session_is_replaced_and_listeners_called(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'metadata.db'}"
    store, _ = open_store(uri, create=True)
    try:
        store.create("/registry/me", ephemeral=True)
        renewed = Changes()
        store.add_session_listener(renewed)
        # As if the process had stalled past its lease: another process sees the lease run out.
        with sqlite3.connect(str(tmp_path / "metadata.db")) as other:
            other.execute("UPDATE sessions SET expires_ms = 0")
        renewed.wait_past(0)
        assert store.exists("/registry/me") is None
        store.create("/registry/me", ephemeral=True)  # the listener's job, on the new session
        assert store.exists("/registry/me") == 0
    finally:
        store.close()
