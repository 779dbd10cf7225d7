"""``bookkeeper_py.progress``: a bar only on a terminal (and not with ``--quiet``, nor between
result lines on the terminal), nothing anywhere else; log lines for daemons at the start, every
interval (count of total, rate, ETA) and at the end, on a clock the test steps."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import pty
import re
import struct
import termios
from collections.abc import Iterator

import pytest

from bookkeeper_py import progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def terminal() -> Iterator[tuple[io.TextIOWrapper, int]]:
    """A pseudo-terminal: the text stream a command would write to, and the side to read."""
    controller, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    stream = open(side, "w", encoding="utf-8", closefd=True)  # noqa: SIM115
    try:
        yield stream, controller
    finally:
        stream.close()
        os.close(controller)


def read_all(controller: int) -> str:
    """What the terminal got so far (the writer has flushed; reads stop when none is left)."""
    os.set_blocking(controller, False)
    chunks = []
    for _ in range(10_000):  # bounded: a bar of a few redraws is far less
        try:
            chunk = os.read(controller, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    text = b"".join(chunks).decode("utf-8", errors="replace")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", text)


def test_off_a_terminal_nothing_is_shown() -> None:
    stream = io.StringIO()
    display = progress.terminal(stream=stream)
    assert display is progress.SILENT
    with display, display.task("work", total=10, unit="things") as task:
        task.advance(10)
    assert stream.getvalue() == ""


def test_quiet_shows_nothing_on_a_terminal(terminal: tuple[io.TextIOWrapper, int]) -> None:
    stream, _ = terminal
    assert progress.terminal(True, stream=stream) is progress.SILENT


def test_lines_on_the_terminal_get_no_bar_between_them(
    terminal: tuple[io.TextIOWrapper, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    stream, _ = terminal
    monkeypatch.setattr("sys.stdout", stream)  # stdout on the same terminal
    assert progress.terminal(prints_lines=True, stream=stream) is progress.SILENT
    assert progress.terminal(stream=stream) is not progress.SILENT


def test_a_terminal_gets_a_bar_with_count_rate_and_times(
    terminal: tuple[io.TextIOWrapper, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("COLUMNS", "160")  # rich asks the process's own std streams, not the pty
    stream, controller = terminal
    display = progress.terminal(stream=stream)
    assert display is not progress.SILENT
    with display:
        with display.task("copying", total=2000, unit="entries") as task:
            task.advance(1500)
            task.advance(500)
        with display.task("scanning", unit="bytes") as scanning:
            scanning.set_total(3_000_000)
            scanning.advance(1_000_000)
    stream.flush()
    text = read_all(controller)
    assert "copying" in text and "2,000/2,000 entries" in text
    assert re.search(r"([\d,.]+|-) /?entries/s|- /s", text)  # the rate (none yet at this speed)
    assert re.search(r"elapsed \d+:\d\d:\d\d", text)
    # ended short of its estimated total: the count reached is the total
    assert "scanning" in text and "1.0/1.0 MB" in text


def test_daemons_log_each_interval_and_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    logger = logging.getLogger("bookkeeper_py.test_progress")
    display = progress.logged(logger, interval_s=5.0, clock=clock)
    with (
        caplog.at_level(logging.INFO, logger=logger.name),
        display,
        display.task("replaying journal /j", total=4_000_000, unit="bytes") as task,
    ):
        clock.now += 2.0
        task.advance(500_000)  # within the interval: no line
        clock.now += 3.0
        task.advance(500_000)  # 1 MB in 5 s
        clock.now += 1.0
        task.advance(1_000_000)  # within the next interval
        clock.now += 4.0
        task.advance(0)  # 2 MB in 10 s
        clock.now += 10.0
        task.advance(2_000_000)
        task.close()  # closing twice logs once
    assert [record.getMessage() for record in caplog.records] == [
        "replaying journal /j: 1.0 MB of 4.0 MB (25%), 0.2 MB/s, ETA 0:00:15",
        "replaying journal /j: 2.0 MB of 4.0 MB (50%), 0.2 MB/s, ETA 0:00:10",
        "replaying journal /j: 4.0 MB of 4.0 MB (100%), 0.2 MB/s, ETA 0:00:00",
        "replaying journal /j: done, 4.0 MB in 20.0 s (0.2 MB/s)",
    ]


def test_daemon_lines_without_a_total(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    logger = logging.getLogger("bookkeeper_py.test_progress")
    display = progress.logged(logger, interval_s=1.0, clock=clock)
    with (
        caplog.at_level(logging.INFO, logger=logger.name),
        display.task("deleting", unit="nodes") as task,
    ):
        clock.now += 2.0
        task.advance(3000)
    assert [record.getMessage() for record in caplog.records] == [
        "deleting: 3,000 nodes, 1,500 nodes/s, elapsed 0:00:02",
        "deleting: done, 3,000 nodes in 2.0 s (1,500 nodes/s)",
    ]


def test_a_daemon_task_nobody_waited_for_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """Shorter than ``min_s``: no line (a bookie that starts at once says nothing of a replay);
    as long as ``min_s``: only the end."""
    clock = FakeClock()
    logger = logging.getLogger("bookkeeper_py.test_progress")
    display = progress.logged(logger, interval_s=5.0, min_s=1.0, clock=clock)
    with caplog.at_level(logging.INFO, logger=logger.name):
        with display.task("replaying journal /j", total=100, unit="bytes") as task:
            clock.now += 0.5
            task.advance(100)
        assert caplog.records == []
        with display.task("replaying journal /k", total=100, unit="bytes") as task:
            clock.now += 1.5
            task.advance(100)
    assert [record.getMessage() for record in caplog.records] == [
        "replaying journal /k: done, 0.0 MB in 1.5 s (0.0 MB/s)"
    ]
