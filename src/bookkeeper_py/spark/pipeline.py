"""The pipeline end to end, as the README's first command runs it (``bookkeeper localbookie 3
--pipeline``): an application appends JSON events to a log; a Structured Streaming job reads
the log, counts and sums the events per user and 2-second window (event time, 1 s watermark)
and writes each finished window to another log, exactly once, and to Parquet; the driver
prints what every micro-batch did. The events and the aggregates stay readable with
``bookkeeper log read`` and any Parquet reader.
"""

from __future__ import annotations

import glob
import json
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bookkeeper_py.client.facade import BookKeeper
from bookkeeper_py.log import LogConfig
from bookkeeper_py.log.facade import LogNamespace

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

NAMESPACE = "demo"
EVENTS = "events"
AGGREGATES = "per-user-2s"
USERS = 8
WINDOW = "2 seconds"
WATERMARK = "1 second"
SENTINEL_USER = "end-of-demo"


@dataclass
class Pipeline:
    """The running demo: its event writer and its two streaming queries."""

    uri: str
    directory: str
    events_written: int = 0
    queries: list[StreamingQuery] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _writer: threading.Thread | None = None

    @property
    def parquet_path(self) -> str:
        return os.path.join(self.directory, "parquet", AGGREGATES)

    def stop(self) -> None:
        self._stop.set()
        if self._writer is not None:
            self._writer.join(30)
        for query in self.queries:
            query.stop()


def _make_logs(uri: str) -> None:
    with BookKeeper(uri) as client:
        logs = LogNamespace(client, NAMESPACE)
        logs.create()
        existing = set(logs.list_logs())
        for name in (EVENTS, AGGREGATES):
            if name not in existing:
                logs.create_log(
                    name, LogConfig(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
                )


def _event(rng: random.Random, ts_ms: int) -> bytes:
    user = f"user-{rng.randrange(USERS)}"
    return json.dumps({"user": user, "amount": rng.randrange(1, 100), "ts": ts_ms}).encode()


def _write_events(pipeline: Pipeline, rate: float, limit: int) -> None:
    """The application: ``rate`` events/s until stopped (or ``limit`` events, then one
    sentinel event far ahead in event time, which closes every window)."""
    rng = random.Random(7)
    with (
        BookKeeper(pipeline.uri) as client,
        LogNamespace(client, NAMESPACE).open_writer(EVENTS) as writer,
    ):
        started = time.monotonic()
        while not pipeline._stop.is_set():
            if limit and pipeline.events_written >= limit:
                future_ms = int(time.time() * 1000) + 3_600_000
                sentinel = {"user": SENTINEL_USER, "amount": 0, "ts": future_ms}
                writer.append(json.dumps(sentinel).encode())
                writer.flush()
                return
            due = int((time.monotonic() - started) * rate) + 1
            while pipeline.events_written < due and not (
                limit and pipeline.events_written >= limit
            ):
                writer.append(_event(rng, int(time.time() * 1000)))
                pipeline.events_written += 1
            writer.flush()
            pipeline._stop.wait(0.05)


def start(
    spark: SparkSession,
    uri: str,
    directory: str,
    *,
    rate: float = 500.0,
    limit: int = 0,
    trigger: str = "500 milliseconds",
) -> Pipeline:
    """Starts the event writer and the two queries (checkpoints under ``directory``)."""
    from pyspark.sql import functions as F

    _make_logs(uri)
    pipeline = Pipeline(uri, directory)
    pipeline._writer = threading.Thread(
        target=_write_events, args=(pipeline, rate, limit), name="demo-events", daemon=True
    )
    pipeline._writer.start()
    events = (
        spark.readStream.format("bookkeeper")
        .option("metadataServiceUri", uri)
        .option("log", f"{NAMESPACE}/{EVENTS}")
        .option("startingOffsets", "earliest")
        .load()
        .select(
            F.from_json(F.col("payload").cast("string"), "user string, amount long, ts long").alias(
                "event"
            )
        )
        .select(
            "event.user",
            "event.amount",
            (F.col("event.ts") / 1000).cast("timestamp").alias("event_time"),
        )
    )
    aggregates = (
        events.withWatermark("event_time", WATERMARK)
        .groupBy(F.window("event_time", WINDOW), "user")
        .agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
        # not a filter on user: the optimizer would push it below the watermark, which would
        # then never see the sentinel (whose amount is 0; every event's is at least 1)
        .where(F.col("amount") > 0)
        .select(
            F.col("window.start").alias("window_start"),
            "user",
            "events",
            "amount",
            F.to_json(
                F.struct(
                    F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ss").alias("window"),
                    "user",
                    "events",
                    "amount",
                )
            ).alias("value"),
        )
    )
    pipeline.queries.append(
        aggregates.select("value")
        .writeStream.format("bookkeeper")
        .option("metadataServiceUri", uri)
        .option("log", f"{NAMESPACE}/{AGGREGATES}")
        .option("checkpointLocation", os.path.join(directory, "checkpoints", "to-log"))
        .outputMode("append")
        .queryName("aggregates_to_log")
        .trigger(processingTime=trigger)
        .start()
    )
    pipeline.queries.append(
        aggregates.select("window_start", "user", "events", "amount")
        .writeStream.format("parquet")
        .option("path", pipeline.parquet_path)
        .option("checkpointLocation", os.path.join(directory, "checkpoints", "to-parquet"))
        .outputMode("append")
        .queryName("aggregates_to_parquet")
        .trigger(processingTime=trigger)
        .start()
    )
    return pipeline


def report_progress(
    pipeline: Pipeline, say: Callable[[str], None], seen: set[tuple[str, int]]
) -> None:
    """Says what each micro-batch not reported yet did."""
    for query in pipeline.queries:
        for progress in query.recentProgress:
            key = (query.name, progress["batchId"])
            if key in seen or not progress["numInputRows"]:
                continue
            seen.add(key)
            written = progress["sink"].get("numOutputRows", -1)
            say(
                f"{query.name} batch {progress['batchId']}: read {progress['numInputRows']} events "
                f"of log {NAMESPACE}/{EVENTS} up to offset {progress['sources'][0]['endOffset']}"
                + (f", wrote {written} finished windows" if written >= 0 else "")
            )


def totals(spark: SparkSession, pipeline: Pipeline) -> dict[str, Any]:
    """What the two sinks hold: aggregates, events counted, windows written twice."""
    from pyspark.sql import functions as F

    logged = (
        spark.read.format("bookkeeper")
        .option("metadataServiceUri", pipeline.uri)
        .option("log", f"{NAMESPACE}/{AGGREGATES}")
        .load()
        .select(
            F.from_json(
                F.col("payload").cast("string"), "window string, user string, events long"
            ).alias("a")
        )
        .select("a.*")
    )
    log_rows = logged.collect()
    written = glob.glob(os.path.join(pipeline.parquet_path, "*.parquet"))
    parquet_rows = spark.read.parquet(pipeline.parquet_path).collect() if written else []
    return {
        "log_aggregates": len(log_rows),
        "log_events": sum(row.events for row in log_rows),
        "log_duplicates": len(log_rows) - len({(r.window, r.user) for r in log_rows}),
        "parquet_aggregates": len(parquet_rows),
        "parquet_events": sum(row.events for row in parquet_rows),
        "parquet_duplicates": len(parquet_rows)
        - len({(r.window_start, r.user) for r in parquet_rows}),
    }
