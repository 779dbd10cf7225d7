"""The "availability of entries" encoding of ``GET_LIST_OF_ENTRIES_OF_LEDGER`` answers.

A bookie answers which entries of a ledger it holds as sequence groups (BookKeeper's
``AvailabilityOfEntriesOfLedger``, docs/protocol.md has the byte layout):

- a *sequence* is a run of consecutive entry ids (``start``, ``size``);
- a *sequence group* is a run of sequences of the same size whose starts are ``period`` apart:
  ``first_start, last_start, size, period`` (``period`` 0 when the group has one sequence).

The bytes are a 64-byte header (big-endian int32 version 0, int32 number of groups, 56 zero
bytes), then 24 bytes per group: int64 first start, int64 last start, int32 size, int32 period.
A ledger written without holes is one group of one sequence, 88 bytes whatever its length.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from bookkeeper_py.wire.errors import MalformedMessageError

HEADER_SIZE = 64
VERSION = 0
_HEADER = struct.Struct(">ii")
_GROUP = struct.Struct(">qqii")
MAX_SEQUENCE_SIZE = 2**31 - 1  # sizes and periods are int32 on the wire


@dataclass(frozen=True, slots=True)
class SequenceGroup:
    first_start: int
    last_start: int
    size: int  # entries per sequence
    period: int  # distance between sequence starts; 0 for a single sequence

    @property
    def count(self) -> int:
        if self.period == 0:
            return self.size
        return ((self.last_start - self.first_start) // self.period + 1) * self.size

    def __contains__(self, entry_id: object) -> bool:
        if not isinstance(entry_id, int) or entry_id < self.first_start:
            return False
        if entry_id >= self.last_start + self.size:
            return False
        offset = entry_id - self.first_start
        return (offset % self.period if self.period else offset) < self.size

    def entry_ids(self) -> Iterator[int]:
        starts = (
            range(self.first_start, self.last_start + 1, self.period)
            if self.period
            else (self.first_start,)
        )
        for start in starts:
            yield from range(start, start + self.size)


def _sequences(entry_ids: Iterable[int]) -> Iterator[tuple[int, int]]:
    """(start, size) runs of increasing ``entry_ids`` (repeats ignored)."""
    start = size = -1
    for entry_id in entry_ids:
        if size > 0 and start <= entry_id < start + size:
            continue
        if size > 0 and entry_id == start + size and size < MAX_SEQUENCE_SIZE:
            size += 1
            continue
        if size > 0:
            if entry_id < start:
                raise ValueError(f"entry ids must increase: {entry_id} after {start + size - 1}")
            yield start, size
        start, size = entry_id, 1
    if size > 0:
        yield start, size


def group_entries(entry_ids: Iterable[int]) -> list[SequenceGroup]:
    """The sequence groups of increasing, non-negative ``entry_ids``."""
    groups: list[SequenceGroup] = []
    current: SequenceGroup | None = None
    for start, size in _sequences(entry_ids):
        if start < 0:
            raise ValueError(f"entry ids are non-negative, got {start}")
        if current is not None and current.size == size:
            gap = start - current.last_start
            if (current.period == 0 and gap <= MAX_SEQUENCE_SIZE) or gap == current.period:
                current = SequenceGroup(current.first_start, start, size, gap)
                continue
        if current is not None:
            groups.append(current)
        current = SequenceGroup(start, start, size, 0)
    if current is not None:
        groups.append(current)
    return groups


def encode(entry_ids: Iterable[int]) -> bytes:
    """The availability bytes of increasing ``entry_ids``."""
    groups = group_entries(entry_ids)
    out = bytearray(HEADER_SIZE + _GROUP.size * len(groups))
    _HEADER.pack_into(out, 0, VERSION, len(groups))
    for index, group in enumerate(groups):
        _GROUP.pack_into(
            out,
            HEADER_SIZE + index * _GROUP.size,
            group.first_start,
            group.last_start,
            group.size,
            group.period,
        )
    return bytes(out)


@dataclass(frozen=True, slots=True)
class AvailableEntries:
    """Decoded availability: ``entry_id in available``, ``len()``, iteration in order."""

    groups: tuple[SequenceGroup, ...]

    @classmethod
    def decode(cls, data: bytes) -> AvailableEntries:
        if len(data) < HEADER_SIZE:
            raise MalformedMessageError(
                f"entry availability of {len(data)} bytes is shorter than its {HEADER_SIZE}-byte header"
            )
        version, count = _HEADER.unpack_from(data, 0)
        if version != VERSION:
            raise MalformedMessageError(f"entry availability version {version} is not supported")
        if count < 0 or len(data) != HEADER_SIZE + count * _GROUP.size:
            raise MalformedMessageError(
                f"entry availability announces {count} groups in {len(data)} bytes"
            )
        groups = []
        previous_end = -1
        for index in range(count):
            first, last, size, period = _GROUP.unpack_from(data, HEADER_SIZE + index * _GROUP.size)
            well_formed = (
                first > previous_end
                and size > 0
                and period >= 0
                and last >= first
                and (period == 0) == (last == first)
                and (period == 0 or ((last - first) % period == 0 and period > size))
            )
            if not well_formed:
                raise MalformedMessageError(
                    f"entry availability group {index} ({first}, {last}, {size}, {period}) is invalid"
                )
            groups.append(SequenceGroup(first, last, size, period))
            previous_end = last + size - 1
        return cls(tuple(groups))

    def __contains__(self, entry_id: object) -> bool:
        if not isinstance(entry_id, int):
            return False
        at = bisect.bisect_right(self.groups, entry_id, key=lambda group: group.first_start)
        return at > 0 and entry_id in self.groups[at - 1]

    def __len__(self) -> int:
        return sum(group.count for group in self.groups)

    def __iter__(self) -> Iterator[int]:
        for group in self.groups:
            yield from group.entry_ids()
