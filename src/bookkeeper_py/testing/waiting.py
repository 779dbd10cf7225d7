"""Bounded waiting for tests: poll a condition until it holds or a deadline passes."""

from __future__ import annotations

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
