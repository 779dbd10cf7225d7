"""Ledger storage: a write cache in front of interleaved entry logs and an LMDB index.

Adds go into the *write cache* (and the journal, which the engine handles). A checkpoint swaps the
write cache for an empty one, writes the swapped entries sorted by (ledger, entry) to the entry
log, fsyncs it, then commits their locations and every changed ledger state to the index in one
durable transaction; only then is the swapped cache dropped. Reads look in the current cache, the
cache being flushed, then the index and the entry log.

Per-ledger state (master key, fenced, explicit LAC) is cached in memory for the ledgers in use and
loaded from the index on demand; changed states stay in memory until a checkpoint persists them.

"No such ledger / entry" is answered only from the caches and the index. A failure to read the
entry log (I/O error, checksum mismatch) is ``StorageIOError``: the bookie answers EIO.
"""

from __future__ import annotations

import heapq
import hmac
import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from itertools import chain, islice
from operator import lt, sub

from bookkeeper_py.speedups import native
from bookkeeper_py.storage.entry_log import EntryLogError, EntryLogger
from bookkeeper_py.storage.index import LedgerIndex
from bookkeeper_py.wire.proto import data_formats_pb2 as formats

log = logging.getLogger(__name__)


_READ_ATTEMPTS = 4  # reads of one entry that compaction may move away under the reader
_GIL_PAUSE_S = 0.00005
# A ledger's entries in a write-cache generation are kept in dicts of at most 1 << _CHUNK_BITS
# entries (by entry id >> _CHUNK_BITS), not in one dict: CPython grows a dict by rehashing all of
# it in one call, and one ledger's dict in a bookie's write cache held the loop for ~5 ms at its
# growth past 87,381 entries (~9 ms past 174,762), in every bookie at once, since each stores the
# ledger at the same rate: the adds due then waited 10-20 ms. A chunk is also the slice in which
# a flushed generation is freed.
_CHUNK_BITS = 10
_GATHER_SLICE = 8192  # cached entries of a ledger a checkpoint writes to the entry log at a time
# A checkpoint commits the locations it put to the index (and frees those entries from the write
# cache) every this many bytes of records written, and at its end (see ``checkpoint``).
_INDEX_PART_BYTES = 16 * 1024 * 1024
# A paced checkpoint rests this many times as long as each slice of its long C-level steps took
# (the index's puts, freeing the flushed generation), at most _MAX_REST_S a slice.
_REST_PER_WORK = 3.0
_MAX_REST_S = 0.002


class StorageIOError(Exception):
    """Reading stored data failed; the answer is unknown, not absent."""


class NoLedgerError(Exception):
    """The storage holds nothing of this ledger."""


class NoEntryError(Exception):
    """The storage knows the ledger but not this entry."""


@dataclass(slots=True)
class LedgerInfo:
    """A ledger's state on this bookie."""

    master_key: bytes
    fenced: bool = False
    explicit_lac: bytes | None = None

    def to_proto(self) -> formats.LedgerData:
        data = formats.LedgerData(exists=True, fenced=self.fenced, masterKey=self.master_key)
        if self.explicit_lac is not None:
            data.explicitLac = self.explicit_lac
        return data


# What _LedgerEntries.add_new returns when it adds nothing: an id held already, ids not increasing.
HELD = -1
UNORDERED = -2


class _LedgerEntries:
    """One ledger's entries in a write-cache generation: entry id -> entry bytes, in dicts of at
    most ``1 << _CHUNK_BITS`` entries keyed by ``entry id >> _CHUNK_BITS`` (see ``_CHUNK_BITS``).
    Iterating yields the entry ids in the order they were first added."""

    __slots__ = ("chunks", "count")

    def __init__(self) -> None:
        self.chunks: dict[int, dict[int, bytes]] = {}
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self.chunks.values())

    def get(self, entry_id: int) -> bytes | None:
        chunk = self.chunks.get(entry_id >> _CHUNK_BITS)
        return None if chunk is None else chunk.get(entry_id)

    def values(self) -> Iterator[bytes]:
        return chain.from_iterable(chunk.values() for chunk in self.chunks.values())

    def items(self) -> Iterator[tuple[int, bytes]]:
        return chain.from_iterable(chunk.items() for chunk in self.chunks.values())

    def put(self, entry_id: int, entry: bytes) -> bytes | None:
        """Adds or replaces one entry; returns the one it replaced."""
        key = entry_id >> _CHUNK_BITS
        chunk = self.chunks.get(key)
        if chunk is None:
            chunk = self.chunks[key] = {}
        previous = chunk.get(entry_id)
        chunk[entry_id] = entry
        if previous is None:
            self.count += 1
        return previous

    def add_new(self, entry_ids: list[int], entries: list[bytes]) -> int:
        """Adds entries whose ids increase, if it holds none of them yet, and returns their
        bytes; changes nothing and returns ``HELD`` if it holds one already, ``UNORDERED`` if the
        ids do not increase. In one C call where the speedups are built (``cache_add_new``;
        else a dict update per chunk the ids fall in)."""
        if native is not None:
            added: int = native.cache_add_new(self.chunks, entry_ids, entries, _CHUNK_BITS)
            if added != UNORDERED:  # (which C also says of entries not bytes: looked at below)
                if added >= 0:
                    self.count += len(entries)
                return added
        if not all(map(lt, entry_ids, islice(entry_ids, 1, None))):
            return UNORDERED
        chunks = self.chunks
        pieces: list[tuple[int, list[int], list[bytes]]] = []
        start, count = 0, len(entry_ids)
        while start < count:
            key = entry_ids[start] >> _CHUNK_BITS
            end = count
            if entry_ids[-1] >> _CHUNK_BITS != key:
                end = bisect_left(entry_ids, (key + 1) << _CHUNK_BITS, start)
            if end - start == count:  # the usual batch: all in one chunk, no copies
                ids, values = entry_ids, entries
            else:
                ids, values = entry_ids[start:end], entries[start:end]
            chunk = chunks.get(key)
            if chunk is not None and not chunk.keys().isdisjoint(ids):
                return HELD
            pieces.append((key, ids, values))
            start = end
        for key, ids, values in pieces:
            chunk = chunks.get(key)
            if chunk is None:
                chunk = chunks[key] = {}
            chunk.update(zip(ids, values, strict=True))
        self.count += count
        return sum(map(len, entries))

    def runs(self, ordered: bool, size: int) -> Iterator[tuple[list[int], list[bytes], list[int]]]:
        """The entries in increasing id order, as (ids, entries, chunk keys) runs of about
        ``size`` (whole chunks, whose keys come with them). ``ordered``: every entry was added in
        increasing order, so that the order they were added in is the order of their ids, which
        needs no sort. The chunks are taken from a list of them made first: ``release`` may drop
        those of runs already taken meanwhile."""
        ids: list[int] = []
        entries: list[bytes] = []
        keys: list[int] = []
        chunks = self.chunks
        for key in list(chunks) if ordered else sorted(chunks):
            chunk = chunks[key]
            if ordered:
                ids += chunk
                entries += chunk.values()
            else:
                chunk_ids = sorted(chunk)
                ids += chunk_ids
                entries += map(chunk.__getitem__, chunk_ids)
            keys.append(key)
            if len(ids) >= size:
                yield ids, entries, keys
                ids, entries, keys = [], [], []
        if ids:
            yield ids, entries, keys

    def release(
        self, keys: list[int], pause: Callable[[], None], lock: threading.Lock | None = None
    ) -> None:
        """Frees the chunks ``keys`` (written and committed by a checkpoint), pausing for the GIL
        after each. Each is taken out under ``lock`` where other threads may still iterate the
        chunks (``LedgerStorage.entry_ids``, while the generation is flushing)."""
        chunks = self.chunks
        for key in keys:
            if lock is None:
                chunk = chunks.pop(key, None)
            else:
                with lock:
                    chunk = chunks.pop(key, None)
            if chunk is not None:
                self.count -= len(chunk)
                chunk.clear()
                pause()


@dataclass(slots=True)
class _Generation:
    """One generation of the write cache: ledger id -> entry id -> entry bytes.

    Keyed per ledger so that a checkpoint walks ledgers in order over int keys that arrive almost
    sorted, instead of sorting (ledger, entry) tuples."""

    ledgers: dict[int, _LedgerEntries] = field(default_factory=dict)
    last_entry: dict[int, int] = field(default_factory=dict)
    dirty_ledgers: set[int] = field(default_factory=set)
    new_ledgers: set[int] = field(default_factory=set)  # created here, not in the index yet
    # Ledgers whose entries did not all arrive in increasing order: only these are sorted at a
    # checkpoint; the others are taken in insertion order, a slice at a time.
    unordered: set[int] = field(default_factory=set)
    size_bytes: int = 0
    count: int = 0


def _merge_into(current: _Generation, older: _Generation) -> None:
    """Adds an older generation's entries and dirty ledgers to ``current``, keeping newer entries."""
    for ledger_id, entries in older.ledgers.items():
        target = current.ledgers.get(ledger_id)
        if target is None:
            current.ledgers[ledger_id] = target = _LedgerEntries()
        for entry_id, entry in entries.items():
            if target.get(entry_id) is None:
                target.put(entry_id, entry)
                current.size_bytes += len(entry)
                current.count += 1
        last = older.last_entry.get(ledger_id, -1)
        if last > current.last_entry.get(ledger_id, -1):
            current.last_entry[ledger_id] = last
        current.unordered.add(ledger_id)  # the older entries came after the newer ones here
    current.dirty_ledgers |= older.dirty_ledgers
    current.new_ledgers |= older.new_ledgers


def _pause_for_gil() -> None:
    """Between slices of a checkpoint's long C-level steps: a sleep, unlike a bare release, lets
    a thread waiting for the GIL (the bookie's loop, its journal) take it before this one takes
    it back."""
    time.sleep(_GIL_PAUSE_S)


def _resting_pause(hurry: threading.Event | None) -> Callable[[], None]:
    """``_pause_for_gil`` that also rests ``_REST_PER_WORK`` times as long as the slice before it
    took, unless ``hurry`` is set (None: never): a paced checkpoint's index puts and release then
    take a quarter of a core instead of a whole one. At the end of a write cache's checkpoint
    they were ~100 and ~60 ms of one core's work in each of three bookies at once, a stall of
    every add on two cores."""
    last = time.perf_counter()

    def pause() -> None:
        nonlocal last
        rest = _GIL_PAUSE_S
        if hurry is None or not hurry.is_set():
            rest = max(rest, min(_REST_PER_WORK * (time.perf_counter() - last), _MAX_REST_S))
        time.sleep(rest)
        last = time.perf_counter()

    return pause


def _release(generation: _Generation, pause: Callable[[], None] = _pause_for_gil) -> None:
    """Frees a flushed generation a chunk of a ledger at a time, pausing for the GIL after each:
    dropped at once, its entries (a write cache's worth) are freed in one C-level call holding
    the GIL for milliseconds, which the bookie's loop and journal threads wait for."""
    ledgers = generation.ledgers
    while ledgers:
        _, entries = ledgers.popitem()
        entries.release(list(entries.chunks), pause)


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    entries: int
    bytes: int
    ledgers: int


# A bookie's share of a striped read walks its entry log over the ids it is asked for; where two
# asked ids are further apart than this (and than _WALK_GAP_RATIO times the closest two), the
# walk stops and the next one starts at the next id: the records between would be read and
# stepped over for nothing (a reader that asks each bookie for a part of a range it leads and
# for every E-th entry of another part).
_WALK_GAP = 64
_WALK_GAP_RATIO = 8


def _walk_ends(entry_ids: list[int], start: int) -> list[int]:
    """Where the walks over ``entry_ids[start:]`` (increasing) end: the indices after each gap
    (see ``_WALK_GAP``), the last being ``len(entry_ids)``."""
    gaps = list(map(sub, islice(entry_ids, start + 1, None), islice(entry_ids, start, None)))
    if not gaps or max(gaps) <= _WALK_GAP:
        return [len(entry_ids)]
    limit = max(_WALK_GAP, _WALK_GAP_RATIO * min(gaps))
    ends = [start + 1 + at for at, gap in enumerate(gaps) if gap > limit]
    ends.append(len(entry_ids))
    return ends


def read_range_with(
    read: Callable[[int, int], bytes],
    read_following: Callable[[int, int, int, int], list[bytes]],
    ledger_id: int,
    first: int,
    max_count: int,
    max_bytes: int,
) -> list[bytes]:
    """A batch read's entries ``first``, ``first + 1``, ... (``read_range`` of a storage): at
    most ``max_count``, as many as fit in ``max_bytes`` counting 4 bytes more per entry, the
    first in any case. ``read(ledger, entry)`` reads one entry (raising for the first is the
    batch's answer); ``read_following(ledger, entry, count, budget)`` the entries from ``entry``
    on that the storage serves together, maybe none (``read`` then takes the next one, and a
    later entry that it cannot read ends the batch). The first entry comes with the run after
    it where it can (read on its own first, it cost a batch of 512 a tenth of its time)."""
    entries = read_following(ledger_id, first, max_count, max_bytes)
    if not entries:  # in the write cache, bigger than the budget, damaged, absent: ``read`` says
        entries = [read(ledger_id, first)]
    budget = max_bytes - sum(map(len, entries)) - 4 * len(entries)
    entry_id, end = first + len(entries), first + max_count
    while entry_id < end:
        run = read_following(ledger_id, entry_id, end - entry_id, budget)
        if run:
            entries += run
            budget -= sum(map(len, run)) + 4 * len(run)
            entry_id += len(run)
            continue
        try:  # in the write cache; or not where the index says (moved meanwhile?), damaged
            entry = read(ledger_id, entry_id)
        except (StorageIOError, NoEntryError, NoLedgerError):
            break
        budget -= 4 + len(entry)
        if budget < 0:
            break
        entries.append(entry)
        entry_id += 1
    return entries


class LedgerStorage:
    """Entries and ledger states of one ledger directory."""

    def __init__(
        self,
        directory: str,
        *,
        log_size_limit: int = 1024**3,
        flush_entrylog_bytes: int = 0,
        ledger_cache_size: int = 100_000,
        remove_from_page_cache: bool = False,
        direct_writes: bool = False,
    ) -> None:
        self.directory = directory
        self.entry_logger = EntryLogger(
            directory,
            log_size_limit,
            flush_entrylog_bytes,
            remove_from_page_cache=remove_from_page_cache,
            direct_writes=direct_writes,
        )
        self.index = LedgerIndex(directory)
        self._ledger_cache_size = ledger_cache_size
        self._infos: dict[int, LedgerInfo] = {}
        # Ledger deletions begun and ended (odd while one runs), under _lock: a ledger state read
        # from the index is cached only if none ran meanwhile.
        self._deletions = 0
        self._evict_at = ledger_cache_size
        self._lock = threading.Lock()  # guards the swap of the current generation
        self._current = _Generation()
        self._flushing: _Generation | None = None
        self._flush_lock = threading.Lock()  # one checkpoint at a time
        self._hurry = threading.Event()  # a paced checkpoint goes at full speed
        self._settled_floor = self.entry_logger.writable_floor

    # -- ledger state --------------------------------------------------------------------------

    def ledger(self, ledger_id: int) -> LedgerInfo | None:
        info = self._infos.get(ledger_id)
        if info is not None:
            return info
        deletions = self._deletions
        data = self.index.ledger(ledger_id)
        if data is None or not data.exists:
            return None
        info = LedgerInfo(
            bytes(data.masterKey),
            data.fenced,
            bytes(data.explicitLac) if data.HasField("explicitLac") else None,
        )
        with self._lock:
            # Not cached if a deletion began or ran since the index was read (a reader thread
            # may read while garbage collection deletes): the state read may be of a ledger now
            # deleted, which would be back in the cache for good.
            if deletions == self._deletions and not deletions & 1:
                self._remember(ledger_id, info)
        return info

    def _remember(self, ledger_id: int, info: LedgerInfo) -> None:
        self._infos[ledger_id] = info
        if len(self._infos) > self._evict_at:
            self._evict_clean()

    def _evict_clean(self) -> None:
        """Drops the oldest clean ledger states down to 90% of the cache size. Changed states stay
        until a checkpoint persists them; if that leaves the cache over its size, the next scan
        waits until it grew by another 10%, so a burst of new ledgers costs no scan per ledger."""
        flushing = self._flushing
        keep = self._current.dirty_ledgers | (
            flushing.dirty_ledgers if flushing is not None else set()
        )
        excess = len(self._infos) - self._ledger_cache_size * 9 // 10
        victims: list[int] = []
        for ledger_id in self._infos:  # insertion order: oldest first
            if len(victims) >= excess:
                break
            if ledger_id not in keep:
                victims.append(ledger_id)
        for ledger_id in victims:
            del self._infos[ledger_id]
        self._evict_at = max(
            self._ledger_cache_size, len(self._infos) + self._ledger_cache_size // 10
        )

    def add_ledger(self, ledger_id: int, master_key: bytes) -> LedgerInfo:
        """The ledger's state, created with ``master_key`` if the ledger is new."""
        info = self.ledger(ledger_id)
        if info is None:
            info = LedgerInfo(master_key)
            self.mark_dirty(ledger_id)  # first: a dirty state is never evicted
            with self._lock:
                self._current.new_ledgers.add(ledger_id)
            self._remember(ledger_id, info)
        elif not info.master_key:
            info.master_key = master_key
            self.mark_dirty(ledger_id)
        return info

    def ledger_count(self) -> int:
        """Ledgers stored here: those in the index and those created since the checkpoint that
        will write them there (a gauge: a checkpoint's commit may count a few twice briefly)."""
        flushing = self._flushing
        waiting = len(self._current.new_ledgers) + (
            len(flushing.new_ledgers) if flushing is not None else 0
        )
        return self.index.counts()[0] + waiting

    def mark_dirty(self, ledger_id: int) -> None:
        with self._lock:
            self._current.dirty_ledgers.add(ledger_id)

    @staticmethod
    def key_matches(info: LedgerInfo, master_key: bytes) -> bool:
        """Constant-time comparison of a presented master key with the stored one."""
        return hmac.compare_digest(info.master_key, master_key)

    # -- entries -------------------------------------------------------------------------------

    def add_entry(self, ledger_id: int, entry_id: int, entry: bytes) -> None:
        self.add_entries(ledger_id, [entry_id], [entry])

    def add_entries(self, ledger_id: int, entry_ids: list[int], entries: list[bytes]) -> None:
        """Puts entries of one ledger that arrived together in the write cache, under one lock;
        an entry the cache holds already (a recovery add) is replaced."""
        with self._lock:
            current = self._current
            cached = current.ledgers.get(ledger_id)
            if cached is None:
                cached = current.ledgers[ledger_id] = _LedgerEntries()
                current.last_entry[ledger_id] = entry_ids[0] - 1
            known = current.last_entry[ledger_id]
            size = cached.add_new(entry_ids, entries)  # the usual batch, all new: one C call
            increasing = size != UNORDERED
            if entry_ids[0] <= known or not increasing:
                current.unordered.add(ledger_id)
            last = entry_ids[-1] if increasing else max(entry_ids)
            if last > known:
                current.last_entry[ledger_id] = last
            if size >= 0:
                current.size_bytes += size
                current.count += len(entries)
                return
            put = cached.put
            grown = added = 0
            for entry_id, entry in zip(entry_ids, entries, strict=True):
                previous = put(entry_id, entry)
                if previous is None:
                    grown += len(entry)
                    added += 1
                else:  # a copy of an entry the cache holds already
                    grown += len(entry) - len(previous)
            current.size_bytes += grown
            current.count += added

    @property
    def write_cache_bytes(self) -> int:
        """Bytes in the write cache not yet being flushed."""
        return self._current.size_bytes

    @property
    def flushing_bytes(self) -> int:
        flushing = self._flushing
        return flushing.size_bytes if flushing is not None else 0

    def cached_bytes(self) -> int:
        """Bytes in the write cache, being flushed included (``write_cache_bytes +
        flushing_bytes`` in one call: the engine asks on every add)."""
        flushing = self._flushing
        return self._current.size_bytes + (flushing.size_bytes if flushing is not None else 0)

    def last_entry_id(self, ledger_id: int) -> int:
        last = self._current.last_entry.get(ledger_id, -1)
        flushing = self._flushing
        if flushing is not None:
            last = max(last, flushing.last_entry.get(ledger_id, -1))
        return max(last, self.index.last_entry(ledger_id))

    def entry_ids(self, ledger_id: int) -> Iterator[int]:
        """Every entry id the bookie holds of the ledger, increasing (repeats possible while a
        checkpoint moves entries from the write cache to the index)."""
        if self.ledger(ledger_id) is None:
            raise NoLedgerError(ledger_id)
        # The write cache before the index: an entry a checkpoint moves in between is then
        # seen in the cache, or in the index, or both, never in neither.
        cached: list[int] = []
        with self._lock:
            for generation in (self._current, self._flushing):
                if generation is not None:
                    cached.extend(generation.ledgers.get(ledger_id, ()))
        cached.sort()
        indexed = (entry_id for entry_id, _ in self.index.entries(ledger_id))
        return heapq.merge(cached, indexed)

    def read_run(self) -> AbstractContextManager[None]:
        """A run of reads on this thread: their index lookups share one read transaction."""
        return self.index.read_run()

    def read(self, ledger_id: int, entry_id: int, nowait: bool = False) -> bytes:
        """The stored bytes of an entry; entry -1 is the last one. With ``nowait``,
        ``ReadWouldBlockError`` rather than waiting for the disk (the bookie's event loop asks
        so, and has a reader thread read it)."""
        if self.ledger(ledger_id) is None:
            raise NoLedgerError(ledger_id)
        if entry_id == -1:
            entry_id = self.last_entry_id(ledger_id)
            if entry_id < 0:
                raise NoEntryError(ledger_id, -1)
        entry = self._cached(ledger_id, entry_id)
        if entry is not None:
            return entry
        location = self.index.location(ledger_id, entry_id)
        if location is None:
            raise NoEntryError(ledger_id, entry_id)
        for _ in range(_READ_ATTEMPTS):
            try:
                return self.entry_logger.read(location, ledger_id, entry_id, nowait)
            except EntryLogError as error:
                # Compaction may have moved the entry (maybe more than once) and deleted its old
                # log after we looked it up: read again only where the index now points.
                moved = self.index.location(ledger_id, entry_id)
                if moved is None or moved == location:
                    raise StorageIOError(str(error)) from error
                location = moved
        raise StorageIOError(
            f"ledger {ledger_id} entry {entry_id} moved {_READ_ATTEMPTS} times while being read"
        )

    def read_range(self, ledger_id: int, first: int, max_count: int, max_bytes: int) -> list[bytes]:
        """The stored bytes of entries ``first``, ``first + 1``, ... (a batch read), at most
        ``max_count`` of them and as many as fit in ``max_bytes`` counting 4 bytes more per
        entry, the first one in any case. Raises as ``read`` does for the first; stops before
        the first later entry it cannot read. Entries the entry logs hold one after the other
        come from one read and one C pass per span (``EntryLogger.read_run``), not a lookup
        each. Waits for the disk."""
        with self.index.read_run():
            return read_range_with(
                self.read, self._read_following, ledger_id, first, max_count, max_bytes
            )

    def _read_following(
        self, ledger_id: int, entry_id: int, max_count: int, max_bytes: int
    ) -> list[bytes]:
        """The entries from ``entry_id`` on that an entry log holds one after the other, none
        if the write cache holds ``entry_id`` (``read`` takes it) or nothing does."""
        if self._cached(ledger_id, entry_id) is not None:
            return []
        location = self.index.location(ledger_id, entry_id)
        if location is None:
            return []
        return self.entry_logger.read_run(location, ledger_id, entry_id, max_count, max_bytes)

    def read_many(
        self, ledger_id: int, entry_ids: list[int], start: int, nowait: bool = False
    ) -> list[bytes]:
        """Entries ``entry_ids[start]``, ``entry_ids[start + 1]``, ... (increasing ids, such as
        a bookie's share of a striped read), as many from the start as come from the write
        cache or from walks over the entry logs (one index lookup per walk, not per entry),
        maybe none: the caller reads the next one the one-entry way, which says what is wrong
        with it. With ``nowait``, only what the page cache holds."""
        entries: list[bytes] = []
        if self.ledger(ledger_id) is None:
            return entries
        at, count = start, len(entry_ids)
        ends = _walk_ends(entry_ids, start)
        part = 0  # of ends: the walks stop there (a gap of ids whose records are not wanted)
        last: int | None = None
        looked = -1  # the end ``last`` was looked up for: where the walk may end
        with self.index.read_run():
            while at < count:
                entry_id = entry_ids[at]
                cached = self._cached(ledger_id, entry_id)
                if cached is not None:
                    entries.append(cached)
                    at += 1
                    continue
                location = self.index.location(ledger_id, entry_id)
                if location is None:
                    break
                while ends[part] <= at:
                    part += 1
                end = ends[part]
                if looked != end and at + 1 < end:
                    looked, last = end, self.index.location(ledger_id, entry_ids[end - 1])
                wanted = entry_ids if end == count else entry_ids[:end]
                got = self.entry_logger.read_picked(
                    location, ledger_id, wanted, at, nowait, last=last if looked == end else None
                )
                if not got:
                    break
                entries += got
                at += len(got)
        return entries

    def _cached(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The entry from the write cache, if it holds it."""
        for generation in (self._current, self._flushing):
            if generation is not None:
                entries = generation.ledgers.get(ledger_id)
                if entries is not None:
                    entry = entries.get(entry_id)
                    if entry is not None:
                        return entry
        return None

    # -- checkpoint ----------------------------------------------------------------------------

    def checkpoint(self, pace_s: float = 0.0) -> CheckpointResult:
        """Persists everything added before this call to the entry log and the index.

        The caller captures the journal position *before* calling; once this returns, every
        record before that position is durable outside the journal. With ``pace_s`` the entry-log
        writes are spread over that many seconds (pausing after the flushes along the way, see
        ``flushEntrylogBytes``) unless ``hurry()`` is called: a checkpoint at full speed takes
        the disk from the journal, whose fsyncs then wait behind it.
        """
        with self._flush_lock:
            with self._lock:
                assert self._flushing is None, (
                    "a checkpoint must never replace a generation in flight"
                )
                flushing = self._current
                self._current = _Generation()
                self._flushing = flushing
            logger = self.entry_logger
            pause = release_pause = _pause_for_gil
            if pace_s > 0 and flushing.size_bytes:
                logger.after_flush = self._pacer(pace_s, flushing.size_bytes)
                pause = _resting_pause(self._hurry)
                # Freeing the flushed entries makes no room in the write cache (they stop
                # counting as the generation stops flushing), so the release rests even when
                # hurried: hurried, it was 66-95 ms of one core in each of three bookies at
                # once, the adds' p99 in those 100 ms 35 ms.
                release_pause = _resting_pause(None)
            try:
                # Each slice's locations go into the index's write transaction right after its
                # entries go to the entry log, so that they are put at the checkpoint's pace; the
                # transaction commits after the entry log is synced. (Put all at the end, a write
                # cache's locations were 56-72 ms of one core in each of three bookies at once.)
                # Every _INDEX_PART_BYTES of records, the log is synced and the locations so far
                # committed, and the cached entries they cover freed: the end of a checkpoint
                # then commits and frees only its last part, where it committed a write cache's
                # worth of index pages and freed every entry at once, in three bookies together.
                with self.index.writing() as index:
                    part_start = logger.written
                    written: list[tuple[_LedgerEntries, list[int]]] = []
                    for ledger_id in sorted(flushing.ledgers):
                        # Entries that came in increasing order (one writer's plain adds) are
                        # taken in that order a slice at a time, pausing between slices: sorting
                        # and gathering a write cache's worth at once held the GIL for 10-24 ms.
                        ordered = ledger_id not in flushing.unordered
                        cached = flushing.ledgers[ledger_id]
                        for entry_ids, in_order, keys in cached.runs(ordered, _GATHER_SLICE):
                            placed = logger.add_many(ledger_id, in_order)
                            index.put_locations(ledger_id, entry_ids, placed, pause)
                            written.append((cached, keys))
                            if logger.written - part_start >= _INDEX_PART_BYTES:
                                logger.flush()  # every record whose location was put: synced
                                index.commit_part()
                                part_start = logger.written
                                for done, done_keys in written:
                                    done.release(done_keys, release_pause, self._lock)
                                written = []
                    self.entry_logger.flush()
                    states = []
                    for ledger_id in sorted(flushing.dirty_ledgers):
                        info = self._infos.get(ledger_id)
                        if info is None:
                            raise RuntimeError(
                                f"ledger {ledger_id} changed but its state left the cache unsaved"
                            )
                        states.append((ledger_id, info.to_proto()))
                    index.commit(states)
            except BaseException:
                # Nothing may be lost: the failed generation is merged back into the current one
                # (newer entries win) before it stops being "flushing", so a reader always finds
                # every entry in one of the two; the next checkpoint retries it in a new log.
                with self._lock:
                    _merge_into(self._current, flushing)
                    self._flushing = None
                self.entry_logger.abandon_active()
                raise
            finally:
                logger.after_flush = None
            with self._lock:
                self._flushing = None
            self.settle()
            _release(flushing, release_pause)
            return CheckpointResult(flushing.count, flushing.size_bytes, len(states))

    def _pacer(self, pace_s: float, total_bytes: int) -> Callable[[], None]:
        """Sleeps after a flush while the writes are ahead of a steady pace over ``pace_s``."""
        started = time.monotonic()
        logger = self.entry_logger
        base = logger.written

        def pace() -> None:
            due = started + pace_s * min(1.0, (logger.written - base) / total_bytes)
            delay = due - time.monotonic()
            if delay > 0:
                self._hurry.wait(delay)

        return pace

    def hurry(self, hurry: bool = True) -> None:
        """Lets a paced checkpoint run at full speed (the write cache fills, or the bookie stops),
        or (``False``) lets the next one be paced again."""
        if not hurry:
            self._hurry.clear()
        elif not self._hurry.is_set():  # called on every add while the write cache is over half
            self._hurry.set()

    def settle(self) -> None:
        """Called with ``exclusive()`` held right after the index committed every location written
        so far: the logs closed by now hold no record the index will ever learn about later."""
        self._settled_floor = self.entry_logger.writable_floor

    @property
    def settled_log_floor(self) -> int:
        """Entry logs below this id are closed and settled: each of their records is either in
        the index already or never will be, so garbage collection may judge them by the index.
        A log rolled in the middle of a checkpoint is not settled until that checkpoint committed
        (its entries are not indexed yet), nor is a log whose file was just created."""
        return self._settled_floor

    def exclusive(self) -> threading.Lock:
        """The lock held while writing entry logs (checkpoints, compaction): one writer at a time."""
        return self._flush_lock

    def delete_ledger(self, ledger_id: int) -> int:
        """Removes everything of a deleted ledger: index state and locations, cached entries.

        Its bytes in entry logs are reclaimed when those logs are deleted or compacted. Never runs
        during a checkpoint (which would find the ledger's changed state gone)."""
        with self._flush_lock:
            with self._lock:
                self._deletions += 1  # odd while deleting: see ``ledger``
                removed = self._current.ledgers.pop(ledger_id, None)
                if removed:
                    self._current.size_bytes -= sum(len(entry) for entry in removed.values())
                    self._current.count -= len(removed)
                self._current.last_entry.pop(ledger_id, None)
                self._current.dirty_ledgers.discard(ledger_id)
                self._current.new_ledgers.discard(ledger_id)
                self._infos.pop(ledger_id, None)
            try:
                return self.index.delete_ledger(ledger_id)
            finally:
                with self._lock:
                    self._deletions += 1

    def close(self) -> None:
        self.entry_logger.close()
        self.index.close()
