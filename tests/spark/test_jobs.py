"""The pipeline jobs: exports to Parquet that resume, and a log compacted by key."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.spark.jobs import compact_log, export_ledgers, export_logs
from bookkeeper_py.spark.options import OptionError
from bookkeeper_py.testing import LocalCluster

from .logs import write_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_a_log_export_resumes_where_it_stopped(
    spark: SparkSession, spark_cluster: LocalCluster, tmp_path: Path
) -> None:
    uri = spark_cluster.metadata_uri
    write_log(uri, "export/a", [b"a%d" % i for i in range(300)], roll_every=120)
    write_log(uri, "export/b", [b"b%d" % i for i in range(50)])
    out = str(tmp_path / "parquet")
    first = export_logs(spark, uri, out, namespace="export", logsPattern="[ab]")
    assert first.records == 350
    write_log(uri, "export/a", [b"a%d" % i for i in range(300, 400)])
    second = export_logs(spark, uri, out, namespace="export", logsPattern="[ab]")
    assert second.records == 100  # only what came since
    rows = spark.read.parquet(out).collect()
    assert sorted(r.payload for r in rows if r.log == "export/a") == sorted(
        b"a%d" % i for i in range(400)
    )
    assert len([r for r in rows if r.log == "export/b"]) == 50
    assert os.path.isdir(os.path.join(out, "log=export%2Fa")) or any(
        name.startswith("log=") for name in os.listdir(out)
    )


def test_a_ledger_export_skips_what_it_exported(
    spark: SparkSession, spark_cluster: LocalCluster, tmp_path: Path
) -> None:
    with BookKeeper(spark_cluster.metadata_uri) as client:
        ids = []
        for n in range(2):
            with client.create_ledger(3, 2, 2, DigestType.CRC32C, b"") as ledger:
                for i in range(20):
                    ledger.add_entry(b"%d:%d" % (n, i))
                ids.append(ledger.ledger_id)
    out = str(tmp_path / "ledgers")
    done = export_ledgers(spark, spark_cluster.metadata_uri, out, ids[:1])
    assert (done.batches, done.records) == (1, 20)
    done = export_ledgers(spark, spark_cluster.metadata_uri, out, ids)
    assert (done.batches, done.records) == (1, 20)  # the first one is not exported again
    rows = spark.read.parquet(out).collect()
    assert sorted((r.ledger_id, r.entry_id) for r in rows) == sorted(
        (ledger, i) for ledger in ids for i in range(20)
    )


def test_a_log_compacted_by_key_keeps_each_keys_last_record(
    spark: SparkSession, spark_cluster: LocalCluster
) -> None:
    uri = spark_cluster.metadata_uri
    events = [{"user": f"u{i % 5}", "n": i} for i in range(40)]
    records = [json.dumps(e).encode() for e in events]
    records.append(b"")  # no key: kept as it is
    records.append(json.dumps({"user": "u3", "deleted": True}).encode())
    write_log(uri, "compact/users", records)
    key = "case when length(payload) = 0 then null else get_json_object(cast(payload as string), '$.user') end"
    done = compact_log(spark, uri, "compact/users", "compact/latest", key)
    rows = (
        spark.read.format("bookkeeper")
        .option("metadataServiceUri", uri)
        .option("log", "compact/latest")
        .load()
        .orderBy("sequence")
        .collect()
    )
    kept = [r.payload for r in rows]
    assert kept == [json.dumps({"user": f"u{u}", "n": 35 + u}).encode() for u in (0, 1, 2, 4)] + [
        b"",
        json.dumps({"user": "u3", "deleted": True}).encode(),
    ]
    assert (done.read, done.kept, done.keys, done.tombstones) == (42, 6, 5, 0)
    again = compact_log(spark, uri, "compact/users", "compact/latest", key)
    assert again.kept == 6  # the target's content is replaced, not appended to
    count = (
        spark.read.format("bookkeeper")
        .option("metadataServiceUri", uri)
        .option("log", "compact/latest")
        .load()
        .count()
    )
    assert count == 6
    with pytest.raises(OptionError, match="key expression"):
        compact_log(spark, uri, "compact/users", "compact/latest", "no_such_column + 1")
