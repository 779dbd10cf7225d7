"""The Spark planner's pure parts: splitting ranges, minPartitions, its bounded caches."""

from __future__ import annotations

from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.spark import planning
from bookkeeper_py.spark.planning import ReadRange, at_least, split
from bookkeeper_py.wire.digest import DigestType


def whole(first: int, last: int, entry_bytes: int) -> ReadRange:
    metadata = LedgerMetadata(
        ledger_id=7,
        ensemble_size=3,
        write_quorum_size=2,
        ack_quorum_size=2,
        digest_type=DigestType.CRC32C,
        password=b"",
        ensembles=((0, ("a:1", "b:1", "c:1")),),
    )
    return ReadRange("ns/log", 1, metadata, first, last, entry_bytes=entry_bytes)


def test_a_range_is_split_by_bytes_and_halved_for_min_partitions() -> None:
    parts = split(whole(0, 99, 1000), 25_000)
    assert [(p.first_entry, p.last_entry) for p in parts] == [(0, 24), (25, 49), (50, 74), (75, 99)]
    assert split(whole(5, 9, 1000), 10**9) == [whole(5, 9, 1000)]
    more = at_least(parts, 6)
    assert len(more) == 6
    covered = sorted(e for p in more for e in range(p.first_entry, p.last_entry + 1))
    assert covered == list(range(100))  # every entry once
    assert len(at_least([whole(3, 3, 10)], 4)) == 1  # one entry stays whole


def test_a_planners_cache_forgets_its_oldest_entries(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(planning, "CACHED", 3)
    cache: dict[int, str] = {}
    for key in range(5):
        planning._remember(cache, key, str(key))
    assert cache == {2: "2", 3: "3", 4: "4"}
