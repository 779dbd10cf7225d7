"""Placement policies: which bookies form a new ensemble, and which replace failed ones.

Pure functions of the bookies the caller knows and a seeded ``random.Random``; the caller reads
the bookie list (from the metadata store, or the simulator's world).

* ``RandomPlacement``: any writable bookies, uniformly (BookKeeper's DefaultEnsemblePlacementPolicy);
  the topology-aware policy below with no topology.
* ``TopologyAwarePlacement``: BookKeeper's RackawareEnsemblePlacementPolicy (``regions=False``)
  and RegionAwareEnsemblePlacementPolicy (``regions=True``). Bookies are mapped to network
  locations (``NetworkTopology``: "/rack" or "/region/rack"; unknown bookies are in
  ``/default-region/default-rack``). Members are chosen one position at a time so that every
  write quorum (Qw consecutive positions, wrapping) spans as many regions (region-aware, up to
  ``min_regions``) and then racks (up to ``min_racks``) as it can; ties are broken at random.
  With ``enforce`` a write quorum that cannot reach ``min_racks`` racks is an error rather than
  a weaker ensemble. Region-aware reads try the local region's replicas first.
* Bookies that keep failing are *quarantined* (``Quarantine``) for a while, and bookies whose
  last answer was a failure are *suspects*; both are chosen only when no other bookie is left.
  ``ChangeRate`` paces a writer's ensemble changes with backoff.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from bookkeeper_py import errors
from bookkeeper_py.core.quorum import write_set

DEFAULT_REGION = "default-region"
DEFAULT_RACK = "default-rack"


class Quarantine:
    """Bookies to avoid when choosing ensemble members: those that failed ``threshold`` times
    within ``window_ms`` (kept out for ``duration_ms``), and *suspects*, whose last answer
    within ``suspect_ms`` was a failure (until one succeeds). Both are chosen only when no
    other bookie is left. Suspects end ensemble-change storms: a dead bookie still registered
    (its session not expired yet) failed once and is not picked again while others answer."""

    def __init__(
        self,
        threshold: int = 3,
        window_ms: int = 60_000,
        duration_ms: int = 60_000,
        suspect_ms: int = 30_000,
    ):
        self.threshold = threshold
        self.window_ms = window_ms
        self.duration_ms = duration_ms
        self.suspect_ms = suspect_ms
        self._failures: dict[str, list[int]] = {}
        self._until: dict[str, int] = {}
        self.suspects: dict[str, int] = {}  # bookie -> when its last failure was

    def record_failure(self, bookie: str, now_ms: int) -> None:
        self.suspects[bookie] = now_ms
        recent = [t for t in self._failures.get(bookie, []) if now_ms - t < self.window_ms]
        recent.append(now_ms)
        self._failures[bookie] = recent
        if len(recent) >= self.threshold:
            self._until[bookie] = now_ms + self.duration_ms
            self._failures[bookie] = []

    def record_success(self, bookie: str) -> None:
        """``bookie`` answered: no longer a suspect (check ``suspects`` first on hot paths)."""
        self.suspects.pop(bookie, None)

    def quarantined(self, now_ms: int) -> set[str]:
        """The bookies to avoid now: quarantined ones and suspects."""
        for bookie in [b for b, until in self._until.items() if until <= now_ms]:
            del self._until[bookie]
        for bookie in [b for b, at in self.suspects.items() if now_ms - at >= self.suspect_ms]:
            del self.suspects[bookie]
        return set(self._until) | set(self.suspects)


class ChangeRate:
    """Paces a writer's ensemble changes: after a change, the next may follow at once; one that
    follows the previous within ``reset_after_ms`` makes the one after it wait ``initial_ms``,
    doubling up to ``max_ms``. A storm of changes (replacements that fail at once: bookies dead
    but still registered) costs a few metadata writes, not a hundred a second."""

    def __init__(
        self, initial_ms: int = 100, max_ms: int = 5_000, reset_after_ms: int = 10_000
    ) -> None:
        self.initial_ms = initial_ms
        self.max_ms = max_ms
        self.reset_after_ms = reset_after_ms
        self._last: int | None = None
        self._quick = 0  # changes in a row that followed the previous one closely

    def made(self, now_ms: int) -> int:
        """A change is made at ``now_ms``; returns when the next one may be."""
        if self._last is not None and now_ms - self._last < self.reset_after_ms:
            self._quick = min(self._quick + 1, 30)
        else:
            self._quick = 0
        self._last = now_ms
        if self._quick == 0:
            return now_ms
        backoff: int = self.initial_ms << (self._quick - 1)
        return now_ms + min(backoff, self.max_ms)


class PlacementPolicy(Protocol):
    def new_ensemble(
        self,
        size: int,
        writable: Iterable[str],
        quarantined: Iterable[str] = (),
        write_quorum_size: int | None = None,
    ) -> tuple[str, ...]: ...

    def replace(
        self,
        ensemble: Sequence[str],
        failed: Mapping[int, str],
        writable: Iterable[str],
        quarantined: Iterable[str] = (),
        exclude: Iterable[str] = (),
        write_quorum_size: int | None = None,
    ) -> tuple[str, ...]: ...

    def read_order(self, replicas: Sequence[tuple[int, str]]) -> Sequence[tuple[int, str]]: ...


class NetworkTopology:
    """Where each bookie is: a mapping of bookie ids to "/rack" or "/region/rack" (BookKeeper's
    DNS-to-switch mapping); an unknown bookie is in the default region's default rack."""

    def __init__(self, locations: Mapping[str, str] | None = None) -> None:
        self._locations: dict[str, tuple[str, str]] = {}
        for bookie, location in (locations or {}).items():
            parts = [part for part in location.split("/") if part]
            if len(parts) == 1:
                self._locations[bookie] = (DEFAULT_REGION, parts[0])
            elif len(parts) == 2:
                self._locations[bookie] = (parts[0], parts[1])
            else:
                raise errors.IncorrectParameterError(
                    f"network location {location!r} of bookie {bookie}: write /rack or /region/rack"
                )

    def region(self, bookie: str) -> str:
        return self._locations.get(bookie, (DEFAULT_REGION, DEFAULT_RACK))[0]

    def rack(self, bookie: str) -> tuple[str, str]:
        """The rack, qualified by its region (racks of two regions never coincide)."""
        return self._locations.get(bookie, (DEFAULT_REGION, DEFAULT_RACK))


class TopologyAwarePlacement:
    """Ensembles whose write quorums span regions (``regions``) and racks; see the module text."""

    def __init__(
        self,
        topology: NetworkTopology,
        rng: random.Random | None = None,
        *,
        min_racks: int = 2,
        enforce: bool = False,
        regions: bool = False,
        min_regions: int = 2,
        local_region: str = "",
    ) -> None:
        self.topology = topology
        self.rng = rng or random.Random()
        self.min_racks = min_racks
        self.enforce = enforce
        self.regions = regions
        self.min_regions = min_regions
        self.local_region = local_region

    def _score(
        self, members: Sequence[str | None], position: int, bookie: str, write_quorum_size: int
    ) -> tuple[int, int]:
        """How well the write quorums through ``position`` spread with ``bookie`` there."""
        size = len(members)
        region_score = rack_score = 0
        for first in range(position - write_quorum_size + 1, position + 1):
            quorum = [
                bookie if index == position else members[index]
                for index in write_set(first % size, size, write_quorum_size)
            ]
            present = [member for member in quorum if member is not None]
            rack_score += min(len({self.topology.rack(m) for m in present}), self.min_racks)
            if self.regions:
                regions = {self.topology.region(m) for m in present}
                region_score += min(len(regions), self.min_regions)
        return region_score, rack_score

    def _fill(
        self,
        members: list[str | None],
        positions: Sequence[int],
        candidates: Sequence[str],
        avoid: set[str],
        write_quorum_size: int,
        what: str,
    ) -> tuple[str, ...]:
        preferred = [bookie for bookie in candidates if bookie not in avoid]
        fallback = [bookie for bookie in candidates if bookie in avoid]
        if len(candidates) < len(positions):
            raise errors.NotEnoughBookiesError(
                f"{what}: need {len(positions)} more writable bookies, only {len(candidates)} "
                f"available ({sorted(candidates)}); start more bookies or use a smaller ensemble"
            )
        for position in positions:
            pool = preferred or fallback
            # Among equally good picks, the rack with the most bookies left: leaving several
            # bookies of one rack for the last positions would force a quorum into one rack.
            left: dict[tuple[str, str], int] = {}
            for bookie in pool:
                left[self.topology.rack(bookie)] = left.get(self.topology.rack(bookie), 0) + 1
            scored = [
                (
                    (
                        *self._score(members, position, bookie, write_quorum_size),
                        left[self.topology.rack(bookie)],
                    ),
                    bookie,
                )
                for bookie in pool
            ]
            best = max(score for score, _ in scored)
            bookie = self.rng.choice([b for score, b in scored if score == best])
            members[position] = bookie
            pool.remove(bookie)
        chosen = self._improve(
            [member for member in members if member is not None], positions, write_quorum_size
        )
        if self.enforce:
            self._check(chosen, write_quorum_size, len({self.topology.rack(b) for b in candidates}))
        return chosen

    def _spread(self, members: Sequence[str], write_quorum_size: int) -> tuple[int, int]:
        """How well all write quorums spread (regions, then racks), each counted up to its goal."""
        regions = racks = 0
        for first in range(len(members)):
            quorum = [members[i] for i in write_set(first, len(members), write_quorum_size)]
            racks += min(len({self.topology.rack(b) for b in quorum}), self.min_racks)
            if self.regions:
                regions += min(len({self.topology.region(b) for b in quorum}), self.min_regions)
        return regions, racks

    def _improve(
        self, members: list[str], positions: Sequence[int], write_quorum_size: int
    ) -> tuple[str, ...]:
        """Swaps the bookies just chosen between their positions while that spreads the write
        quorums better: one position at a time cannot see that its pick leaves the last
        positions only bookies of a rack next to them."""
        best = self._spread(members, write_quorum_size)
        for _ in range(len(members) * len(members)):  # bounded; each swap strictly improves
            improved = False
            for a in positions:
                for b in positions:
                    if a >= b:
                        continue
                    members[a], members[b] = members[b], members[a]
                    spread = self._spread(members, write_quorum_size)
                    if spread > best:
                        best, improved = spread, True
                    else:
                        members[a], members[b] = members[b], members[a]
            if not improved:
                break
        return tuple(members)

    def _check(self, ensemble: Sequence[str], write_quorum_size: int, racks_known: int) -> None:
        needed = min(self.min_racks, write_quorum_size)
        for first in range(len(ensemble)):
            quorum = [ensemble[i] for i in write_set(first, len(ensemble), write_quorum_size)]
            racks = {self.topology.rack(b) for b in quorum}
            if len(racks) < needed:
                raise errors.NotEnoughBookiesError(
                    f"cannot spread every write quorum over {needed} racks: {quorum} are in "
                    f"{sorted('/'.join(r) for r in racks)} ({racks_known} racks have writable "
                    "bookies); add bookies in other racks or turn off the enforcement"
                )

    def adheres(self, ensemble: Sequence[str], write_quorum_size: int) -> bool:
        """Whether every write quorum of ``ensemble`` spans ``min_racks`` racks (or Qw of them)."""
        try:
            self._check(ensemble, write_quorum_size, 0)
        except errors.NotEnoughBookiesError:
            return False
        return True

    def new_ensemble(
        self,
        size: int,
        writable: Iterable[str],
        quarantined: Iterable[str] = (),
        write_quorum_size: int | None = None,
    ) -> tuple[str, ...]:
        members: list[str | None] = [None] * size
        return self._fill(
            members,
            range(size),
            sorted(set(writable)),
            set(quarantined),
            write_quorum_size or size,
            "new ensemble",
        )

    def replace(
        self,
        ensemble: Sequence[str],
        failed: Mapping[int, str],
        writable: Iterable[str],
        quarantined: Iterable[str] = (),
        exclude: Iterable[str] = (),
        write_quorum_size: int | None = None,
    ) -> tuple[str, ...]:
        taken = set(ensemble) | set(exclude) | set(failed.values())
        members: list[str | None] = [
            None if index in failed else bookie for index, bookie in enumerate(ensemble)
        ]
        return self._fill(
            members,
            sorted(failed),
            sorted(set(writable) - taken),
            set(quarantined),
            write_quorum_size or len(ensemble),
            f"replacing {sorted(failed.values())}",
        )

    def read_order(self, replicas: Sequence[tuple[int, str]]) -> Sequence[tuple[int, str]]:
        """Region-aware: the local region's replicas first (stable otherwise)."""
        if not (self.regions and self.local_region):
            return replicas
        return sorted(replicas, key=lambda r: self.topology.region(r[1]) != self.local_region)


class RandomPlacement(TopologyAwarePlacement):
    """Uniformly random ensembles (BookKeeper's DefaultEnsemblePlacementPolicy): the topology-aware
    choice with every bookie in one rack, where every pick scores the same."""

    def __init__(self, rng: random.Random | None = None) -> None:
        super().__init__(NetworkTopology(), rng)
