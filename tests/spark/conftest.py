"""One Spark session (local[2]) and one 3-bookie cluster for every Spark test of a run: a
session takes ~5 s to start and its first job ~4 s more (pyspark-datasource.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from bookkeeper_py.testing import LocalCluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from bookkeeper_py.spark.session import spark_session

    # local[2,2]: two threads, and a failed task is tried once more (tests of retried attempts)
    session = spark_session("local[2,2]", "bookkeeper-py-tests")
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3) as local:
        yield local
