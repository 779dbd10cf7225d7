"""Quorum arithmetic (reference section 3.1) and the ordered-ack writer window."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper_py.core.quorum import (
    AckSet,
    CoverageSet,
    check_quorum_sizes,
    negative_threshold,
    write_set,
)
from bookkeeper_py.errors import IncorrectParameterError


def test_write_sets_of_the_protocol_example() -> None:
    # E=4, Qw=3: entry 0 -> B1 B2 B3, 1 -> B2 B3 B4, 2 -> B3 B4 B1, 3 -> B4 B1 B2 (protocol.md)
    assert [write_set(e, 4, 3) for e in range(6)] == [
        [0, 1, 2],
        [1, 2, 3],
        [2, 3, 0],
        [3, 0, 1],
        [0, 1, 2],
        [1, 2, 3],
    ]


@pytest.mark.parametrize("sizes", [(2, 3, 2), (3, 2, 3), (3, 3, 0), (0, 0, 0)])
def test_bad_quorum_sizes_are_refused(sizes: tuple[int, int, int]) -> None:
    with pytest.raises(
        IncorrectParameterError, match="ensemble size >= write quorum >= ack quorum"
    ):
        check_quorum_sizes(*sizes)


def test_ack_set_needs_qa_distinct_bookies() -> None:
    acks = AckSet(3, 2)
    assert not acks.ack(0)
    assert not acks.ack(0)
    assert acks.ack(2)
    failing = AckSet(3, 2)
    failing.fail(0)
    assert failing.still_possible
    failing.fail(1)
    assert not failing.still_possible


def brute_force_covered(known: set[int], e: int, qw: int, qa: int) -> bool:
    """Covered iff no write set can still gather Qa acks from bookies that have not answered."""
    return all(sum(1 for m in write_set(first, e, qw) if m not in known) < qa for first in range(e))


@given(
    st.sampled_from([(3, 3, 2), (3, 2, 2), (5, 3, 2), (4, 4, 3), (5, 2, 1), (6, 3, 3)]), st.data()
)
def test_coverage_matches_brute_force(sizes: tuple[int, int, int], data: st.DataObject) -> None:
    e, qw, qa = sizes
    order = data.draw(st.permutations(range(e)))
    coverage = CoverageSet(e, qw, qa)
    known: set[int] = set()
    for index in order:
        known.add(index)
        assert coverage.add_known(index) == brute_force_covered(known, e, qw, qa)


def test_coverage_when_qw_above_qa_and_e_above_qw() -> None:
    # E=5 Qw=3 Qa=2: each write set needs 2 known bookies. {0, 2, 4}: write set {4, 0, 1} has two,
    # {1, 2, 3} has only bookie 2 -> not covered; adding 3 covers every window.
    coverage = CoverageSet(5, 3, 2)
    for index in (0, 2, 4):
        coverage.add_known(index)
    assert not coverage.covered
    assert coverage.add_known(3)
    assert negative_threshold(3, 2) == 2
