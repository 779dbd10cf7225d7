"""Ctrl-C in ``bookkeeper bench`` stops cleanly with a partial report, and ``--seconds`` bounds
catch-up reads. (Behaviour only: no timing is asserted.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psutil
import pytest

WRITES = ["writes", "--local", "1", "-e", "1", "-w", "1", "-a", "1", "--seconds", "120"]


def interrupted_bench(*args: str) -> tuple[subprocess.CompletedProcess[str], list[int]]:
    """Runs ``bookkeeper bench ARGS``, sends SIGINT (to its PID only) once it reports progress,
    and returns what it printed and the PIDs of the processes it had started."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bookkeeper_py", "bench", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    children: list[int] = []
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 120
        for line in process.stderr:  # progress lines, one per second
            if "/s   p99" in line or time.monotonic() > deadline:
                break
        children = [child.pid for child in psutil.Process(process.pid).children(recursive=True)]
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), children


def assert_all_gone(pids: list[int]) -> None:
    alive = []
    for pid in pids:
        try:
            child = psutil.Process(pid)
            child.wait(timeout=30)
        except psutil.NoSuchProcess:
            continue
        except psutil.TimeoutExpired:
            alive.append(pid)
            child.kill()
    assert alive == [], f"processes left running after the bench: {alive}"


@pytest.mark.slow
def test_ctrl_c_during_writes_prints_the_partial_report() -> None:
    result, children = interrupted_bench(*WRITES)
    assert result.returncode == 130, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("interrupted after ") and lines[0].endswith(": partial results")
    adds = int(lines[1].split(" adds in ")[0].replace(",", ""))
    assert adds > 0
    assert "add latency (ms): p50" in lines[2]
    assert children, "the bench started its bookie"
    assert_all_gone(children)


@pytest.mark.slow
def test_ctrl_c_with_json_marks_the_report_interrupted() -> None:
    result, children = interrupted_bench(*WRITES, "--rate", "2000", "--json")
    assert result.returncode == 130, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["interrupted"] is True and report["entries"] > 0
    assert report["elapsed_s"] > 0 and report["failures"] == 0
    assert_all_gone(children)


@pytest.mark.slow
def test_catch_up_reads_stop_after_seconds() -> None:
    """A read of many entries with --seconds 0 stops at once: fewer entries read than written
    (entry counts only; how long it took is not asserted)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bookkeeper_py",
            "bench",
            "reads",
            "--local",
            "3",
            "--entries",
            "3000",
            "--read-batch",
            "100",
            "--seconds",
            "0",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["entries"] == 0 and report["interrupted"] is False
    assert report["settings"]["seconds"] == 0
