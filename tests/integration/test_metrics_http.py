"""The bookie's HTTP port: /metrics parsed by Prometheus's own text parser moves as a client
adds and reads; /heartbeat and the read-only /api/v1/bookie/* endpoints answer (issue 4)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.errors import NotEnoughBookiesError, WriteError
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing import LocalCluster


@pytest.fixture(scope="module")
def cluster(module_metadata_uri: str | None) -> Iterator[LocalCluster]:
    with LocalCluster(1, metadata_uri=module_metadata_uri) as local:
        yield local


def get(cluster: LocalCluster, path: str) -> bytes:
    with urllib.request.urlopen(
        f"http://127.0.0.1:{cluster.bookies[0].http_port}{path}", timeout=10
    ) as answer:
        assert answer.status == 200
        return bytes(answer.read())


def scrape(cluster: LocalCluster) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(get(cluster, "/metrics").decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_move_with_adds_and_reads(cluster: LocalCluster) -> None:
    before = scrape(cluster)
    with BookKeeper(cluster.metadata_uri) as client:
        writer = client.create_ledger(1, 1, 1, DigestType.CRC32C, b"m")
        for _ in range(50):
            writer.add_entry(b"x" * 100)
        writer.close()
        reader = client.open_ledger(writer.ledger_id, b"m")
        assert len(reader.read_entries(0, 49)) == 50
    after = scrape(cluster)
    adds = "bookkeeper_server_ADD_ENTRY_REQUEST_count"
    assert value(after, adds, success="true") - value(before, adds, success="true") == 50
    # E = Qw = 1: the client reads in batches (BATCH_READ_ENTRY), one request or more
    reads = (
        "bookkeeper_server_READ_ENTRY_REQUEST_count",
        "bookkeeper_server_BATCH_READ_ENTRY_REQUEST_count",
    )
    assert (
        sum(
            value(after, name, success="true") - value(before, name, success="true")
            for name in reads
        )
        >= 1
    )
    fences = "bookkeeper_server_READ_ENTRY_FENCE_REQUEST_count"
    assert value(after, fences, success="true") == value(
        before, fences, success="true"
    )  # closed: no fencing
    written = value(after, "bookie_WRITE_BYTES_total") - value(before, "bookie_WRITE_BYTES_total")
    assert written >= 50 * (100 + 32)  # payload and header of each entry
    read = value(after, "bookie_READ_BYTES_total") - value(before, "bookie_READ_BYTES_total")
    # exactly the 50 entries the client read (header 32 + CRC32C 4 + payload 100 bytes each);
    # nothing the bookie read for itself
    assert read == 50 * 136
    syncs = "bookie_journal_JOURNAL_SYNC_count"
    assert value(after, syncs, success="true", journalIndex="0") > value(
        before, syncs, success="true", journalIndex="0"
    )
    assert value(after, "bookie_SERVER_STATUS") == 1.0


def test_metrics_of_named_families_alone(cluster: LocalCluster) -> None:
    """``/metrics?name[]=F&name[]=G``: the metric families named F and G alone."""
    query = "name%5B%5D=bookie_journal_JOURNAL_SYNC&name%5B%5D=bookie_SERVER_STATUS"
    text = get(cluster, "/metrics?" + query).decode()
    names = {family.name for family in text_string_to_metric_families(text)}
    assert names == {"bookie_journal_JOURNAL_SYNC", "bookie_SERVER_STATUS"}


def test_heartbeat_and_bookie_endpoints(cluster: LocalCluster) -> None:
    assert get(cluster, "/heartbeat") == b"OK\n"
    info = json.loads(get(cluster, "/api/v1/bookie/info"))
    assert info["bookieId"] == cluster.bookie_ids[0] and 0 < info["freeSpace"] <= info["totalSpace"]
    state = json.loads(get(cluster, "/api/v1/bookie/state"))
    assert state == {
        "running": True,
        "readOnly": False,
        "shuttingDown": False,
        "availableForHighPriorityWrites": True,
    }
    marks = json.loads(get(cluster, "/api/v1/bookie/last_log_mark"))
    assert list(marks) == [cluster.bookies[0].journal_directory]
    files = json.loads(get(cluster, "/api/v1/bookie/list_disk_file"))
    assert ".txn" in files["journal files"] and "data.mdb" in files["index files"]
    assert json.loads(get(cluster, "/api/v1/bookie/list_disk_file?file_type=journal")) == {
        "journal files": files["journal files"]
    }
    assert list(json.loads(get(cluster, "/api/v1/bookie/list_disk_file?file_type=index"))) == [
        "index files"
    ]
    with pytest.raises(urllib.error.HTTPError) as refused:
        get(cluster, "/api/v1/bookie/list_disk_file?file_type=txn")
    with refused.value:
        assert refused.value.code == 400
        assert refused.value.read() == b"file_type must be journal, entrylog or index, not 'txn'"


def put(cluster: LocalCluster, path: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{cluster.bookies[0].http_port}{path}", data=body, method="PUT"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, bytes(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_an_operator_can_turn_the_bookie_read_only_and_back(metadata_uri: str | None) -> None:
    # A cluster of its own: the switch moves the bookie's registration, which the other tests of
    # the module's cluster read.
    with (
        LocalCluster(1, metadata_uri=metadata_uri) as cluster,
        MetadataClient.connect(cluster.metadata_uri) as metadata,
    ):
        bookie = cluster.bookie_ids[0]
        with BookKeeper(cluster.metadata_uri) as client:
            existing = client.create_ledger(1, 1, 1)
            assert existing.add_entry(b"before") == 0
            answer = put(cluster, "/api/v1/bookie/state/readonly", b'{"readOnly": true}')
            assert answer == (200, b'{"readOnly": true}')
            assert json.loads(get(cluster, "/api/v1/bookie/state/readonly")) == {"readOnly": True}
            with pytest.raises(WriteError, match="EREADONLY"):
                existing.add_entry(b"while read-only")
        assert metadata.readonly_bookies() == [bookie] and metadata.writable_bookies() == []
        assert json.loads(get(cluster, "/api/v1/bookie/state"))["readOnly"] is True
        with BookKeeper(cluster.metadata_uri) as client, pytest.raises(NotEnoughBookiesError):
            client.create_ledger(1, 1, 1)  # no writable bookie is registered
        for body, wanted in (
            (b'{"readOnly": "yes"}', b'"readOnly" must be true or false'),
            (b"not json", b'expected a JSON body {"readOnly": true|false}: Expecting value'),
            (b'{"readonly": true}', b'expected a JSON body {"readOnly": true|false}'),
            (b"[true]", b'expected a JSON body {"readOnly": true|false}'),
            (b"", b'expected a JSON body {"readOnly": true|false}'),
        ):
            status, said = put(cluster, "/api/v1/bookie/state/readonly", body)
            assert status == 400 and said.startswith(wanted), (body, status, said)
            assert b"\n" not in said, said
            # nothing changed: still read-only, and registered so
            assert json.loads(get(cluster, "/api/v1/bookie/state/readonly")) == {"readOnly": True}
            assert metadata.readonly_bookies() == [bookie] and metadata.writable_bookies() == []
        assert put(cluster, "/api/v1/bookie/state/readonly", b'{"readOnly": false}') == (
            200,
            b'{"readOnly": false}',
        )
        assert metadata.writable_bookies() == [bookie] and metadata.readonly_bookies() == []
        with BookKeeper(cluster.metadata_uri) as client:
            handle = client.create_ledger(1, 1, 1)
            assert handle.add_entry(b"writable again") == 0
            handle.close()


def test_force_read_only_bookie_starts_read_only_and_stays_so() -> None:
    with LocalCluster(1, bookie_args=["--force-read-only", "true"]) as forced:
        bookie = forced.bookie_ids[0]
        metadata = MetadataClient.connect(forced.metadata_uri)
        try:
            assert metadata.readonly_bookies() == [bookie] and metadata.writable_bookies() == []
            with BookKeeper(forced.metadata_uri) as client, pytest.raises(NotEnoughBookiesError):
                client.create_ledger(1, 1, 1)
            # the operator's switch cannot make it writable: the configuration decides
            assert put(forced, "/api/v1/bookie/state/readonly", b'{"readOnly": false}') == (
                400,
                b"Bookie is in forceReadOnly mode, cannot transit to writable mode",
            )
            assert json.loads(get(forced, "/api/v1/bookie/state/readonly")) == {"readOnly": True}
            assert json.loads(get(forced, "/api/v1/bookie/state"))["readOnly"] is True
            assert metadata.readonly_bookies() == [bookie]
        finally:
            metadata.close()


def test_metrics_on_a_port_of_their_own() -> None:
    from bookkeeper_py.testing.local_cluster import free_port

    port = free_port()
    with LocalCluster(1, bookie_args=["--metrics-port", str(port)]) as local:
        with BookKeeper(local.metadata_uri) as client:
            handle = client.create_ledger(1, 1, 1)
            handle.add_entry(b"counted")
            handle.close()
        url = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = answer.read().decode()
        families = {family.name for family in text_string_to_metric_families(text)}
        assert "bookkeeper_server_ADD_ENTRY_REQUEST" in families
        with pytest.raises(urllib.error.HTTPError) as refused:  # /metrics only on that port
            urllib.request.urlopen(f"{url}/api/v1/bookie/state", timeout=10)
        refused.value.close()
        assert refused.value.code == 404


def test_is_ready_server_config_and_list_bookies(cluster: LocalCluster) -> None:
    bookie = cluster.bookie_ids[0]
    assert get(cluster, "/api/v1/bookie/is_ready") == b"OK"
    settings = json.loads(get(cluster, "/api/v1/config/server_config"))
    assert settings["bookiePort"] == int(bookie.rsplit(":", 1)[1])
    assert settings["journalSyncData"] is True and "bookieId" not in settings  # set keys only
    assert put(cluster, "/api/v1/config/server_config", b'{"bookiePort": 1}')[0] == 405
    assert json.loads(get(cluster, "/api/v1/config/server_config")) == settings  # unchanged
    assert json.loads(get(cluster, "/api/v1/bookie/list_bookies")) == {bookie: None}
    assert json.loads(get(cluster, "/api/v1/bookie/list_bookies?type=ro")) == {}
    assert json.loads(get(cluster, "/api/v1/bookie/list_bookies?print_hostnames=true")) == {
        bookie: "127.0.0.1"
    }
    with pytest.raises(urllib.error.HTTPError) as refused:
        get(cluster, "/api/v1/bookie/list_bookies?type=writable")
    with refused.value:
        assert refused.value.code == 400
        assert refused.value.read() == b"type must be rw or ro, not 'writable'"


def test_a_bookie_without_read_only_mode_refuses_the_switch() -> None:
    with LocalCluster(1, bookie_args=["--read-only-mode-enabled", "false"]) as local:
        assert put(local, "/api/v1/bookie/state/readonly", b'{"readOnly": true}') == (
            400,
            b"Bookie is disabled ReadOnly mode, cannot transit to readOnly mode",
        )
        assert json.loads(get(local, "/api/v1/bookie/state/readonly")) == {"readOnly": False}
        with BookKeeper(local.metadata_uri) as client:  # still writable
            handle = client.create_ledger(1, 1, 1)
            assert handle.add_entry(b"taken") == 0
            handle.close()


def test_cluster_info_over_http_and_from_the_shell(metadata_uri: str | None) -> None:
    import subprocess
    import sys

    with LocalCluster(2, metadata_uri=metadata_uri) as local:
        http = f"http://127.0.0.1:{local.bookies[0].http_port}/api/v1/bookie/cluster_info"

        def over_http() -> dict[str, object]:
            with urllib.request.urlopen(http, timeout=10) as answer:
                return dict(json.loads(answer.read()))

        assert over_http() == {
            "auditorElected": False,
            "auditorId": "",
            "clusterUnderReplicated": False,
            "ledgerReplicationEnabled": True,
            "totalBookiesCount": 2,
            "writableBookiesCount": 2,
            "readonlyBookiesCount": 0,
            "unavailableBookiesCount": 0,
        }
        local.stop_bookie(1)  # its cookie stays: known, unavailable
        shell = subprocess.run(
            [
                sys.executable,
                "-m",
                "bookkeeper_py",
                "shell",
                "clusterinfo",
                "--metadata-uri",
                local.metadata_uri,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        from_shell = json.loads(shell.stdout)
        assert from_shell["writableBookiesCount"] == 1
        assert from_shell["unavailableBookiesCount"] == 1
        assert over_http() == from_shell  # one service behind both
