"""Pipeline jobs on any Spark master (``bookkeeper spark export|compact|audit``; importable):

- ``export_logs``: logs to Parquet, partitioned by log and day, resumable: a Structured
  Streaming query with ``Trigger.AvailableNow`` whose checkpoint (beside the data, in
  ``_checkpoint``) remembers how far each log was exported; each run appends what came since,
  exactly once (Spark's file sink commits each batch once).
- ``export_ledgers``: raw ledgers to Parquet, one ``ledger_id=N`` directory each, written to a
  temporary directory and renamed: a run skips the ledgers already exported.
- ``compact_log``: the last record of every key (a Spark SQL expression over the records, such
  as ``get_json_object(cast(payload as string), '$.user')``) into another log, in one commit
  that replaces its content (Kafka's log compaction, done as a job): a key whose last record
  has an empty payload is dropped (a tombstone, as Kafka's null value); records whose key is
  null are kept as they are.
- ``audit`` (``bookkeeper_py.spark.audit``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bookkeeper_py.spark.options import OptionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CHECKPOINT = "_checkpoint"  # Spark's readers skip names starting with "_"


def _source(spark: SparkSession, uri: str, **options: str) -> DataFrame:
    reader = spark.read.format("bookkeeper").option("metadataServiceUri", uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


@dataclass(frozen=True)
class Exported:
    records: int  # in this run
    batches: int
    path: str


def export_logs(
    spark: SparkSession,
    uri: str,
    path: str,
    *,
    client: Mapping[str, str] | None = None,
    **subject: str,
) -> Exported:
    """Appends to Parquet at ``path`` what the logs named by ``subject`` (``log``, ``logs``
    or ``logsPattern`` with ``namespace``, as the data source's options) hold that an earlier
    run did not export. ``client``: the data source's client options (``auth.*``, ``tls.*``,
    ``client.*``), for every job here alike."""
    from pyspark.sql import functions as F

    if not subject:
        raise OptionError("name the logs to export: log, logs or logsPattern")
    reader = (
        spark.readStream.format("bookkeeper")
        .option("metadataServiceUri", uri)
        .option("startingOffsets", "earliest")
    )
    for key, value in {**(client or {}), **subject}.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .withColumn("date", F.to_date("timestamp"))
        .writeStream.format("parquet")
        .option("path", path)
        .option("checkpointLocation", os.path.join(path, CHECKPOINT))
        .partitionBy("log", "date")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the export failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    return Exported(sum(p["numInputRows"] for p in progress), len(progress), path)


def export_ledgers(
    spark: SparkSession,
    uri: str,
    path: str,
    ledgers: list[int],
    password: str = "",
    *,
    client: Mapping[str, str] | None = None,
) -> Exported:
    """Writes each ledger not exported yet to ``path/ledger_id=N`` (Parquet: entry_id,
    payload)."""
    os.makedirs(path, exist_ok=True)
    records = written = 0
    for ledger_id in ledgers:
        final = os.path.join(path, f"ledger_id={ledger_id}")
        if os.path.isdir(final):
            continue
        partial = os.path.join(path, f"_ledger_id={ledger_id}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        frame = _source(
            spark, uri, **(client or {}), ledgers=str(ledger_id), password=password
        ).drop("ledger_id")
        frame.write.parquet(partial)
        records += spark.read.parquet(partial).count()
        os.rename(partial, final)
        written += 1
    return Exported(records, written, path)


@dataclass(frozen=True)
class Compacted:
    read: int
    kept: int
    keys: int
    tombstones: int


def compact_log(
    spark: SparkSession,
    uri: str,
    source: str,
    target: str,
    key: str,
    *,
    namespace: str = "",
    client: Mapping[str, str] | None = None,
) -> Compacted:
    """Compacts log ``source`` by the SQL expression ``key`` into log ``target`` (made if
    missing; its content replaced in one commit)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    options = {**(client or {}), "log": source}
    if namespace:
        options["namespace"] = namespace
    records = _source(spark, uri, **options)
    try:
        keyed = records.withColumn("_key", F.expr(key))
    except Exception as error:
        raise OptionError(f"key expression {key!r}: {error}") from None
    latest = Window.partitionBy("_key").orderBy(F.desc("sequence"))
    ranked = keyed.withColumn(
        "_rank", F.when(F.col("_key").isNull(), 1).otherwise(F.row_number().over(latest))
    )
    last = ranked.where(F.col("_rank") == 1).cache()
    try:
        read = records.count()
        keys = last.where(F.col("_key").isNotNull()).count()
        tombstones = last.where(F.col("_key").isNotNull() & (F.length("payload") == 0)).count()
        kept = last.where(F.col("_key").isNull() | (F.length("payload") > 0))
        kept_count = kept.count()
        sink = kept.orderBy("sequence").coalesce(1).select("payload")
        writer = (
            sink.write.format("bookkeeper")
            .option("metadataServiceUri", uri)
            .option("log", target)
            .mode("overwrite")
        )
        for option, value in (client or {}).items():
            writer = writer.option(option, value)
        if namespace:
            writer = writer.option("namespace", namespace)
        writer.save()
    finally:
        last.unpersist()
    return Compacted(read, kept_count, keys, tombstones)
