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
