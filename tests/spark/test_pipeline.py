"""The README's main job: `bookkeeper localbookie 3 --pipeline`, run to a checked end."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_the_pipeline_aggregates_every_event_exactly_once_into_a_log_and_parquet(
    tmp_path: os.PathLike[str],
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bookkeeper_py",
            "localbookie",
            "3",
            "--pipeline",
            "--exit-after-demo",
            "--pipeline-events",
            "2000",
            "--master",
            "local[2]",
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (
        "log demo/per-user-2s: " in done.stdout
        and "counting 2000 events, 0 duplicates; Parquet: " in done.stdout
        and done.stdout.count("counting 2000 events, 0 duplicates") == 2
    ), done.stdout
    assert "aggregates_to_log batch" in done.stdout


def test_the_format_is_found_without_registering_it(tmp_path: os.PathLike[str]) -> None:
    """pyspark_bookkeeper: a session that never called register() reads a log."""
    from bookkeeper_py.testing import LocalCluster

    from .logs import write_log

    script = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
         .getOrCreate())
rows = spark.read.format("BookKeeper").option("metadataServiceUri", sys.argv[1]) \\
    .option("log", "auto/found").load().collect()
print("payloads", sorted(r.payload.decode() for r in rows))
spark.stop()
"""
    with LocalCluster(3, base_directory=str(tmp_path)) as cluster:
        write_log(cluster.metadata_uri, "auto/found", [b"x", b"y"])
        done = subprocess.run(
            [sys.executable, "-c", script, cluster.metadata_uri],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "payloads ['x', 'y']" in done.stdout
