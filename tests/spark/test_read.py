"""Batch reads of logs and ledgers with format("bookkeeper") on a real cluster."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.log.facade import LogNamespace
from bookkeeper_py.log.format import Position
from bookkeeper_py.testing import LocalCluster

from .logs import write_log

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def read(spark: SparkSession, cluster: LocalCluster, **options: str) -> DataFrame:
    reader = spark.read.format("bookkeeper").option("metadataServiceUri", cluster.metadata_uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_a_log_across_segments_reads_back_in_order(
    spark: SparkSession, spark_cluster: LocalCluster
) -> None:
    payloads = [b"record %d" % i for i in range(5000)]
    write_log(
        spark_cluster.metadata_uri, "read/orders", payloads, roll_every=1500, batch_bytes=4096
    )
    frame = read(spark, spark_cluster, log="read/orders", partitionBytes="8192")
    rows = frame.orderBy("sequence").collect()
    assert [row.payload for row in rows] == payloads
    assert [row.sequence for row in rows] == list(range(5000))
    assert {row.log for row in rows} == {"read/orders"}
    assert len({row.ledger_id for row in rows}) == 4  # 3 rolls
    assert frame.rdd.getNumPartitions() > 4  # closed segments split by size
    positions = [(row.ledger_id, row.entry_id, row.slot) for row in rows]
    assert positions == sorted(positions) and len(set(positions)) == 5000
    assert [row.txid for row in rows] == list(range(5000))
    assert all(row.timestamp is not None for row in rows)


def test_offsets_bound_a_read_by_sequence_number(
    spark: SparkSession, spark_cluster: LocalCluster
) -> None:
    write_log(
        spark_cluster.metadata_uri,
        "read/bounded",
        [b"%d" % i for i in range(3000)],
        roll_every=1000,
        batch_bytes=2048,
    )
    frame = read(
        spark,
        spark_cluster,
        log="read/bounded",
        startingOffsets=json.dumps({"read/bounded": 999}),
        endingOffsets=json.dumps({"read/bounded": 2001}),
    )
    assert sorted(row.sequence for row in frame.collect()) == list(range(999, 2001))
    latest = read(spark, spark_cluster, log="read/bounded", startingOffsets="latest")
    assert latest.count() == 0


def test_metadata_columns_and_a_pattern_of_logs(
    spark: SparkSession, spark_cluster: LocalCluster
) -> None:
    for name in ("p-a", "p-b", "other"):
        write_log(spark_cluster.metadata_uri, f"pattern/{name}", [name.encode()] * 10)
    frame = read(
        spark, spark_cluster, namespace="pattern", logsPattern="p-.*", includeMetadata="true"
    )
    rows = frame.collect()
    assert sorted({row.log for row in rows}) == ["pattern/p-a", "pattern/p-b"]
    assert len(rows) == 20 and {row.segment for row in rows} == {1}
    assert {row.writer_id for row in rows} == {""} and {row.writer_sequence for row in rows} == {-1}


def test_a_truncated_range_fails_or_is_skipped_by_failondataloss(
    spark: SparkSession, spark_cluster: LocalCluster
) -> None:
    uri = spark_cluster.metadata_uri
    write_log(uri, "read/cut", [b"%d" % i for i in range(300)], roll_every=100, batch_bytes=512)
    with BookKeeper(uri) as client:
        logs = LogNamespace(client, "read")
        second = logs.describe("cut").metadata.segments[1]
        logs.truncate("cut", Position(second.ledger_id, 0, 0))
    asked = json.dumps({"read/cut": 0})
    with pytest.raises(Exception, match="now starts at 100"):
        read(spark, spark_cluster, log="read/cut", startingOffsets=asked).collect()
    rows = read(
        spark, spark_cluster, log="read/cut", startingOffsets=asked, failOnDataLoss="false"
    ).collect()
    assert sorted(row.sequence for row in rows) == list(range(100, 300))


def test_raw_ledgers_read_whole(spark: SparkSession, spark_cluster: LocalCluster) -> None:
    with BookKeeper(spark_cluster.metadata_uri) as client:
        ids = []
        for n in range(2):
            ledger = client.create_ledger(3, 2, 2, DigestType.CRC32C, b"")
            for i in range(50):
                ledger.add_entry(b"%d-%d" % (n, i))
            if n == 0:
                ledger.close()
            ids.append(ledger.ledger_id)
        frame = read(spark, spark_cluster, ledgers=",".join(map(str, ids)))
        rows = frame.orderBy("ledger_id", "entry_id").collect()
    assert [(r.ledger_id, r.entry_id) for r in rows[:2]] == [(ids[0], 0), (ids[0], 1)]
    assert [r.payload for r in rows if r.ledger_id == ids[0]] == [b"0-%d" % i for i in range(50)]
    # the open ledger up to its LAC: the last entry is not confirmed to readers yet
    assert len([r for r in rows if r.ledger_id == ids[1]]) >= 49


def test_a_bad_option_fails_at_planning_naming_it(
    spark: SparkSession, spark_cluster: LocalCluster
) -> None:
    with pytest.raises(Exception, match="startingOffsets"):
        read(spark, spark_cluster, log="read/orders", startingOffsets="soonest").collect()
    with pytest.raises(Exception, match="exactly one of the options"):
        read(spark, spark_cluster).collect()
