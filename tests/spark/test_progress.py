"""Progress of the Spark jobs (issue 23): ``spark.progress.followed`` counts the tasks of the
jobs its block starts, from Spark's status tracker, up to their total; ``bookkeeper spark export``
on a terminal draws the bar on stderr, and with its output piped prints the result alone."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bookkeeper_py.progress import SILENT, Display, Task
from bookkeeper_py.spark.progress import followed
from bookkeeper_py.testing import LocalCluster

from ..integration.test_progress import plain, run_on_terminal, run_piped
from .logs import write_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]


class Recorded(Display):
    """A display that keeps what its one task was told."""

    def __init__(self) -> None:
        self.tasks: list[RecordedTask] = []

    def task(self, description: str, total: int | None = None, unit: str = "") -> Task:
        self.tasks.append(RecordedTask(description, unit))
        return self.tasks[-1]


class RecordedTask(Task):
    def __init__(self, description: str, unit: str) -> None:
        self.description, self.unit = description, unit
        self.done, self.totals, self.closed = 0, [], False

    def advance(self, count: int = 1) -> None:
        assert count > 0
        self.done += count

    def set_total(self, total: int | None) -> None:
        self.totals.append(total)

    def close(self) -> None:
        self.closed = True


def test_the_tasks_of_the_block_s_jobs_counted_to_their_total(spark: SparkSession) -> None:
    from pyspark.sql import functions

    shown = Recorded()
    # jobs of 8 tasks or more each: a count, then a grouping (8 map tasks, then reduce tasks)
    with followed(spark, shown, "counting", interval_s=0.05):
        assert spark.range(0, 10_000, numPartitions=8).count() == 10_000
        grouped = spark.range(0, 10_000, numPartitions=8).groupBy(functions.col("id") % 3)
        assert sorted(row[1] for row in grouped.count().collect()) == [3333, 3333, 3334]
    [task] = shown.tasks
    assert task.description == "counting" and task.unit == "tasks" and task.closed
    assert task.totals and task.done == task.totals[-1] >= 16
    # a job outside the block is not counted; a silent display asks Spark nothing
    spark.range(0, 100, numPartitions=4).count()
    assert task.done == task.totals[-1]
    with followed(spark, SILENT, "nothing"):
        spark.range(0, 100, numPartitions=4).count()
    assert spark.sparkContext.getLocalProperty("spark.jobGroup.id") is None


def test_spark_export_shows_a_bar_on_a_terminal_and_nothing_piped(
    spark_cluster: LocalCluster, tmp_path: Path
) -> None:
    uri = spark_cluster.metadata_uri
    write_log(uri, "progress/events", [b"event %d" % i for i in range(2000)], roll_every=500)
    command = [sys.executable, "-m", "bookkeeper_py", "spark", "export", "--master", "local[2]"]
    command += ["--metadata-uri", uri, "--log", "progress/events"]
    status, _, drawn = run_on_terminal([*command, "--path", str(tmp_path / "a")], stdout_too=False)
    assert status == 0, plain(drawn)
    text = plain(drawn)
    assert "exporting" in text and re.search(r"\d+/\d+ tasks", text), text
    done = run_piped([*command, "--path", str(tmp_path / "b")])
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(
        rf"exported 2000 records in \d+ batches to {re.escape(str(tmp_path / 'b'))}\n",
        done.stdout.decode(),
    ), done.stdout
    assert b"tasks" not in done.stderr and b"\x1b[" not in done.stderr
