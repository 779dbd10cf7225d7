"""Progress of long operations, one way everywhere: a bar with the count, rate and ETA on a
terminal, nothing when output goes to a file or pipe, a log line per step in a daemon.

An operation takes a :class:`Display` (``SILENT`` by default) and opens a :class:`Task` per
phase (``display.task("writing entries", total=n, unit="entries")``), which it ``advance``\\ s
and closes; a total unknown at first is given later (``set_total``). The caller picks the
display:

- ``terminal(quiet)``, for commands: a ``rich`` bar on stderr when stderr is a terminal and
  ``--quiet`` was not given; otherwise silent, so stdout carries the result alone and a pipe or
  a file gets nothing else. Commands that print their result line by line while they run pass
  ``prints_lines=True``: with stdout on the terminal too those lines show the progress, and a bar
  redrawn between them would tear them, so none is drawn then.
- ``logged(logger)``, for daemons: a line every ``interval_s`` while a task runs (count of total,
  percent, rate, ETA), and one at its end (count, time, rate) if it took ``min_s`` (1 s) or more:
  a task nobody waited for logs nothing (a bookie that starts at once says only that it
  started). The clock is an argument, so tests step it.

Library code never decides whether to show anything: it reports to the display it is given.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    import rich.progress


class Task:
    """One phase of a long operation. This base class shows nothing (``SILENT``'s tasks)."""

    def advance(self, count: int = 1) -> None:
        """``count`` more units done."""

    def set_total(self, total: int | None) -> None:
        """The total once known, or a better estimate (None: unknown)."""

    def close(self) -> None:
        """The phase is over (a bar stays drawn at its final count; a daemon logs the end)."""

    def __enter__(self) -> Task:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class Display:
    """Where the tasks of an operation show. This base class shows nothing (``SILENT``);
    ``terminal`` and ``logged`` make the others. Enter it around the operation."""

    def task(self, description: str, total: int | None = None, unit: str = "") -> Task:
        """Opens a task; ``unit`` names what is counted (``"bytes"`` is shown as MB)."""
        return Task()

    def __enter__(self) -> Display:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None


SILENT = Display()


def terminal(
    quiet: bool = False, *, prints_lines: bool = False, stream: IO[str] | None = None
) -> Display:
    """A bar on ``stream`` (stderr) if it is a terminal and not ``quiet``; else ``SILENT``.
    ``prints_lines``: the command writes its result to stdout as it goes (see the module)."""
    stream = sys.stderr if stream is None else stream
    if quiet or not _isatty(stream):
        return SILENT
    if prints_lines and _isatty(sys.stdout):
        return SILENT
    from rich.console import Console

    console = Console(file=stream)
    if not console.is_terminal or console.is_dumb_terminal:
        return SILENT
    return _BarDisplay(console)


def quiet_option(command: argparse.ArgumentParser, help_text: str = "") -> None:
    """``-q/--quiet`` of a command: no progress bar on a terminal (there is none off one)."""
    command.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help=help_text or "no progress bar (progress shows on stderr only when it is a terminal)",
    )


def logged(
    logger: logging.Logger,
    *,
    interval_s: float = 5.0,
    min_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> Display:
    """Log lines through ``logger`` (INFO): every ``interval_s`` seconds while a task runs, and
    at its end if it took ``min_s`` or more (or logged a line before)."""
    return _LogDisplay(logger, interval_s, min_s, clock)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def amount(count: float, unit: str) -> str:
    """``count`` ``unit``\\ s for people: bytes as MB, other counts with thousands separators."""
    if unit == "bytes":
        return f"{count / 1e6:,.1f} MB"
    return f"{count:,.0f} {unit}".rstrip()


def duration(seconds: float) -> str:
    """``h:mm:ss`` (as the bar shows times)."""
    whole = max(0, round(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


# -- on a terminal: rich ---------------------------------------------------------------------


def _columns() -> tuple[rich.progress.ProgressColumn, ...]:
    from rich.progress import BarColumn, ProgressColumn, TextColumn
    from rich.text import Text

    class Count(ProgressColumn):
        """``done/total unit`` (``?`` while the total is unknown)."""

        def render(self, task: rich.progress.Task) -> Text:
            unit = task.fields.get("unit", "")
            if unit == "bytes":
                total = "?" if task.total is None else f"{task.total / 1e6:,.1f}"
                return Text(f"{task.completed / 1e6:,.1f}/{total} MB")
            total = "?" if task.total is None else f"{int(task.total):,}"
            return Text(f"{int(task.completed):,}/{total} {unit}".rstrip())

    class Rate(ProgressColumn):
        """Units a second over the last half minute."""

        def render(self, task: rich.progress.Task) -> Text:
            speed = task.finished_speed or task.speed
            if speed is None:
                return Text("- /s")
            return Text(f"{amount(speed, task.fields.get('unit', ''))}/s")

    class Times(ProgressColumn):
        """The time taken, and the ETA while running (once the rate and total are known)."""

        def render(self, task: rich.progress.Task) -> Text:
            elapsed = task.finished_time if task.finished else task.elapsed
            text = f"elapsed {duration(elapsed or 0.0)}"
            if not task.finished:
                left = task.time_remaining
                text += f" ETA {'-:--:--' if left is None else duration(left)}"
            return Text(text)

    return (
        TextColumn("{task.description}"),
        BarColumn(),
        Count(),
        Rate(),
        Times(),
    )


class _BarDisplay(Display):
    def __init__(self, console: object) -> None:
        from rich.progress import Progress

        # stdout is left alone: the result goes there, not through the bar's console.
        self.progress = Progress(
            *_columns(),
            console=console,  # type: ignore[arg-type]
            redirect_stdout=False,
            redirect_stderr=True,
        )

    def task(self, description: str, total: int | None = None, unit: str = "") -> Task:
        return _BarTask(self.progress, self.progress.add_task(description, total=total, unit=unit))

    def __enter__(self) -> Display:
        self.progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.progress.stop()


class _BarTask(Task):
    def __init__(self, progress: rich.progress.Progress, task_id: rich.progress.TaskID) -> None:
        self.progress = progress
        self.task_id = task_id

    def advance(self, count: int = 1) -> None:
        self.progress.advance(self.task_id, count)

    def set_total(self, total: int | None) -> None:
        self.progress.update(self.task_id, total=total)
        if total is None:  # rich's update reads None as "unchanged"
            self._task().total = None

    def _task(self) -> rich.progress.Task:
        return next(task for task in self.progress.tasks if task.id == self.task_id)

    def close(self) -> None:
        task = self._task()
        if task.total is None or task.completed < task.total:
            # Ended short of (or without) its total: that count was the total after all.
            self.progress.update(self.task_id, total=task.completed)
        self.progress.stop_task(self.task_id)
        self.progress.refresh()


# -- in a daemon: log lines ------------------------------------------------------------------


class _LogDisplay(Display):
    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float,
        min_s: float,
        clock: Callable[[], float],
    ):
        self.logger = logger
        self.interval_s = interval_s
        self.min_s = min_s
        self.clock = clock

    def task(self, description: str, total: int | None = None, unit: str = "") -> Task:
        return _LogTask(self, description, total, unit)


class _LogTask(Task):
    def __init__(self, display: _LogDisplay, description: str, total: int | None, unit: str):
        self.display = display
        self.description = description
        self.total = total
        self.unit = unit
        self.done = 0
        self.started = self.last_line = display.clock()
        self.closed = False
        self.lines = 0  # progress lines logged
        self._lock = threading.Lock()

    def advance(self, count: int = 1) -> None:
        with self._lock:
            self.done += count
            now = self.display.clock()
            if now - self.last_line < self.display.interval_s:
                return
            self.last_line = now
            self.lines += 1
            line = self._running(now)
        self.display.logger.info("%s", line)

    def _running(self, now: float) -> str:
        elapsed = now - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        line = f"{self.description}: {amount(self.done, self.unit)}"
        if self.total is None:
            return f"{line}, {amount(rate, self.unit)}/s, elapsed {duration(elapsed)}"
        percent = 100.0 * self.done / self.total if self.total else 100.0
        eta = duration(max(0.0, self.total - self.done) / rate) if rate > 0 else "-:--:--"
        return (
            f"{line} of {amount(self.total, self.unit)} ({percent:.0f}%), "
            f"{amount(rate, self.unit)}/s, ETA {eta}"
        )

    def set_total(self, total: int | None) -> None:
        with self._lock:
            self.total = total

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            elapsed = self.display.clock() - self.started
        if elapsed < self.display.min_s and not self.lines:
            return  # nobody waited: nothing to say
        rate = self.done / elapsed if elapsed > 0 else 0.0
        self.display.logger.info(
            "%s: done, %s in %.1f s (%s/s)",
            self.description,
            amount(self.done, self.unit),
            elapsed,
            amount(rate, self.unit),
        )
