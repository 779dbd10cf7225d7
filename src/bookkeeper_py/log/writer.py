"""The writer of a log: the seeds' "Ledgers to logs" protocol over the asyncio client.

Opening: read the segment list, fence and recover every open segment (the last two, when the
previous writer was rolling), create a ledger, compare-and-swap the list; only then accept
appends. Records are batched into entries (flushed by size, by delay and on ``flush``) and
acknowledged in order. Rolling: create a ledger, CAS it onto the list, write to it from then
on, and close the previous ledger once its last appends are acknowledged (they keep going
while the list is updated). A CAS conflict means the list changed: read it again; if this
writer's segment is no longer the last open one, another writer took over: ``LogFencedError``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from bookkeeper_py import errors
from bookkeeper_py.log.format import (
    DUPLICATE,
    ENTRY_OVERHEAD,
    RECORD_OVERHEAD,
    EndOfStreamError,
    EntryFlags,
    LogConfig,
    LogError,
    LogFencedError,
    LogMetadata,
    Position,
    RecordTooLargeError,
    Segment,
    SegmentState,
    WrittenLedger,
    check_name,
    decode_entry,
    encode_control,
    encode_entry,
)
from bookkeeper_py.log.namespace import LOG_LEDGER_PROPERTY, backoff, data_entry, now_ms
from bookkeeper_py.metadata.driver import BadVersionError

if TYPE_CHECKING:
    from bookkeeper_py.client.ledger import LedgerHandle, ReadHandle
    from bookkeeper_py.log.namespace import LogNamespace

log = logging.getLogger(__name__)

OPEN_ATTEMPTS = 10  # list conflicts before a writer gives up opening
ROLL_RETRY_S = 1.0  # after a roll that failed before changing anything
CLOSE_ATTEMPTS = 30  # recording a segment closed, while the metadata store fails
CLOSE_RETRY_S = (0.05, 2.0)
HIGH_WATER_BYTES = 32 * 1024 * 1024  # ``drain`` waits while more than this is unacknowledged


class PendingAppend:
    """The future position of an appended record: ``await`` it, or ``result()`` once done."""

    __slots__ = ("_batch", "_slot")

    def __init__(self, batch: _Batch | None, slot: int) -> None:
        self._batch = batch
        self._slot = slot

    def __await__(self) -> Generator[Any, None, Position]:
        if self._batch is None:
            return DUPLICATE
        ledger_id, entry_id = yield from self._batch.future.__await__()
        return Position(ledger_id, entry_id, self._slot)

    def done(self) -> bool:
        return self._batch is None or self._batch.future.done()

    def add_done_callback(self, callback: Callable[[PendingAppend], object]) -> None:
        """Calls ``callback(self)`` once the append is acknowledged or failed, as
        ``asyncio.Future.add_done_callback`` does (from the event loop, soon after)."""
        if self._batch is None:
            asyncio.get_running_loop().call_soon(callback, self)
        else:
            self._batch.future.add_done_callback(lambda _: callback(self))

    def result(self) -> Position:
        """The position (``DUPLICATE`` for a record an idempotent writer had appended before);
        raises the append's error; ``asyncio.InvalidStateError`` before it is done."""
        if self._batch is None:
            return DUPLICATE
        ledger_id, entry_id = self._batch.future.result()
        return Position(ledger_id, entry_id, self._slot)


class _Batch:
    """Records on their way into one entry."""

    __slots__ = (
        "added",
        "bytes",
        "first_sequence",
        "future",
        "payloads",
        "segment",
        "timestamps",
        "txids",
        "writer_sequences",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, first_sequence: int) -> None:
        self.future: asyncio.Future[tuple[int, int]] = loop.create_future()
        self.payloads: list[bytes] = []
        self.txids: list[int] = []
        self.timestamps: list[int] = []
        self.writer_sequences: list[int] = []
        self.bytes = 0
        self.first_sequence = first_sequence
        self.segment: _Open | None = None
        self.added: asyncio.Future[int] | None = None


@dataclass
class _Open:
    """A segment this writer writes (or is closing), with what it learned of it."""

    segment: Segment
    handle: LedgerHandle
    start_sequence: int
    records: int = 0
    entry_bytes: int = 0
    first_txid: int = -1
    last_txid: int = -1
    first_timestamp: int = -1
    last_timestamp: int = -1
    last_entry: int = -1
    last_slot: int = -1
    last_writer_sequence: int = -1
    created_ms: int = 0

    def closed_segment(self) -> Segment:
        return replace(
            self.segment,
            state=SegmentState.CLOSED,
            last_entry=self.last_entry,
            last_slot=self.last_slot,
            start_sequence=self.start_sequence,
            record_count=self.records,
            byte_count=self.handle.length,
            first_txid=self.first_txid,
            last_txid=self.last_txid,
            first_timestamp=self.first_timestamp,
            last_timestamp=self.last_timestamp,
            last_writer_sequence=self.last_writer_sequence,
            closed_ms=now_ms(),
        )


class LogWriter:
    """The single writer of a log (open it with ``LogNamespace.open_writer``).

    ``append`` is synchronous and cheap (no task per record): it returns a ``PendingAppend``
    to await; ``write`` appends and awaits. Records are acknowledged in order once the entry
    holding them is on Qa bookies. ``drain`` waits while too much is unacknowledged.
    """

    def __init__(
        self,
        namespace: LogNamespace,
        log_name: str,
        metadata: LogMetadata,
        current: _Open,
        *,
        writer_id: str,
        batch_bytes: int,
        flush_delay_ms: float,
        next_sequence: int,
        last_txid: int,
        last_timestamp: int,
        last_writer_sequence: int,
    ) -> None:
        self.namespace = namespace
        self.log_name = log_name
        self.metadata = metadata  # the log's value as this writer last wrote it
        self.writer_id = writer_id
        self.config = metadata.config
        self.batch_bytes = min(batch_bytes, self.config.max_entry_bytes - ENTRY_OVERHEAD)
        self.max_record_bytes = self.config.max_entry_bytes - ENTRY_OVERHEAD - RECORD_OVERHEAD
        self.flush_delay_s = flush_delay_ms / 1000
        self._loop = asyncio.get_running_loop()
        self._current = current
        self._next_sequence = next_sequence
        self._last_txid = last_txid
        self._last_timestamp = last_timestamp
        self.last_writer_sequence = last_writer_sequence  # durable or sent
        self._batch = _Batch(self._loop, next_sequence)
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: deque[_Batch] = deque()
        self._unacknowledged_bytes = 0
        self._drained: asyncio.Future[None] | None = None
        self._keepalive: asyncio.TimerHandle | None = None
        self._keepalive_due = False
        self._rolling: asyncio.Task[None] | None = None
        self._roll_from = 0  # the segment a roll under way started from
        self._roll_after = 0.0  # loop time before which no roll starts (after a failed one)
        self._roll_error: BaseException | None = None  # why the last roll changed nothing
        # entries flushed while a roll waits for the old segment: sent to the new one after
        self._held: list[tuple[_Batch, bytes]] | None = None
        self._last_acknowledged: Position | None = None  # the last record acknowledged
        self._error: BaseException | None = None
        self._closed = False
        self._ending = False  # close or end of stream under way: no roll starts any more
        self.rolls = 0

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        namespace: LogNamespace,
        log_name: str,
        *,
        writer_id: str = "",
        batch_bytes: int = 256 * 1024,
        flush_delay_ms: float = 1.0,
    ) -> LogWriter:
        """Takes the log over (fencing any previous writer). ``writer_id`` makes the writer
        idempotent: records carry its sequence numbers, and records at or below the last one
        durable in the log are not appended again (``last_writer_sequence`` tells it after
        opening). Entries are flushed at ``batch_bytes`` of records or ``flush_delay_ms`` after
        their first record."""
        if writer_id:
            check_name("writer id", writer_id)
        if batch_bytes < 1:
            raise errors.IncorrectParameterError("batch_bytes is 1 or more")
        if flush_delay_ms < 0:
            raise errors.IncorrectParameterError("flush_delay_ms is 0 or more")
        for _ in range(OPEN_ATTEMPTS):
            metadata, version = await namespace.read_log(log_name)
            wanted = metadata.config.placement
            if wanted and wanted != namespace.client.config.placement:
                raise errors.IncorrectParameterError(
                    f"log {namespace.name}/{log_name} places its ledgers with the {wanted!r} "
                    f"policy; this client uses {namespace.client.config.placement!r}: open it "
                    f"with a client made with placement={wanted!r}"
                )
            if metadata.end_of_stream:
                raise EndOfStreamError(
                    f"log {namespace.name}/{log_name} was ended (end of stream): nothing more "
                    "can be appended to it"
                )
            recovered, tail = await _recover_open_segments(namespace, metadata)
            handle = await _create_ledger(namespace, log_name, metadata.config)
            last = metadata.last_segment
            if last is not None and handle.ledger_id <= last.ledger_id:
                await _discard(namespace, handle)
                raise LogError(
                    f"log {namespace.name}/{log_name}: the cluster gave ledger id "
                    f"{handle.ledger_id}, not above the log's last ({last.ledger_id}); positions "
                    "would go back: check the metadata service's id generator"
                )
            segment = Segment(
                sequence=metadata.next_segment,
                ledger_id=handle.ledger_id,
                writer_id=writer_id,
                start_sequence=tail.next_sequence,
                created_ms=now_ms(),
            )
            updated = metadata
            for closed in recovered:
                updated = updated.replace_segment(closed).with_writer_sequence(
                    closed.writer_id, closed.last_writer_sequence
                )
            updated = replace(
                updated,
                segments=(*updated.segments, segment),
                next_segment=metadata.next_segment + 1,
            )
            try:
                version = await namespace.write_log(log_name, updated, version)
            except BadVersionError:
                log.info(
                    "log %s/%s: the segment list changed while opening; reading it again",
                    namespace.name,
                    log_name,
                )
                await _discard(namespace, handle)
                continue
            current = _Open(segment, handle, tail.next_sequence, created_ms=segment.created_ms)
            return cls(
                namespace,
                log_name,
                updated,
                current,
                writer_id=writer_id,
                batch_bytes=batch_bytes,
                flush_delay_ms=flush_delay_ms,
                next_sequence=tail.next_sequence,
                last_txid=tail.last_txid,
                last_timestamp=tail.last_timestamp,
                last_writer_sequence=updated.writer_sequence(writer_id) if writer_id else -1,
            )
        raise LogFencedError(
            f"log {namespace.name}/{log_name}: the segment list changed {OPEN_ATTEMPTS} times "
            "while this writer opened it: another writer keeps taking it over"
        )

    # -- appending -------------------------------------------------------------------------------

    @property
    def next_sequence(self) -> int:
        """The log sequence number the next appended record gets."""
        return self._next_sequence

    @property
    def ledger_id(self) -> int:
        """The ledger of the segment being written."""
        return self._current.handle.ledger_id

    def append(
        self, data: bytes, *, txid: int | None = None, sequence: int | None = None
    ) -> PendingAppend:
        """Appends a record. ``txid`` (default: the last one + 1) must increase; an idempotent
        writer's ``sequence`` (default: the last one + 1) too, and a record whose ``sequence``
        is at or below the last one appended is not appended again: its position is
        ``DUPLICATE``."""
        if self._error is not None:
            raise self._error
        if self._closed:
            raise errors.LedgerClosedError(f"this writer of log {self._where()} is closed")
        size = len(data)
        if size > self.max_record_bytes:
            self.refuse_size(size)
        if self.writer_id:
            if sequence is None:
                sequence = self.last_writer_sequence + 1
            elif sequence <= self.last_writer_sequence:
                return PendingAppend(None, 0)
            self.last_writer_sequence = sequence
        elif sequence is not None:
            raise errors.IncorrectParameterError(
                "record sequence numbers need an idempotent writer: open it with a writer_id"
            )
        if txid is None:
            txid = self._last_txid + 1
        elif txid <= self._last_txid:
            raise errors.IncorrectParameterError(
                f"transaction ids of log {self._where()} increase: {txid} after {self._last_txid}"
            )
        self._last_txid = txid
        batch = self._batch
        if batch.bytes + size + RECORD_OVERHEAD > self.batch_bytes and batch.payloads:
            self._flush()
            batch = self._batch
        slot = len(batch.payloads)
        batch.payloads.append(data)
        batch.txids.append(txid)
        if self.writer_id:
            batch.writer_sequences.append(sequence)  # type: ignore[arg-type]
        batch.bytes += size + RECORD_OVERHEAD
        self._next_sequence += 1
        if slot == 0:
            if self.flush_delay_s == 0:
                self._loop.call_soon(self._flush_timer)
            else:
                self._timer = self._loop.call_later(self.flush_delay_s, self._flush_timer)
        if batch.bytes >= self.batch_bytes:
            self._flush()
        return PendingAppend(batch, slot)

    def refuse_size(self, size: int) -> None:
        """Raises ``RecordTooLargeError`` for a record of ``size`` bytes."""
        raise RecordTooLargeError(
            f"a record of {size} bytes does not fit in an entry of log {self._where()} "
            f"(at most {self.max_record_bytes} bytes; raise the log's max_entry_bytes)"
        )

    async def write(
        self, data: bytes, *, txid: int | None = None, sequence: int | None = None
    ) -> Position:
        """Appends a record and waits until it is acknowledged."""
        return await self.append(data, txid=txid, sequence=sequence)

    async def drain(self) -> None:
        """Lets the loop run (sends, acknowledgements, timers), then waits while more than
        ``HIGH_WATER_BYTES`` of records are unacknowledged (as ``asyncio.StreamWriter.drain``);
        raises the writer's error. A producer calls it every few hundred appends."""
        await asyncio.sleep(0)
        while self._unacknowledged_bytes > HIGH_WATER_BYTES and self._error is None:
            if self._drained is None or self._drained.done():
                self._drained = self._loop.create_future()
            await self._drained
        if self._error is not None:
            raise self._error

    async def flush(self) -> Position | None:
        """Sends what is batched and waits until every record appended so far is acknowledged;
        the last record's position (None when nothing was appended)."""
        self._flush()
        last = self._held[-1][0] if self._held else self._in_flight[-1] if self._in_flight else None
        if last is not None:
            await asyncio.shield(last.future)
        if self._error is not None:
            raise self._error
        return self._last_acknowledged

    def _where(self) -> str:
        return f"{self.namespace.name}/{self.log_name}"

    def _flush_timer(self) -> None:
        self._timer = None
        if self._batch.payloads and self._error is None:
            self._flush()

    def _flush(self) -> None:
        """Sends the batch as the next entry of the current segment."""
        batch = self._batch
        if not batch.payloads or self._error is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._batch = _Batch(self._loop, self._next_sequence)
        # A record's timestamp is when its entry was sent (one clock read per entry), and
        # never goes back, whatever the clock does.
        timestamp = max(now_ms(), self._last_timestamp)
        self._last_timestamp = timestamp
        batch.timestamps = [timestamp] * len(batch.payloads)
        entry = encode_entry(
            batch.first_sequence,
            batch.txids,
            batch.timestamps,
            batch.payloads,
            self.writer_id,
            batch.writer_sequences if self.writer_id else None,
        )
        self._send(batch, entry)
        self._keepalive_due = True
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        current = self._current
        current.entry_bytes += len(entry)
        if (
            self._rolling is None
            and not self._ending
            and self._roll_due(current, timestamp)
            and self._loop.time() >= self._roll_after
        ):
            self._roll_from = current.segment.sequence
            self._rolling = asyncio.ensure_future(self._roll())

    def _send(self, batch: _Batch, entry: bytes, segment: _Open | None = None) -> None:
        if segment is None and self._held is not None:
            self._held.append((batch, entry))
            return
        current = segment or self._current
        batch.segment = current
        try:
            added = current.handle.add_entry_async(entry)
        except errors.BKError as error:
            self._fail(error)
            batch.future.set_exception(self._error or error)
            batch.future.exception()  # retrieved: the caller may not await it
            return
        batch.added = added
        self._in_flight.append(batch)
        self._unacknowledged_bytes += batch.bytes
        added.add_done_callback(self._acknowledged)

    def _acknowledged(self, _: object) -> None:
        """Completes the batches at the head whose entries are acknowledged, in order."""
        in_flight = self._in_flight
        while in_flight:
            batch = in_flight[0]
            added = batch.added
            assert added is not None
            if not added.done():
                break
            in_flight.popleft()
            self._unacknowledged_bytes -= batch.bytes
            if added.cancelled() or added.exception() is not None:
                error = (
                    errors.BKError("append cancelled") if added.cancelled() else added.exception()
                )
                self._fail(error)  # type: ignore[arg-type]
                if not batch.future.done():
                    batch.future.set_exception(self._error)  # type: ignore[arg-type]
                    batch.future.exception()
                continue
            entry_id = added.result()
            segment = batch.segment
            assert segment is not None
            count = len(batch.payloads)
            if count:
                if segment.first_txid < 0:
                    segment.first_txid = batch.txids[0]
                    segment.first_timestamp = batch.timestamps[0]
                segment.records += count
                segment.last_txid = batch.txids[-1]
                segment.last_timestamp = batch.timestamps[-1]
                segment.last_entry = entry_id
                segment.last_slot = count - 1
                self._last_acknowledged = Position(segment.handle.ledger_id, entry_id, count - 1)
                if batch.writer_sequences:
                    segment.last_writer_sequence = batch.writer_sequences[-1]
            if not batch.future.done():
                batch.future.set_result((segment.handle.ledger_id, entry_id))
        drained = self._drained
        if (
            drained is not None
            and not drained.done()
            and (self._unacknowledged_bytes <= HIGH_WATER_BYTES or self._error is not None)
        ):
            drained.set_result(None)
        if (
            not in_flight
            and not self._batch.payloads
            and self._keepalive_due
            and self._keepalive is None
            and self._error is None
            and not self._closed
        ):
            # Idle after data: one control entry makes the last data entry confirmed for
            # readers (its LAC travels on the next entry), as DistributedLog's control records.
            self._keepalive = self._loop.call_later(
                max(self.flush_delay_s, 0.001), self._send_keepalive
            )

    def _send_keepalive(self) -> None:
        self._keepalive = None
        if self._in_flight or self._batch.payloads or self._error is not None or self._closed:
            return
        self._keepalive_due = False
        self._control(0)

    def _control(self, flags: int) -> _Batch:
        """Sends a control entry (no records) to the current segment."""
        batch = _Batch(self._loop, self._next_sequence)
        self._send(batch, encode_control(flags, self._next_sequence))
        return batch

    def _fail(self, error: BaseException) -> None:
        """The writer can go on no more: every append waiting fails with this error."""
        if self._error is not None:
            return
        if isinstance(error, errors.LedgerFencedError) or (
            isinstance(error, errors.LedgerClosedError) and not self._closed
        ):
            error = LogFencedError(
                f"log {self._where()}: another writer took the log over (ledger "
                f"{self._current.handle.ledger_id} was fenced); this writer's unacknowledged "
                "appends failed: open a new writer if this process should lead"
            )
        self._error = error
        if self._timer is not None:
            self._timer.cancel()
        if self._batch.payloads:
            self._batch.future.set_exception(error)
            self._batch.future.exception()
        self._batch = _Batch(self._loop, self._next_sequence)
        for batch in [*self._in_flight, *(b for b, _ in self._held or ())]:
            if not batch.future.done():
                batch.future.set_exception(error)
                batch.future.exception()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- rolling ---------------------------------------------------------------------------------

    def _roll_due(self, current: _Open, now: int) -> bool:
        config = self.config
        return bool(
            (config.roll_bytes and current.entry_bytes >= config.roll_bytes)
            or (
                config.roll_records
                and self._next_sequence - current.start_sequence >= config.roll_records
            )
            or (config.roll_age_ms and now - current.created_ms >= config.roll_age_ms)
        )

    async def _roll(self) -> None:
        try:
            await self._roll_once()
        except (errors.MetadataUnavailableError, errors.NotEnoughBookiesError) as error:
            if self._current.segment.sequence == self._roll_from:
                # Nothing changed (no new segment yet): writing goes on in this one, and the
                # roll is tried again a while later.
                log.warning("log %s: roll failed, tried again later: %s", self._where(), error)
                self._roll_after = self._loop.time() + ROLL_RETRY_S
                self._roll_error = error
            else:
                self._fail(error)
        except BaseException as error:  # the writer fails with it
            if not isinstance(error, asyncio.CancelledError):
                log.warning("log %s: roll failed: %s", self._where(), error)
                self._fail(error)
        finally:
            self._rolling = None

    async def _roll_once(self) -> None:
        """Creates the next segment, CASes it onto the list, moves the appends to it, then
        closes the previous one once its entries are acknowledged."""
        namespace = self.namespace
        handle = await _create_ledger(namespace, self.log_name, self.config)
        old = self._current
        if handle.ledger_id <= old.handle.ledger_id:
            await _discard(namespace, handle)
            raise LogError(
                f"log {self._where()}: the cluster gave ledger id {handle.ledger_id}, not above "
                f"the log's last ({old.handle.ledger_id}); positions would go back: check the "
                "metadata service's id generator"
            )
        segment = Segment(
            sequence=0,  # set in the transform
            ledger_id=handle.ledger_id,
            writer_id=self.writer_id,
            created_ms=now_ms(),
        )
        added: list[Segment] = []

        def add(metadata: LogMetadata) -> LogMetadata:
            self._check_owner(metadata, old.segment)
            new = replace(segment, sequence=metadata.next_segment)
            added[:] = [new]
            return replace(
                metadata,
                segments=(*metadata.segments, new),
                next_segment=metadata.next_segment + 1,
            )

        try:
            self.metadata, _ = await namespace.update_log(self.log_name, lambda _: True, add)
        except errors.MetadataUnavailableError:
            # The store may have applied the write before failing (ZooKeeper: "outcome
            # unknown"): the list says.
            found = await self._segment_of(handle.ledger_id)
            if found is None:
                await _discard(namespace, handle)
                raise
            added[:] = [found]
        except BaseException:
            await _discard(namespace, handle)
            raise
        if self._error is not None or self._closed:
            return
        # Switch. The last batch goes to the old segment; what is flushed from now on is held
        # until every entry of the old segment is acknowledged, and only then sent to the new
        # one: an entry of the old segment that fails fails the writer before anything of the
        # new one is sent, so the log never holds a later record without an earlier one.
        self._flush()
        self._held = []
        self._current = _Open(added[0], handle, self._next_sequence, created_ms=added[0].created_ms)
        self.rolls += 1
        try:
            await self._settled(old)
            # The marker ends the old segment for tailing readers; it goes before the held
            # entries of the new one in the order acknowledgements complete.
            self._send_to(old, encode_control(EntryFlags.END_OF_SEGMENT, self._segment_end(old)))
        finally:
            held, self._held = self._held, None
            if self._error is None:
                for batch, entry in held:
                    self._send(batch, entry)
        await self._close_segment(old, 0, marked=True)
        await self._retention()

    async def _segment_of(self, ledger_id: int) -> Segment | None:
        """The segment of ``ledger_id`` in the list as stored (None if not there), read
        again while the store fails."""
        pauses = backoff(*CLOSE_RETRY_S)
        for _ in range(CLOSE_ATTEMPTS):
            try:
                metadata, _ = await self.namespace.read_log(self.log_name)
            except errors.MetadataUnavailableError:
                await asyncio.sleep(next(pauses))
                continue
            return next((s for s in metadata.segments if s.ledger_id == ledger_id), None)
        return None

    async def _close_segment(self, old: _Open, flags: int, *, marked: bool = False) -> None:
        """Ends a segment that receives no more appends: a control entry marks its end for
        tailing readers (unless ``marked`` already) and, once it is acknowledged, a second one
        makes it confirmed (the LAC an entry carries covers the entries acknowledged before
        it); the ledger is closed and the list records the segment as closed. A metadata store
        that fails on the way is asked again (the writer goes on in its new segment)."""
        if not marked:
            self._send_to(old, encode_control(flags, self._segment_end(old)))
        await self._settled(old)
        self._send_to(old, encode_control(0, self._segment_end(old)))
        await self._settled(old)
        handle: ReadHandle = old.handle
        pauses = backoff(*CLOSE_RETRY_S)
        for attempt in range(CLOSE_ATTEMPTS):
            try:
                if attempt == 0:
                    await old.handle.close()
                elif not handle.is_closed:
                    # its close did not reach the store: recovery closes it at the same entry
                    # (every entry of it was acknowledged)
                    handle = await self.namespace.open_ledger(old.handle.ledger_id, recover=True)
                closed = replace(old.closed_segment(), byte_count=handle.length)

                def close(metadata: LogMetadata, closed: Segment = closed) -> LogMetadata:
                    stored = metadata.segment(closed.sequence) or closed
                    # a truncation inside the segment since it was opened is kept
                    closed = replace(closed, min_entry=stored.min_entry, min_slot=stored.min_slot)
                    return metadata.replace_segment(closed).with_writer_sequence(
                        closed.writer_id, closed.last_writer_sequence
                    )

                self.metadata, _ = await self.namespace.update_log(
                    self.log_name,
                    lambda metadata, closed=closed: (
                        (  # type: ignore[misc]
                            metadata.segment(closed.sequence) or closed
                        ).is_open
                    ),
                    close,
                )
                return
            except (errors.MetadataUnavailableError, errors.MetadataVersionError) as error:
                log.info(
                    "log %s: closing segment %d: %s; again",
                    self._where(),
                    old.segment.sequence,
                    error,
                )
                await asyncio.sleep(next(pauses))
        raise errors.MetadataUnavailableError(
            f"log {self._where()}: could not record segment {old.segment.sequence} as closed "
            f"after {CLOSE_ATTEMPTS} attempts: the metadata store keeps failing"
        )

    async def _settled(self, segment: _Open) -> None:
        """Waits until everything sent to ``segment`` is acknowledged; raises the writer's
        error."""
        pending = [b.future for b in self._in_flight if b.segment is segment]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._error is not None:
            raise self._error

    def _segment_end(self, old: _Open) -> int:
        return (
            old.start_sequence
            + sum(len(b.payloads) for b in self._in_flight if b.segment is old)
            + old.records
        )

    def _send_to(self, segment: _Open, entry: bytes) -> None:
        """A control entry to ``segment`` (which may no longer be the current one)."""
        self._send(_Batch(self._loop, self._next_sequence), entry, segment)

    def _check_owner(self, metadata: LogMetadata, mine: Segment) -> None:
        """Raises ``LogFencedError`` unless this writer's segment is still the last one."""
        last = metadata.last_segment
        if last is None or last.ledger_id != mine.ledger_id or not last.is_open:
            raise LogFencedError(
                f"log {self._where()}: another writer took the log over (its segment list no "
                f"longer ends with this writer's ledger {mine.ledger_id})"
            )

    async def _retention(self) -> None:
        config = self.config
        if not (config.retention_age_ms or config.retention_bytes):
            return
        try:
            await self.namespace.apply_retention(self.log_name)
        except (errors.BKError, OSError) as error:
            log.warning(
                "log %s: retention failed (the next roll tries again): %s", self._where(), error
            )

    async def roll(self) -> None:
        """Rolls to a new segment now (as the roll policy does by itself); raises what stopped
        it (the writer goes on in its segment when nothing changed)."""
        if self._rolling is None:
            self._roll_from = self._current.segment.sequence
            self._roll_error = None
            self._rolling = asyncio.ensure_future(self._roll())
        await asyncio.shield(self._rolling)
        if self._error is not None:
            raise self._error
        if self._roll_error is not None:
            raise self._roll_error

    # -- ending ----------------------------------------------------------------------------------

    async def close(self) -> None:
        """Flushes, waits for every append, closes the segment's ledger and records it in the
        list. The log stays open for the next writer."""
        await self._end(0)

    async def mark_end_of_stream(self) -> None:
        """Ends the log for good: what was appended is flushed, an end-of-stream marker is
        written (tailing readers stop there) and no writer can append to the log again."""
        await self._end(EntryFlags.END_OF_STREAM)

    async def _end(self, flags: int) -> None:
        if self._closed:
            return
        self._ending = True
        self._flush()
        if self._rolling is not None:
            await asyncio.gather(self._rolling, return_exceptions=True)
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        self._closed = True
        try:
            if self._error is not None:
                raise self._error
            current = self._current
            if flags & EntryFlags.END_OF_STREAM:
                # The log is ended in the store first, by a CAS that checks this writer still
                # owns it: a writer taking over meanwhile either fenced this one first (the CAS
                # fails) or finds the log ended (its open fails). Only then does the marker go
                # into the ledger, for tailing readers to stop at.
                await self._settled(current)

                def end(metadata: LogMetadata) -> LogMetadata:
                    self._check_owner(metadata, current.segment)
                    return replace(metadata, end_of_stream=True)

                self.metadata, _ = await self.namespace.update_log(
                    self.log_name, lambda metadata: not metadata.end_of_stream, end
                )
            try:
                await self._close_segment(current, flags | EntryFlags.END_OF_SEGMENT)
            except (LogFencedError, errors.LedgerFencedError):
                if not flags & EntryFlags.END_OF_STREAM:
                    raise
                # Ended, and a writer that opened meanwhile (and then found the log ended)
                # fenced the segment: it is closed; the list is told what recovery found.
                closed = await recover_segment(
                    self.namespace, current.segment, current.start_sequence
                )
                await self.namespace.update_log(
                    self.log_name,
                    lambda metadata: (metadata.segment(closed.sequence) or closed).is_open,
                    lambda metadata: metadata.replace_segment(closed),
                )
        finally:
            if not self._current.handle._closed:
                try:
                    await self._current.handle.close()
                except errors.BKError as error:
                    log.debug("log %s: closing the ledger: %s", self._where(), error)


@dataclass(frozen=True, slots=True)
class _Tail:
    next_sequence: int
    last_txid: int
    last_timestamp: int


async def _create_ledger(namespace: LogNamespace, log_name: str, config: LogConfig) -> LedgerHandle:
    """A new ledger for a segment of the log, with the log's parameters and its name in the
    ledger's custom metadata."""
    return await namespace.client.create_ledger(
        config.ensemble_size,
        config.write_quorum_size,
        config.ack_quorum_size,
        config.digest_type,
        namespace.password,
        {LOG_LEDGER_PROPERTY: f"{namespace.name}/{log_name}".encode()},
    )


async def _discard(namespace: LogNamespace, handle: LedgerHandle) -> None:
    """Deletes a ledger this writer created and could not add to the list."""
    try:
        await handle.close()
        await namespace.client.delete_ledger(handle.ledger_id)
    except errors.BKError as error:
        log.warning("ledger %d: could not delete it (%s): it is unused", handle.ledger_id, error)


async def _recover_open_segments(
    namespace: LogNamespace, metadata: LogMetadata
) -> tuple[list[Segment], _Tail]:
    """Fences and recovers every segment the list says is open (the previous writer's last
    one, and the one before when it was rolling), and returns them closed with what their
    entries tell, with the tail of the log after them."""
    next_sequence = metadata.base_sequence
    last_txid, last_timestamp = metadata.base_txid, metadata.base_timestamp
    recovered = []
    for segment in metadata.segments:
        if segment.is_open:
            segment = await recover_segment(namespace, segment, next_sequence)
            recovered.append(segment)
        if segment.state == SegmentState.TRUNCATED and segment.start_sequence < 0:
            continue
        if segment.start_sequence >= 0:
            next_sequence = max(next_sequence, segment.end_sequence)
        if segment.last_txid >= 0:
            last_txid = max(last_txid, segment.last_txid)
        if segment.last_timestamp >= 0:
            last_timestamp = max(last_timestamp, segment.last_timestamp)
    return recovered, _Tail(next_sequence, last_txid, last_timestamp)


async def recover_segment(namespace: LogNamespace, segment: Segment, start: int) -> Segment:
    """Closes an open segment from its ledger: opening the ledger with recovery fences its
    writer; the first and last data entries give the counts, ids and times."""
    try:
        handle = await namespace.open_ledger(segment.ledger_id, recover=True)
    except errors.NoSuchLedgerError:
        log.warning("segment %d: its ledger %d is gone", segment.sequence, segment.ledger_id)
        return replace(segment, state=SegmentState.TRUNCATED)
    try:
        return await _closed_from_ledger(handle, segment, start)
    finally:
        await handle.close()


async def _closed_from_ledger(handle: ReadHandle, segment: Segment, start: int) -> Segment:
    last_entry = handle.last_add_confirmed
    closed = replace(
        segment,
        state=SegmentState.CLOSED,
        start_sequence=start,
        byte_count=handle.length,
        closed_ms=now_ms(),
    )
    if last_entry < 0:
        return closed
    first = await data_entry(handle, 0, last_entry, 1, segment)
    if first is None:  # control entries only
        head = decode_entry((await handle.read_entry(0)).data, "entry 0", segment)
        return replace(closed, start_sequence=head.first_sequence)
    first_id, first_entry = first
    last = await data_entry(handle, last_entry, first_id, -1, segment)
    assert last is not None
    last_id, last_decoded = last
    count = len(last_decoded.payloads)
    return replace(
        closed,
        start_sequence=first_entry.first_sequence,
        record_count=last_decoded.first_sequence + count - first_entry.first_sequence,
        last_entry=last_id,
        last_slot=count - 1,
        first_txid=first_entry.txids[0],
        first_timestamp=first_entry.timestamps[0],
        last_txid=last_decoded.txids[-1],
        last_timestamp=last_decoded.timestamps[-1],
        last_writer_sequence=(
            last_decoded.writer_sequences[-1] if last_decoded.writer_sequences else -1
        ),
    )


async def commit_ledgers(
    namespace: LogNamespace,
    log_name: str,
    ledgers: list[WrittenLedger],
    *,
    writer_id: str,
    writer_sequence: int,
    overwrite: bool = False,
) -> bool:
    """Appends closed ledgers of RELATIVE entries to a log in one compare-and-swap, as
    segments in the order of their ledger ids (positions compare by ledger id): a Spark job's
    commit. As a writer's open, it first fences and recovers the segments the list says are
    open (a live writer of the log is fenced). Each ledger's records get the next sequence
    numbers; transaction ids and timestamps its writer did not give get the next ids and the
    commit's time. ``writer_id`` and ``writer_sequence`` (a job, or a streaming query and its
    batch) make it idempotent: False, and nothing changes, when they were committed before.
    With ``overwrite`` the log's segments are truncated in the same swap (their ledgers deleted
    after it), so readers see the old content or the new, never both."""
    check_name("writer id", writer_id)
    where = f"{namespace.name}/{log_name}"
    for _ in range(OPEN_ATTEMPTS):
        metadata, version = await namespace.read_log(log_name)
        if metadata.end_of_stream:
            raise EndOfStreamError(f"log {where} was ended (end of stream): nothing can be added")
        if metadata.writer_sequence(writer_id) >= writer_sequence:
            return False
        recovered, tail = await _recover_open_segments(namespace, metadata)
        updated = metadata
        for closed in recovered:
            updated = updated.replace_segment(closed).with_writer_sequence(
                closed.writer_id, closed.last_writer_sequence
            )
        if overwrite:
            updated = replace(
                updated,
                segments=tuple(replace(s, state=SegmentState.TRUNCATED) for s in updated.segments),
            )
        last_ledger = max((s.ledger_id for s in metadata.segments), default=-1)
        next_sequence, last_txid = tail.next_sequence, tail.last_txid
        last_timestamp = tail.last_timestamp
        committed_ms = max(now_ms(), last_timestamp)
        added: list[Segment] = []
        for ledger in sorted(ledgers, key=lambda written: written.ledger_id):
            if ledger.ledger_id <= last_ledger:
                raise LogError(
                    f"log {where}: ledger {ledger.ledger_id} was written before ledger "
                    f"{last_ledger} joined the log (another writer added a segment meanwhile); "
                    "positions would go back: write again"
                )
            count = ledger.record_count
            first_txid = ledger.first_txid if ledger.first_txid >= 0 else last_txid + 1
            final_txid = ledger.last_txid if ledger.first_txid >= 0 else first_txid + count - 1
            if first_txid <= last_txid:
                raise errors.IncorrectParameterError(
                    f"log {where}: transaction ids increase across the log; ledger "
                    f"{ledger.ledger_id} starts at {first_txid}, after {last_txid}: order the "
                    "rows by transaction id within and across partitions, or leave the ids to "
                    "the log"
                )
            first_stamp = ledger.first_timestamp
            final_stamp = ledger.last_timestamp
            if first_stamp < 0:
                first_stamp = final_stamp = committed_ms
            elif first_stamp < last_timestamp:
                raise errors.IncorrectParameterError(
                    f"log {where}: timestamps never go back in a log; ledger {ledger.ledger_id} "
                    f"starts at {first_stamp}, after {last_timestamp}: order the rows by "
                    "timestamp, or leave the timestamps to the log"
                )
            added.append(
                Segment(
                    sequence=updated.next_segment + len(added),
                    ledger_id=ledger.ledger_id,
                    state=SegmentState.CLOSED,
                    writer_id=writer_id,
                    last_entry=ledger.last_entry if count else -1,
                    last_slot=ledger.last_slot if count else -1,
                    start_sequence=next_sequence,
                    record_count=count,
                    byte_count=ledger.byte_count,
                    first_txid=first_txid if count else -1,
                    last_txid=final_txid if count else -1,
                    first_timestamp=first_stamp if count else -1,
                    last_timestamp=final_stamp if count else -1,
                    last_writer_sequence=writer_sequence,
                    created_ms=committed_ms,
                    closed_ms=committed_ms,
                )
            )
            last_ledger = ledger.ledger_id
            next_sequence += count
            if count:
                last_txid, last_timestamp = final_txid, final_stamp
        updated = replace(
            updated,
            segments=(*updated.segments, *added),
            next_segment=updated.next_segment + len(added),
        ).with_writer_sequence(writer_id, writer_sequence)
        try:
            await namespace.write_log(log_name, updated, version)
        except BadVersionError:
            log.info("log %s: the segment list changed while committing; again", where)
            continue
        if overwrite:
            await namespace._delete_truncated(log_name, updated)
        return True
    raise LogFencedError(
        f"log {where}: the segment list changed {OPEN_ATTEMPTS} times while committing: "
        "another writer keeps changing it"
    )
