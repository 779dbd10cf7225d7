"""The entry-location index and per-ledger state, in LMDB (docs/formats/index.md).

Two named databases in one LMDB environment:

* ``locations``: key ``ledgerId (8, big-endian) || entryId (8)`` -> value ``location (8)``.
  Keys sort by ledger then entry, so "last entry of a ledger" is one reverse seek and deleting a
  ledger is one range.
* ``ledgers``: key ``ledgerId (8)`` -> ``LedgerData`` protobuf (exists, fenced, masterKey,
  explicitLac), BookKeeper's own DbLedgerStorage record.

Why LMDB (``bench/index_store.py``, 3M keys = 1M ledgers x 3 entries, this machine): 6.7M
batched durable puts/s, 484k point lookups/s and 531k last-entry seeks/s, against RocksDB's
3.8M / 176k / 135k and SQLite's 0.54M / 170k / 174k. It is a copy-on-write B+tree: a commit is
durable when it returns, and a crash leaves the last committed state with no log to replay. A
million ledgers cost a million small keys in one file, not a million files.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat

import lmdb

from bookkeeper_py.speedups import native
from bookkeeper_py.wire.proto import data_formats_pb2 as formats

_KEY = struct.Struct(">qq")
_LEDGER = struct.Struct(">q")
_LOCATION = struct.Struct(">Q")
MAX_ENTRY_ID = 2**63 - 1
_PUT_SLICE = 1024
# The C packing of a slice of locations into LMDB items (``commit``), where it is in use: the
# same keys and values as _KEY and _LOCATION pack.
_c_pairs: Callable[[int, list[int], list[int], int, int], list[tuple[bytes, bytes]]] | None = (
    native.index_pairs if native is not None else None
)


class LedgerIndexError(Exception):
    """The index store failed."""


class _Run:
    """A run of lookups on one thread: its read transaction (None until the first lookup) and
    the index version that transaction saw."""

    __slots__ = ("txn", "version")

    def __init__(self) -> None:
        self.txn: lmdb.Transaction | None = None
        self.version = -1


class IndexWrite:
    """A write transaction of a ``LedgerIndex`` (``LedgerIndex.writing``)."""

    def __init__(self, index: LedgerIndex) -> None:
        self._index = index
        self._txn = index._env.begin(write=True)
        self._cursor = self._txn.cursor(index._locations)
        self._ledgers = index._ledgers
        self.committed = False
        self.parts = 0  # commits of locations before the last one (``commit_part``)

    def put_locations(
        self,
        ledger_id: int,
        entry_ids: Sequence[int],
        places: Sequence[int],
        between_slices: Callable[[], None] | None = None,
    ) -> None:
        """Puts the locations of ``entry_ids`` (``places``, in the same order). Given in
        (ledger, entry) order they go in fastest (LMDB inserts sorted keys fastest). Keys and
        values are packed in C (``index_pairs``; by C-level ``map`` loops on the pure-Python
        path), ``_PUT_SLICE`` at a time, with ``between_slices`` called after each:
        ``putmulti`` holds the GIL throughout (a write cache's worth at once held it for
        40-90 ms in a loaded bookie, a stall of every request), so a checkpoint hands the GIL
        over between slices."""
        cursor = self._cursor
        for start in range(0, len(entry_ids), _PUT_SLICE):
            if (
                _c_pairs is not None
                and isinstance(entry_ids, list)
                and isinstance(places, list)
                and len(entry_ids) == len(places)
            ):
                cursor.putmulti(_c_pairs(ledger_id, entry_ids, places, start, start + _PUT_SLICE))
            else:
                ids = entry_ids[start : start + _PUT_SLICE]
                keys = map(_KEY.pack, repeat(ledger_id), ids)
                values = map(_LOCATION.pack, places[start : start + _PUT_SLICE])
                cursor.putmulti(zip(keys, values, strict=True))
            if between_slices is not None:
                between_slices()

    def commit_part(self) -> None:
        """Makes the locations put so far durable and goes on in a new transaction: a checkpoint
        commits its locations in parts along its paced writes (each part's records synced
        before it), so that its end does not commit a write cache's worth at once (an LMDB
        commit writes every page the transaction dirtied, and syncs them). Readers see each part
        as soon as it is committed, as they see a whole commit."""
        self._txn.commit()
        self._index._version += 1
        self.parts += 1
        self._txn = self._index._env.begin(write=True)
        self._cursor = self._txn.cursor(self._index._locations)

    def commit(self, ledgers: Iterable[tuple[int, formats.LedgerData]] = ()) -> None:
        """Puts the ledger states and makes the whole transaction durable."""
        for ledger_id, data in ledgers:
            self._txn.put(_LEDGER.pack(ledger_id), data.SerializeToString(), db=self._ledgers)
        self._txn.commit()
        self.committed = True

    def abort(self) -> None:
        self._txn.abort()


# The address space an index reserves (LMDB maps it; only what is written takes memory or disk).
# A process whose address space is smaller (under valgrind: bench/add_path.py --instructions)
# sets a smaller one before opening an index.
MAP_SIZE = 1 << 40


class LedgerIndex:
    """Entry locations and ledger states of one ledger directory. Thread-safe."""

    def __init__(
        self, directory: str, map_size: int | None = None, *, readonly: bool = False
    ) -> None:
        """``readonly``: for tools; creates nothing (the directory and the index must exist),
        and takes LMDB's reader lock only if a bookie made the lock file. ``map_size``: the
        address space LMDB reserves (``MAP_SIZE`` unless given)."""
        try:
            self._env = lmdb.open(
                directory,
                map_size=map_size or MAP_SIZE,
                max_dbs=4,
                sync=True,
                metasync=True,
                readahead=False,
                readonly=readonly,
                create=not readonly,
                lock=not readonly or os.path.exists(os.path.join(directory, "lock.mdb")),
            )
        except lmdb.Error as error:
            raise LedgerIndexError(
                f"cannot open the ledger index in {directory}: {error}"
            ) from error
        self._locations = self._env.open_db(b"locations")
        self._ledgers = self._env.open_db(b"ledgers")
        # Bumped after every write commit: a run of lookups (read_run) keeps one read
        # transaction while this stays the same, and takes a new one when it moved.
        self._version = 0
        self._local = threading.local()  # .run: the thread's _Run, while it is in one

    def close(self) -> None:
        self._env.close()

    def commit(
        self,
        locations: Iterable[tuple[int, Sequence[int], Sequence[int]]],
        ledgers: Iterable[tuple[int, formats.LedgerData]],
        between_slices: Callable[[], None] | None = None,
    ) -> None:
        """Writes entry locations and ledger states in one durable commit. ``locations`` holds
        ``(ledger, entry ids, their locations)`` runs (see ``IndexWrite.put_locations``)."""
        with self.writing() as write:
            for ledger_id, entry_ids, places in locations:
                write.put_locations(ledger_id, entry_ids, places, between_slices)
            write.commit(ledgers)

    @contextlib.contextmanager
    def writing(self) -> Iterator[IndexWrite]:
        """One write transaction, its locations put as they come and made durable, with the
        ledger states, by ``IndexWrite.commit``: a checkpoint puts each slice of locations right
        after writing its entries to the entry log, spread over the paced checkpoint, and
        commits once the entry log is synced (or in parts, ``IndexWrite.commit_part``). Not
        committed (an exception, or no ``commit``), it leaves the index as it was at the last
        part. Readers meanwhile see the last commit (LMDB's snapshots); other writers wait, so
        the callers hold the storage's ``exclusive()`` lock."""
        write = IndexWrite(self)
        try:
            yield write
        finally:
            if write.committed:
                self._version += 1
            else:
                write.abort()

    @contextlib.contextmanager
    def read_run(self) -> Iterator[None]:
        """A run of lookups on this thread (a bookie's batch of reads): they share one LMDB read
        transaction (a begin and an abort per lookup cost twice the lookup), renewed whenever a
        write committed meanwhile, so that a lookup never sees an index older than the last
        commit (a checkpoint releases its write-cache entries only after committing them here).
        Held only for the run: a long-lived reader would keep LMDB from reusing pages."""
        local = self._local
        if getattr(local, "run", None) is not None:
            yield  # nested: the outer run's
            return
        run = local.run = _Run()
        try:
            yield
        finally:
            local.run = None
            if run.txn is not None:
                run.txn.abort()

    def location(self, ledger_id: int, entry_id: int) -> int | None:
        run: _Run | None = getattr(self._local, "run", None)
        value: bytes | memoryview | None
        if run is None:
            with self._env.begin(db=self._locations) as txn:
                value = txn.get(_KEY.pack(ledger_id, entry_id))
        else:
            version = self._version  # read before the transaction begins: never newer than it
            if run.txn is None or run.version != version:
                if run.txn is not None:
                    run.txn.abort()
                run.txn = self._env.begin(db=self._locations)
                run.version = version
            value = run.txn.get(_KEY.pack(ledger_id, entry_id))
        return None if value is None else int(_LOCATION.unpack(value)[0])

    def last_entry(self, ledger_id: int) -> int:
        """The largest entry id indexed for the ledger, -1 if none."""
        with self._env.begin(db=self._locations) as txn:
            cursor = txn.cursor()
            # Seek past the ledger's last possible key, then step back one.
            if cursor.set_range(_KEY.pack(ledger_id, MAX_ENTRY_ID)):
                key_ledger, entry_id = _KEY.unpack(cursor.key())
                if key_ledger == ledger_id:
                    return int(entry_id)
                found = cursor.prev()
            else:
                found = cursor.last()
            if not found:
                return -1
            key_ledger, entry_id = _KEY.unpack(cursor.key())
            return int(entry_id) if key_ledger == ledger_id else -1

    def counts(self) -> tuple[int, int]:
        """(ledgers with a state, entry locations): the sizes of the two databases."""
        with self._env.begin() as txn:
            return (
                int(txn.stat(self._ledgers)["entries"]),
                int(txn.stat(self._locations)["entries"]),
            )

    def ledger(self, ledger_id: int) -> formats.LedgerData | None:
        with self._env.begin(db=self._ledgers) as txn:
            value = txn.get(_LEDGER.pack(ledger_id))
        if value is None:
            return None
        data = formats.LedgerData()
        data.ParseFromString(value)
        return data

    def ledger_ids(self) -> Iterator[int]:
        """Every ledger with a state, increasing (read in a snapshot, in pages)."""
        with self._env.begin(db=self._ledgers) as txn:
            for key in txn.cursor().iternext(keys=True, values=False):
                yield int(_LEDGER.unpack(key)[0])

    def entries(self, ledger_id: int) -> Iterator[tuple[int, int]]:
        """(entry id, location) of every indexed entry of the ledger, increasing."""
        with self._env.begin(db=self._locations) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(_KEY.pack(ledger_id, 0)):
                return
            for key, value in cursor:
                key_ledger, entry_id = _KEY.unpack(key)
                if key_ledger != ledger_id:
                    return
                yield int(entry_id), int(_LOCATION.unpack(value)[0])

    def move_locations(self, moves: list[tuple[int, int, int, int]]) -> int:
        """Compaction's commit: for each (ledger, entry, old, new), point the entry at ``new`` only
        if it still points at ``old``; one durable transaction. Returns how many moved."""
        moved = 0
        with self._env.begin(write=True, db=self._locations) as txn:
            for ledger_id, entry_id, old, new in moves:
                key = _KEY.pack(ledger_id, entry_id)
                current = txn.get(key)
                if current is not None and _LOCATION.unpack(current)[0] == old:
                    txn.put(key, _LOCATION.pack(new))
                    moved += 1
        self._version += 1
        return moved

    def delete_ledger(self, ledger_id: int) -> int:
        """Removes a ledger's state and locations; returns the number of entries removed."""
        removed = 0
        with self._env.begin(write=True) as txn:
            txn.delete(_LEDGER.pack(ledger_id), db=self._ledgers)
            cursor = txn.cursor(self._locations)
            positioned = cursor.set_range(_KEY.pack(ledger_id, 0))
            while positioned:
                key = cursor.key()
                if not key or _KEY.unpack(key)[0] != ledger_id:
                    break
                positioned = cursor.delete()  # deletes and moves to the next key
                removed += 1
        self._version += 1
        return removed
