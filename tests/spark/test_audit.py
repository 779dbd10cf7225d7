"""The audit job on a real cluster: a healthy cluster reports healthy with every entry and
replica counted; a planted missing replica and a planted corrupt entry are found, each as one
finding, and nothing else; a stopped bookie is unreachable, not missing its entries."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from bookkeeper_py import BookKeeper, DigestType, errors
from bookkeeper_py.aio import BookKeeper as AsyncBookKeeper
from bookkeeper_py.client.facade import LedgerHandle
from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.spark import audit as audit_module
from bookkeeper_py.spark.audit import Check, Finding, audit, merge
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.local_cluster import free_ports
from bookkeeper_py.wire.digest import DigestManager, master_key
from bookkeeper_py.wire.status import StatusCode

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TIMEOUT_S = 60.0


def payload(ledger_id: int, entry_id: int) -> bytes:
    return b"audit %d/%d " % (ledger_id, entry_id) + bytes(entry_id % 7) * 10


def write(
    client: BookKeeper, entries: int, quorums: tuple[int, int, int] = (3, 2, 2)
) -> tuple[int, LedgerHandle]:
    """A ledger of ``entries`` written through the client: (its id, its open handle)."""
    handle = client.create_ledger(*quorums, DigestType.CRC32C, b"")
    for entry_id in range(entries):
        handle.add_entry(payload(handle.ledger_id, entry_id))
    return handle.ledger_id, handle


def holders(metadata: LedgerMetadata, entry_id: int) -> list[str]:
    """The bookies that hold ``entry_id``, in write set order."""
    ensemble = metadata.ensemble_at(entry_id)
    return [
        ensemble[i] for i in write_set(entry_id, metadata.ensemble_size, metadata.write_quorum_size)
    ]


async def _plant(
    uri: str,
    ensembles: tuple[tuple[int, tuple[str, ...]], ...],
    entries: int,
    skip: set[tuple[int, str]],
    closed: bool,
) -> int:
    """A 3/2/2 ledger written replica by replica: every entry on its write set's bookies except
    the (entry, bookie) pairs in ``skip``; closed at its last entry, or left open."""
    async with AsyncBookKeeper(uri) as client:
        port = client.metadata_port
        ledger_id = await port.generate_ledger_id()
        digest = DigestManager(ledger_id, DigestType.CRC32C, b"")
        bodies, length = [], 0
        for entry_id in range(entries):
            data = payload(ledger_id, entry_id)
            length += len(data)
            bodies.append(digest.package(entry_id, entry_id - 1, length, data))
        metadata = LedgerMetadata(
            ledger_id,
            3,
            2,
            2,
            DigestType.CRC32C,
            b"",
            ensembles,
            state=LedgerState.CLOSED if closed else LedgerState.OPEN,
            last_entry_id=entries - 1 if closed else -1,
            length=length if closed else 0,
        )
        await port.create_ledger_metadata(metadata)
        for entry_id, body in enumerate(bodies):
            for bookie in holders(metadata, entry_id):
                if (entry_id, bookie) in skip:
                    continue
                status = await client.bookie_client.recovery_add(
                    bookie, ledger_id, entry_id, master_key(b""), body
                )
                assert status == StatusCode.EOK
        return ledger_id


def plant(
    uri: str,
    ensembles: tuple[tuple[int, tuple[str, ...]], ...],
    entries: int,
    skip: set[tuple[int, str]] | None = None,
    *,
    closed: bool = True,
) -> int:
    planting = _plant(uri, ensembles, entries, skip or set(), closed)
    return asyncio.run(asyncio.wait_for(planting, TIMEOUT_S))


async def _corrupt(uri: str, ledger_id: int, entry_id: int, bookie: str) -> None:
    """Rewrites the replica of ``entry_id`` on ``bookie`` with one payload byte flipped (its
    ids intact: the bookie takes it as a recovery add of that entry)."""
    async with AsyncBookKeeper(uri) as client:
        status, body = await client.bookie_client.read_entry(bookie, ledger_id, entry_id)
        assert status == StatusCode.EOK
        flipped = body[:-1] + bytes([body[-1] ^ 0x01])
        status = await client.bookie_client.recovery_add(
            bookie, ledger_id, entry_id, master_key(b""), flipped
        )
        assert status == StatusCode.EOK
        status, body = await client.bookie_client.read_entry(bookie, ledger_id, entry_id)
        assert (status, body) == (StatusCode.EOK, flipped)


def corrupt(uri: str, ledger_id: int, entry_id: int, bookie: str) -> None:
    asyncio.run(asyncio.wait_for(_corrupt(uri, ledger_id, entry_id, bookie), TIMEOUT_S))


@pytest.fixture
def made(spark_cluster: LocalCluster) -> Iterator[list[int]]:
    """The ids of the ledgers a test makes, deleted after it (the cluster is shared)."""
    ids: list[int] = []
    yield ids
    with BookKeeper(spark_cluster.metadata_uri) as client:
        for ledger_id in ids:
            try:
                client.delete_ledger(ledger_id)
            except errors.NoSuchLedgerError:
                pass


@pytest.fixture
def small_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Partitions of a few replicas: fragments split across partitions and tasks."""
    monkeypatch.setattr(audit_module, "PARTITION_REPLICAS", 5)


def test_a_healthy_cluster_is_healthy_with_every_replica_counted(
    spark: SparkSession,
    spark_cluster: LocalCluster,
    made: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    uri = spark_cluster.metadata_uri
    b0, b1, b2 = spark_cluster.bookie_ids
    with BookKeeper(uri) as client:
        for entries, quorums in ((40, (3, 2, 2)), (0, (3, 2, 2)), (15, (2, 2, 1))):
            ledger_id, handle = write(client, entries, quorums)
            handle.close()
            made.append(ledger_id)
        two_fragments = plant(uri, ((0, (b0, b1, b2)), (8, (b2, b0, b1))), 20)
        made.append(two_fragments)
        open_id, writer = write(client, 25)  # left open: audited up to its LAC, not fenced
        made.append(open_id)
        try:
            with client.open_ledger_no_recovery(open_id) as reader:
                lac = reader.last_add_confirmed
            assert 0 <= lac < 25
            with monkeypatch.context() as patch:
                patch.setattr(audit_module, "PARTITION_REPLICAS", 5)  # fragments split
                report = audit(spark, uri, ledgers=made)
            everything = audit(spark, uri)
            writer.add_entry(b"the writer goes on: no fence")
        finally:
            writer.close()
    entries = 40 + 0 + 15 + 20 + (lac + 1)
    assert report.findings == [] and report.problems == []
    assert report.healthy
    assert (report.ledgers, report.entries, report.replicas) == (5, entries, 2 * entries)
    assert report.lines() == [
        f"audited 5 ledgers, {entries} entries, {2 * entries} replicas answered: healthy"
    ]
    # every ledger of the cluster: those of other tests too
    assert not [f for f in everything.findings if f.ledger_id in made]
    assert everything.ledgers >= 5 and everything.entries >= entries


def test_a_missing_replica_and_a_corrupt_entry_are_found_and_nothing_else(
    spark: SparkSession, spark_cluster: LocalCluster, made: list[int], small_partitions: None
) -> None:
    uri = spark_cluster.metadata_uri
    b0, b1, b2 = spark_cluster.bookie_ids
    with BookKeeper(uri) as client:
        written, handle = write(client, 30)
        handle.close()
        made.append(written)
        metadata = client.get_ledger_metadata(written)
    damaged = holders(metadata, 7)[1]
    corrupt(uri, written, 7, damaged)
    # the second fragment's bookie b1 never got its entries 12..17
    ensembles = ((0, (b0, b1, b2)), (10, (b1, b2, b0)))
    lost = [e for e in range(12, 18) if b1 in holders_of(ensembles, e)]
    planted = plant(uri, ensembles, 24, {(e, b1) for e in lost})
    made.append(planted)
    assert len(lost) == 4  # 12, 14, 15, 17: in two partitions of 5 replicas, one finding

    report = audit(spark, uri, ledgers=made)

    assert [
        (f.ledger_id, f.fragment, f.first_entry, f.last_entry, f.bookie, f.kind)
        for f in report.findings
    ] == sorted(
        [
            (written, 0, 7, 7, damaged, "corrupt"),
            (planted, 10, lost[0], lost[-1], b1, "missing"),
        ]
    )
    by_kind = {f.kind: f for f in report.findings}
    assert "digest mismatch" in by_kind["corrupt"].detail
    assert by_kind["missing"].detail.startswith("ENOENTRY")
    assert not report.healthy and report.under_replicated() == sorted(made)
    assert (report.ledgers, report.entries, report.replicas) == (2, 54, 108)
    lines = report.lines()
    assert len(lines) == 3 and all("\n" not in line for line in lines)
    assert lines[-1].endswith("2 findings (1 missing, 1 corrupt) in 2 ledgers")
    assert f"missing ledger {planted} fragment 10 entries {lost[0]}-{lost[-1]} bookie {b1}" in (
        "\n".join(lines)
    )


def holders_of(ensembles: tuple[tuple[int, tuple[str, ...]], ...], entry_id: int) -> list[str]:
    ensemble = [bookies for first, bookies in ensembles if first <= entry_id][-1]
    return [ensemble[i] for i in write_set(entry_id, 3, 2)]


def test_a_stopped_bookie_is_unreachable_not_missing(
    spark: SparkSession, spark_cluster: LocalCluster, made: list[int]
) -> None:
    uri = spark_cluster.metadata_uri
    with BookKeeper(uri) as client:
        written, handle = write(client, 30)
        handle.close()
        made.append(written)
        metadata = client.get_ledger_metadata(written)
    stopped = spark_cluster.bookies[2]
    held = [e for e in range(30) if stopped.bookie_id in holders(metadata, e)]
    spark_cluster.stop_bookie(stopped.index)
    try:
        report = audit(spark, uri, ledgers=[written], client_options={"connect_timeout_s": 2.0})
    finally:
        spark_cluster.start_bookie(stopped.index)
    assert [
        (f.fragment, f.first_entry, f.last_entry, f.bookie, f.kind) for f in report.findings
    ] == [(0, held[0], held[-1], stopped.bookie_id, "unreachable")]
    assert report.findings[0].detail  # why: the connection refused
    assert (report.ledgers, report.entries, report.replicas) == (1, 30, 60 - len(held))
    assert not report.healthy


def test_an_open_ledger_whose_lac_no_bookie_can_tell_is_checked_up_to_its_last_fragment(
    spark: SparkSession, spark_cluster: LocalCluster, made: list[int]
) -> None:
    uri = spark_cluster.metadata_uri
    # the last fragment's bookies listen nowhere (ports that were free a moment ago)
    ghosts = tuple(f"127.0.0.1:{port}" for port in free_ports(3))
    planted = plant(uri, ((0, tuple(spark_cluster.bookie_ids)), (10, ghosts)), 10, closed=False)
    made.append(planted)

    report = audit(spark, uri, ledgers=[planted], client_options={"connect_timeout_s": 2.0})

    assert report.findings == []
    assert (report.ledgers, report.entries, report.replicas) == (1, 10, 20)
    assert len(report.problems) == 1 and "its LAC could not be read" in report.problems[0]
    assert not report.healthy
    assert report.lines()[0].startswith(f"unchecked ledger {planted}: open")
    assert report.lines()[-1].endswith(": 1 ledger unchecked")


def test_mistakes_a_user_can_make_fail_in_one_line(
    spark: SparkSession, spark_cluster: LocalCluster
) -> None:
    with pytest.raises(errors.IncorrectParameterError, match="metadata service URI") as bad_uri:
        audit(spark, "ledgers.example.com:2181")
    with pytest.raises(errors.NoSuchLedgerError, match="ledger 987654321 does not exist") as gone:
        audit(spark, spark_cluster.metadata_uri, ledgers=[987654321])
    with pytest.raises(errors.IncorrectParameterError, match="not a ledger id") as bad_id:
        audit(spark, spark_cluster.metadata_uri, ledgers=[-1])
    with pytest.raises(errors.IncorrectParameterError, match="unknown client option") as option:
        audit(spark, spark_cluster.metadata_uri, client_options={"timeout": 1})
    for raised in (bad_uri, gone, bad_id, option):
        assert "\n" not in str(raised.value)


def test_what_a_bookie_holds_and_how_findings_merge() -> None:
    """Without Spark: the places that hold an entry are its write set's, and findings that
    meet (no entry the bookie holds between them) are one."""
    for ensemble_size, write_quorum_size in ((3, 2), (5, 3), (4, 4), (3, 1)):
        for index in range(ensemble_size):
            check = Check(
                1, DigestType.CRC32C, b"", ensemble_size, write_quorum_size, 0, index, 3, 40
            )
            expected = [
                e for e in range(3, 41) if index in write_set(e, ensemble_size, write_quorum_size)
            ]
            assert list(check.entries()) == expected
            assert check.replicas == len(expected)
    shapes = {(1, 0, "b"): (3, 2, 0)}  # place 0 of 3/2 holds 0, 2, 3, 5, 6, 8, ...
    parts = [Finding(1, 0, 5, 6, "b", "missing"), Finding(1, 0, 0, 3, "b", "missing")]
    assert merge(parts, shapes) == [Finding(1, 0, 0, 6, "b", "missing")]
    apart = [Finding(1, 0, 0, 2, "b", "missing"), Finding(1, 0, 5, 6, "b", "missing")]
    assert merge(apart, shapes) == apart  # entry 3 is held and was good
    kinds = [Finding(1, 0, 0, 2, "b", "missing"), Finding(1, 0, 3, 3, "b", "corrupt")]
    assert merge(kinds, shapes) == sorted(kinds)
