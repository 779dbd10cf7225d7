"""Placement policies: which bookies form a new ensemble, and which replace failed ones.

Pure functions of the bookies the caller knows and a seeded ``random.Random``; the caller reads
the bookie list (from the metadata store, or the simulator's world).

* ``RandomPlacement``: any writable bookies, uniformly (BookKeeper's DefaultEnsemblePlacementPolicy).
* Bookies that keep failing are *quarantined* (``Quarantine``) for a while and chosen only when
  no other bookie is left.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence

from bookkeeper import errors


class Quarantine:
    """Bookies that failed ``threshold`` times within ``window_ms``, kept out for ``duration_ms``."""

    def __init__(self, threshold: int = 3, window_ms: int = 60_000, duration_ms: int = 60_000):
        self.threshold = threshold
        self.window_ms = window_ms
        self.duration_ms = duration_ms
        self._failures: dict[str, list[int]] = {}
        self._until: dict[str, int] = {}

    def record_failure(self, bookie: str, now_ms: int) -> None:
        recent = [t for t in self._failures.get(bookie, []) if now_ms - t < self.window_ms]
        recent.append(now_ms)
        self._failures[bookie] = recent
        if len(recent) >= self.threshold:
            self._until[bookie] = now_ms + self.duration_ms
            self._failures[bookie] = []

    def quarantined(self, now_ms: int) -> set[str]:
        for bookie in [b for b, until in self._until.items() if until <= now_ms]:
            del self._until[bookie]
        return set(self._until)


class RandomPlacement:
    """Uniformly random ensembles; quarantined bookies only as a last resort."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()

    def _pick(self, count: int, candidates: Sequence[str], avoid: set[str], what: str) -> list[str]:
        preferred = [bookie for bookie in candidates if bookie not in avoid]
        if len(preferred) >= count:
            return self.rng.sample(preferred, count)
        fallback = [bookie for bookie in candidates if bookie in avoid]
        if len(preferred) + len(fallback) < count:
            raise errors.NotEnoughBookiesError(
                f"{what}: need {count} more writable bookies, only {len(candidates)} available "
                f"({sorted(candidates)}); start more bookies or use a smaller ensemble"
            )
        return preferred + self.rng.sample(fallback, count - len(preferred))

    def new_ensemble(
        self, size: int, writable: Iterable[str], quarantined: Iterable[str] = ()
    ) -> tuple[str, ...]:
        candidates = sorted(set(writable))
        return tuple(self._pick(size, candidates, set(quarantined), "new ensemble"))

    def replace(
        self,
        ensemble: Sequence[str],
        failed: Mapping[int, str],
        writable: Iterable[str],
        quarantined: Iterable[str] = (),
        exclude: Iterable[str] = (),
    ) -> tuple[str, ...]:
        """``ensemble`` with each failed index given a bookie outside the ensemble (and outside
        ``exclude``); raises ``NotEnoughBookiesError`` when there are not enough."""
        taken = set(ensemble) | set(exclude) | set(failed.values())
        candidates = sorted(set(writable) - taken)
        chosen = self._pick(
            len(failed), candidates, set(quarantined), f"replacing {sorted(failed.values())}"
        )
        members = list(ensemble)
        for index, bookie in zip(sorted(failed), chosen, strict=True):
            members[index] = bookie
        return tuple(members)
