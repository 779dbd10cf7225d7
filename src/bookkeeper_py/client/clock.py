"""The clock port: what the runtime asks of time. ``now()`` (monotonic seconds) for deadlines
and timing decisions, ``call_at(when, callback)`` for timers on that time line.

``MonotonicClock`` is the real one: ``time.monotonic`` (under uvloop, ``loop.time()`` per add and
per answer cost a third of the client's time in ``bookkeeper bench writes``) and the running
loop's timers. ``LoopClock`` reads the loop's own time: the simulator's virtual-time loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def call_at(self, when: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        """Runs ``callback`` on the running loop at ``when`` (this clock's time)."""
        ...


class MonotonicClock:
    now = staticmethod(time.monotonic)

    def call_at(self, when: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - time.monotonic()), callback)


class LoopClock:
    """The time of ``loop`` (asyncio's, or the simulator's virtual one)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.now = loop.time

    def call_at(self, when: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        return self._loop.call_at(when, callback)
