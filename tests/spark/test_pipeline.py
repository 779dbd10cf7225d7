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
