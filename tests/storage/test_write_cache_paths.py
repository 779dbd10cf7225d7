"""A bookie's write cache takes batches of adds alike through the C speedup (``cache_add_new``:
the usual batch, ids increasing and all new, in one call) and the pure-Python path: the same
entries in the same chunks, the same last entry ids, the same ledgers marked unordered, the
same counts and bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bookkeeper_py.storage import ledger_storage
from bookkeeper_py.storage.ledger_storage import LedgerStorage
from tests.speedup_paths import take_path

CHUNK = 1 << ledger_storage._CHUNK_BITS

# (ledger id, entry ids) of each batch, in order.
BATCHES: list[tuple[int, list[int]]] = [
    (1, [0, 1, 2]),  # the usual batch
    (1, [3]),
    (1, [CHUNK - 2, CHUNK - 1, CHUNK, CHUNK + 1]),  # across a chunk's end, after a gap
    (1, [2, 3, 4]),  # held already (a recovery add's copies): replaced, not counted twice
    (1, [10, 9]),  # not increasing
    (1, [5, 6]),  # increasing and new, but below the last id: unordered
    (2, [7, 8, 3 * CHUNK]),  # a new ledger starting past 0, a chunk skipped
    (2, [3 * CHUNK]),  # one held already
    (3, [2**40, 2**40 + 1]),  # large ids
    (4, [5, 6]),
    (4, [3, 4]),  # increasing and new, below the last id: the only reason 4 is unordered
]


def _cache_state(storage: LedgerStorage) -> dict[str, Any]:
    current = storage._current
    return {
        "ledgers": {
            ledger_id: ({key: dict(chunk) for key, chunk in cached.chunks.items()}, cached.count)
            for ledger_id, cached in current.ledgers.items()
        },
        "last_entry": dict(current.last_entry),
        "unordered": set(current.unordered),
        "size_bytes": current.size_bytes,
        "count": current.count,
    }


def _fill(directory: Path) -> dict[str, Any]:
    directory.mkdir()
    storage = LedgerStorage(str(directory))
    try:
        for number, (ledger_id, entry_ids) in enumerate(BATCHES):
            entries = [f"{ledger_id}:{entry_id}:{number}".encode() for entry_id in entry_ids]
            storage.add_entries(ledger_id, entry_ids, entries)
        return _cache_state(storage)
    finally:
        storage.close()


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_batch_goes_into_the_write_cache_alike_in_c_and_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    take_path(monkeypatch, ledger_storage, "native", path)
    state = _fill(tmp_path / path)
    monkeypatch.undo()
    take_path(monkeypatch, ledger_storage, "native", "python")
    assert state == _fill(tmp_path / "reference")
    # And what that is: the later copy of an entry held twice, every id once.
    ledger_one, count = state["ledgers"][1]
    held = {entry_id: entry for chunk in ledger_one.values() for entry_id, entry in chunk.items()}
    assert held[3] == b"1:3:3" and held[10] == b"1:10:4" and count == len(held) == 13
    assert state["unordered"] == {1, 2, 4} and state["last_entry"][3] == 2**40 + 1


def test_the_c_path_leaves_the_cache_alone_when_it_cannot_take_a_batch() -> None:
    native = ledger_storage.native
    if native is None:
        pytest.skip("C speedups not built here")
    chunks: dict[int, dict[int, bytes]] = {0: {5: b"five"}}
    assert native.cache_add_new(chunks, [4, 5, 6], [b"a", b"b", b"c"], 10) == -1  # 5 held
    assert native.cache_add_new(chunks, [7, 6], [b"a", b"b"], 10) == -2  # not increasing
    assert native.cache_add_new(chunks, [7], [bytearray(b"a")], 10) == -2  # not bytes
    assert chunks == {0: {5: b"five"}}
    assert native.cache_add_new(chunks, [1023, 1024], [b"ab", b"c"], 10) == 3
    assert chunks == {0: {5: b"five", 1023: b"ab"}, 1: {1024: b"c"}}
    with pytest.raises(TypeError, match="cache_add_new"):
        native.cache_add_new(chunks, [1], [], 10)
