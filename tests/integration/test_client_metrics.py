"""The client's metrics (``ClientConfig.metrics``) in BookKeeper's names: adds, reads and ledger
operations timed by outcome, ensemble changes, pending adds, LAC updates, under-replicated adds,
digest mismatches, and the per-bookie channel stats only when asked for; nothing recorded
without them. Each counter moves when its event happens, and only then."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from bookkeeper_py import BookKeeper, DigestType, aio, errors
from bookkeeper_py.prometheus import PrometheusMetrics
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.local_cluster import free_port
from bookkeeper_py.testing.raw import recv_frame
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.digest import DigestManager, master_key
from bookkeeper_py.wire.status import StatusCode

LABEL = re.compile(r'(\w+)="([^"]*)"')
WAIT_S = 20.0  # the longest a test waits for an answer that comes later (a timeout's)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Three bookies for the tests that leave them as they found them."""
    with LocalCluster(3) as local:
        yield local


def value(metrics: PrometheusMetrics, sample: str) -> float:
    rendered = metrics.render().decode().splitlines()
    [line] = [line for line in rendered if line.startswith(sample + " ")]
    return float(line.rsplit(" ", 1)[1])


def labelled(metrics: PrometheusMetrics, name: str, **labels: str) -> float:
    """The value of the sample ``name`` with exactly ``labels``, in whatever order they come."""
    found = []
    for line in metrics.render().decode().splitlines():
        match = re.fullmatch(r"(\w+)\{(.*)\} (\S+)", line)
        if match and match[1] == name and dict(LABEL.findall(match[2])) == labels:
            found.append(float(match[3]))
    [only] = found
    return only


def channel(metrics: PrometheusMetrics, name: str, bookie: str, success: bool = True) -> float:
    """How many requests a per-bookie op stat counted, by outcome."""
    return labelled(
        metrics,
        f"per_channel_bookie_client_{name}_count",
        bookie=bookie,
        success="true" if success else "false",
    )


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not true within {WAIT_S:.0f} s"
        time.sleep(0.05)


def lac_updates(metrics: PrometheusMetrics) -> tuple[float, float]:
    return (
        value(metrics, "bookkeeper_client_LAC_UPDATE_HITS"),
        value(metrics, "bookkeeper_client_LAC_UPDATE_MISSES"),
    )


def test_client_metrics_in_bookkeepers_names() -> None:
    metrics = PrometheusMetrics("bookkeeper", rollover_s=3600)
    with LocalCluster(3) as local, BookKeeper(local.metadata_uri, metrics=metrics) as client:
        handle = client.create_ledger(2, 2, 2)
        for number in range(20):
            handle.add_entry(b"entry %d" % number)
        assert value(metrics, 'bookkeeper_client_ADD_ENTRY_count{success="true"}') == 20
        assert value(metrics, "bookkeeper_client_NUM_PENDING_ADD") == 0
        assert value(metrics, "bookkeeper_client_NUM_ENSEMBLE_CHANGE") == 0
        first = client.get_ledger_metadata(handle.ledger_id).ensembles[0][1]
        local.stop_bookie(local.bookie_ids.index(first[0]))  # the writer replaces it
        for number in range(20, 30):
            handle.add_entry(b"entry %d" % number)
        assert value(metrics, "bookkeeper_client_NUM_ENSEMBLE_CHANGE") >= 1
        handle.close()
        assert value(metrics, "bookkeeper_client_NUM_ENSEMBLE_CHANGE") >= 1  # kept after close
        reader = client.open_ledger(handle.ledger_id)
        assert len(reader.read_entries(0, 29)) == 30
        client.delete_ledger(handle.ledger_id)
        assert value(metrics, 'bookkeeper_client_ADD_ENTRY_count{success="true"}') == 30
        assert value(metrics, 'bookkeeper_client_READ_ENTRY_count{success="true"}') == 1
        for operation in ("CREATE", "OPEN", "DELETE"):
            assert (
                value(metrics, f'bookkeeper_client_LEDGER_{operation}_count{{success="true"}}') == 1
            )
        assert value(metrics, 'bookkeeper_client_LEDGER_RECOVER_count{success="true"}') == 0
        assert value(metrics, "bookkeeper_client_SPECULATIVE_READ_COUNT") >= 0
        # a ledger that is not there: a failed open
        with pytest.raises(errors.NoSuchLedgerError):
            client.open_ledger(999_999)
        assert value(metrics, 'bookkeeper_client_LEDGER_OPEN_count{success="false"}') == 1


def test_lac_updates_count_the_lacs_bookies_tell_a_reader(cluster: LocalCluster) -> None:
    metrics = PrometheusMetrics("bookkeeper", rollover_s=3600)
    with BookKeeper(cluster.metadata_uri, metrics=metrics) as client:
        writer = client.create_ledger(3, 3, 2)
        for number in range(5):
            writer.add_entry(b"entry %d" % number)  # the bookies' LAC is 3
        assert lac_updates(metrics) == (0, 0)  # a writer's own LAC is no update
        reader = client.open_ledger_no_recovery(writer.ledger_id)  # reads the LAC: -1 to 3
        assert reader.last_add_confirmed == 3
        assert lac_updates(metrics) == (1, 0)
        assert reader.read_last_add_confirmed() == 3
        assert lac_updates(metrics) == (1, 1)
        assert len(reader.read_entries(0, 3)) == 4
        assert lac_updates(metrics) == (1, 1)  # entry reads leave the LAC alone
        writer.add_entry(b"entry 5")  # carries LAC 4: the long poll is answered at once
        lac, entry = reader.read_last_add_confirmed_and_entry(4, 10_000)
        assert (lac, entry is not None) == (4, True)
        assert lac_updates(metrics) == (2, 1)
        # past LAC + 1: the bookie waits out the poll and tells LAC 4 again, which stays
        assert reader.read_last_add_confirmed_and_entry(6, 200) == (4, None)
        assert lac_updates(metrics) == (2, 2)
        writer.add_entry(b"entry 6")  # carries LAC 5
        assert reader.read_explicit_last_add_confirmed() == 5
        assert lac_updates(metrics) == (3, 2)
        writer.close()


def test_a_corrupt_entry_counts_a_digest_mismatch(cluster: LocalCluster) -> None:
    """Entry 3 is written straight to the only bookie of a 1/1/1 ledger with one payload byte
    changed after its digest was computed: one mismatch for each time a read brings it back."""
    metrics = PrometheusMetrics("bookkeeper", rollover_s=3600)
    with BookKeeper(cluster.metadata_uri, metrics=metrics) as client:
        writer = client.create_ledger(1, 1, 1, DigestType.CRC32C, b"dm")
        for number in range(3):
            writer.add_entry(b"entry %d" % number)
        digest = DigestManager(writer.ledger_id, DigestType.CRC32C, b"dm")
        packaged = bytearray(digest.package(3, 2, 4 * 7, b"entry 3"))
        packaged[-1] ^= 0xFF
        host, port = writer.metadata.ensembles[0][1][0].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(v2.encode_add_request(master_key(b"dm"), bytes(packaged)))
            assert v2.decode_response(recv_frame(connection)).status == StatusCode.EOK
        good = writer.read_unconfirmed_entries(0, 2)
        assert [entry.data for entry in good] == [b"entry 0", b"entry 1", b"entry 2"]
        assert value(metrics, "bookkeeper_client_READ_ENTRY_DM") == 0
        with pytest.raises(errors.BKError):
            writer.read_unconfirmed_entries(3, 3)
        # the batch read (E = Qw), then the entry read on its own from its one replica
        assert value(metrics, "bookkeeper_client_READ_ENTRY_DM") == 2
        writer.close()


def test_adds_a_bookie_fails_after_the_ack_quorum_count_as_under_replicated(
    cluster: LocalCluster,
) -> None:
    """3/3/2 with one bookie frozen: each add completes on the other two, and the frozen
    bookie's request for it times out afterwards: one under-replicated add each."""
    metrics = PrometheusMetrics("bookkeeper", rollover_s=3600)
    with BookKeeper(
        cluster.metadata_uri, metrics=metrics, per_bookie_metrics=True, request_timeout_s=2.0
    ) as client:
        writer = client.create_ledger(3, 3, 2)
        for number in range(5):
            writer.add_entry(b"entry %d" % number)
        frozen_id = writer.metadata.ensembles[0][1][2]
        # the third bookie's acks need not have come with the adds: wait for them
        wait_until(lambda: channel(metrics, "ADD_ENTRY", frozen_id) == 5)
        assert value(metrics, "bookkeeper_client_ADD_ENTRY_UR") == 0
        frozen = cluster.bookie_ids.index(frozen_id)
        cluster.pause_bookie(frozen)
        try:
            for number in range(5, 8):
                writer.add_entry(b"entry %d" % number)
            wait_until(lambda: value(metrics, "bookkeeper_client_ADD_ENTRY_UR") >= 3)
            assert value(metrics, "bookkeeper_client_ADD_ENTRY_UR") == 3
            assert channel(metrics, "ADD_ENTRY", frozen_id, success=False) == 3
            assert channel(metrics, "TIMEOUT_ADD_ENTRY", frozen_id) == 3
        finally:
            cluster.resume_bookie(frozen)
        assert writer.ensemble_changes == 0  # failures of completed adds replace nobody
        writer.close()
        assert value(metrics, "bookkeeper_client_ADD_ENTRY_UR") == 3


def test_per_bookie_channel_stats_only_when_asked_for(cluster: LocalCluster) -> None:
    def write_and_read(client: BookKeeper) -> tuple[str, ...]:
        writer = client.create_ledger(2, 2, 2)
        for number in range(10):
            writer.add_entry(b"entry %d" % number)
        tail = client.open_ledger_no_recovery(writer.ledger_id)
        assert tail.read_explicit_last_add_confirmed() == 8  # READ_LAC, over v3
        writer.close()
        reader = client.open_ledger(writer.ledger_id)
        assert len(reader.read_entries(0, 9)) == 10
        return writer.metadata.ensembles[0][1]

    off = PrometheusMetrics("bookkeeper", rollover_s=3600)
    with BookKeeper(cluster.metadata_uri, metrics=off) as client:
        write_and_read(client)
    assert "per_channel_bookie_client" not in off.render().decode()
    assert value(off, 'bookkeeper_client_ADD_ENTRY_count{success="true"}') == 10

    on = PrometheusMetrics("bookkeeper", rollover_s=3600)
    with BookKeeper(cluster.metadata_uri, metrics=on, per_bookie_metrics=True) as client:
        ensemble = write_and_read(client)
        reads = read_lacs = 0.0
        for bookie in ensemble:  # 2/2/2: every add waited for both bookies
            assert channel(on, "ADD_ENTRY", bookie) == 10
            assert channel(on, "ADD_ENTRY", bookie, success=False) == 0
            assert channel(on, "TIMEOUT_ADD_ENTRY", bookie) == 0
            assert channel(on, "CLIENT_CONNECT_TIMER", bookie) >= 1
            assert (
                labelled(on, "per_channel_bookie_client_FAILED_CONNECTION_COUNTER", bookie=bookie)
                == 0
            )
            reads += channel(on, "READ_ENTRY", bookie)
            read_lacs += channel(on, "READ_LAC", bookie)
        assert reads >= 1 and read_lacs >= 1
        [other] = [bookie for bookie in cluster.bookie_ids if bookie not in ensemble]
        assert f'bookie="{other}"' not in on.render().decode()  # never asked anything

    async def ask_a_bookie_that_is_not_there(metrics: PrometheusMetrics, bookie: str) -> None:
        async with aio.BookKeeper(
            cluster.metadata_uri, metrics=metrics, per_bookie_metrics=True
        ) as client:
            with pytest.raises(errors.BookieHandleNotAvailableError):
                await client.bookie_client.read_entry(bookie, 1, 0)

    refused = PrometheusMetrics("bookkeeper", rollover_s=3600)
    nobody = f"127.0.0.1:{free_port()}"  # nothing listens there
    asyncio.run(ask_a_bookie_that_is_not_there(refused, nobody))
    counter = "per_channel_bookie_client_FAILED_CONNECTION_COUNTER"
    assert labelled(refused, counter, bookie=nobody) == 1
    assert channel(refused, "CLIENT_CONNECT_TIMER", nobody, success=False) == 1
    assert channel(refused, "READ_ENTRY", nobody) == 0  # never sent
