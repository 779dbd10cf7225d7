"""Writes with format("bookkeeper"): a DataFrame appended all at once or not at all, an
overwrite, failed and retried task attempts that leave no orphan, and streaming writes that
stay exactly once across a replayed batch."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bookkeeper_py import BookKeeper
from bookkeeper_py.log.facade import LogNamespace
from bookkeeper_py.testing import LocalCluster

from .logs import write_log

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def read_log(spark: SparkSession, cluster: LocalCluster, key: str) -> DataFrame:
    return (
        spark.read.format("bookkeeper")
        .option("metadataServiceUri", cluster.metadata_uri)
        .option("log", key)
        .load()
    )


def log_ledgers(cluster: LocalCluster, key: str) -> tuple[list[int], list[int]]:
    """(the log's segments' ledgers, every ledger tagged with the log)."""
    namespace, _, name = key.partition("/")
    with BookKeeper(cluster.metadata_uri) as client:
        logs = LogNamespace(client, namespace)
        segments = [s.ledger_id for s in logs.describe(name).metadata.segments]
        tagged = [
            ledger_id
            for ledger_id in client.list_ledgers()
            if client.get_ledger_metadata(ledger_id).custom_metadata.get("bookkeeper-py.log")
            == key.encode()
        ]
    return segments, tagged


def test_a_batch_append_then_an_overwrite(spark: SparkSession, spark_cluster: LocalCluster) -> None:
    uri = spark_cluster.metadata_uri
    write_log(uri, "write/batch", [b"old %d" % i for i in range(10)])
    frame = spark.range(0, 3000, numPartitions=3).selectExpr(
        "cast(concat('row ', id) as binary) as payload"
    )
    frame.write.format("bookkeeper").option("metadataServiceUri", uri).option(
        "log", "write/batch"
    ).mode("append").save()
    rows = read_log(spark, spark_cluster, "write/batch").orderBy("sequence").collect()
    assert [r.sequence for r in rows] == list(range(3010))
    assert [r.payload for r in rows[:10]] == [b"old %d" % i for i in range(10)]
    assert sorted(r.payload for r in rows[10:]) == sorted(b"row %d" % i for i in range(3000))
    assert [r.txid for r in rows] == list(range(3010))  # ids after the log's last
    assert len({r.ledger_id for r in rows[10:]}) == 3  # one ledger per task
    for ledger in {r.ledger_id for r in rows[10:]}:  # each task's rows in DataFrame order
        mine = [int(r.payload.split()[1]) for r in rows if r.ledger_id == ledger]
        assert mine == sorted(mine)

    spark.range(0, 5).selectExpr("cast(id as string) as value").write.format("bookkeeper").option(
        "metadataServiceUri", uri
    ).option("log", "write/batch").mode("overwrite").save()
    rows = read_log(spark, spark_cluster, "write/batch").orderBy("sequence").collect()
    assert sorted(r.payload for r in rows) == [b"0", b"1", b"2", b"3", b"4"]
    assert [r.sequence for r in rows] == list(range(3010, 3015))  # sequence numbers go on
    segments, tagged = log_ledgers(spark_cluster, "write/batch")
    assert sorted(segments) == sorted(tagged)  # the old ledgers are deleted


def test_a_failed_job_leaves_nothing_and_a_retried_attempt_no_orphan(
    spark: SparkSession, spark_cluster: LocalCluster
) -> None:
    uri = spark_cluster.metadata_uri
    write_log(uri, "write/fail", [b"kept"])

    def failing(every_attempt: bool):  # type: ignore[no-untyped-def]
        def fail_in_partition_one(rows):  # type: ignore[no-untyped-def]
            from pyspark import TaskContext

            context = TaskContext.get()
            for row in rows:
                if context.partitionId() == 1 and (every_attempt or context.attemptNumber() == 0):
                    raise ValueError("boom in partition 1")
                yield row

        return fail_in_partition_one

    source = spark.range(0, 300, numPartitions=3).selectExpr(
        "cast(concat('r', id) as binary) as payload"
    )

    def write(every_attempt: bool) -> None:
        frame = spark.createDataFrame(
            source.rdd.mapPartitions(failing(every_attempt)), source.schema
        )
        frame.write.format("bookkeeper").option("metadataServiceUri", uri).option(
            "log", "write/fail"
        ).mode("append").save()

    with pytest.raises(Exception, match="boom in partition 1"):
        write(every_attempt=True)
    assert [r.payload for r in read_log(spark, spark_cluster, "write/fail").collect()] == [b"kept"]
    segments, tagged = log_ledgers(spark_cluster, "write/fail")
    assert sorted(segments) == sorted(tagged)  # the failed job's ledgers are gone

    write(every_attempt=False)  # attempt 0 of partition 1 fails, attempt 1 succeeds
    rows = read_log(spark, spark_cluster, "write/fail").collect()
    assert sorted(r.payload for r in rows) == sorted([b"kept"] + [b"r%d" % i for i in range(300)])
    segments, tagged = log_ledgers(spark_cluster, "write/fail")
    assert sorted(segments) == sorted(tagged)  # the failed attempt's ledger was swept


def test_a_streaming_write_is_exactly_once_across_a_replayed_batch(
    spark: SparkSession, spark_cluster: LocalCluster, tmp_path: Path
) -> None:
    uri = spark_cluster.metadata_uri
    write_log(uri, "write/events", [b"%d" % i for i in range(600)])
    checkpoint = tmp_path / "checkpoint"

    def run() -> None:
        query = (
            spark.readStream.format("bookkeeper")
            .option("metadataServiceUri", uri)
            .option("log", "write/events")
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", "200")
            .load()
            .selectExpr("payload", "sequence as txid")
            .writeStream.format("bookkeeper")
            .option("metadataServiceUri", uri)
            .option("log", "write/copy")
            .option("txidColumn", "txid")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    run()
    commits = sorted(
        glob.glob(str(checkpoint / "commits" / "[0-9]*")), key=lambda p: int(os.path.basename(p))
    )
    os.remove(commits[-1])  # as after a crash between the sink's commit and Spark's record
    crc = os.path.join(os.path.dirname(commits[-1]), f".{os.path.basename(commits[-1])}.crc")
    if os.path.exists(crc):
        os.remove(crc)
    write_log(uri, "write/events", [b"%d" % i for i in range(600, 700)])
    run()
    rows = read_log(spark, spark_cluster, "write/copy").orderBy("sequence").collect()
    assert [int(r.payload) for r in rows] == list(range(700))  # once each, in order
    assert [r.txid for r in rows] == list(range(700))  # the ids the query gave
    segments, tagged = log_ledgers(spark_cluster, "write/copy")
    assert sorted(segments) == sorted(tagged)  # the replayed batch's ledgers were swept
