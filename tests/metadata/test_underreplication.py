"""The ``underreplication/`` tree (reference sections 1.9 and 1.14) on every driver, and the
shell commands that read and switch it."""

from __future__ import annotations

import re

import pytest

from bookkeeper_py.errors import MetadataStoreError
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.metadata.port import MetadataPort, run_blocking
from bookkeeper_py.metadata.underreplication import UnderReplication

from .test_cluster_commands import refused, shell

BIG = (1 << 40) + 7  # a 63-bit id: its marker path uses every hex level


def test_markers_locks_and_switches(uri: str) -> None:
    with MetadataClient.connect(uri, create=True) as client:
        client.init_cluster()
        run_blocking(client, lambda port: markers_locks_and_switches(client, port, uri))


async def markers_locks_and_switches(client: MetadataClient, port: MetadataPort, uri: str) -> None:
    manager = await UnderReplication(port).ensure_layout()
    base = f"{client.root}/underreplication"
    layout, _ = client.store.get(f"{base}/LAYOUT")
    assert layout == b'type: "BASIC"\nversion: 1\n'
    assert await manager.marked() == []

    assert await manager.mark(BIG, ["b:2"])
    await manager.mark(5, ["a:1"])
    await manager.mark(5, ["a:1", "c:3"])  # merged, no duplicates
    assert not await manager.mark(5, ["c:3"])
    assert await manager.marked() == [5, BIG]
    assert await manager.missing_replicas(5) == ["a:1", "c:3"]
    assert await manager.missing_replicas(6) is None
    data, _ = client.store.get(f"{base}/ledgers/0000/0000/0000/0005/urL0000000005")
    assert re.fullmatch(rb'replica: "a:1"\nreplica: "c:3"\nctime: \d{13}\n', data)
    assert client.store.exists(f"{base}/ledgers/0000/0100/0000/0007/urL{BIG:010d}") is not None

    # One worker at a time; the lock ends with its holder's session.
    other = MetadataClient.connect(uri)
    try:
        assert run_blocking_in_thread(other, lambda p: _acquire(p, 5, "worker-1:3181"))
        assert not await manager.acquire(5, "me")
        assert await manager.lock_holder(5) == "worker-1:3181"
        assert not run_blocking_in_thread(other, lambda p: _acquire(p, 6, "worker-1:3181"))
    finally:
        other.close()
    assert await manager.lock_holder(5) is None
    assert await manager.acquire(5, "worker-2:3181")
    await manager.unmark(5)
    assert await manager.missing_replicas(5) is None and await manager.lock_holder(5) is None
    assert await manager.marked() == [BIG]
    # The emptied directories go with the marker; the others stay.
    assert client.store.children(f"{base}/ledgers") == ["0000"]
    assert client.store.children(f"{base}/ledgers/0000") == ["0100"]

    # The election: the lowest vote is the auditor; a withdrawn vote hands it on.
    first = await manager.vote("bookie-1:3181")
    second = await manager.vote("bookie-2:3181")
    assert first < second and await manager.auditor() == "bookie-1:3181"
    await manager.withdraw(first)
    assert await manager.auditor() == "bookie-2:3181"

    assert await manager.is_enabled()
    assert await manager.lost_bookie_recovery_delay() == (0, -1)
    await manager.set_enabled(False)
    await manager.set_lost_bookie_recovery_delay(30)
    again = await UnderReplication(port).ensure_layout()
    assert not await again.is_enabled()
    delay, version = await again.lost_bookie_recovery_delay()
    assert delay == 30
    await again.trigger_audit()  # the same value again, a new version: the auditor's cue
    assert await again.lost_bookie_recovery_delay() == (30, version + 1)
    assert client.store.get(f"{base}/lostBookieRecoveryDelay")[0] == b"30"
    await again.set_enabled(True)
    assert await manager.is_enabled()


async def _acquire(port: MetadataPort, ledger_id: int, holder: str) -> bool:
    return await (await UnderReplication(port).ensure_layout()).acquire(ledger_id, holder)


def run_blocking_in_thread(client: MetadataClient, work):  # type: ignore[no-untyped-def]
    """``run_blocking`` from inside a running loop (the test's): on a thread of its own."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(run_blocking, client, work).result(60)


def test_an_incompatible_layout_is_refused(uri: str) -> None:
    with MetadataClient.connect(uri, create=True) as client:
        client.init_cluster()
        client.store.create(f"{client.root}/underreplication")
        client.store.create(
            f"{client.root}/underreplication/LAYOUT", b'type: "BASIC"\nversion: 2\n'
        )
        with pytest.raises(MetadataStoreError, match="BASIC version 2"):
            run_blocking(client, lambda port: UnderReplication(port).ensure_layout())


def test_autorecovery_shell_commands(capsys: pytest.CaptureFixture[str], uri: str) -> None:
    shell(capsys, uri, "initnewcluster")
    with MetadataClient.connect(uri) as client:
        run_blocking(client, _three_and_four)
        assert shell(capsys, uri, "listunderreplicated").split() == ["3", "4"]
        assert shell(capsys, uri, "listunderreplicated", "-mr", "b:2").split() == ["4"]
        assert shell(capsys, uri, "listunderreplicated", "-emr", "b:2").split() == ["3"]
        detailed = shell(capsys, uri, "listunderreplicated", "-pmr", "-prw")
        assert (
            "missing replicas: b:2, c:3" in detailed
            and "replication worker: worker:3181" in detailed
        )
    assert "enabled" in shell(capsys, uri, "autorecovery")
    assert "disabled" in shell(capsys, uri, "autorecovery", "-d")
    assert "disabled" in shell(capsys, uri, "autorecovery")
    assert "is enabled" in shell(capsys, uri, "autorecovery", "-e")
    assert "0 s" in shell(capsys, uri, "lostbookierecoverydelay", "-g")
    assert "set to 45 s" in shell(capsys, uri, "lostbookierecoverydelay", "-s", "45")
    assert "45 s" in shell(capsys, uri, "lostbookierecoverydelay")
    assert "0 or more" in refused(capsys, uri, "lostbookierecoverydelay", "-s", "-1")
    assert shell(capsys, uri, "lostbookierecoverydelay").strip() == "lostBookieRecoveryDelay: 45 s"


async def _three_and_four(port: MetadataPort) -> None:
    manager = await UnderReplication(port).ensure_layout()
    await manager.mark(3, ["a:1"])
    await manager.mark(4, ["b:2", "c:3"])
    await manager.acquire(4, "worker:3181")
