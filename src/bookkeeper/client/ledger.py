"""Ledger handles of the asyncio client: writing (ordered acks), closing, reading, recovery.

The decisions come from ``bookkeeper.core`` (write sets, ack quorums, coverage, the negative
rule); this module sends the requests and feeds the answers back.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bookkeeper import errors
from bookkeeper.client.connection import BookieConnection, Callback, describe, status_error
from bookkeeper.core.lac import LastConfirmedRead, ReadRequest
from bookkeeper.core.metadata import LedgerMetadata, LedgerState
from bookkeeper.core.quorum import write_set
from bookkeeper.core.writer import PendingAdds
from bookkeeper.wire.digest import DigestManager, Entry, master_key, peek_header
from bookkeeper.wire.status import StatusCode

if TYPE_CHECKING:
    from bookkeeper.client.client import BookKeeper

log = logging.getLogger(__name__)

READ_WINDOW = 128  # entries read concurrently by a range read


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """An entry read from a ledger."""

    ledger_id: int
    entry_id: int
    data: bytes

    @property
    def length(self) -> int:
        return len(self.data)


class ReadHandle:
    """A handle for reading a ledger (opened with or without recovery)."""

    def __init__(self, client: BookKeeper, metadata: LedgerMetadata, password: bytes) -> None:
        self._client = client
        self.metadata = metadata
        self._digest = DigestManager(metadata.ledger_id, metadata.digest_type, password)
        self._master_key = master_key(password)
        self.last_add_confirmed = metadata.last_entry_id if metadata.is_closed else -1
        self.length = metadata.length if metadata.is_closed else 0
        self._closed = False

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def is_closed(self) -> bool:
        """Whether the ledger is closed in the metadata this handle knows."""
        return self.metadata.is_closed

    # -- single-request helpers ----------------------------------------------------------------

    async def _request(
        self, bookie_id: str, send: Callable[[BookieConnection, Callback], None]
    ) -> tuple[StatusCode, bytes]:
        """One request to one bookie (``send`` issues it with the answer callback); connection
        and timeout failures raise."""
        connection = await self._client.pool.get(bookie_id)
        future: asyncio.Future[tuple[StatusCode, bytes]] = (
            asyncio.get_running_loop().create_future()
        )

        def answered(status: StatusCode | None, body: bytes | errors.BKError) -> None:
            if future.done():
                return
            if status is None:
                assert isinstance(body, errors.BKError)
                future.set_exception(body)
            else:
                assert isinstance(body, bytes)
                future.set_result((status, body))

        send(connection, answered)
        return await future

    async def _read_from(
        self, bookie_id: str, entry_id: int, fence: bool
    ) -> tuple[StatusCode, bytes]:
        key = self._master_key if fence else None
        return await self._request(
            bookie_id,
            lambda connection, answered: connection.read(
                self.ledger_id, entry_id, fence, key, answered
            ),
        )

    # -- reads ---------------------------------------------------------------------------------

    async def read_entry_from_replicas(self, entry_id: int) -> Entry:
        """Reads ``entry_id`` from the replicas of its write set in order, the next on any failure."""
        ensemble = self.metadata.ensemble_at(entry_id)
        problems: list[str] = []
        negatives = 0
        members = write_set(entry_id, self.metadata.ensemble_size, self.metadata.write_quorum_size)
        for index in members:
            bookie = ensemble[index]
            try:
                status, body = await self._read_from(bookie, entry_id, fence=False)
            except errors.BKError as error:
                problems.append(f"{bookie}: {error}")
                continue
            if status == StatusCode.EOK:
                try:
                    return self._digest.verify(body, entry_id)
                except errors.DigestMismatchError as error:
                    problems.append(f"{bookie}: {error}")
                    continue
            if status in (StatusCode.ENOENTRY, StatusCode.ENOLEDGER):
                negatives += 1
            problems.append(f"{bookie}: {status.name}")
        if negatives == len(members):
            raise errors.NoSuchEntryError(
                f"ledger {self.ledger_id} entry {entry_id}: no replica has it ({'; '.join(problems)})"
            )
        raise errors.ReadError(
            f"ledger {self.ledger_id} entry {entry_id}: no replica could serve it ({'; '.join(problems)})"
        )

    async def _read_range(self, first: int, last: int) -> list[LedgerEntry]:
        if first < 0 or last < first:
            raise errors.IncorrectParameterError(
                f"bad entry range [{first}, {last}] for ledger {self.ledger_id}"
            )
        self._check_open()
        results: list[LedgerEntry | None] = [None] * (last - first + 1)
        semaphore = asyncio.Semaphore(READ_WINDOW)

        async def one(entry_id: int) -> None:
            async with semaphore:
                entry = await self.read_entry_from_replicas(entry_id)
                results[entry_id - first] = LedgerEntry(self.ledger_id, entry_id, entry.payload)

        tasks = [asyncio.ensure_future(one(entry_id)) for entry_id in range(first, last + 1)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        return [entry for entry in results if entry is not None]

    async def read_entries(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first``..``last`` (inclusive); only up to the last add confirmed."""
        if last > self.last_add_confirmed:
            raise errors.NoSuchEntryError(
                f"ledger {self.ledger_id}: entry {last} is beyond the last add confirmed "
                f"({self.last_add_confirmed}); use read_unconfirmed_entries to read past it"
            )
        return await self._read_range(first, last)

    async def read_unconfirmed_entries(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first``..``last`` even past the LAC (they may not be durable on Qa bookies)."""
        return await self._read_range(first, last)

    async def read_last_add_confirmed(self) -> int:
        """The largest LAC any bookie of the last ensemble has seen, read until the ensemble is
        covered (no fencing); also advances this handle's LAC."""
        if self.metadata.is_closed:
            return self.last_add_confirmed
        lac = await self._last_confirmed()
        if lac > self.last_add_confirmed:
            self.last_add_confirmed = lac
        return self.last_add_confirmed

    async def _last_confirmed(self) -> int:
        """The largest LAC piggybacked on the last entries of the last ensemble's bookies, read
        until the ensemble is covered (``core.lac``), without fencing."""
        read = LastConfirmedRead(self.metadata, fence=False)

        async def ask(request: ReadRequest) -> tuple[int, StatusCode | None, Entry | None, str]:
            try:
                status, body = await self._read_from(
                    request.bookie, request.entry_id, request.fence
                )
            except errors.BKError as error:
                return request.bookie_index, None, None, f"{request.bookie}: {error}"
            if status != StatusCode.EOK:
                return (
                    request.bookie_index,
                    status,
                    None,
                    f"{request.bookie}: {describe(status, body)}",
                )
            try:
                entry = self._digest.verify(body, peek_header(body)[1])
            except (ValueError, errors.DigestMismatchError) as error:
                return request.bookie_index, None, None, f"{request.bookie}: {error}"
            return request.bookie_index, status, entry, ""

        pending = {asyncio.ensure_future(ask(request)) for request in read.start()}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    outcome = read.on_answer(*task.result())
                    if outcome is not None:
                        return outcome.lac
        finally:
            for task in pending:
                task.cancel()
        raise errors.LedgerRecoveryError(f"ledger {self.ledger_id}: the LAC read did not end")

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ClientClosedError(f"handle of ledger {self.ledger_id} is closed")

    async def close(self) -> None:
        """Releases the handle (a read handle changes nothing in the ledger)."""
        self._closed = True


class LedgerHandle(ReadHandle):
    """The single writer of a ledger: adds are acknowledged in entry-id order after Qa acks."""

    def __init__(self, client: BookKeeper, metadata: LedgerMetadata, password: bytes) -> None:
        super().__init__(client, metadata, password)
        self.last_add_confirmed = -1
        self.length = 0  # bytes of the confirmed entries
        self._pushed_length = 0  # bytes of every entry sent, confirmed or not
        self._pending = PendingAdds(
            metadata.ensemble_size, metadata.write_quorum_size, metadata.ack_quorum_size
        )
        self._futures: dict[int, asyncio.Future[int]] = {}
        self._connecting: set[asyncio.Future[None]] = set()
        self._error: errors.BKError | None = None
        # BookKeeper's client throttle: at most this many adds sent and not yet acknowledged; the
        # rest wait here (already numbered and packaged) and go out as acks free permits.
        self._throttle = client.throttle
        self._in_flight = 0
        self._waiting: collections.deque[tuple[int, bytes, list[int]]] = collections.deque()

    @property
    def last_add_pushed(self) -> int:
        return self._pending.last_add_pushed

    def add_entry_async(self, data: bytes) -> asyncio.Future[int]:
        """Sends ``data`` as the next entry; the future gives its entry id once acknowledged."""
        if self._closed:
            raise errors.LedgerClosedError(f"ledger {self.ledger_id} is closed by this writer")
        if self._error is not None:
            raise self._error
        data = bytes(data)
        add = self._pending.push(len(data))
        self._pushed_length += len(data)
        entry_id = add.entry_id
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._futures[entry_id] = future
        entry = self._digest.package(
            entry_id, self._pending.last_add_confirmed, self._pushed_length, data
        )
        if self._in_flight < self._throttle:
            self._send_entry(entry_id, entry, add.write_set)
        else:
            self._waiting.append((entry_id, entry, add.write_set))
        return future

    def _send_entry(self, entry_id: int, entry: bytes, write_set: list[int]) -> None:
        self._in_flight += 1
        ensemble = self.metadata.ensemble_at(entry_id)
        for index in write_set:
            self._send_add(ensemble[index], index, entry_id, entry, recovery=False)

    async def add_entry(self, data: bytes) -> int:
        """Adds ``data`` and returns its entry id once Qa bookies made it durable."""
        return await self.add_entry_async(data)

    def _send_add(
        self, bookie_id: str, index: int, entry_id: int, entry: bytes, recovery: bool
    ) -> None:
        def answered(status: StatusCode | None, body: bytes | errors.BKError) -> None:
            self._on_add_answer(bookie_id, index, entry_id, status, body)

        connection = self._client.pool.ready(bookie_id)
        if connection is not None:
            connection.add(self.ledger_id, entry_id, self._master_key, entry, recovery, answered)
            return

        async def connect_then_send() -> None:
            try:
                connection = await self._client.pool.get(bookie_id)
            except errors.BKError as error:
                answered(None, error)
                return
            connection.add(self.ledger_id, entry_id, self._master_key, entry, recovery, answered)

        task = asyncio.ensure_future(connect_then_send())
        self._connecting.add(task)  # keep a reference until it ran (asyncio holds tasks weakly)
        task.add_done_callback(self._connecting.discard)

    def _on_add_answer(
        self,
        bookie_id: str,
        index: int,
        entry_id: int,
        status: StatusCode | None,
        body: bytes | errors.BKError,
    ) -> None:
        if self._error is not None:
            return
        if status == StatusCode.EOK:
            for add in self._pending.on_ack(entry_id, index):
                self.last_add_confirmed = add.entry_id
                self.length += add.payload_length
                self._in_flight -= 1
                future = self._futures.pop(add.entry_id, None)
                if future is not None and not future.done():
                    future.set_result(add.entry_id)
            while self._waiting and self._in_flight < self._throttle:
                self._send_entry(*self._waiting.popleft())
            return
        if status is None:
            assert isinstance(body, errors.BKError)
            error = body
        else:
            error = status_error(
                status, bookie_id, f"add of ledger {self.ledger_id} entry {entry_id}"
            )
        if isinstance(error, errors.LedgerFencedError | errors.UnauthorizedAccessError):
            self._fail(error)
            return
        if not self._pending.on_failure(entry_id, index):
            # No ensemble change yet (issue 6): an entry that cannot reach Qa fails the writer.
            self._fail(
                errors.WriteError(
                    f"ledger {self.ledger_id} entry {entry_id} cannot reach its ack quorum "
                    f"(Qa={self.metadata.ack_quorum_size}): {error}"
                )
            )

    def _fail(self, error: errors.BKError) -> None:
        """Fails every pending add (sent or waiting for a permit); the handle takes no more adds."""
        self._waiting.clear()
        if self._error is None:
            self._error = error
            log.warning("ledger %d writer failed: %s", self.ledger_id, error)
        for add in self._pending.drain():
            future = self._futures.pop(add.entry_id, None)
            if future is not None and not future.done():
                future.set_exception(error)

    async def close(self) -> None:
        """Closes the ledger: pending adds fail, then the metadata is CAS-ed to CLOSED at the LAC."""
        if self._closed:
            return
        self._closed = True
        if len(self._pending):
            self._fail(
                errors.LedgerClosedError(
                    f"ledger {self.ledger_id} was closed with this add pending"
                )
            )
        last_entry = self.last_add_confirmed
        length = self.length

        def needs_change(current: LedgerMetadata) -> bool:
            if current.state == LedgerState.CLOSED:
                if current.last_entry_id == last_entry and current.length == length:
                    return False
                raise errors.MetadataVersionError(
                    f"ledger {self.ledger_id} was closed by someone else at entry {current.last_entry_id} "
                    f"(length {current.length}) while this writer had {last_entry} (length {length}) confirmed"
                )
            if current.state == LedgerState.IN_RECOVERY:
                raise errors.LedgerFencedError(
                    f"ledger {self.ledger_id} is being recovered by another client"
                )
            return True

        self.metadata, _ = await asyncio.to_thread(
            self._client.metadata.update_ledger_metadata,
            self.ledger_id,
            needs_change,
            lambda current: current.closed_at(last_entry, length),
        )
