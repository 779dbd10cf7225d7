"""Progress of the Spark jobs a command runs, on the command's progress display.

Spark knows how far a job is: each stage's tasks, done and total. ``followed`` puts the jobs the
block starts (from this thread) in a job group of their own and, while the block runs, a thread
asks Spark's status tracker every ``interval_s`` for that group's jobs and their stages, and
shows the tasks done of those known as one task of ``progress`` (count, rate, ETA). A stage
becomes known when its job starts, so the total grows as later jobs start; once a job ended, its
stages count the tasks they ran (a stage Spark skipped, its shuffle output already there, none). Nothing is polled
when the display is silent (output piped, ``--quiet``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

from bookkeeper_py.progress import SILENT, Display, Task

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

INTERVAL_S = 0.5


class _Follower:
    """Counts the tasks of one job group's stages (done, total) and moves ``task`` along."""

    def __init__(self, spark: SparkSession, group: str, task: Task) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.group = group
        self.task = task
        self.stages: dict[int, tuple[int, int]] = {}  # stage id -> (tasks done, tasks)
        self.shown = 0

    def poll(self) -> None:
        for job_id in self.tracker.getJobIdsForGroup(self.group):
            job = self.tracker.getJobInfo(job_id)
            if job is None:
                continue
            ended = str(job.status) == "SUCCEEDED"
            for stage_id in job.stageIds:
                stage = self.tracker.getStageInfo(stage_id)
                if stage is None:
                    continue
                done = stage.numCompletedTasks
                # a stage of an ended job that did not run all its tasks was skipped (its
                # output already there): only what it ran counts
                self.stages[stage_id] = (done, done if ended else stage.numTasks)
        total = sum(tasks for _, tasks in self.stages.values())
        done = sum(min(finished, tasks) for finished, tasks in self.stages.values())
        if total:
            self.task.set_total(total)
        if done > self.shown:
            self.task.advance(done - self.shown)
            self.shown = done


@contextlib.contextmanager
def followed(
    spark: SparkSession,
    display: Display,
    description: str,
    *,
    interval_s: float = INTERVAL_S,
) -> Iterator[None]:
    """Shows the progress of the Spark jobs started in the block (see the module)."""
    if display is SILENT:
        yield
        return
    context = spark.sparkContext
    group = f"bookkeeper-{uuid.uuid4().hex[:12]}"
    context.setJobGroup(group, description)
    stop = threading.Event()
    with display.task(description, unit="tasks") as task:
        follower = _Follower(spark, group, task)

        def run() -> None:
            while not stop.wait(interval_s):
                try:
                    follower.poll()
                except Exception as error:  # the context stopping under us: stop showing
                    log.debug("spark progress: %s", error)
                    return

        thread = threading.Thread(target=run, name="spark-progress", daemon=True)
        thread.start()
        try:
            yield
            with contextlib.suppress(Exception):
                follower.poll()  # the final counts
        finally:
            stop.set()
            thread.join(10.0)
            context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
