"""Readers of a log: catch-up reads of closed segments with read-ahead, then tailing of the
open segment with long polls, moving to the next segment when one ends; never fencing.

A reader delivers records in position order, each once: it goes forward entry by entry, and a
writer change only closes the segment being read (its last entries as recovered are read
before the next segment). Starting points: the earliest record, the latest (records appended
from now on), a position, a transaction id, a timestamp, or a subscription's position.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from bookkeeper_py import errors
from bookkeeper_py.log.format import (
    DecodedEntry,
    EntryFlags,
    LogMetadata,
    LogRecord,
    Position,
    Segment,
    SegmentState,
    decode_entry,
)
from bookkeeper_py.log.namespace import backoff, data_entry

if TYPE_CHECKING:
    from bookkeeper_py.client.ledger import LedgerEntry, ReadHandle
    from bookkeeper_py.log.namespace import LogNamespace

log = logging.getLogger(__name__)

Start = Literal["earliest", "latest"] | Position
READ_AHEAD_BYTES = 16 * 1024 * 1024  # entries of a closed segment read ahead of the consumer
MAX_CHUNK_ENTRIES = 512
READ_AHEAD_CHUNKS = 4
LIST_POLL_S = (0.005, 0.5)  # waiting for the next segment: first and longest pause


@dataclass(slots=True)
class _Cursor:
    segment: int  # sequence of the segment to read
    entry: int  # next entry id in it
    slot: int  # first slot to deliver of that entry


class LogReader:
    """Reads a log's records in order (``LogNamespace.open_reader``). ``read_batch`` gives the
    records of the next entry (waiting for one while tailing); iterate with ``async for``."""

    def __init__(
        self,
        namespace: LogNamespace,
        log_name: str,
        metadata: LogMetadata,
        cursor: _Cursor,
        *,
        next_sequence: int,
        last_position: Position,
        subscription: str | None,
        end: Position | None,
        poll_timeout_ms: int,
        follow: bool,
    ) -> None:
        self.namespace = namespace
        self.log_name = log_name
        self._metadata = metadata
        self._cursor = cursor
        self.next_sequence = next_sequence  # of the next record to deliver (-1: not known yet)
        self.last_position = last_position  # of the last record delivered (or before start)
        self.subscription = subscription
        self.end = end
        self.poll_timeout_ms = poll_timeout_ms
        self.follow = follow
        self._source: AsyncGenerator[tuple[int, int, DecodedEntry], None] | None = None
        self._pending: deque[LogRecord] = deque()  # read, not yet delivered (read_next)
        self._next: asyncio.Future[tuple[int, int, DecodedEntry]] | None = None
        self._ended = False
        self._closed = False

    @classmethod
    async def open(
        cls,
        namespace: LogNamespace,
        log_name: str,
        start: Start = "earliest",
        *,
        txid: int | None = None,
        timestamp: int | None = None,
        subscription: str | None = None,
        end: Position | None = None,
        poll_timeout_ms: int = 1000,
        follow: bool = True,
    ) -> LogReader:
        """A reader from ``start`` (``"earliest"``, ``"latest"`` or a ``Position``), or from
        the first record whose ``txid`` or ``timestamp`` (ms) is at least the one given, or
        after the position of ``subscription`` (made at ``start`` if missing). ``end`` stops
        after that position; without ``follow`` the reader stops at the confirmed tail instead
        of waiting for more."""
        metadata, _ = await namespace.read_log(log_name)
        last_position = Position(0, -1, -1)
        next_sequence = -1
        if subscription is not None:
            stored = await namespace.get_subscription(log_name, subscription)
            if stored is None:
                stored = await namespace.subscribe(
                    log_name, subscription, at_latest=start == "latest"
                )
            after = stored.position
            cursor = _cursor_at(metadata, Position(after.ledger_id, after.entry_id, after.slot + 1))
            last_position = after
            next_sequence = stored.sequence + 1 if stored.sequence >= 0 else -1
        elif txid is not None or timestamp is not None:
            cursor = await _seek(namespace, metadata, txid, timestamp)
        elif start == "earliest":
            cursor = _cursor_at(metadata, Position(0, 0, 0))
        elif start == "latest":
            cursor, last_position, next_sequence = await _latest(namespace, metadata)
        elif isinstance(start, Position):
            cursor = _cursor_at(metadata, start)
        else:
            raise errors.IncorrectParameterError(
                f"a reader starts at 'earliest', 'latest' or a Position, got {start!r}"
            )
        return cls(
            namespace,
            log_name,
            metadata,
            cursor,
            next_sequence=next_sequence,
            last_position=last_position,
            subscription=subscription,
            end=end,
            poll_timeout_ms=poll_timeout_ms,
            follow=follow,
        )

    # -- delivering ------------------------------------------------------------------------------

    async def read_batch(self) -> list[LogRecord]:
        """The next records (those of one entry, at least one), waiting for them while
        tailing; ``[]`` once the log ended (end of stream, ``end`` reached or, without
        ``follow``, the tail)."""
        if self._pending:
            records = list(self._pending)
            self._pending.clear()
        else:
            records = await self._next_batch()
        if records:
            last = records[-1]
            self.last_position = Position(last.ledger_id, last.entry_id, last.slot)
            self.next_sequence = last.sequence + 1
        return records

    async def read_next(self) -> LogRecord | None:
        """The next record (None once the log ended)."""
        if not self._pending:
            self._pending.extend(await self._next_batch())
            if not self._pending:
                return None
        record = self._pending.popleft()
        self.last_position = Position(record.ledger_id, record.entry_id, record.slot)
        self.next_sequence = record.sequence + 1
        return record

    async def _next_batch(self) -> list[LogRecord]:
        if self._closed:
            raise errors.ClientClosedError(f"this reader of log {self._where()} is closed")
        if self._ended:
            return []
        if self._source is None:
            self._source = self._entries()
        while True:
            # The generator runs in a task of its own: a caller that gives up waiting (a
            # timeout, a cancelled task) leaves it going, and the next read takes its result.
            if self._next is None:
                self._next = asyncio.ensure_future(self._source.__anext__())
            try:
                ledger_id, entry_id, decoded = await asyncio.shield(self._next)
            except StopAsyncIteration:
                self._next = None
                self._ended = True
                return []
            except asyncio.CancelledError:
                if self._next.done() and self._next.cancelled():
                    self._next = None
                raise
            except BaseException:
                self._next = None
                raise
            self._next = None
            cursor = self._cursor
            slot = cursor.slot if entry_id == cursor.entry else 0
            cursor.entry, cursor.slot = entry_id + 1, 0
            if decoded.flags & EntryFlags.END_OF_STREAM:
                self._ended = True
            if not decoded.payloads or slot >= len(decoded.payloads):
                if self._ended:
                    return []
                continue
            records = decoded.records(ledger_id, entry_id, slot)
            if self.end is not None and records[-1].position >= self.end:
                records = [r for r in records if r.position <= self.end]
                self._ended = True
            return records

    def __aiter__(self) -> AsyncIterator[LogRecord]:
        return self._records()

    async def _records(self) -> AsyncIterator[LogRecord]:
        while True:
            records = await self.read_batch()
            if not records:
                return
            for record in records:
                yield record

    async def commit(self, record: LogRecord | None = None) -> None:
        """Stores in the reader's subscription that its consumer is done with ``record`` (by
        default the last record delivered) and every record before it."""
        if self.subscription is None:
            raise errors.IncorrectParameterError(
                "this reader has no subscription: open it with subscription=NAME to commit"
            )
        if record is not None:
            position, sequence = record.position, record.sequence
        else:
            position, sequence = self.last_position, self.next_sequence - 1
        if position.entry_id < 0:
            return
        await self.namespace.commit(self.log_name, self.subscription, position, sequence)

    async def close(self) -> None:
        self._closed = True
        if self._next is not None:
            self._next.cancel()
            await asyncio.gather(self._next, return_exceptions=True)
            self._next = None
        source, self._source = self._source, None
        # A read cancelled by the caller may still be unwinding inside the generator: it ends
        # the generator itself on its way out.
        if source is not None and not getattr(source, "ag_running", False):
            await source.aclose()

    async def __aenter__(self) -> LogReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _where(self) -> str:
        return f"{self.namespace.name}/{self.log_name}"

    # -- finding entries -------------------------------------------------------------------------

    async def _entries(self) -> AsyncGenerator[tuple[int, int, DecodedEntry], None]:
        """Every entry from the cursor on, segment after segment."""
        while True:
            segment = await self._next_segment()
            if segment is None:
                return
            cursor = self._cursor
            if (cursor.entry, cursor.slot) < (segment.min_entry, segment.min_slot):
                cursor.entry, cursor.slot = segment.min_entry, segment.min_slot
            try:
                handle = await self.namespace.open_ledger(segment.ledger_id, recover=False)
            except errors.NoSuchLedgerError:
                log.warning(
                    "log %s: segment %d (ledger %d) was truncated under this reader; going on",
                    self._where(),
                    segment.sequence,
                    segment.ledger_id,
                )
                self._cursor = _Cursor(segment.sequence + 1, 0, 0)
                continue
            ended_stream = False
            segment_ended = handle.is_closed
            try:
                source = (
                    self._read_closed(handle, segment)
                    if handle.is_closed
                    else self._tail(handle, segment)
                )
                try:
                    async for entry_id, decoded in source:
                        yield segment.ledger_id, entry_id, decoded
                        if decoded.flags & EntryFlags.END_OF_STREAM:
                            ended_stream = True
                            return
                        if decoded.flags & EntryFlags.END_OF_SEGMENT:
                            segment_ended = True
                            break
                finally:
                    # (already being closed when the loop shuts down abandoned generators)
                    with contextlib.suppress(RuntimeError):
                        await source.aclose()
            finally:
                await handle.close()
            if ended_stream:
                return
            if not (segment_ended or handle.is_closed):
                if not self.follow:
                    return  # the confirmed tail of the open segment
                continue  # follow() ended without the segment's end: look again
            self._cursor = _Cursor(segment.sequence + 1, 0, 0)

    async def _read_closed(
        self, handle: ReadHandle, segment: Segment
    ) -> AsyncGenerator[tuple[int, DecodedEntry], None]:
        """A closed segment's entries from the cursor, read ahead in chunks."""
        first, last = self._cursor.entry, handle.last_add_confirmed
        if first > last:
            return
        average = max(1, handle.length // max(1, last + 1))
        chunk = max(1, min(MAX_CHUNK_ENTRIES, READ_AHEAD_BYTES // 4 // average))
        ranges = ((low, min(last, low + chunk - 1)) for low in range(first, last + 1, chunk))
        reads: deque[asyncio.Future[list[LedgerEntry]]] = deque()
        where = f"log {self._where()} ledger {handle.ledger_id}"

        def read_next_range() -> None:
            span = next(ranges, None)
            if span is not None:
                reads.append(asyncio.ensure_future(handle.read_entries(*span)))

        try:
            for _ in range(READ_AHEAD_CHUNKS):
                read_next_range()
            while reads:
                entries = await reads.popleft()
                read_next_range()
                for entry in entries:
                    yield (
                        entry.entry_id,
                        decode_entry(entry.data, f"{where} entry {entry.entry_id}", segment),
                    )
        finally:
            for read in reads:
                read.cancel()
            if reads:
                await asyncio.gather(*reads, return_exceptions=True)

    async def _tail(
        self, handle: ReadHandle, segment: Segment
    ) -> AsyncGenerator[tuple[int, DecodedEntry], None]:
        """An open segment's entries from the cursor as they are confirmed; ends once the
        ledger is closed and read (or, without ``follow``, at its confirmed tail)."""
        where = f"log {self._where()} ledger {handle.ledger_id}"
        if not self.follow:
            lac = await handle.read_last_add_confirmed()
            if self._cursor.entry <= lac:
                for entry in await handle.read_entries(self._cursor.entry, lac):
                    yield (
                        entry.entry_id,
                        decode_entry(entry.data, f"{where} entry {entry.entry_id}", segment),
                    )
            return
        entries = handle.follow(self._cursor.entry, timeout_ms=self.poll_timeout_ms, parallel=True)
        try:
            async for entry in entries:
                yield (
                    entry.entry_id,
                    decode_entry(entry.data, f"{where} entry {entry.entry_id}", segment),
                )
        finally:
            await entries.aclose()

    async def _next_segment(self) -> Segment | None:
        """The live segment at or after the cursor's, reading the list again (and waiting,
        while following) until there is one; None once the log ends there."""
        pauses = backoff(*LIST_POLL_S)
        refreshed = False
        while True:
            wanted = self._cursor.segment
            for segment in self._metadata.segments:
                if segment.sequence >= wanted and segment.state != SegmentState.TRUNCATED:
                    if segment.sequence > wanted:
                        self._cursor = _Cursor(segment.sequence, 0, 0)
                    return segment
            if self._metadata.end_of_stream and refreshed:
                return None
            if refreshed and not self.follow:
                return None
            if refreshed:
                await asyncio.sleep(next(pauses))
            self._metadata, _ = await self.namespace.read_log(self.log_name)
            refreshed = True


def _cursor_at(metadata: LogMetadata, position: Position) -> _Cursor:
    """The cursor of the first record at or after ``position``."""
    for segment in metadata.live_segments:
        if segment.ledger_id == position.ledger_id:
            return _Cursor(segment.sequence, max(0, position.entry_id), max(0, position.slot))
        if segment.ledger_id > position.ledger_id:
            return _Cursor(segment.sequence, 0, 0)
    return _Cursor(metadata.next_segment, 0, 0)


async def _latest(namespace: LogNamespace, metadata: LogMetadata) -> tuple[_Cursor, Position, int]:
    """The cursor after the last confirmed record, that record's position and the sequence
    number of the next one."""
    segments = metadata.live_segments
    if not segments:
        return _Cursor(metadata.next_segment, 0, 0), Position(0, -1, -1), metadata.base_sequence
    # While the writer rolls, it still appends to the older of two open segments: the tail is
    # in the first open one.
    last = next((s for s in segments if s.is_open), segments[-1])
    if not last.is_open:
        position = last.last_position or Position(last.ledger_id, -1, -1)
        return _Cursor(last.sequence + 1, 0, 0), position, last.end_sequence
    handle = await namespace.open_ledger(last.ledger_id, recover=False)
    try:
        lac = handle.last_add_confirmed
        if lac < 0:
            sequence = last.start_sequence
            if sequence < 0:  # added by a roll, nothing in it yet: the end of what is before
                before = [s for s in segments if s.sequence < last.sequence and not s.is_open]
                sequence = before[-1].end_sequence if before else metadata.base_sequence
            return _Cursor(last.sequence, 0, 0), Position(last.ledger_id, -1, -1), sequence
        entry = decode_entry((await handle.read_entry(lac)).data, "the tail", last)
        count = len(entry.payloads)
        return (
            _Cursor(last.sequence, lac + 1, 0),
            Position(last.ledger_id, lac, count - 1),
            entry.first_sequence + count,
        )
    finally:
        await handle.close()


async def _seek(
    namespace: LogNamespace, metadata: LogMetadata, txid: int | None, timestamp: int | None
) -> _Cursor:
    """The cursor of the first record whose transaction id (or timestamp) is at least the one
    given: the segment from the list, the entry by binary search (both increase)."""
    key: Literal["txid", "timestamp"] = "txid" if txid is not None else "timestamp"
    value = txid if txid is not None else timestamp
    assert value is not None
    for segment in metadata.live_segments:
        last = segment.last_txid if key == "txid" else segment.last_timestamp
        if not segment.is_open and (segment.record_count == 0 or last < value):
            continue
        handle = await namespace.open_ledger(segment.ledger_id, recover=False)
        try:
            found = await _search(handle, segment, key, value)
        finally:
            await handle.close()
        if found is not None:
            return found
    return _Cursor(metadata.next_segment, 0, 0)


async def _search(
    handle: ReadHandle, segment: Segment, key: Literal["txid", "timestamp"], value: int
) -> _Cursor | None:
    found = await find_record(handle, segment, key, value)
    if found is not None:
        return _Cursor(segment.sequence, *found)
    if not segment.is_open:
        return None
    return _Cursor(segment.sequence, max(segment.min_entry, handle.last_add_confirmed + 1), 0)


def _last_key(decoded: DecodedEntry, key: str) -> int:
    if key == "sequence":
        return decoded.first_sequence + len(decoded.payloads) - 1
    column = decoded.txids if key == "txid" else decoded.timestamps
    return int(column[-1])


async def find_record(
    handle: ReadHandle, segment: Segment, key: Literal["txid", "timestamp", "sequence"], value: int
) -> tuple[int, int] | None:
    """(entry id, slot) of the segment's first confirmed record whose transaction id,
    timestamp or log sequence number is at least ``value``, by binary search over its entries
    from ``min_entry`` to the handle's LAC (all three increase); None when no record is."""
    low, high = segment.min_entry, handle.last_add_confirmed
    found: tuple[int, DecodedEntry] | None = None
    while low <= high:
        middle = (low + high) // 2
        probe = await data_entry(handle, middle, high, 1, segment)
        if probe is None:
            high = middle - 1
            continue
        entry_id, decoded = probe
        if _last_key(decoded, key) >= value:
            found = probe
            high = middle - 1
        else:
            low = entry_id + 1
    if found is None:
        return None
    entry_id, decoded = found
    if key == "sequence":
        return entry_id, max(0, value - decoded.first_sequence)
    column = decoded.txids if key == "txid" else decoded.timestamps
    return entry_id, next(i for i, v in enumerate(column) if v >= value)
