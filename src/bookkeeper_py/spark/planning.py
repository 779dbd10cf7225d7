"""Planning reads on the driver: snapshots of logs (one metadata read each, plus the open
segment's LAC read without fencing), offsets (log sequence numbers) resolved from
``earliest``/``latest``/timestamps, and the ranges of entries that Spark tasks read straight
from the bookies.

A ``ReadRange`` carries everything its task needs (the ledger's metadata, the bookies'
endpoints, the entry range, the sequence bounds), so a task opens no metadata session: it
reads with a client made for known bookies (``metadata.port.KnownBookies``). Nothing here
imports PySpark.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from bookkeeper_py import errors
from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.client.ledger import ReadHandle
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.log.format import LogMetadata, Position, Segment, decode_entry
from bookkeeper_py.log.namespace import LogNamespace, data_entry
from bookkeeper_py.log.reader import find_record

log = logging.getLogger(__name__)
K = TypeVar("K")
V = TypeVar("V")


class DataLossError(errors.BKError):
    """Records a read needs are gone (truncated, or their ledger deleted) and
    ``failOnDataLoss`` is true."""


@dataclass(frozen=True)
class ReadRange:
    """Entries ``first_entry``..``last_entry`` of one ledger, of which a task keeps the
    records with a log sequence number in [``start_sequence``, ``end_sequence``)
    (``end_sequence`` -1: all); for a raw ledger (``log`` ""), the entries themselves."""

    log: str  # namespace/log, "" for a raw ledger
    segment: int  # the segment's sequence number in its log (-1 for a raw ledger)
    metadata: LedgerMetadata
    first_entry: int
    last_entry: int
    start_sequence: int = 0
    end_sequence: int = -1
    entry_bytes: int = 0  # an estimate of the average entry size, to size the task's reads
    endpoints: tuple[tuple[str, str, int], ...] = ()  # bookie id, host, port
    fail_on_data_loss: bool = True
    # the segment's start sequence, first txid and first timestamp (relative entries' bases)
    bases: tuple[int, int, int] | None = None

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id


@dataclass
class Span:
    """A live segment's confirmed records: sequence numbers [start, end) in entries
    first_entry..last_entry (last_entry < first_entry: no record)."""

    segment: Segment
    start: int
    end: int
    first_entry: int
    last_entry: int
    lac: int  # the last entry readers may read (the closed ledger's last entry, or the LAC)
    length: int  # bytes of the ledger's entries so far (an estimate for an open one)


@dataclass
class LogSnapshot:
    """One log as a plan sees it."""

    key: str  # namespace/log
    metadata: LogMetadata
    spans: list[Span] = field(default_factory=list)

    @property
    def first(self) -> int:
        """The sequence number of the first record still in the log (the next one's when
        it is empty)."""
        for span in self.spans:
            if span.end > span.start:
                return span.start
        return self.next

    @property
    def next(self) -> int:
        """The sequence number the next record gets, as far as readers can tell."""
        return max([self.metadata.base_sequence] + [span.end for span in self.spans])


def split_key(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name


class Planner:
    """Snapshots and ranges for one client; keeps what it learned of segments (first
    sequences, truncation points, endpoints) between calls, for a streaming query's runner
    that plans every trigger."""

    def __init__(self, client: BookKeeper, password: bytes = b"") -> None:
        self.client = client
        self.password = password
        self._namespaces: dict[str, LogNamespace] = {}
        self._endpoints: dict[str, tuple[str, int]] = {}
        self._first_sequence: dict[tuple[int, int, int], int] = {}  # (ledger, entry, slot)
        self._closed_ledgers: dict[int, LedgerMetadata] = {}

    def namespace(self, name: str) -> LogNamespace:
        found = self._namespaces.get(name)
        if found is None:
            found = self._namespaces[name] = LogNamespace(self.client, name, password=self.password)
        return found

    async def log_names(self, namespace: str) -> list[str]:
        names: list[str] = []
        space = self.namespace(namespace)
        while True:
            page = await space.list_logs(after=names[-1] if names else None)
            if not page:
                return names
            names.extend(page)

    # -- snapshots ----------------------------------------------------------------------------

    async def snapshot(self, key: str) -> LogSnapshot:
        namespace, name = split_key(key)
        space = self.namespace(namespace)
        metadata, _ = await space.read_log(name)
        snapshot = LogSnapshot(key, metadata)
        previous_end = metadata.base_sequence
        for segment in metadata.live_segments:
            span = await self._span(space, segment, previous_end)
            if span is None:
                continue
            snapshot.spans.append(span)
            previous_end = max(previous_end, span.end)
        return snapshot

    async def _span(self, space: LogNamespace, segment: Segment, previous_end: int) -> Span | None:
        if not segment.is_open:
            if segment.record_count == 0 or segment.last_entry < segment.min_entry:
                end = max(previous_end, segment.end_sequence)
                return Span(segment, end, end, 0, -1, segment.last_entry, segment.byte_count)
            start = segment.start_sequence
            if (segment.min_entry, segment.min_slot) > (0, 0):
                start = await self._sequence_at(space, segment)
            return Span(
                segment,
                start,
                segment.end_sequence,
                segment.min_entry,
                segment.last_entry,
                segment.last_entry,
                segment.byte_count,
            )
        try:
            handle = await space.open_ledger(segment.ledger_id, recover=False)
        except errors.NoSuchLedgerError:
            return None
        try:
            lac = handle.last_add_confirmed
            empty = Span(segment, previous_end, previous_end, 0, -1, lac, 0)
            if lac < segment.min_entry:
                return empty
            last = await data_entry(handle, lac, segment.min_entry, -1, segment)
            if last is None:
                return empty
            last_entry, decoded = last
            end = decoded.first_sequence + len(decoded.payloads)
            start = await self._open_start(handle, segment)
            length = handle.length or (last_entry + 1) * len(decoded.payloads)
            return Span(segment, start, end, segment.min_entry, last_entry, lac, length)
        finally:
            await handle.close()

    async def _open_start(self, handle: ReadHandle, segment: Segment) -> int:
        """The sequence number of an open segment's first record still there."""
        key = (segment.ledger_id, segment.min_entry, segment.min_slot)
        known = self._first_sequence.get(key)
        if known is not None:
            return known
        first = await data_entry(handle, segment.min_entry, handle.last_add_confirmed, 1, segment)
        assert first is not None, "an entry at or below the LAC holds records"
        entry_id, decoded = first
        slot = segment.min_slot if entry_id == segment.min_entry else 0
        found = decoded.first_sequence + min(slot, len(decoded.payloads))
        _remember(self._first_sequence, key, found)
        return found

    async def _sequence_at(self, space: LogNamespace, segment: Segment) -> int:
        """The first sequence number at or after a closed segment's truncation point."""
        key = (segment.ledger_id, segment.min_entry, segment.min_slot)
        known = self._first_sequence.get(key)
        if known is None:
            handle = await space.open_ledger(segment.ledger_id, recover=False)
            try:
                entry = decode_entry(
                    (await handle.read_entry(segment.min_entry)).data, "truncation", segment
                )
            finally:
                await handle.close()
            known = entry.first_sequence + min(segment.min_slot, len(entry.payloads))
            _remember(self._first_sequence, key, known)
        return known

    # -- offsets ------------------------------------------------------------------------------

    async def sequence_at_timestamp(self, snapshot: LogSnapshot, timestamp_ms: int) -> int:
        """The sequence number of the first record whose timestamp is at least
        ``timestamp_ms`` (the tail's when none is)."""
        namespace, _ = split_key(snapshot.key)
        space = self.namespace(namespace)
        for span in snapshot.spans:
            if span.end <= span.start:
                continue
            segment = span.segment
            if not segment.is_open and segment.last_timestamp < timestamp_ms:
                continue
            handle = await space.open_ledger(segment.ledger_id, recover=False)
            try:
                found = await find_record(handle, segment, "timestamp", timestamp_ms)
                if found is None:
                    continue
                entry = decode_entry((await handle.read_entry(found[0])).data, "timestamp", segment)
                return max(span.start, entry.first_sequence + found[1])
            finally:
                await handle.close()
        return snapshot.next

    async def position_of(self, snapshot: LogSnapshot, sequence: int) -> Position | None:
        """The position of record ``sequence`` (None when the snapshot does not hold it)."""
        namespace, _ = split_key(snapshot.key)
        for span in snapshot.spans:
            if span.start <= sequence < span.end:
                handle = await self.namespace(namespace).open_ledger(
                    span.segment.ledger_id, recover=False
                )
                try:
                    found = await find_record(handle, span.segment, "sequence", sequence)
                finally:
                    await handle.close()
                return None if found is None else Position(span.segment.ledger_id, *found)
        return None

    # -- ranges -------------------------------------------------------------------------------

    async def ranges(
        self,
        snapshot: LogSnapshot,
        start: int,
        end: int,
        *,
        partition_bytes: int,
        fail_on_data_loss: bool,
    ) -> list[ReadRange]:
        """The ranges holding records [start, end) of the log (``end`` at most its next)."""
        namespace, _ = split_key(snapshot.key)
        space = self.namespace(namespace)
        out: list[ReadRange] = []
        for span in snapshot.spans:
            low, high = max(start, span.start), min(end, span.end)
            if low >= high:
                continue
            segment = span.segment
            first, last = span.first_entry, span.last_entry
            if low > span.start or high < span.end:
                handle = await space.open_ledger(segment.ledger_id, recover=False)
                try:
                    if low > span.start:
                        first = await self._entry_of(handle, segment, low, span)
                    if high < span.end:
                        last = await self._entry_of(handle, segment, high - 1, span)
                finally:
                    await handle.close()
            metadata = await self.ledger_metadata(segment.ledger_id)
            base = ReadRange(
                snapshot.key,
                segment.sequence,
                metadata,
                first,
                last,
                low,
                high,
                max(1, span.length // max(1, span.lac + 1)),
                await self.endpoints(metadata),
                fail_on_data_loss,
                (
                    (segment.start_sequence, segment.first_txid, segment.first_timestamp)
                    if segment.start_sequence >= 0
                    else None
                ),
            )
            out.extend(split(base, partition_bytes))
        return out

    async def _entry_of(
        self, handle: ReadHandle, segment: Segment, sequence: int, span: Span
    ) -> int:
        found = await find_record(handle, segment, "sequence", sequence)
        if found is None:
            raise errors.BKError(
                f"ledger {segment.ledger_id}: no entry holds sequence number {sequence}"
            )
        return found[0]

    async def ledger_ranges(
        self, ledger_ids: Iterable[int], *, partition_bytes: int, fail_on_data_loss: bool
    ) -> list[ReadRange]:
        """Raw ledgers, whole (an open one up to its LAC, read without fencing)."""
        out: list[ReadRange] = []
        for ledger_id in ledger_ids:
            try:
                handle = await self.client.open_ledger_no_recovery(ledger_id, self.password)
            except errors.NoSuchLedgerError:
                if fail_on_data_loss:
                    raise DataLossError(
                        f"ledger {ledger_id} does not exist (failOnDataLoss=false skips it)"
                    ) from None
                log.warning("ledger %d does not exist: skipped (failOnDataLoss=false)", ledger_id)
                continue
            try:
                last = handle.last_add_confirmed
                metadata = handle.metadata
                length = handle.length
            finally:
                await handle.close()
            if last < 0:
                continue
            base = ReadRange(
                "",
                -1,
                metadata,
                0,
                last,
                entry_bytes=max(1, length // (last + 1)) if length else 1024,
                endpoints=await self.endpoints(metadata),
                fail_on_data_loss=fail_on_data_loss,
            )
            out.extend(split(base, partition_bytes))
        return out

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        """A ledger's metadata (a closed ledger's is kept: it no longer changes)."""
        known = self._closed_ledgers.get(ledger_id)
        if known is not None:
            return known
        metadata, _ = await self.client.metadata_port.read_ledger_metadata(ledger_id)
        if metadata.is_closed:
            _remember(self._closed_ledgers, ledger_id, metadata)
        return metadata

    async def endpoints(self, metadata: LedgerMetadata) -> tuple[tuple[str, str, int], ...]:
        port = self.client.metadata_port
        found = []
        for bookie in sorted({b for _, ensemble in metadata.ensembles for b in ensemble}):
            if bookie not in self._endpoints:
                endpoint = await port.bookie_endpoint(bookie)
                self._endpoints[bookie] = (endpoint.host, endpoint.port)
            host, port_number = self._endpoints[bookie]
            found.append((bookie, host, port_number))
        return tuple(found)


CACHED = 10_000  # what a planner remembers of segments; a streaming query's runs for days


def _remember(cache: dict[K, V], key: K, value: V) -> None:
    """``cache[key] = value``, the oldest entry forgotten past ``CACHED`` entries (dicts keep
    insertion order; what is forgotten is read again when needed)."""
    cache[key] = value
    if len(cache) > CACHED:
        del cache[next(iter(cache))]


def split(whole: ReadRange, partition_bytes: int) -> list[ReadRange]:
    """``whole`` in ranges of about ``partition_bytes`` of entries each."""
    entries = whole.last_entry - whole.first_entry + 1
    per_range = max(1, partition_bytes // max(1, whole.entry_bytes))
    if entries <= per_range:
        return [whole]
    return [
        replace(whole, first_entry=low, last_entry=min(whole.last_entry, low + per_range - 1))
        for low in range(whole.first_entry, whole.last_entry + 1, per_range)
    ]


def at_least(ranges: list[ReadRange], count: int) -> list[ReadRange]:
    """``minPartitions``: the largest ranges halved until there are ``count`` (a range of one
    entry stays whole)."""
    out = list(ranges)
    while len(out) < count:
        index = max(range(len(out)), key=lambda i: out[i].last_entry - out[i].first_entry)
        widest = out[index]
        if widest.last_entry <= widest.first_entry:
            break
        middle = (widest.first_entry + widest.last_entry) // 2
        out[index : index + 1] = [
            replace(widest, last_entry=middle),
            replace(widest, first_entry=middle + 1),
        ]
    return out
