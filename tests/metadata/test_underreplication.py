"""The ``underreplication/`` tree (reference sections 1.9 and 1.14) on every driver, and the
shell commands that read and switch it."""

from __future__ import annotations

import re

import pytest

from bookkeeper_py.errors import MetadataStoreError
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.metadata.underreplication import UnderReplicationManager

from .test_cluster_commands import refused, shell

BIG = (1 << 40) + 7  # a 63-bit id: its marker path uses every hex level


def test_markers_locks_and_switches(uri: str) -> None:
    with MetadataClient.connect(uri, create=True) as client:
        client.init_cluster()
        manager = UnderReplicationManager(client)
        base = f"{client.root}/underreplication"
        layout, _ = client.store.get(f"{base}/LAYOUT")
        assert layout == b'type: "BASIC"\nversion: 1\n'
        assert list(manager.underreplicated_ledgers()) == []

        manager.mark_underreplicated(BIG, ["b:2"])
        manager.mark_underreplicated(5, ["a:1"])
        manager.mark_underreplicated(5, ["a:1", "c:3"])  # merged, no duplicates
        assert list(manager.underreplicated_ledgers()) == [5, BIG]
        assert manager.missing_replicas(5) == ["a:1", "c:3"]
        assert manager.missing_replicas(6) is None
        data, _ = client.store.get(f"{base}/ledgers/0000/0000/0000/0005/urL0000000005")
        assert re.fullmatch(rb'replica: "a:1"\nreplica: "c:3"\nctime: \d{13}\n', data)
        assert client.store.exists(f"{base}/ledgers/0000/0100/0000/0007/urL{BIG:010d}") is not None

        # One worker at a time; the lock ends with its holder's session.
        with MetadataClient.connect(uri) as other:
            worker = UnderReplicationManager(other)
            assert worker.acquire(5, "worker-1:3181")
            assert not manager.acquire(5)
            assert manager.lock_holder(5) == "worker-1:3181"
            assert not worker.acquire(6)  # not marked: nothing to lock
        assert manager.lock_holder(5) is None
        assert manager.acquire(5, "worker-2:3181")
        manager.mark_replicated(5)
        assert manager.missing_replicas(5) is None and manager.lock_holder(5) is None
        assert list(manager.underreplicated_ledgers()) == [BIG]
        # The emptied directories go with the marker; the others stay.
        assert client.store.children(f"{base}/ledgers") == ["0000"]
        assert client.store.children(f"{base}/ledgers/0000") == ["0100"]

        assert manager.is_enabled() and manager.lost_bookie_recovery_delay() == 0
        manager.disable()
        manager.set_lost_bookie_recovery_delay(30)
        again = UnderReplicationManager(client)
        assert not again.is_enabled() and again.lost_bookie_recovery_delay() == 30
        assert client.store.get(f"{base}/lostBookieRecoveryDelay")[0] == b"30"
        again.enable()
        assert manager.is_enabled()


def test_an_incompatible_layout_is_refused(uri: str) -> None:
    with MetadataClient.connect(uri, create=True) as client:
        client.init_cluster()
        client.store.create(f"{client.root}/underreplication")
        client.store.create(
            f"{client.root}/underreplication/LAYOUT", b'type: "BASIC"\nversion: 2\n'
        )
        with pytest.raises(MetadataStoreError, match="BASIC version 2"):
            UnderReplicationManager(client)


def test_autorecovery_shell_commands(capsys: pytest.CaptureFixture[str], uri: str) -> None:
    shell(capsys, uri, "initnewcluster")
    with MetadataClient.connect(uri) as client:
        manager = UnderReplicationManager(client)
        manager.mark_underreplicated(3, ["a:1"])
        manager.mark_underreplicated(4, ["b:2", "c:3"])
        manager.acquire(4, "worker:3181")
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
