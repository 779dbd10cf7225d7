"""Ledger handles of the asyncio client: writing (ordered acks), closing, reading, recovery.

The decisions come from ``bookkeeper_py.core`` (write sets, ack quorums, coverage, the negative
rule); this module sends the requests and feeds the answers back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Iterable,
    Sequence,
)
from dataclasses import replace
from functools import partial
from itertools import accumulate
from typing import TYPE_CHECKING, NamedTuple, Self

from bookkeeper_py import errors
from bookkeeper_py.client.client_metrics import timed
from bookkeeper_py.client.connection import (
    AddSink,
    BatchSink,
    BookieConnection,
    Callback,
    ReadSink,
    describe,
    status_error,
)
from bookkeeper_py.core.lac import NEGATIVE_ANSWERS, LastConfirmedRead, ReadRequest
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.core.quorum import negative_threshold, write_set
from bookkeeper_py.core.reader import (
    READ_WINDOW,
    LastConfirmedAndEntryRead,
    LongPoll,
    RangeRead,
    ReadAttempt,
    ReadConfirmed,
    ReadSend,
    SendBatch,
    SendStripe,
    Tail,
    TailEnded,
    answered_at_all,
)
from bookkeeper_py.core.writer import (
    ChangeEnsemble,
    Completed,
    Failed,
    Force,
    Forced,
    Instruction,
    LedgerWriter,
    SendAdds,
    WriteLac,
    change_ensemble,
    close_needed,
)
from bookkeeper_py.metadata.port import update_ledger_metadata
from bookkeeper_py.speedups import native
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.digest import DigestManager, DigestType, Entry, master_key
from bookkeeper_py.wire.errors import MalformedMessageError
from bookkeeper_py.wire.status import StatusCode, from_v2

if TYPE_CHECKING:
    from bookkeeper_py.client.client import BookKeeper

log = logging.getLogger(__name__)

# Ledgers with E = Qw are read in BATCH_READ_ENTRY requests (v2), as BookKeeper's batch reads:
BATCH_BYTES = 4 * 1024 * 1024  # answer size asked for (the bookie cuts to its frame limit)
# A long poll that no bookie could wait on (none holds the ledger yet) is asked again after this
# pause, doubled each time up to the maximum, within the caller's timeout.
UNKNOWN_LEDGER_PAUSE_S = 0.05
UNKNOWN_LEDGER_MAX_PAUSE_S = 1.0
# A loop pass's adds go out at its end, together; a long pass (hundreds of answers completing
# as many adds, whose callbacks add the next ones) sends them in slices of this many as they come,
# so that the bookies work on one slice while the client takes the rest of the pass. At once, they
# and the client took turns. 3/2/2 with 1,000 in flight, 3 runs each: 100 B 97,000-142,000
# adds/s without slices, 110,000-146,000 with 256, 148,000-156,000 with 512; 1 KiB 67,000-86,000,
# 78,000-89,000, 90,000-94,000. Slices of 128 made the bookies' journal groups small.
SEND_SLICE_ADDS = 512
# Adds that answers' callbacks called are sent as those callbacks end, not at the end of the pass,
# while the writer has at most this many outstanding: a writer with one add in flight waited a loop
# pass (the next poll of the loop and the other callbacks due) between an add's acknowledgement and
# its next add's send, for batching that few adds do not need. Many outstanding: the pass's adds
# still go together.
SEND_AT_ONCE_MAX_PENDING = 8


def _changed(
    current: LedgerMetadata,
    first_entry: int,
    based_on: tuple[int, tuple[str, ...]],
    ensemble: tuple[str, ...],
) -> LedgerMetadata:
    updated = change_ensemble(current, first_entry, based_on, ensemble)
    assert updated is not None, "only called when the change is still to be made"
    return updated


class LedgerEntry(NamedTuple):
    """An entry read from a ledger: immutable, its fields by name (``entry.data``) or position.

    A named tuple, not a frozen dataclass: a catch-up read makes one per entry, and a frozen
    dataclass's ``__init__`` (a Python function setting each field through ``object.__setattr__``)
    cost ~1.2 µs of the client's ~7 µs per entry read; the read paths make these with one C call
    (``_new_entry``)."""

    ledger_id: int
    entry_id: int
    data: bytes

    @property
    def length(self) -> int:
        return len(self.data)


# One bookie's answers to a striped read, CRC32C entries checked and kept in one C pass; a batch
# read's answer checked and made entries in one.
_stripe_answers = native.stripe_answers if native is not None else None
_batch_entries = native.crc32c_batch_entries if native is not None else None
_group_adds = native.group_adds if native is not None else None
_complete_adds = native.complete_adds if native is not None else None
# An add's callback (``add_entry_callback``): called with the entry id and None once the add is
# acknowledged, or with the error that failed it.
AddCallback = Callable[[int, "errors.BKError | None"], None]
# LedgerEntry(ledger_id, entry_id, data) without the named tuple's Python-level __new__.
_NewEntry = Callable[[type[LedgerEntry], tuple[int, int, bytes]], LedgerEntry]
_new_entry: _NewEntry = tuple.__new__


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
        self._tasks: set[asyncio.Future[None]] = set()  # connects, long polls, metadata work
        # (fragment start, entry % E) -> (that fragment's ensemble, its replicas in read order)
        self._replica_cache: dict[
            tuple[int, int], tuple[tuple[str, ...], list[tuple[int, str]]]
        ] = {}

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def client(self) -> BookKeeper:
        """The client this handle belongs to."""
        return self._client

    @property
    def digest(self) -> DigestManager:
        """Packages and verifies this ledger's entries (its digest type and password)."""
        return self._digest

    @property
    def master_key(self) -> bytes:
        """The key bookies check on fencing reads and adds (derived from the password)."""
        return self._master_key

    @property
    def is_closed(self) -> bool:
        """Whether the ledger is closed in the metadata this handle knows."""
        return self.metadata.is_closed

    def _learned_lac(self, lac: int) -> None:
        """A LAC bookies told this reader (BookKeeper's ``updateLastConfirmed``): the handle's
        LAC moves up to it; with the client's metrics, a LAC update hit if it did, a miss if
        not."""
        stats = self._client.stats
        if lac > self.last_add_confirmed:
            self.last_add_confirmed = lac
            if stats is not None:
                stats.lac_update_hits.inc()
        elif stats is not None:
            stats.lac_update_misses.inc()

    def _digest_mismatch(self) -> None:
        """An entry read came back with a digest that does not match (READ_ENTRY_DM)."""
        if self._client.stats is not None:
            self._client.stats.read_digest_mismatches.inc()

    # -- single-request helpers ----------------------------------------------------------------

    async def _read_from(
        self, bookie_id: str, entry_id: int, fence: bool
    ) -> tuple[StatusCode, bytes]:
        return await self._client.bookie_client.read_entry(
            bookie_id, self.ledger_id, entry_id, fence=fence, master_key=self._master_key
        )

    async def read_stored_entry(
        self, entry_id: int, exclude: Collection[str] = (), last: Collection[str] = ()
    ) -> bytes:
        """Entry ``entry_id`` exactly as bookies store it (ids, LAC, length, digest, payload),
        from the first replica of its write set outside ``exclude`` that serves it with a good
        digest (those in ``last`` asked after the others): what a bookie copies to repair or
        re-replicate its own copy. Each request ends by the request timeout; ``ReadError``
        names every replica's failure."""
        problems: list[str] = []
        for bookie in self.stored_entry_sources(entry_id, exclude, last):
            try:
                status, body = await self._read_from(bookie, entry_id, False)
            except errors.BKError as error:
                problems.append(f"{bookie}: {error}")
                continue
            if status != StatusCode.EOK:
                problems.append(f"{bookie}: {status.name}")
                continue
            try:
                self._digest.verify(body, entry_id)
            except errors.DigestMismatchError as error:
                self._digest_mismatch()
                problems.append(f"{bookie}: {error}")
                continue
            return body
        raise errors.ReadError(
            f"ledger {self.ledger_id} entry {entry_id}: no replica outside {sorted(exclude)} "
            f"served it ({'; '.join(problems) or 'none left'})"
        )

    def stored_entry_sources(
        self, entry_id: int, exclude: Collection[str] = (), last: Collection[str] = ()
    ) -> list[str]:
        """The replicas of ``entry_id`` to read its stored bytes from, in the order to try them
        (``read_stored_entry``'s): the read order, those in ``exclude`` left out, those in
        ``last`` at the end."""
        replicas = [bookie for _, bookie in self._replicas(entry_id) if bookie not in exclude]
        if last:
            replicas.sort(key=lambda bookie: bookie in last)
        return replicas

    async def last_entry_on(self, bookie: str) -> int:
        """The highest entry id ``bookie`` holds of this ledger (-1: none), by a read of entry
        -1; ``ReadError`` if it cannot say (down, in limbo, a bad digest)."""
        try:
            status, body = await self._read_from(bookie, -1, False)
        except errors.BKError as error:
            raise errors.ReadError(f"ledger {self.ledger_id}: {bookie}: {error}") from error
        if status in NEGATIVE_ANSWERS:
            return -1
        if status != StatusCode.EOK:
            raise errors.ReadError(f"ledger {self.ledger_id}: {bookie} answered {status.name}")
        entry_id = int.from_bytes(body[8:16], "big", signed=True)
        self._digest.verify(body, entry_id)  # raises DigestMismatchError
        return entry_id

    # -- reads ---------------------------------------------------------------------------------

    def _replicas(self, entry_id: int) -> list[tuple[int, str]]:
        """The replicas of ``entry_id`` in the order to try them: the placement policy's read
        order (local region first), then by health (recent failures, pending reads)."""
        start, ensemble = self.metadata.fragment_of(entry_id)
        key = (start, entry_id % self.metadata.ensemble_size)
        replicas = self._replica_cache.get(key)
        if replicas is None or replicas[0] is not ensemble:
            members = write_set(
                entry_id, self.metadata.ensemble_size, self.metadata.write_quorum_size
            )
            ordered = self._client.placement.read_order([(i, ensemble[i]) for i in members])
            replicas = (ensemble, list(ordered))
            self._replica_cache[key] = replicas
        if self._client.config.reorder_read_sequence:
            return self._client.replica_health.order(replicas[1], self._client.now_ms())
        return replicas[1]

    def _on_bookie(
        self,
        bookie_id: str,
        issue: Callable[[BookieConnection], None],
        answered: Callback,
        v3: bool = False,
    ) -> None:
        self._client.bookie_client.send(bookie_id, issue, answered, v3)

    def _spawn(self, coroutine: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)  # keep a reference until it ran (asyncio holds tasks weakly)
        task.add_done_callback(self._tasks.discard)

    def _send_read(
        self,
        attempt: ReadAttempt,
        answer: Callable[[ReadAttempt, StatusCode | None, bytes | errors.BKError], None],
    ) -> None:
        answered = partial(answer, attempt)
        self._on_bookie(
            attempt.bookie,
            lambda connection: connection.read(
                self.ledger_id, attempt.entry_id, False, None, answered
            ),
            answered,
        )

    async def read_entry(self, entry_id: int) -> LedgerEntry:
        """One entry, even past the LAC (``read_unconfirmed_entries`` of one)."""
        return (await self._read_range(entry_id, entry_id))[0]

    async def _read_range(self, first: int, last: int) -> list[LedgerEntry]:
        if first < 0 or last < first:
            raise errors.IncorrectParameterError(
                f"bad entry range [{first}, {last}] for ledger {self.ledger_id}"
            )
        self._check_open()
        if self.metadata.is_closed and last > self.metadata.last_entry_id:
            raise errors.NoSuchEntryError(
                f"ledger {self.ledger_id} is closed at entry {self.metadata.last_entry_id}: "
                f"entry {last} does not exist"
            )
        stats = self._client.stats
        async with timed(stats.read if stats else None):
            return await _RangeRead(self, first, last).run()

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

    async def read_last_add_confirmed_and_entry(
        self, entry_id: int, timeout_ms: int, parallel: bool = False
    ) -> tuple[int, LedgerEntry | None]:
        """Long poll (BookKeeper's readLastAddConfirmedAndEntry): waits up to ``timeout_ms`` on
        a bookie of ``entry_id``'s write set until the LAC passes ``entry_id - 1`` (as Java's:
        the bookie piggybacks the entry after the LAC the request names), and returns the new LAC
        with entry ``entry_id`` if it is now confirmed. ``parallel`` asks the whole write set at
        once. Nothing new within the timeout returns the unchanged LAC and None.

        Bookies that hold nothing of the ledger yet (a writer that has not written) may answer at
        once that they have no such ledger instead of waiting (Java's do): the poll is asked
        again after a pause (growing to a second) until ``timeout_ms`` has passed."""
        self._check_open()
        if self.metadata.is_closed:
            if entry_id > self.last_add_confirmed:
                return self.last_add_confirmed, None
            return self.last_add_confirmed, await self.read_entry(entry_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        pause = UNKNOWN_LEDGER_PAUSE_S
        while True:
            found, unknown = await self._long_poll_once(
                entry_id, max(1, round((deadline - loop.time()) * 1000)), parallel
            )
            left = deadline - loop.time()
            if found is not None or not unknown or left <= 0:
                return self.last_add_confirmed, found
            await asyncio.sleep(min(pause, left))
            pause = min(2 * pause, UNKNOWN_LEDGER_MAX_PAUSE_S)
            if loop.time() >= deadline:
                return self.last_add_confirmed, None

    async def _long_poll_once(
        self, entry_id: int, timeout_ms: int, parallel: bool
    ) -> tuple[LedgerEntry | None, bool]:
        """One long poll: the entry if it came, and whether no bookie knew the ledger."""
        poll = LastConfirmedAndEntryRead(
            self.ledger_id,
            entry_id,
            entry_id - 1,
            self._replicas(entry_id),
            timeout_ms,
            parallel=parallel,
        )
        run = _LongPollRun(self, poll, entry_id, timeout_ms)
        try:
            found = await run.finished
        finally:
            run.end()
        return found, poll.result is not None and poll.result.unknown

    def _long_poll(
        self,
        request: LongPoll,
        answer: Callable[[StatusCode | None, bytes | errors.BKError, int], None],
    ) -> None:
        def issue(connection: BookieConnection) -> None:
            connection.read_long_poll(
                self.ledger_id, request.previous_lac, request.timeout_ms, answer
            )

        def failed(status: StatusCode | None, body: bytes | errors.BKError) -> None:
            answer(status, body, -1)

        self._on_bookie(request.bookie, issue, failed, v3=True)

    async def refresh_metadata(self) -> LedgerMetadata:
        """Reads the ledger's metadata again (a tailing reader learns of ensemble changes and
        of the close this way); a closed ledger's LAC becomes its last entry."""
        metadata, _ = await self._client.metadata_port.read_ledger_metadata(self.ledger_id)
        if metadata.stores_password:
            self.metadata = metadata
        else:  # legacy format: keep the digest type and password the handle was opened with
            self.metadata = replace(
                metadata, password=self.metadata.password, digest_type=self.metadata.digest_type
            )
        if metadata.is_closed:
            self.last_add_confirmed = metadata.last_entry_id
            self.length = metadata.length
        return self.metadata

    async def follow(
        self,
        start: int = 0,
        *,
        timeout_ms: int = 10_000,
        batch: int = READ_WINDOW,
        parallel: bool = False,
    ) -> AsyncGenerator[LedgerEntry, None]:
        """Every entry from ``start`` on as it is confirmed, following a live writer with long
        polls; ends after the last entry once the ledger is closed. Never fences. ``parallel``
        long-polls the whole write set of the next entry: with E > Qw the LAC that confirms an
        entry travels on the next one, which only part of that write set stores, so one
        replica alone may wait out the whole poll while the writer is idle."""
        tail = Tail(start, batch)
        while True:
            self._check_open()
            step = tail.next_step(self.last_add_confirmed, self.metadata.is_closed)
            if isinstance(step, TailEnded):
                return
            if isinstance(step, ReadConfirmed):
                try:
                    entries = await self._read_range(step.first, step.last)
                except errors.BKError:
                    known = self.metadata
                    if tail.read_failed(known.is_closed) is None:
                        raise
                    if await self.refresh_metadata() == known:
                        raise  # nothing new to read from: the failure stands
                    continue
                for confirmed in entries:
                    yield confirmed
                tail.delivered(step.last)
                continue
            lac, entry = await self.read_last_add_confirmed_and_entry(
                step.entry_id, timeout_ms, parallel
            )
            if entry is not None:
                yield entry
            if tail.polled(lac, entry is not None) is not None:
                await self.refresh_metadata()
                if not self.metadata.is_closed:
                    # The replicas polled may not have heard of the LAC (with Qw < E it travels
                    # on later entries, which other bookies store): ask the whole ensemble.
                    with contextlib.suppress(errors.BKError):
                        await self.read_last_add_confirmed()

    async def read_last_add_confirmed(self) -> int:
        """The largest LAC any bookie of the last ensemble has seen, read until the ensemble is
        covered (no fencing); also advances this handle's LAC."""
        if self.metadata.is_closed:
            return self.last_add_confirmed
        self._learned_lac(await self._last_confirmed())
        return self.last_add_confirmed

    async def read_explicit_last_add_confirmed(self) -> int:
        """BookKeeper's readExplicitLastConfirmed: asks every bookie of the last ensemble for
        the explicit LAC a writer sent it (``explicit_lac_interval_s``) and its last entry
        (READ_LAC, over v3), until the ensemble is covered as for ``read_last_add_confirmed``,
        and returns the largest of those LACs; also advances this handle's LAC. A writer that
        went idle after its last add has that entry confirmed here only (its LAC travels with
        the next entry otherwise)."""
        if self.metadata.is_closed:
            return self.last_add_confirmed
        explicit = -1

        async def ask(request: ReadRequest) -> tuple[int, StatusCode | None, Entry | None, str]:
            nonlocal explicit
            index, bookie = request.bookie_index, request.bookie
            try:
                status, lac_body, last_entry = await self._client.bookie_client.read_lac(
                    bookie, self.ledger_id
                )
            except errors.BKError as error:
                return index, None, None, f"{bookie}: {error}"
            if status != StatusCode.EOK:
                return index, status, None, f"{bookie}: {describe(status, last_entry)}"
            try:
                if lac_body:
                    explicit = max(explicit, self._digest.verify_lac(lac_body))
                if not last_entry:  # an explicit LAC and no entry: known, as "no entry"
                    return index, StatusCode.ENOENTRY, None, ""
                return index, status, self._digest.verify_read(last_entry, -1), ""
            except (ValueError, errors.DigestMismatchError) as error:
                return index, None, None, f"{bookie}: {error}"

        self._learned_lac(max(await self._read_until_covered(ask), explicit))
        return self.last_add_confirmed

    async def _last_confirmed(self) -> int:
        """The largest LAC piggybacked on the last entries of the last ensemble's bookies, read
        until the ensemble is covered (``core.lac``), without fencing."""

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
                entry = self._digest.verify_read(body, request.entry_id)
            except (ValueError, errors.DigestMismatchError) as error:
                return request.bookie_index, None, None, f"{request.bookie}: {error}"
            return request.bookie_index, status, entry, ""

        return await self._read_until_covered(ask)

    async def _read_until_covered(
        self,
        ask: Callable[[ReadRequest], Awaitable[tuple[int, StatusCode | None, Entry | None, str]]],
    ) -> int:
        """Asks every bookie of the last ensemble (``ask`` gives its answer as
        ``LastConfirmedRead.on_answer`` takes it) until the ensemble is covered; the LAC."""
        read = LastConfirmedRead(self.metadata, fence=False)
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

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class _RangeRead:
    """Executes ``core.reader.RangeRead`` for entries ``first``..``last``: sends its batch and
    entry reads, verifies and keeps what comes back, and sets one timer for its next
    deadline (speculative reads)."""

    def __init__(self, handle: ReadHandle, first: int, last: int) -> None:
        self.handle = handle
        self.client = client = handle.client
        self.first = first
        self.results: list[LedgerEntry | None] = [None] * (last - first + 1)
        self.loop = asyncio.get_running_loop()
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.ticker: asyncio.TimerHandle | None = None
        self._sinks: dict[str, _RangeReadSink] = {}  # per bookie: its entry reads in flight
        self._v3 = client.config.use_v3
        metadata = handle.metadata
        config = client.config
        self.plan = RangeRead(
            metadata.ledger_id,
            first,
            last,
            fragment_starts=[start for start, _ in metadata.ensembles],
            replicas=handle._replicas,
            health=client.replica_health,
            negatives_needed=negative_threshold(
                metadata.write_quorum_size, metadata.ack_quorum_size
            ),
            # E = Qw: every bookie of a fragment holds all of it; BATCH_READ_ENTRY is v2's
            batched=metadata.ensemble_size == metadata.write_quorum_size and not config.use_v3,
            # E > Qw: v2 reads are pipelined, each entry from its first replica
            striped=not config.use_v3,
            ensemble_size=metadata.ensemble_size,
            speculative_ms=config.speculative_read_timeout_ms,
            max_speculative_ms=config.max_speculative_read_timeout_ms,
            read_order=client.placement.read_order,
        )

    async def run(self) -> list[LedgerEntry]:
        self._send(self.plan.start(self.client.now_ms()))
        try:
            await self.finished
        finally:
            if self.ticker is not None:
                self.ticker.cancel()
                self.ticker = None
            # The sinks point back here: left in place, this read, its results and every entry
            # in them would wait for the cyclic garbage collector, whose passes over them were
            # a third of a striped catch-up reader's CPU. A sink that a late answer still
            # reaches works on without being listed here.
            self._sinks.clear()
        return [entry for entry in self.results if entry is not None]

    def _send(self, sends: list[ReadSend]) -> None:
        """Sends the plan's requests: batch reads one by one, stripes and entry reads as one
        batch per bookie (one sink standing for them, their answers coming back together)."""
        by_bookie: dict[str, list[ReadAttempt]] = {}
        for send in sends:
            if isinstance(send, SendStripe):
                self._read_stripe(send)
            elif isinstance(send, SendBatch):
                self._send_batch(send)
            elif self._v3:  # v3 requests go one by one (matched by their txnId)
                self.handle._send_read(send, self._answer)
            elif (attempts := by_bookie.get(send.bookie)) is None:
                by_bookie[send.bookie] = [send]
            else:
                attempts.append(send)
        for bookie, attempts in by_bookie.items():
            self._read_from(bookie, attempts)
        self._settle()

    def _sink(self, bookie: str) -> _RangeReadSink:
        sink = self._sinks.get(bookie)
        if sink is None:
            sink = self._sinks[bookie] = _RangeReadSink(self, bookie)
        return sink

    def _read_stripe(self, stripe: SendStripe) -> None:
        # An entry is in one stripe once, before any careful read of it: not pending here yet.
        sink = self._sink(stripe.bookie)
        sink.attempts.update(dict.fromkeys(stripe.entry_ids))
        self._read_batch(stripe.bookie, stripe.entry_ids, sink)

    def _read_batch(self, bookie: str, entry_ids: list[int], sink: _RangeReadSink) -> None:
        ledger_id = self.handle.ledger_id
        connection = self.client.pool.ready(bookie)
        if connection is not None:
            connection.read_batch(ledger_id, entry_ids, sink)
        else:
            self.handle._on_bookie(
                bookie,
                partial(_read_batch, ledger_id, entry_ids, sink),
                partial(_batch_not_sent, entry_ids, sink),
            )

    def _read_from(self, bookie: str, attempts: list[ReadAttempt]) -> None:
        sink = self._sink(bookie)
        in_flight = sink.attempts
        entry_ids: list[int] = []
        for attempt in attempts:
            if attempt.entry_id in in_flight:  # read from it once already: the request of its own
                self.handle._send_read(attempt, self._answer)
                continue
            in_flight[attempt.entry_id] = attempt
            entry_ids.append(attempt.entry_id)
        if entry_ids:
            self._read_batch(bookie, entry_ids, sink)

    def _settle(self) -> None:
        """Finished, or the timer set for the plan's next deadline."""
        plan = self.plan
        self.client.speculative_reads += plan.speculative_reads
        plan.speculative_reads = 0
        if plan.done:
            if not self.finished.done():
                self.finished.set_result(None)
            return
        if self.ticker is not None:
            return  # its tick sets the next one (deadlines only move later as reads start)
        deadline = plan.next_deadline()
        if deadline is None:
            return
        delay_ms = max(0, deadline - self.client.now_ms())
        self.ticker = self.loop.call_later(delay_ms / 1000, self._tick)

    def _tick(self) -> None:
        self.ticker = None
        if not self.finished.done():
            self._send(self.plan.tick(self.client.now_ms()))

    def _send_batch(self, batch: SendBatch) -> None:
        answered = partial(self._batch_answer, batch)
        self.handle._on_bookie(
            batch.bookie,
            lambda connection: connection.batch_read(
                self.handle.ledger_id,
                batch.start,
                batch.end - batch.start + 1,
                BATCH_BYTES,
                answered,
            ),
            answered,
        )

    def _batch_answer(
        self, batch: SendBatch, status: StatusCode | None, body: bytes | errors.BKError
    ) -> None:
        if self.finished.done():
            if status is not None:  # a late answer: its bookie is not frozen
                self.client.replica_health.heard(batch.bookie)
            return
        served = 0
        if status == StatusCode.EOK and isinstance(body, bytes):
            digest, start, ledger_id = self.handle.digest, batch.start, self.handle.ledger_id
            count = batch.end - start + 1
            # Checked and made entries in one C call when every record is whole and good; else
            # entry by entry up to the first fault, which is named.
            entries: list[LedgerEntry] | None = None
            if _batch_entries is not None and digest.digest_type is DigestType.CRC32C:
                entries = _batch_entries(body, ledger_id, start, count, LedgerEntry)
            if entries is None:
                payloads: list[bytes] = []
                try:
                    for raw in v2.batch_entries(body)[:count]:
                        payloads.append(digest.payload(raw, start + len(payloads)))
                except (errors.DigestMismatchError, MalformedMessageError) as error:
                    if isinstance(error, errors.DigestMismatchError):
                        self.handle._digest_mismatch()
                    log.info("ledger %d: batch read from %s: %s", ledger_id, batch.bookie, error)
                    status = None
                new = _new_entry
                entries = [
                    new(LedgerEntry, (ledger_id, entry_id, data))
                    for entry_id, data in enumerate(payloads, start)
                ]
            at, served = start - self.first, len(entries)
            self.results[at : at + served] = entries
        self._send(self.plan.on_batch_answer(batch.start, status, served, self.client.now_ms()))

    def _answers(self, sink: _RangeReadSink, frames: list[bytes]) -> None:
        """Answers of one bookie (v2 answer frames) to its stripe and entry reads, taken
        together: what the plan sends next goes out in one batch per bookie. A stripe's entry
        is verified and kept here, and the plan told of them all at once."""
        pending = sink.attempts
        failed: list[tuple[int, StatusCode | None]] = []
        careful: list[tuple[ReadAttempt, StatusCode | None, bytes]] = []
        results, first, ledger_id = self.results, self.first, self.handle.ledger_id
        digest = self.handle.digest
        rest: list[tuple[int, int, bytes, ReadAttempt | None]]
        if _stripe_answers is not None and digest.digest_type is DigestType.CRC32C:
            # The C pass takes every stripe's entry that checks out; the rest come back here.
            delivered, rest = _stripe_answers(
                frames, pending, results, first, ledger_id, LedgerEntry, _GONE
            )
        else:
            delivered, rest = [], []
            for frame in frames:
                entry_id, rc, body = v2.read_answer(frame)
                rest.append((entry_id, rc, body, pending.pop(entry_id, _GONE)))
        payload, new = digest.payload, _new_entry
        for entry_id, rc, body, attempt in rest:
            if attempt is None:  # a stripe's
                if rc == 0:
                    try:
                        data = payload(body, entry_id)
                    except errors.DigestMismatchError as error:
                        self.handle._digest_mismatch()
                        log.info("ledger %d: read from %s: %s", ledger_id, sink.bookie, error)
                        failed.append((entry_id, None))
                        continue
                    results[entry_id - first] = new(LedgerEntry, (ledger_id, entry_id, data))
                    delivered.append(entry_id)
                else:
                    failed.append((entry_id, from_v2(rc)))
            elif attempt is not _GONE:
                careful.append((attempt, from_v2(rc), body))
        self._answered_together(sink.bookie, delivered, failed, careful)

    def _failures(self, sink: _RangeReadSink, entry_ids: list[int], error: errors.BKError) -> None:
        """No answer will come from ``sink``'s bookie for these reads."""
        pending = sink.attempts
        failed: list[tuple[int, StatusCode | None]] = []
        careful: list[tuple[ReadAttempt, StatusCode | None, bytes | errors.BKError]] = []
        for entry_id in entry_ids:
            attempt = pending.pop(entry_id, _GONE)
            if attempt is None:
                failed.append((entry_id, None))
            elif attempt is not _GONE:
                careful.append((attempt, None, error))
        if failed:
            log.info(
                "ledger %d: %d reads from %s failed: %s",
                self.handle.ledger_id,
                len(failed),
                sink.bookie,
                error,
            )
        self._answered_together(sink.bookie, [], failed, careful)

    def _answered_together(
        self,
        bookie: str,
        delivered: list[int],
        failed: list[tuple[int, StatusCode | None]],
        careful: Sequence[tuple[ReadAttempt, StatusCode | None, bytes | errors.BKError]],
    ) -> None:
        sends: list[ReadSend] = []
        if delivered or failed:
            if self.finished.done():
                heard = answered_at_all(delivered, failed)
                self.client.replica_health.answered(bookie, len(delivered) + len(failed), heard)
            else:
                now = self.client.now_ms()
                sends = self.plan.on_stripe_answers(bookie, delivered, failed, now)
        for attempt, status, body in careful:
            sends += self._answered(attempt, status, body)
        self._send(sends)

    def _answer(
        self, attempt: ReadAttempt, status: StatusCode | None, body: bytes | errors.BKError
    ) -> None:
        self._send(self._answered(attempt, status, body))

    def _answered(
        self, attempt: ReadAttempt, status: StatusCode | None, body: bytes | errors.BKError
    ) -> list[ReadSend]:
        """Verifies and keeps an answered entry; what the plan sends next."""
        if self.finished.done():
            self.client.replica_health.answered(attempt.bookie, heard=status is not None)
            return []
        problem = ""
        if status == StatusCode.EOK:
            assert isinstance(body, bytes)
            try:
                entry = self.handle.digest.verify(body, attempt.entry_id)
            except errors.DigestMismatchError as error:
                self.handle._digest_mismatch()
                status, problem = None, str(error)
            else:
                if self.results[attempt.entry_id - self.first] is None:
                    self.results[attempt.entry_id - self.first] = LedgerEntry(
                        self.handle.ledger_id, attempt.entry_id, entry.payload
                    )
        elif status is None:
            problem = str(body)
        try:
            return self.plan.on_entry_answer(attempt, status, problem, self.client.now_ms())
        except errors.BKError as error:
            self.finished.set_exception(error)
            return []


class _RangeReadSink(ReadSink):
    """The answers of one bookie to a range read's stripe and entry reads."""

    __slots__ = ("_range_read", "attempts", "bookie")

    def __init__(self, range_read: _RangeRead, bookie: str) -> None:
        self._range_read = range_read
        self.bookie = bookie
        # Sent to the bookie, not answered yet: entry id -> the careful read's attempt, or
        # None for a stripe's read.
        self.attempts: dict[int, ReadAttempt | None] = {}

    def answered(self, frames: list[bytes]) -> None:
        self._range_read._answers(self, frames)

    def failed(self, entry_ids: list[int], error: errors.BKError) -> None:
        self._range_read._failures(self, entry_ids, error)


class _LongPollRun:
    """Executes one ``core.reader.LastConfirmedAndEntryRead``: sends its long polls, verifies
    and reports what comes back, and sets the timer of its speculative polls. ``end`` unlinks
    the timer (its callback refers back here), so that the run goes as soon as its caller is
    done with it rather than at the cyclic collector's next pass: a tailing reader long-polls
    hundreds of times a second. A late answer finds ``finished`` done and stops there."""

    def __init__(
        self, handle: ReadHandle, poll: LastConfirmedAndEntryRead, entry_id: int, timeout_ms: int
    ) -> None:
        self.handle, self.poll, self.entry_id = handle, poll, entry_id
        self.loop = loop = asyncio.get_running_loop()
        self.finished: asyncio.Future[LedgerEntry | None] = loop.create_future()
        self.told: list[int] = []  # the LACs bookies answered with (EOK)
        self.deadline = loop.time() + timeout_ms / 1000
        config = handle._client.config
        self.delay_s = config.speculative_read_lac_timeout_ms / 1000
        self.max_delay_s = config.max_speculative_read_lac_timeout_ms / 1000
        self.timer: asyncio.TimerHandle | None = None
        self.send(poll.start())
        if self.delay_s > 0 and not self.finished.done():
            self.timer = loop.call_later(self.delay_s, self.speculate)

    def send(self, requests: list[LongPoll]) -> None:
        for request in requests:
            self.handle._long_poll(request, partial(self.answer, request))

    def answer(
        self, request: LongPoll, status: StatusCode | None, body: bytes | errors.BKError, lac: int
    ) -> None:
        finished = self.finished
        if finished.done():
            return
        handle, poll = self.handle, self.poll
        entry: Entry | None = None
        problem = "" if status is not None else str(body)
        if status == StatusCode.EOK and isinstance(body, bytes) and body:
            try:
                entry = handle._digest.verify(body, self.entry_id)
            except errors.DigestMismatchError as error:
                handle._digest_mismatch()
                status, problem = None, str(error)
        elif status not in (StatusCode.EOK, None):
            problem = describe(status, body)
        if status == StatusCode.EOK:
            self.told.append(lac)
        try:
            more = poll.on_answer(request.bookie_index, status, lac, entry is not None, problem)
        except errors.BKError as error:
            finished.set_exception(error)
            return
        if poll.result is not None:
            # What the bookies said, not the poll's previous LAC (more than the handle knew
            # when the caller polls past LAC + 1); nothing when none knew the ledger.
            if self.told:
                handle._learned_lac(max(self.told))
            found = entry if poll.result.entry_from is not None else None
            finished.set_result(
                None
                if found is None
                else LedgerEntry(handle.ledger_id, self.entry_id, found.payload)
            )
            return
        self.send(more)

    def speculate(self) -> None:
        self.timer = None
        if self.finished.done():
            return
        more = self.poll.speculate(max(1, round((self.deadline - self.loop.time()) * 1000)))
        if more:
            self.send(more)
            self.delay_s = min(2 * self.delay_s, self.max_delay_s)
            self.timer = self.loop.call_later(self.delay_s, self.speculate)

    def end(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.finished.done():
            self.finished.cancel()


_GONE = ReadAttempt(-1, "", -1)  # an answer to a read no longer pending here


def _read_batch(
    ledger_id: int, entry_ids: list[int], sink: ReadSink, connection: BookieConnection
) -> None:
    connection.read_batch(ledger_id, entry_ids, sink)


class WriteHandle(ReadHandle):
    """The single writer of a ledger: executes ``core.writer.LedgerWriter``'s instructions.

    Adds are acknowledged in entry-id order after Qa acks; a failed bookie is replaced by an
    ensemble change (placement policy, CAS of a new fragment) and the unacknowledged entries are
    sent again to its replacement. Add timeouts are the connections' request timeouts: a request
    not answered in time comes back as a failed answer. With ``deferred_sync`` the bookies
    answer before their journal sync (over v3) and ``force`` makes the entries durable and
    confirmed. ``LedgerHandle`` numbers the entries; ``LedgerHandleAdv`` takes the caller's."""

    def __init__(
        self,
        client: BookKeeper,
        metadata: LedgerMetadata,
        password: bytes,
        deferred_sync: bool = False,
    ) -> None:
        super().__init__(client, metadata, password)
        self.last_add_confirmed = -1
        self.length = 0  # bytes of the completed entries
        self.deferred_sync = deferred_sync
        self._writer = LedgerWriter(
            metadata,
            max_in_flight=client.config.throttle,
            delay_ensemble_change=client.config.delay_ensemble_change,
            explicit_lac_interval_ms=int(client.config.explicit_lac_interval_s * 1000),
            deferred_sync=deferred_sync,
        )
        self._force_futures: dict[int, asyncio.Future[int]] = {}
        self._loop = asyncio.get_running_loop()
        # The client's clock in ms (``BookKeeper.now_ms``, bound: read several times an add)
        self._now: Callable[[], int] = client.now_ms
        # What waits for each pending add: its future, or its callback (add_entry_callback)
        self._futures: dict[int, asyncio.Future[int] | AddCallback] = {}
        # Callbacks of adds completed or failed in this writer step, called at its end
        self._ready: list[tuple[AddCallback, int, errors.BKError | None]] = []
        self._entries: dict[int, bytes] = {}  # packaged once, sent to every bookie (and resent)
        self._ticker: asyncio.TimerHandle | None = None
        self._ticker_at = 0  # when it fires (ms, the client's clock)
        self._deadline_check = False  # a look at the writer's next deadline is scheduled
        # v2 adds go out in batches: the SendAdds of one loop pass, sent at its end as one
        # write per bookie, each bookie's answers coming back through one sink
        self._batched = not (client.config.use_v3 or deferred_sync)
        self._pushed = False  # adds were pushed this pass: _send_pushed is scheduled
        # (unless they were pushed by the callbacks _call_back runs, which then sends them at
        # once or schedules _send_pushed itself: no loop callback for an add sent at once)
        self._calling_back = False
        self._push_unscheduled = False
        # LedgerHandle's adds of this slice, numbered on from the writer's last_add_pushed and
        # not yet taken by the writer: it takes them, and they are packaged, in one step as the
        # slice is sent
        self._run: list[bytes] = []
        self._slice = 0  # adds pushed since the last send of this pass
        self._sends: list[SendAdds] = []
        self._sending = False  # _send_batches is scheduled, or about to run
        self._sinks: dict[tuple[int, str], _WriterSink] = {}
        self._head_length = -1  # the last entry length's request head, for the next one
        self._head = b""
        # With the client's metrics: when each pending add was called (perf_counter())
        self._stats = client.stats
        self._added_at: dict[int, float] | None = None
        if self._stats is not None:
            self._added_at = {}
            self._stats.writer_opened(self)

    @property
    def pending_adds(self) -> int:
        """Adds called and not completed."""
        return len(self._futures)

    @property
    def last_add_pushed(self) -> int:
        return self._writer.last_add_pushed + len(self._run)

    @property
    def ensemble_changes(self) -> int:
        """Ensemble changes this writer made (a failed or slow bookie replaced)."""
        return self._writer.ensemble_changes

    def _record_adds(self, entry_ids: Iterable[int], succeeded: bool) -> None:
        """The client's ADD_ENTRY latencies of adds that completed (or failed)."""
        assert self._added_at is not None and self._stats is not None
        now, called = time.perf_counter(), self._added_at.pop
        record = self._stats.add.success if succeeded else self._stats.add.failure
        for entry_id in entry_ids:
            at = called(entry_id, None)
            if at is not None:
                record(now - at)

    def _record_under_replicated(self, before: int) -> None:
        """ADD_ENTRY_UR: the adds the writer counted under-replicated since it had ``before``
        (read off it around failed answers only: the acks cost nothing)."""
        found = self._writer.under_replicated_adds - before
        if found and self._stats is not None:
            self._stats.add_under_replicated.inc(found)

    def _add(self, data: bytes, entry_id: int | None) -> asyncio.Future[int]:
        future: asyncio.Future[int] = self._loop.create_future()
        self._push(data, entry_id, future)
        return future

    def _push(
        self, data: bytes, entry_id: int | None, waiting: asyncio.Future[int] | AddCallback
    ) -> int:
        """Takes ``data`` as the next entry (or as ``entry_id``), answered to ``waiting``: the
        next entry joins the slice's run, which the writer takes as the slice is sent; an
        entry of the caller's id is taken at once (its id may be refused)."""
        if self._closed:
            raise errors.LedgerClosedError(f"ledger {self.ledger_id} is closed by this writer")
        writer = self._writer
        if entry_id is None:
            if writer.error is not None:
                raise writer.error
            run = self._run
            run.append(bytes(data))
            entry_id = writer.last_add_pushed + len(run)
        else:
            data = bytes(data)
            # raises once the writer failed, or for an entry id taken already
            entry_id = writer.push(len(data), entry_id)
            self._entries[entry_id] = self._digest.package(
                entry_id, writer.last_add_confirmed, writer.pushed_length, data
            )
        self._futures[entry_id] = waiting
        if self._added_at is not None:
            self._added_at[entry_id] = time.perf_counter()
        if not self._pushed:  # the pass's adds are sent together, at its end
            self._pushed = True
            self._slice = 1
            if self._calling_back:  # _call_back sends them at once, or schedules this, at its end
                self._push_unscheduled = True
            else:
                self._loop.call_soon(self._send_pushed)
        else:
            self._slice += 1
            if self._slice >= SEND_SLICE_ADDS:  # a long pass: this slice goes now
                self._send_slice()
        return entry_id

    def _send_pushed(self) -> None:
        """Sends the adds pushed in this loop pass (as far as the in-flight bound allows): one
        writer step, one clock read. Nothing if they went already (``_call_back``)."""
        if not self._pushed:
            return
        self._pushed = False
        self._send_slice()

    def _send_slice(self) -> None:
        """Sends the adds pushed so far in this pass (see ``SEND_SLICE_ADDS``)."""
        self._slice = 0
        self._sending = True  # the sends go out below, not a pass later
        if self._run:
            self._take_run()
        self._execute(self._writer.send_waiting(self._now()))
        self._send_batches()

    def _take_run(self) -> None:
        """The writer takes the slice's run of next entries, packaged together; if it has
        failed since they were called, they fail with its error."""
        run, self._run = self._run, []
        writer = self._writer
        lengths = list(accumulate(map(len, run), initial=writer.pushed_length))
        del lengths[0]
        try:
            first = writer.push_run(lengths)
        except errors.BKError as error:
            first = writer.last_add_pushed + 1  # as the run was numbered
            self._execute([Failed(tuple(range(first, first + len(run))), error)])
            return
        packaged = self._digest.package_run(first, writer.last_add_confirmed, lengths, run)
        self._entries.update(zip(range(first, first + len(run)), packaged, strict=True))

    async def force(self) -> int:
        """Makes every acknowledged entry durable on every bookie of the ensemble and confirmed
        (DEFERRED_SYNC); returns the LAC. Nothing to do for other ledgers."""
        if self._run:  # the adds called before it are part of it
            self._take_run()
        instructions = self._writer.force()
        first = instructions[0]
        assert isinstance(first, Force | Forced)
        future: asyncio.Future[int] = self._loop.create_future()
        self._force_futures[first.force_id] = future
        self._execute(instructions)
        return await future

    # -- executing the writer's instructions -----------------------------------------------------

    def _execute(self, instructions: list[Instruction]) -> None:
        for instruction in instructions:
            if isinstance(instruction, SendAdds):
                if self._batched:
                    if not self._sending:
                        self._sending = True
                        self._loop.call_soon(self._send_batches)
                    self._sends.append(instruction)
                    continue
                # v3 (or DEFERRED_SYNC) adds, one request each: v2 adds go in batches above.
                for entry_id, targets in instruction:
                    entry = self._entries[entry_id]
                    for index, bookie in targets:
                        self._send_add(bookie, index, entry_id, entry)
            elif isinstance(instruction, Completed):
                self.last_add_confirmed = self._writer.last_add_confirmed
                self.length = instruction.length
                if _complete_adds is not None:  # the same, in one C call
                    _complete_adds(
                        self._entries,
                        self._futures,
                        instruction.first,
                        instruction.last,
                        asyncio.Future,
                        self._ready,
                    )
                else:
                    forget, take = self._entries.pop, self._futures.pop
                    for entry_id in range(instruction.first, instruction.last + 1):
                        forget(entry_id, None)
                        future = take(entry_id, None)
                        if future is None:
                            continue
                        if not isinstance(future, asyncio.Future):  # an add's callback
                            self._ready.append((future, entry_id, None))
                        elif not future.done():  # not cancelled by its caller
                            future.set_result(entry_id)
                if self._added_at is not None:
                    self._record_adds(range(instruction.first, instruction.last + 1), True)
            elif isinstance(instruction, Failed):
                # the failure reaches the caller as every later add's exception
                log.info("ledger %d writer failed: %s", self.ledger_id, instruction.error)
                for entry_id in instruction.entry_ids:
                    self._entries.pop(entry_id, None)
                    future = self._futures.pop(entry_id, None)
                    if future is None:
                        continue
                    if not isinstance(future, asyncio.Future):  # an add's callback
                        self._ready.append((future, entry_id, instruction.error))
                    elif not future.done():
                        future.set_exception(instruction.error)
                if self._added_at is not None:
                    self._record_adds(instruction.entry_ids, False)
            elif isinstance(instruction, ChangeEnsemble):
                self._spawn(self._change_ensemble(instruction))
            elif isinstance(instruction, WriteLac):
                self._write_lac(instruction)
            elif isinstance(instruction, Force):
                for _, bookie_id in instruction.targets:
                    self._force_on(instruction.force_id, bookie_id)
            elif isinstance(instruction, Forced):
                self.last_add_confirmed = self._writer.last_add_confirmed
                done = self._force_futures.pop(instruction.force_id, None)
                if done is not None and not done.done():
                    if instruction.error is not None:
                        done.set_exception(instruction.error)
                    else:
                        done.set_result(instruction.lac)
        self._schedule_tick()
        if self._ready:
            self._call_back()

    def _call_back(self) -> None:
        """Calls the callbacks of the adds this step completed or failed, in order, once the
        writer's state is whole again (a callback may add more). One that raises is reported
        to the loop's exception handler, as a callback the loop runs would be; the rest are
        still called."""
        ready, self._ready = self._ready, []
        outer, self._calling_back = self._calling_back, True
        try:
            for callback, entry_id, error in ready:
                try:
                    callback(entry_id, error)
                except Exception as raised:  # the caller's code: reported, not ours
                    self._loop.call_exception_handler(
                        {
                            "message": f"ledger {self.ledger_id}: the callback of entry "
                            f"{entry_id} raised",
                            "exception": raised,
                        }
                    )
        except BaseException:  # the loop is going down (KeyboardInterrupt...): sends as _push
            self._calling_back = outer
            if not outer and self._push_unscheduled:
                self._push_unscheduled = False
                self._loop.call_soon(self._send_pushed)
            raise
        self._calling_back = outer
        if outer:
            return  # the outermost call sends or schedules what the callbacks added
        unscheduled, self._push_unscheduled = self._push_unscheduled, False
        if self._pushed and not self._sending and len(self._futures) <= SEND_AT_ONCE_MAX_PENDING:
            self._send_pushed()  # the adds the callbacks called (see SEND_AT_ONCE_MAX_PENDING)
        elif unscheduled and self._pushed:
            self._loop.call_soon(self._send_pushed)  # as _push would have: at the pass's end

    def _force_on(self, force_id: int, bookie_id: str) -> None:
        def answered(status: StatusCode | None, body: bytes | errors.BKError) -> None:
            problem = str(body) if status is None else describe(status, body)
            self._execute(self._writer.on_force_answer(force_id, bookie_id, status, problem))

        self._on_bookie(
            bookie_id,
            lambda connection: connection.force_ledger(self.ledger_id, answered),
            answered,
            v3=True,
        )

    def _schedule_tick(self) -> None:
        """One timer, for the writer's next deadline (timeouts, a paced ensemble change, the
        explicit LAC); none while nothing can come due before an event. Looked at once per
        loop pass, not after every answer; and not at all while the writer's deadlines can
        only grow (``LedgerWriter.deadlines_only_grow``) and the timer set is due first, or
        there is no deadline to time (no add timeout): a writer's steps then set no timer, as
        they would not."""
        if self._closed or self._deadline_check:
            return
        writer = self._writer
        if writer.deadlines_only_grow and (
            self._ticker is not None or writer.add_timeout_ms is None
        ):
            return
        self._deadline_check = True
        self._loop.call_soon(self._set_timer)

    def _set_timer(self) -> None:
        self._deadline_check = False
        if self._closed:
            return
        now = self._now()
        deadline = self._writer.next_deadline(now)
        if deadline is None or (self._ticker is not None and self._ticker_at <= deadline):
            return
        if self._ticker is not None:
            self._ticker.cancel()
        self._ticker_at = deadline
        self._ticker = self._loop.call_later(max(0, deadline - now) / 1000, self._tick)

    def _tick(self) -> None:
        self._ticker = None
        self._execute(self._writer.tick(self._now()))

    def _send_batches(self) -> None:
        """Sends this pass's adds: each entry's request encoded once, one write per bookie."""
        self._sending = False
        sends, self._sends = self._sends, []
        entries = self._entries
        batches: dict[tuple[int, str], tuple[list[int], list[bytes]]] = {}
        for send in sends:
            at, count = 0, len(send.entry_ids)
            while at < count:
                if _group_adds is not None and self._head_length >= 0:  # up to another length
                    at = _group_adds(send.entry_ids, send.targets, entries, self._head, batches, at)
                    if at == count:
                        break
                entry_id = send.entry_ids[at]
                entry = entries.get(entry_id)
                at += 1
                if entry is None:
                    continue  # failed (the ledger closed, the writer fenced) before it went out
                if len(entry) != self._head_length:
                    self._head = v2.add_request_head(self._master_key, len(entry))
                    self._head_length = len(entry)
                head = self._head
                for target in send.targets[at - 1]:
                    batch = batches.get(target)
                    if batch is None:
                        batch = batches[target] = ([], [])
                    batch[0].append(entry_id)
                    batch[1].extend((head, entry))
        pool = self._client.pool
        for (index, bookie_id), (entry_ids, chunks) in batches.items():
            sink = self._sinks.get((index, bookie_id))
            if sink is None:
                sink = self._sinks[(index, bookie_id)] = _WriterSink(self, index, bookie_id)
            connection = pool.ready(bookie_id)
            if connection is not None:
                connection.add_batch(self.ledger_id, entry_ids, chunks, sink)
            else:
                self._on_bookie(
                    bookie_id,
                    partial(_send_batch, self.ledger_id, entry_ids, chunks, sink),
                    partial(_batch_not_sent, entry_ids, sink),
                )

    def _adds_acked(self, bookie_id: str, index: int, entry_ids: list[int]) -> None:
        if self._client.quarantine.suspects:
            self._client.quarantine.record_success(bookie_id)
        self._execute(self._writer.on_add_acks(index, bookie_id, entry_ids, self._now()))

    def _adds_failed(
        self, bookie_id: str, index: int, entry_ids: list[int], error: errors.BKError
    ) -> None:
        """No answer came (or will) for these adds to one bookie: one failure of that bookie."""
        log.info(
            "ledger %d: %d adds to %s failed: %s", self.ledger_id, len(entry_ids), bookie_id, error
        )
        now = self._now()
        self._client.quarantine.record_failure(bookie_id, now)
        problem = str(error)
        writer = self._writer
        under_replicated = writer.under_replicated_adds
        instructions: list[Instruction] = []
        for entry_id in entry_ids:
            instructions += writer.on_add_answer(entry_id, index, bookie_id, None, now, problem)
        self._record_under_replicated(under_replicated)
        self._execute(instructions)

    def _add_answered(
        self,
        bookie_id: str,
        index: int,
        entry_id: int,
        status: StatusCode | None,
        body: bytes | errors.BKError,
    ) -> None:
        writer = self._writer
        if status == StatusCode.EOK:
            if self._client.quarantine.suspects:
                self._client.quarantine.record_success(bookie_id)
            self._execute(writer.on_add_answer(entry_id, index, bookie_id, status, self._now()))
            return
        problem = str(
            body if status is None else status_error(status, bookie_id, f"add of entry {entry_id}")
        )
        log.info("ledger %d: %s", self.ledger_id, problem)
        self._client.quarantine.record_failure(bookie_id, self._now())
        under_replicated = writer.under_replicated_adds
        instructions = writer.on_add_answer(
            entry_id, index, bookie_id, status, self._now(), problem
        )
        self._record_under_replicated(under_replicated)
        self._execute(instructions)

    def _send_add(self, bookie_id: str, index: int, entry_id: int, entry: bytes) -> None:
        """Sends entry ``entry_id`` to one bookie on its own (a v3 or DEFERRED_SYNC add)."""
        answered = partial(self._add_answered, bookie_id, index, entry_id)
        deferred = self.deferred_sync
        connection = self._client.pool.ready(bookie_id, deferred)
        if connection is not None:
            connection.add(
                self.ledger_id, entry_id, self._master_key, entry, False, answered, deferred
            )
            return
        self._on_bookie(
            bookie_id,
            lambda connection: connection.add(
                self.ledger_id, entry_id, self._master_key, entry, False, answered, deferred
            ),
            answered,
            v3=deferred,
        )

    async def _change_ensemble(self, change: ChangeEnsemble) -> None:
        based_on = (change.based_on_start, change.ensemble)
        try:
            writable = await self._client.metadata_port.writable_bookies()
            ensemble = self._client.placement.replace(
                change.ensemble,
                change.failed,
                writable,
                quarantined=self._client.quarantine.quarantined(self._now()),
                write_quorum_size=self.metadata.write_quorum_size,
            )
            log.info(
                "ledger %d: replacing %s from entry %d: new ensemble %s",
                self.ledger_id,
                sorted(change.failed.values()),
                change.first_entry,
                list(ensemble),
            )
            metadata, _ = await update_ledger_metadata(
                self._client.metadata_port,
                self.ledger_id,
                lambda current: (
                    change_ensemble(current, change.first_entry, based_on, ensemble) is not None
                ),
                lambda current: _changed(current, change.first_entry, based_on, ensemble),
            )
        except errors.BKError as error:
            self._execute(self._writer.on_ensemble_change_failed(error, self._now()))
            return
        self.metadata = metadata
        self._execute(self._writer.on_ensemble_changed(metadata, self._now()))

    def _write_lac(self, write: WriteLac) -> None:
        body = self._digest.package_lac(write.lac)

        def answered(status: StatusCode | None, problem: bytes | errors.BKError) -> None:
            if status != StatusCode.EOK:
                log.debug(
                    "ledger %d: explicit LAC write failed: %s", self.ledger_id, status or problem
                )

        for _, bookie_id in write.targets:
            self._on_bookie(
                bookie_id,
                lambda connection: connection.write_lac(
                    self.ledger_id, write.lac, self._master_key, body, answered
                ),
                answered,
                v3=True,
            )

    async def close(self) -> None:
        """Closes the ledger at its LAC, as BookKeeper's ``LedgerHandle.close``: adds still
        pending (sent, not yet acknowledged by Qa bookies) fail with ``LedgerClosedError`` and
        are not part of the ledger; then the metadata is CAS-ed to CLOSED. To keep every add,
        wait for their futures first (``await asyncio.gather(*futures)``)."""
        if self._closed:
            return
        if self.deferred_sync and self._writer.error is None:
            try:  # what was acknowledged becomes durable and part of the closed ledger
                await self.force()
            except errors.BKError as error:
                log.warning(
                    "ledger %d: closing at entry %d, the last one forced: %s",
                    self.ledger_id,
                    self._writer.last_add_confirmed,
                    error,
                )
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._run:  # adds not sent yet: pending, they fail with the others
            self._take_run()
        last_entry, length, failures = self._writer.close()
        self._execute(failures)
        if self._stats is not None:
            self._stats.writer_closed(self)

        self.metadata, _ = await update_ledger_metadata(
            self._client.metadata_port,
            self.ledger_id,
            lambda current: close_needed(current, last_entry, length),
            lambda current: current.closed_at(last_entry, length),
        )


class _WriterSink(AddSink):
    """The answers of one bookie (at one ensemble index) to a writer's batched adds."""

    __slots__ = ("_bookie_id", "_handle", "_index")

    def __init__(self, handle: WriteHandle, index: int, bookie_id: str) -> None:
        self._handle = handle
        self._index = index
        self._bookie_id = bookie_id

    def acked(self, entry_ids: list[int]) -> None:
        self._handle._adds_acked(self._bookie_id, self._index, entry_ids)

    def refused(self, entry_id: int, status: StatusCode) -> None:
        self._handle._add_answered(self._bookie_id, self._index, entry_id, status, b"")

    def failed(self, entry_ids: list[int], error: errors.BKError) -> None:
        self._handle._adds_failed(self._bookie_id, self._index, entry_ids, error)


def _send_batch(
    ledger_id: int,
    entry_ids: list[int],
    chunks: list[bytes],
    sink: AddSink,
    connection: BookieConnection,
) -> None:
    connection.add_batch(ledger_id, entry_ids, chunks, sink)


def _batch_not_sent(
    entry_ids: list[int], sink: BatchSink, status: StatusCode | None, body: bytes | errors.BKError
) -> None:
    """A batch whose bookie could not be connected to: each request failed with that error."""
    error = (
        body
        if isinstance(body, errors.BKError)
        else errors.BookieHandleNotAvailableError(f"no connection: {describe(status, body)}")
    )
    sink.failed(entry_ids, error)


class LedgerHandle(WriteHandle):
    """A ledger's writer that numbers the entries 0, 1, 2...."""

    def add_entry_async(self, data: bytes) -> asyncio.Future[int]:
        """Sends ``data`` as the next entry; the future gives its entry id once acknowledged."""
        return self._add(data, None)

    async def add_entry(self, data: bytes) -> int:
        """Adds ``data`` and returns its entry id once Qa bookies made it durable."""
        return await self._add(data, None)

    def add_entry_callback(self, data: bytes, callback: AddCallback) -> int:
        """Sends ``data`` as the next entry and returns its id; ``callback(entry_id, None)`` is
        called on the loop once it is acknowledged, or ``callback(entry_id, error)`` once it
        failed, in entry-id order (BookKeeper's ``asyncAddEntry(data, cb, ctx)``). No future
        per add: for writers that keep thousands in flight. A callback that raises is
        reported to the loop's exception handler."""
        return self._push(data, None, callback)


class LedgerHandleAdv(WriteHandle):
    """A ledger's writer with caller-chosen entry ids (BookKeeper's LedgerHandleAdv): any order,
    each id once; acknowledged in id order, so an id not yet added holds back those above it."""

    def add_entry_async(self, entry_id: int, data: bytes) -> asyncio.Future[int]:
        """Sends ``data`` as entry ``entry_id``; the future completes once it is acknowledged."""
        return self._add(data, entry_id)

    async def add_entry(self, entry_id: int, data: bytes) -> int:
        return await self._add(data, entry_id)

    def add_entry_callback(self, entry_id: int, data: bytes, callback: AddCallback) -> int:
        """Sends ``data`` as entry ``entry_id``, answered to ``callback`` as
        ``LedgerHandle.add_entry_callback``'s are."""
        return self._push(data, entry_id, callback)
