"""Structured Streaming reads with format("bookkeeper"): admission control, restarts from the
checkpoint, a tail followed as the writer appends, and a subscription moved on commit."""

from __future__ import annotations

import glob
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bookkeeper_py import BookKeeper
from bookkeeper_py.log.facade import LogNamespace
from bookkeeper_py.testing import LocalCluster

from .logs import write_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def stream(spark: SparkSession, cluster: LocalCluster, **options: str):  # type: ignore[no-untyped-def]
    reader = spark.readStream.format("bookkeeper").option(
        "metadataServiceUri", cluster.metadata_uri
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def to_parquet(frame, path: Path, checkpoint: Path) -> StreamingQuery:  # type: ignore[no-untyped-def]
    return (
        frame.select("sequence", "payload")
        .writeStream.format("parquet")
        .option("path", str(path))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_available_now_in_limited_batches_then_a_restart_with_the_last_commit_lost(
    spark: SparkSession, spark_cluster: LocalCluster, tmp_path: Path
) -> None:
    uri = spark_cluster.metadata_uri
    write_log(uri, "stream/events", [b"%d" % i for i in range(1000)], roll_every=400)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    frame = stream(
        spark,
        spark_cluster,
        log="stream/events",
        startingOffsets="earliest",
        maxRecordsPerTrigger="300",
    )
    query = to_parquet(frame, out, checkpoint)
    query.awaitTermination(120)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [300, 300, 300, 100]
    last = query.recentProgress[-1]["sources"][0]
    assert last["endOffset"] == '{"stream/events": 1000}'
    assert last["latestOffset"] == '{"stream/events": 1000}'  # reportLatestOffset: the tail

    # a crash after the last batch was written but before its commit was recorded
    commits = sorted(
        glob.glob(str(checkpoint / "commits" / "[0-9]*")), key=lambda p: int(os.path.basename(p))
    )
    last = commits[-1]
    os.remove(last)
    crc = os.path.join(os.path.dirname(last), f".{os.path.basename(last)}.crc")
    if os.path.exists(crc):
        os.remove(crc)
    write_log(uri, "stream/events", [b"%d" % i for i in range(1000, 1500)])
    query = to_parquet(frame, out, checkpoint)
    query.awaitTermination(120)
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(row.sequence for row in rows) == list(range(1500))  # each exactly once
    assert sorted(int(row.payload) for row in rows) == list(range(1500))


def test_a_tail_is_followed_as_the_writer_appends_and_the_subscription_moves(
    spark: SparkSession, spark_cluster: LocalCluster
) -> None:
    uri = spark_cluster.metadata_uri
    write_log(uri, "stream/tail", [b"before"] * 5)
    frame = stream(spark, spark_cluster, log="stream/tail", subscription="spark-tail")
    query = (
        frame.select("sequence", "payload")
        .writeStream.format("memory")
        .queryName("tail_sink")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()  # started at "latest": the 5 records before are not read
        with BookKeeper(uri) as client:
            logs = LogNamespace(client, "stream")
            with logs.open_writer("tail") as writer:  # stays open: the segment is never closed
                for i in range(40):
                    writer.append(b"live %d" % i)
                writer.flush()
                done = threading.Event()
                for _ in range(300):  # 30 s at most
                    if spark.sql("select count(*) from tail_sink").first()[0] >= 40:
                        done.set()
                        break
                    done.wait(0.1)
                assert done.is_set(), f"nothing reached the sink: {query.lastProgress}"
                rows = spark.sql("select sequence, payload from tail_sink").collect()
                assert sorted(r.sequence for r in rows) == list(range(5, 45))  # from latest
                for i in range(40, 60):
                    writer.append(b"live %d" % i)
                writer.flush()
                query.processAllAvailable()
                query.processAllAvailable()  # commit(end) comes with the next batch's planning
            info = {s.subscription.name: s for s in logs.subscriptions("tail")}
            assert info["spark-tail"].subscription.sequence >= 44
    finally:
        query.stop()
    rows = spark.sql("select sequence from tail_sink").collect()
    assert sorted(r.sequence for r in rows) == list(range(5, 65))
