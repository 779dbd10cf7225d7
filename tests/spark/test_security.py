"""Reads and writes through format("bookkeeper") on bookies that require authentication."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bookkeeper_py.testing import LocalCluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SECRET = b"a shared secret of the spark tests, long enough"


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "secret"
    path.write_bytes(SECRET + b"\n")
    return path


@pytest.fixture(scope="module")
def auth_cluster(secret_file: Path) -> Iterator[LocalCluster]:
    args = ["--auth-provider", "shared-secret", "--auth-secret-file", str(secret_file)]
    with LocalCluster(3, bookie_args=args) as cluster:
        yield cluster


def test_a_write_and_a_read_with_the_shared_secret(
    spark: SparkSession, auth_cluster: LocalCluster, secret_file: Path, tmp_path: Path
) -> None:
    uri = auth_cluster.metadata_uri
    spark.range(0, 100, numPartitions=2).selectExpr("cast(id as string) as value").write.format(
        "bookkeeper"
    ).option("metadataServiceUri", uri).option("log", "secure/log").option(
        "auth.sharedSecretFile", str(secret_file)
    ).option("auth.name", "spark-tests").mode("append").save()
    rows = (
        spark.read.format("bookkeeper")
        .option("metadataServiceUri", uri)
        .option("log", "secure/log")
        .option("auth.sharedSecretFile", str(secret_file))
        .load()
        .collect()
    )
    assert sorted(int(r.payload) for r in rows) == list(range(100))

    wrong = tmp_path / "wrong"
    wrong.write_bytes(b"another secret, also long enough\n")
    with pytest.raises(Exception, match="shared secret"):
        spark.read.format("bookkeeper").option("metadataServiceUri", uri).option(
            "log", "secure/log"
        ).option("auth.sharedSecretFile", str(wrong)).load().collect()


def test_a_write_and_a_read_over_mutual_tls(spark: SparkSession, tmp_path: Path) -> None:
    from ..integration.test_security import Pki

    pki = Pki(tmp_path, "127.0.0.1", "localhost")
    args = pki.bookie_args("--tls-client-auth", "true", "--tls-trust", pki.ca_path)
    tls = {
        "tls.truststore": pki.ca_path,
        "tls.certificate": pki.client_cert,
        "tls.key": pki.client_key,
    }
    with LocalCluster(3, bookie_args=args) as cluster:
        uri = cluster.metadata_uri
        writer = spark.range(0, 50).selectExpr("cast(id as string) as value").write
        writer = writer.format("bookkeeper").option("metadataServiceUri", uri)
        writer.option("log", "tls/log").options(**tls).mode("append").save()
        reader = spark.read.format("bookkeeper").option("metadataServiceUri", uri)
        rows = reader.option("log", "tls/log").options(**tls).load().collect()
        assert sorted(int(r.payload) for r in rows) == list(range(50))
        plain = spark.read.format("bookkeeper").option("metadataServiceUri", uri)
        with pytest.raises(Exception, match="EUA"):  # the bookies refuse a client without TLS
            plain.option("log", "tls/log").option("client.request_timeout_s", "3").load().collect()


def test_the_spark_commands_jobs_present_the_commands_secret(
    spark: SparkSession,
    auth_cluster: LocalCluster,
    secret_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``bookkeeper spark``'s jobs take the command's shared secret (``bookkeeper
    --auth-secret-file FILE`` or $BOOKKEEPER_AUTH_SECRET_FILE) into the data source's options,
    for the driver and every task: an export, a compaction and an audit on bookies that require
    it. Without it the export is refused."""
    import argparse

    from bookkeeper_py.admin.spark_commands import client_source_options
    from bookkeeper_py.spark.audit import audit
    from bookkeeper_py.spark.jobs import compact_log, export_logs
    from bookkeeper_py.spark.options import parse_client_options

    monkeypatch.delenv("BOOKKEEPER_AUTH_SECRET_FILE", raising=False)
    assert client_source_options(argparse.Namespace(client_secret_file=None)) == {}
    client = client_source_options(argparse.Namespace(client_secret_file=str(secret_file)))
    monkeypatch.setenv("BOOKKEEPER_AUTH_SECRET_FILE", str(secret_file))
    assert client_source_options(argparse.Namespace(client_secret_file=None)) == client
    uri = auth_cluster.metadata_uri
    values = [(f"k{i % 3}:{i}",) for i in range(30)]
    writer = spark.createDataFrame(values, ["value"]).coalesce(1).write.format("bookkeeper")
    writer.option("metadataServiceUri", uri).option("log", "jobs/source").options(**client).mode(
        "append"
    ).save()

    exported = export_logs(spark, uri, str(tmp_path / "export"), client=client, log="jobs/source")
    assert exported.records == 30
    key = "substring(cast(payload as string), 1, 2)"
    done = compact_log(spark, uri, "jobs/source", "jobs/compacted", key, client=client)
    assert (done.read, done.kept, done.keys) == (30, 3, 3)
    report = audit(spark, uri, client_options=parse_client_options(client))
    assert report.healthy, report.lines()
    with pytest.raises(Exception):  # noqa: B017 - the bookies' refusal, wrapped by Spark
        export_logs(spark, uri, str(tmp_path / "refused"), log="jobs/source")
