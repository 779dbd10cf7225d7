"""Bounded waiting for tests: poll a condition until it holds or a deadline passes; stop a child
process as Ctrl-C would."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable


def wait_for(
    condition: Callable[[], bool], timeout_s: float, what: str, *, interval_s: float = 0.05
) -> None:
    """Returns once ``condition()`` is true; raises ``AssertionError`` naming ``what`` after
    ``timeout_s``. Exceptions from the condition count as "not yet" (a store reconnecting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except Exception:
            pass
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(interval_s)


def interrupt(process: subprocess.Popen[str], timeout_s: float = 60.0) -> tuple[str, str]:
    """Ctrl-C for a child process: SIGINT to its PID only, then its remaining output once it
    exited; killed (by PID) if it has not within ``timeout_s``. The caller reads
    ``process.returncode``."""
    process.send_signal(signal.SIGINT)
    try:
        return process.communicate(timeout=timeout_s)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)
