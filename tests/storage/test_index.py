"""The entry-location index: a run of lookups shares one read transaction, and never answers
from an index older than the last commit; committed locations, packed in C or in Python."""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from bookkeeper_py.storage import index as index_module
from bookkeeper_py.storage.index import MAX_ENTRY_ID, LedgerIndex
from tests.speedup_paths import take_path


def test_a_run_of_lookups_sees_every_commit_made_during_it(tmp_path: Path) -> None:
    index = LedgerIndex(str(tmp_path))
    try:
        index.commit([(1, [0, 1], [100, 101])], [])
        with index.read_run():
            assert index.location(1, 0) == 100
            assert index.location(1, 2) is None
            # A checkpoint on another thread commits entry 2 (then releases it from the write
            # cache): the run's next lookup must find it.
            writer = threading.Thread(target=index.commit, args=([(1, [2], [102])], []))
            writer.start()
            writer.join(30)
            assert index.location(1, 2) == 102
            # Compaction moves entry 0: the run follows it.
            assert index.move_locations([(1, 0, 100, 200)]) == 1
            assert index.location(1, 0) == 200
            with index.read_run():  # nested: the same run
                assert index.location(1, 1) == 101
            assert index.delete_ledger(1) == 3
            assert index.location(1, 1) is None
        assert index.location(1, 0) is None  # outside a run, as before
        assert getattr(index._local, "run", None) is None
    finally:
        index.close()


@pytest.mark.parametrize("path", ["c", "python"])
def test_committed_locations_are_found_the_c_and_python_packings_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A checkpoint's runs (lists, packed in C where built) and runs of other sequences (a
    tuple, a range: the Python packing), over more than one put slice, with ids and locations
    at the ends of their ranges: every location is found, and the LMDB items are the same
    either way."""
    take_path(monkeypatch, index_module, "_c_pairs", path)
    ids = list(range(2500))
    places = [(7 << 32) | (i * 1032) for i in ids]
    runs: list[tuple[int, Sequence[int], Sequence[int]]] = [
        (3, ids, places),
        (4, [0, MAX_ENTRY_ID], [0, 2**64 - 1]),
        (5, tuple(range(10)), range(100, 110)),
    ]
    index = LedgerIndex(str(tmp_path))
    try:
        index.commit(runs, [])
        for ledger_id, entry_ids, locations in runs:
            for entry_id, location in zip(entry_ids, locations, strict=True):
                assert index.location(ledger_id, entry_id) == location
        with index._env.begin(db=index._locations) as txn:
            items = list(txn.cursor())
    finally:
        index.close()
    expected = [
        (struct.pack(">qq", ledger_id, entry_id), struct.pack(">Q", location))
        for ledger_id, entry_ids, locations in runs
        for entry_id, location in zip(entry_ids, locations, strict=True)
    ]
    assert items == expected


def test_a_write_is_seen_only_once_committed_and_an_unfinished_one_leaves_nothing(
    tmp_path: Path,
) -> None:
    """A checkpoint puts its locations as it writes the entry log and commits at the end:
    meanwhile lookups (the bookie's reads, in runs or alone, on other threads) see the last
    commit; a write that fails, or ends without committing, changes nothing."""
    index = LedgerIndex(str(tmp_path))
    try:
        index.commit([(1, [0], [100])], [])
        seen: list[int | None] = []
        with index.writing() as write:
            write.put_locations(1, [1, 2], [101, 102])
            reader = threading.Thread(target=lambda: seen.append(index.location(1, 1)))
            reader.start()
            reader.join(30)
            assert seen == [None]
            with index.read_run():
                assert (index.location(1, 0), index.location(1, 2)) == (100, None)
            write.commit([])
        assert (index.location(1, 1), index.location(1, 2)) == (101, 102)
        with pytest.raises(RuntimeError), index.writing() as write:
            write.put_locations(1, [3], [103])
            raise RuntimeError("the entry log's sync failed")
        with index.writing() as write:
            write.put_locations(1, [4], [104])  # and no commit
        assert (index.location(1, 3), index.location(1, 4), index.last_entry(1)) == (None, None, 2)
        index.commit([(1, [5], [105])], [])  # the index takes writes after both
        assert index.location(1, 5) == 105
    finally:
        index.close()
