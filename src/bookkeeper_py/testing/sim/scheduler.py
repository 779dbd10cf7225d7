"""Virtual time and the event queue of a simulation."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(order=True, slots=True)
class _Scheduled:
    at_ms: float
    sequence: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)


class Timer:
    """A scheduled callback that can be cancelled before it runs."""

    __slots__ = ("_item",)

    def __init__(self, item: _Scheduled) -> None:
        self._item = item

    def cancel(self) -> None:
        self._item.cancelled = True

    @property
    def at_ms(self) -> float:
        return self._item.at_ms


class Simulation:
    """A seeded event loop over virtual milliseconds. Callbacks run one at a time, in time order
    (ties in scheduling order); nothing sleeps."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.random = random.Random(seed)
        self.now_ms = 0.0
        self.steps = 0
        self._queue: list[_Scheduled] = []
        self._sequence = 0

    def call_at(self, at_ms: float, callback: Callable[[], None]) -> Timer:
        """Runs ``callback`` at virtual time ``at_ms`` (now, if that is in the past)."""
        self._sequence += 1
        item = _Scheduled(max(at_ms, self.now_ms), self._sequence, callback)
        heapq.heappush(self._queue, item)
        return Timer(item)

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> Timer:
        return self.call_at(self.now_ms + max(0.0, delay_ms), callback)

    @property
    def idle(self) -> bool:
        return not any(not item.cancelled for item in self._queue)

    def step(self) -> bool:
        """Runs the next callback; False when nothing is scheduled."""
        while self._queue:
            item = heapq.heappop(self._queue)
            if item.cancelled:
                continue
            self.now_ms = item.at_ms
            self.steps += 1
            item.callback()
            return True
        return False

    def run(
        self,
        *,
        until: Callable[[], bool] | None = None,
        max_steps: int = 1_000_000,
        max_time_ms: float | None = None,
        after_step: Callable[[], None] | None = None,
    ) -> bool:
        """Steps until ``until()`` holds (True), or the queue empties, ``max_steps`` callbacks
        ran or virtual time passed ``max_time_ms`` (False). ``after_step`` runs after every
        callback: the invariant checks."""
        for _ in range(max_steps):
            if until is not None and until():
                return True
            if max_time_ms is not None and self._queue and self._next_time() > max_time_ms:
                return False
            if not self.step():
                return until is not None and until()
            if after_step is not None:
                after_step()
        return until is not None and until()

    def _next_time(self) -> float:
        while self._queue and self._queue[0].cancelled:
            heapq.heappop(self._queue)
        return self._queue[0].at_ms if self._queue else float("inf")
