"""The availability-of-entries encoding of GET_LIST_OF_ENTRIES_OF_LEDGER answers."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper_py.wire import availability
from bookkeeper_py.wire.availability import AvailableEntries, SequenceGroup
from bookkeeper_py.wire.errors import MalformedMessageError


def group_bytes(first: int, last: int, size: int, period: int) -> bytes:
    return (
        first.to_bytes(8, "big")
        + last.to_bytes(8, "big")
        + size.to_bytes(4, "big")
        + period.to_bytes(4, "big")
    )


def header(groups: int) -> bytes:
    return bytes(4) + groups.to_bytes(4, "big") + bytes(56)


def test_groups_of_the_reference_example() -> None:
    # 1-3, 6-8 (same size, 5 apart), 11 and 13 (size 1, 2 apart), 16-18, 21-22
    entries = [1, 2, 3, 6, 7, 8, 11, 13, 16, 17, 18, 21, 22]
    assert availability.group_entries(entries) == [
        SequenceGroup(1, 6, 3, 5),
        SequenceGroup(11, 13, 1, 2),
        SequenceGroup(16, 16, 3, 0),
        SequenceGroup(21, 21, 2, 0),
    ]
    assert availability.encode(entries) == header(4) + b"".join(
        [
            group_bytes(1, 6, 3, 5),
            group_bytes(11, 13, 1, 2),
            group_bytes(16, 16, 3, 0),
            group_bytes(21, 21, 2, 0),
        ]
    )


def test_a_ledger_without_holes_is_one_group_whatever_its_length() -> None:
    encoded = availability.encode(range(1_000_000))
    assert encoded == header(1) + group_bytes(0, 0, 1_000_000, 0)
    decoded = AvailableEntries.decode(encoded)
    assert len(decoded) == 1_000_000
    assert 999_999 in decoded and 1_000_000 not in decoded and -1 not in decoded


def test_repeats_are_ignored_and_decreasing_ids_refused() -> None:
    assert availability.encode([0, 0, 1, 1, 2]) == availability.encode([0, 1, 2])
    with pytest.raises(ValueError, match="must increase"):
        availability.encode([5, 6, 2])


def test_empty() -> None:
    assert availability.encode([]) == header(0)
    assert list(AvailableEntries.decode(header(0))) == []


@pytest.mark.parametrize(
    "data, problem",
    [
        (bytes(10), "shorter than"),
        (b"\x00\x00\x00\x01" + bytes(60), "version 1"),
        (header(2) + group_bytes(0, 0, 1, 0), "announces 2 groups"),
        (header(1) + group_bytes(0, 0, 0, 0), "invalid"),  # empty sequences
        (header(1) + group_bytes(0, 10, 3, 0), "invalid"),  # several sequences, no period
        (header(1) + group_bytes(0, 10, 3, 3), "invalid"),  # sequences that touch
        (header(1) + group_bytes(0, 10, 3, 4), "invalid"),  # 10 is not a multiple of 4
        (header(2) + group_bytes(0, 0, 5, 0) + group_bytes(3, 3, 1, 0), "invalid"),  # overlap
    ],
)
def test_malformed_availability_is_refused(data: bytes, problem: str) -> None:
    with pytest.raises(MalformedMessageError, match=problem):
        AvailableEntries.decode(data)


@given(st.sets(st.integers(min_value=0, max_value=5_000), max_size=300))
def test_decode_inverts_encode(entries: set[int]) -> None:
    ordered = sorted(entries)
    decoded = AvailableEntries.decode(availability.encode(ordered))
    assert list(decoded) == ordered
    assert len(decoded) == len(ordered)
    for probe in range(-2, 5_003, 7):
        assert (probe in decoded) == (probe in entries)


@given(st.binary(max_size=200))
def test_decoding_garbage_raises_only_malformed(data: bytes) -> None:
    try:
        decoded = AvailableEntries.decode(header(len(data) // 24) + data)
    except MalformedMessageError:
        return
    assert len(decoded) >= len(decoded.groups)
    for entry_id in itertools.islice(decoded, 50):  # groups may hold 2^62 entries: a sample
        assert entry_id in decoded
