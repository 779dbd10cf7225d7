"""The clock port: what the runtime asks of time, ``now()`` in monotonic seconds, for
deadlines and every timing decision (quarantine, replica health, speculative reads). Timers are
the running loop's (``call_later`` / ``call_at``): under the simulator that loop runs in virtual
time, so ``LoopClock`` reads the same time line.

``MonotonicClock`` is the real one: ``time.monotonic`` (under uvloop, ``loop.time()`` per add and
per answer cost a third of the client's time in ``bookkeeper bench writes``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds, on the running loop's time line."""
        ...


class MonotonicClock:
    now = staticmethod(time.monotonic)


class LoopClock:
    """The time of ``loop`` (asyncio's, or the simulator's virtual one)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.now = loop.time
