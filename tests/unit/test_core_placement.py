"""Placement policies: random, rack-aware, region-aware, and the quarantine."""

from __future__ import annotations

import random

import pytest

from bookkeeper_py import errors
from bookkeeper_py.core.placement import (
    ChangeRate,
    NetworkTopology,
    Quarantine,
    RandomPlacement,
    TopologyAwarePlacement,
)
from bookkeeper_py.core.quorum import write_set

RACKS = {f"b{i}": f"/rack{i % 3}" for i in range(6)}  # two bookies in each of three racks


def racks_of_every_write_quorum(
    topology: NetworkTopology, ensemble: tuple[str, ...], qw: int
) -> list[int]:
    return [
        len({topology.rack(ensemble[i]) for i in write_set(first, len(ensemble), qw)})
        for first in range(len(ensemble))
    ]


@pytest.mark.parametrize("sizes", [(3, 2), (3, 3), (4, 2), (5, 3), (6, 2)])
def test_rack_aware_spreads_every_write_quorum_over_two_racks(sizes: tuple[int, int]) -> None:
    size, qw = sizes
    topology = NetworkTopology(RACKS)
    for seed in range(50):
        policy = TopologyAwarePlacement(topology, random.Random(seed))
        ensemble = policy.new_ensemble(size, RACKS, write_quorum_size=qw)
        assert len(set(ensemble)) == size
        assert min(racks_of_every_write_quorum(topology, ensemble, qw)) >= 2
        assert policy.adheres(ensemble, qw)


def test_random_placement_often_puts_a_write_quorum_in_one_rack() -> None:
    """The baseline the rack-aware test is measured against: it would fail with random picks."""
    topology = NetworkTopology(RACKS)
    ones = sum(
        min(
            racks_of_every_write_quorum(
                topology, RandomPlacement(random.Random(seed)).new_ensemble(4, RACKS), 2
            )
        )
        == 1
        for seed in range(50)
    )
    assert ones > 0


def test_a_replacement_keeps_the_write_quorums_spread() -> None:
    topology = NetworkTopology(RACKS)
    for seed in range(50):
        policy = TopologyAwarePlacement(topology, random.Random(seed))
        ensemble = policy.new_ensemble(3, RACKS, write_quorum_size=2)
        replaced = policy.replace(ensemble, {1: ensemble[1]}, RACKS, write_quorum_size=2)
        assert replaced[0] == ensemble[0] and replaced[2] == ensemble[2]
        assert replaced[1] not in ensemble
        assert min(racks_of_every_write_quorum(topology, replaced, 2)) >= 2


def test_one_rack_gives_a_weaker_ensemble_or_an_error_when_enforced() -> None:
    one_rack = {f"b{i}": "/rack0" for i in range(4)}
    topology = NetworkTopology(one_rack)
    ensemble = TopologyAwarePlacement(topology, random.Random(1)).new_ensemble(
        3, one_rack, write_quorum_size=2
    )
    assert len(set(ensemble)) == 3
    enforcing = TopologyAwarePlacement(topology, random.Random(1), enforce=True)
    with pytest.raises(errors.NotEnoughBookiesError, match="2 racks"):
        enforcing.new_ensemble(3, one_rack, write_quorum_size=2)


def test_unknown_bookies_are_in_the_default_rack() -> None:
    topology = NetworkTopology({"b0": "/r1"})
    assert topology.rack("b0") == ("default-region", "r1")
    assert topology.rack("elsewhere") == ("default-region", "default-rack")
    with pytest.raises(errors.IncorrectParameterError, match="/region/rack"):
        NetworkTopology({"b0": "/a/b/c"})


def test_region_aware_spreads_write_quorums_over_regions_and_reads_locally_first() -> None:
    locations = {
        "east1": "/east/r1",
        "east2": "/east/r2",
        "east3": "/east/r1",
        "west1": "/west/r1",
        "west2": "/west/r2",
        "west3": "/west/r2",
    }
    topology = NetworkTopology(locations)
    for seed in range(50):
        policy = TopologyAwarePlacement(
            topology, random.Random(seed), regions=True, local_region="west"
        )
        ensemble = policy.new_ensemble(4, locations, write_quorum_size=2)
        for first in range(4):
            quorum = [ensemble[i] for i in write_set(first, 4, 2)]
            assert {topology.region(b) for b in quorum} == {"east", "west"}
    replicas = [(0, "east1"), (1, "west2"), (2, "east2"), (3, "west1")]
    assert policy.read_order(replicas) == [(1, "west2"), (3, "west1"), (0, "east1"), (2, "east2")]


def test_quarantined_bookies_are_used_only_when_nothing_else_is_left() -> None:
    quarantine = Quarantine(threshold=2, window_ms=1000, duration_ms=5000, suspect_ms=300)
    quarantine.record_failure("b0", 0)
    assert quarantine.quarantined(10) == {"b0"}  # a suspect: its last answer was a failure
    quarantine.record_success("b0")
    assert quarantine.quarantined(20) == set()  # it answered since
    quarantine.record_failure("b1", 30)
    assert quarantine.quarantined(400) == set()  # suspects are forgotten after suspect_ms
    quarantine.record_failure("b0", 500)
    assert quarantine.quarantined(600) == {"b0"}  # twice within the window: quarantined
    quarantine.record_success("b0")
    assert quarantine.quarantined(700) == {"b0"}  # and that lasts its duration
    for policy in (
        RandomPlacement(random.Random(3)),
        TopologyAwarePlacement(NetworkTopology(RACKS), random.Random(3)),
    ):
        for _ in range(20):
            assert "b0" not in policy.new_ensemble(5, RACKS, {"b0"}, write_quorum_size=2)
        assert "b0" in policy.new_ensemble(6, RACKS, {"b0"}, write_quorum_size=2)
    assert quarantine.quarantined(5600) == set()


def test_ensemble_changes_in_quick_succession_back_off() -> None:
    rate = ChangeRate(initial_ms=100, max_ms=1000, reset_after_ms=10_000)
    assert rate.made(0) == 0  # the first change: the next may follow at once
    assert rate.made(10) == 110
    assert rate.made(110) == 310
    assert rate.made(310) == 710
    assert rate.made(710) == 1510
    assert rate.made(1510) == 2510  # capped at max_ms
    assert rate.made(20_000) == 20_000  # long after the last: at once again
