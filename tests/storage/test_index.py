"""The entry-location index: a run of lookups shares one read transaction, and never answers
from an index older than the last commit."""

from __future__ import annotations

import threading
from pathlib import Path

from bookkeeper_py.storage.index import LedgerIndex


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
