"""Making a ledger's missing copies again (BookKeeper's LedgerChecker and
LedgerFragmentReplicator, reference section 1.14).

A *fragment* is the run of entries one ensemble holds (from its first entry to the next
ensemble's first entry - 1, or the closed ledger's last entry). A fragment is short when its
ensemble names a bookie that is gone (not registered, or refusing connections: ``ClusterBookies``)
or leaving (being decommissioned). For each short fragment the ``Replicator``:

1. picks a replacement for each such bookie with the client's placement policy (a writable
   bookie not in the fragment, rack-aware when the client is configured so);
2. copies every entry of the fragment whose write set includes a replaced index: read from a
   surviving member of the write set (``ReadHandle.read_stored_entry``: a read-only bookie will
   do; the digest is checked, and the bytes are copied exactly as stored), written to the new
   bookie with RECOVERY_ADD, a window of entries in flight, paced by a bytes-per-second limit;
3. swaps the bookies in the metadata with a compare-and-swap (``LedgerMetadata.with_members``),
   only once every copy was acknowledged.

An open ledger's last fragment belongs to its writer (whose own ensemble change replaces a
bookie it cannot write to); it is only touched once the ledger is closed. When the caller says
so (after the grace period of ``openLedgerRereplicationGracePeriod``), the ledger is fenced and
recovered first, as BookKeeper's replication worker does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bookkeeper_py import errors
from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.client.connection import Callback
from bookkeeper_py.client.ledger import ReadHandle
from bookkeeper_py.client.recovery import recover
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.metadata.port import update_ledger_metadata
from bookkeeper_py.wire.status import StatusCode

log = logging.getLogger(__name__)


# -- which fragments are short ------------------------------------------------------------------


@dataclass(frozen=True)
class Fragment:
    """Entries ``first_entry``..``last_entry`` (inclusive; ``last_entry`` < ``first_entry`` when
    the fragment holds none) stored on ``ensemble``; ``missing`` maps ensemble indices to the
    bookies whose copies must be made again."""

    ledger_id: int
    first_entry: int
    last_entry: int
    ensemble: tuple[str, ...]
    missing: Mapping[int, str]

    def entries(self, write_quorum_size: int) -> list[int]:
        """The entries of this fragment that a missing index stores."""
        size = len(self.ensemble)
        indices = set(self.missing)
        return [
            entry
            for entry in range(self.first_entry, self.last_entry + 1)
            if any((index - entry) % size < write_quorum_size for index in indices)
        ]


def fragments(metadata: LedgerMetadata) -> list[tuple[int, int | None, tuple[str, ...]]]:
    """(first entry, last entry or None while the ledger is open, bookies) of every fragment."""
    found: list[tuple[int, int | None, tuple[str, ...]]] = []
    ensembles = metadata.ensembles
    for position, (first, members) in enumerate(ensembles):
        if position + 1 < len(ensembles):
            last: int | None = ensembles[position + 1][0] - 1
        else:
            last = metadata.last_entry_id if metadata.is_closed else None
        found.append((first, last, members))
    return found


def short_fragments(
    metadata: LedgerMetadata,
    gone: Callable[[str], bool],
    lost: Mapping[int, Collection[str]] | None = None,
) -> tuple[list[Fragment], bool]:
    """(the fragments with a known end whose ensemble names a bookie ``gone`` says is gone, or
    one that ``lost`` (fragment's first entry -> bookies) says lost its copies of that
    fragment, whether the open ledger's last fragment names one too)."""
    found = []
    open_short = False
    for first, last, members in fragments(metadata):
        lost_here = lost.get(first, ()) if lost else ()
        missing = {
            index: bookie
            for index, bookie in enumerate(members)
            if gone(bookie) or bookie in lost_here
        }
        if not missing:
            continue
        if last is None:
            open_short = True
            continue
        found.append(Fragment(metadata.ledger_id, first, last, members, missing))
    return found, open_short


def names_gone_bookie(metadata: LedgerMetadata, gone: Callable[[str], bool]) -> bool:
    return any(gone(bookie) for bookie in metadata.bookies())


def _held(index: int, first: int, last: int, metadata: LedgerMetadata) -> list[int]:
    """The first and the last entry of ``first``..``last`` that ensemble index ``index`` stores
    (one or two ids; [] when it stores none)."""
    size, quorum = metadata.ensemble_size, metadata.write_quorum_size

    def stores(entry: int) -> bool:
        return (index - entry) % size < quorum

    lowest = next((e for e in range(first, min(last, first + size - 1) + 1) if stores(e)), None)
    if lowest is None:
        return []
    highest = next(e for e in range(last, max(first, last - size + 1) - 1, -1) if stores(e))
    return [lowest, highest]


async def missing_on(
    client: BookKeeper, metadata: LedgerMetadata, bookies: Collection[str]
) -> dict[int, set[str]]:
    """Fragment (by its first entry) -> those of ``bookies`` (live ones) that answer "no such
    entry" or "no such ledger" for the first or last entry they should hold of it, for the
    fragments with a known end (BookKeeper's LedgerChecker): lost data on a live bookie, a
    replaced disk, entries its writer never got to it. Per fragment: a bookie is replaced only
    where it lacks data. A bookie that cannot be reached is not counted (the lost-bookie audit
    covers it)."""
    missing: dict[int, set[str]] = {}
    for first, last, members in fragments(metadata):
        if last is None or last < first:
            continue
        for index, bookie in enumerate(members):
            if bookie not in bookies or bookie in missing.get(first, ()):
                continue
            for entry_id in set(_held(index, first, last, metadata)):
                try:
                    status, _ = await client.bookie_client.read_entry(
                        bookie, metadata.ledger_id, entry_id
                    )
                except errors.BKError:
                    continue
                if status in (StatusCode.ENOENTRY, StatusCode.ENOLEDGER):
                    missing.setdefault(first, set()).add(bookie)
    return missing


@dataclass(frozen=True)
class ClusterBookies:
    """The bookies as AutoRecovery sees them at a moment: registered, and of those the ones
    that refuse connections. A killed bookie refuses them at once, while its registration stays
    until its metadata session expires (the ZooKeeper session timeout, the SQLite lease): the
    auditor counts it lost from the refusal, and the workers treat it as gone as soon as its
    ledgers are marked. A bookie that cannot be reached otherwise (no answer) counts as live
    until its registration goes."""

    registered: frozenset[str]
    registered_writable: tuple[str, ...]
    refusing: frozenset[str]

    @property
    def live(self) -> set[str]:
        return set(self.registered - self.refusing)

    @property
    def writable(self) -> list[str]:
        return [bookie for bookie in self.registered_writable if bookie not in self.refusing]


async def cluster_bookies(client: BookKeeper) -> ClusterBookies:
    """The registered bookies (read from the store now), each probed (``refusing``)."""
    writable, readonly = await client.metadata_port.bookies_now()
    registered = frozenset(writable) | frozenset(readonly)
    refusing = await client.bookie_client.refusing(registered)
    return ClusterBookies(registered, tuple(writable), frozenset(refusing))


# -- pacing and progress -------------------------------------------------------------------------


class Throttle:
    """Paces copies to ``bytes_per_second`` (0 or less: no limit; BookKeeper's
    ``replicationRateByBytes``), shared by every copy of one process."""

    def __init__(self, bytes_per_second: float = 0) -> None:
        self.bytes_per_second = bytes_per_second
        self._free_at = 0.0

    def reserve(self, size: int) -> float:
        """Takes ``size`` bytes of the rate: the seconds to wait before sending them."""
        if self.bytes_per_second <= 0:
            return 0.0
        now = time.monotonic()
        start = max(self._free_at, now)
        self._free_at = start + size / self.bytes_per_second
        return start - now

    async def take(self, size: int) -> None:
        delay = self.reserve(size)
        if delay > 0:
            await asyncio.sleep(delay)


@dataclass
class Progress:
    """What a replication run did so far, and how far it has to go (for the operator's progress
    line and ETA, and the metrics). Totals are known once the work was planned."""

    ledgers_total: int = 0
    ledgers_done: int = 0
    entries_total: int = 0
    entries_done: int = 0
    bytes_done: int = 0
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None  # time.monotonic() at the end: the rate stays as it ended

    def finish(self) -> None:
        if self.finished is None:
            self.finished = time.monotonic()

    def _elapsed(self) -> float:
        return (self.finished if self.finished is not None else time.monotonic()) - self.started

    def rate(self) -> float:
        """Bytes copied per second so far (over the whole run, once finished)."""
        elapsed = self._elapsed()
        return self.bytes_done / elapsed if elapsed > 0 else 0.0

    def eta_s(self) -> float | None:
        """Seconds left at the rate so far (None before anything was copied)."""
        if self.entries_done == 0 or self.entries_total <= self.entries_done:
            return None if self.entries_done == 0 else 0.0
        return self._elapsed() * (self.entries_total - self.entries_done) / self.entries_done

    def line(self) -> str:
        eta = self.eta_s()
        return (
            f"{self.ledgers_done}/{self.ledgers_total} ledgers, "
            f"{self.entries_done}/{self.entries_total} entries, "
            f"{self.bytes_done / 1e6:.1f} MB copied, {self.rate() / 1e6:.1f} MB/s, "
            f"ETA {'-' if eta is None else f'{eta:.0f} s'}"
        )


# -- the replicator ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicationOptions:
    entries_in_flight: int = 10  # BookKeeper's rereplicationEntryBatchSize
    bytes_per_second: float = 0  # replicationRateByBytes; 0 or less: no limit


@dataclass
class LedgerOutcome:
    ledger_id: int
    whole: bool = False  # no fragment names a gone or leaving bookie any more
    deleted: bool = False  # the ledger was deleted meanwhile: nothing to do
    waiting_for_writer: bool = False  # open, and its writer's fragment names a gone bookie
    fragments: int = 0  # fragments whose copies were made again
    entries: int = 0
    bytes: int = 0


class Replicator:
    """Makes the missing copies of ledgers through ``client`` (its bookie connections, its
    metadata port and its placement policy)."""

    def __init__(
        self,
        client: BookKeeper,
        options: ReplicationOptions | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        self.client = client
        self.options = options or ReplicationOptions()
        self.throttle = throttle or Throttle(self.options.bytes_per_second)

    async def registered(self) -> tuple[set[str], list[str]]:
        """(every live bookie, the writable ones): ``cluster_bookies``."""
        bookies = await cluster_bookies(self.client)
        return bookies.live, bookies.writable

    async def plan(
        self,
        ledger_id: int,
        leaving: Collection[str],
        live: Collection[str],
        lost: Mapping[int, Collection[str]] | None = None,
    ) -> tuple[LedgerMetadata, list[Fragment], bool] | None:
        """(metadata, short fragments, whether the open last fragment is short) of a ledger;
        None when it does not exist."""
        try:
            metadata, _ = await self.client.metadata_port.read_ledger_metadata(ledger_id)
        except errors.NoSuchLedgerError:
            return None

        def gone(bookie: str) -> bool:
            return bookie in leaving or bookie not in live

        found, open_short = short_fragments(metadata, gone, lost)
        return metadata, found, open_short

    async def replicate(
        self,
        ledger_id: int,
        leaving: Collection[str] = (),
        *,
        lost: Mapping[int, Collection[str]] | None = None,
        fence_open: bool = False,
        progress: Progress | None = None,
    ) -> LedgerOutcome:
        """Makes again every copy of ``ledger_id`` that is on a bookie not live or in
        ``leaving``, or that ``lost`` (fragment's first entry -> bookies, ``missing_on``) says
        its bookie lost. An open ledger whose last fragment names such a bookie is fenced and
        recovered first when ``fence_open``, else that fragment is left to its writer. Raises
        ``ReplicationError`` (or the client's errors) when a copy cannot be made now; what was
        finished stays finished."""
        outcome = LedgerOutcome(ledger_id)
        leaving = set(leaving)
        live, writable = await self.registered()
        planned = await self.plan(ledger_id, leaving, live, lost)
        if planned is None:
            outcome.deleted = outcome.whole = True
            return outcome
        metadata, short, open_short = planned
        if open_short and fence_open:
            log.info("ledger %d: open and its writer's bookies are gone; recovering it", ledger_id)
            handle = ReadHandle(self.client, metadata, metadata.password)
            try:
                await recover(handle)
            except errors.LedgerClosedError:
                pass  # its writer closed it meanwhile
            planned = await self.plan(ledger_id, leaving, live, lost)
            if planned is None:
                outcome.deleted = outcome.whole = True
                return outcome
            metadata, short, open_short = planned
        targets_pool = [bookie for bookie in writable if bookie not in leaving]
        for fragment in short:
            copied_entries, copied_bytes = await self._fragment(
                metadata, fragment, targets_pool, leaving, live, progress
            )
            outcome.fragments += 1
            outcome.entries += copied_entries
            outcome.bytes += copied_bytes
        after = await self.plan(ledger_id, leaving, live, lost)
        if after is None:
            outcome.deleted = outcome.whole = True
            return outcome
        _, still_short, open_short = after
        outcome.waiting_for_writer = open_short
        outcome.whole = not still_short and not open_short
        return outcome

    async def _fragment(
        self,
        metadata: LedgerMetadata,
        fragment: Fragment,
        writable: list[str],
        leaving: set[str],
        live: Collection[str],
        progress: Progress | None,
    ) -> tuple[int, int]:
        """Copies one fragment's missing entries to new bookies and swaps them into the
        metadata: (entries copied, bytes written)."""
        ledger_id = metadata.ledger_id
        try:
            new = self.client.placement.replace(
                fragment.ensemble,
                fragment.missing,
                writable,
                exclude=leaving | set(fragment.ensemble),
                write_quorum_size=metadata.write_quorum_size,
            )
        except errors.NotEnoughBookiesError as error:
            raise errors.ReplicationError(
                f"ledger {ledger_id}: no bookie to copy the fragment at entry "
                f"{fragment.first_entry} to ({error}); add bookies or wait for one to return"
            ) from error
        replacements = {index: new[index] for index in fragment.missing}
        handle = ReadHandle(self.client, metadata, metadata.password)
        entries = fragment.entries(metadata.write_quorum_size)
        # A leaving bookie that still runs is a good source, but the others are asked first (as
        # a live one that lost some of the fragment's entries).
        dead = {bookie for bookie in fragment.missing.values() if bookie not in live}
        last = leaving | (set(fragment.missing.values()) - dead)
        copy = _FragmentCopy(
            handle,
            replacements,
            entries,
            dead,
            last,
            max(1, self.options.entries_in_flight),
            self.throttle,
            progress,
        )
        copied = await copy.run()
        await self._swap(ledger_id, fragment, replacements)
        log.info(
            "ledger %d: fragment at entry %d copied (%d entries, %d bytes) and %s replaced by %s",
            ledger_id,
            fragment.first_entry,
            len(entries),
            copied,
            sorted(fragment.missing.values()),
            sorted(replacements.values()),
        )
        return len(entries), copied

    async def _swap(
        self, ledger_id: int, fragment: Fragment, replacements: Mapping[int, str]
    ) -> None:
        """Puts the new bookies in the fragment's place in the metadata (compare-and-swap)."""

        def needs_change(current: LedgerMetadata) -> bool:
            members = dict(current.ensembles).get(fragment.first_entry)
            if members is None:
                raise errors.MetadataVersionError(
                    f"ledger {ledger_id}: its fragment at entry {fragment.first_entry} is gone"
                )
            if all(members[index] == bookie for index, bookie in replacements.items()):
                return False  # an earlier attempt landed although its answer was lost
            if any(members[index] != fragment.missing[index] for index in replacements):
                raise errors.MetadataVersionError(
                    f"ledger {ledger_id}: the fragment at entry {fragment.first_entry} changed "
                    f"while it was copied ({list(fragment.ensemble)} -> {list(members)}); "
                    "it is checked again on the next attempt"
                )
            if not current.is_closed and current.last_ensemble[0] == fragment.first_entry:
                raise errors.MetadataVersionError(
                    f"ledger {ledger_id}: the fragment at {fragment.first_entry} is its open "
                    "writer's; only the writer changes it"
                )
            return True

        def transform(current: LedgerMetadata) -> LedgerMetadata:
            try:
                return current.with_members(fragment.first_entry, replacements)
            except ValueError as error:
                raise errors.MetadataVersionError(str(error)) from error

        await update_ledger_metadata(self.client.metadata_port, ledger_id, needs_change, transform)


class _FragmentCopy:
    """Copies ``entries`` of one fragment to the new bookies of their write sets: each entry
    read from its first serving replica outside ``dead`` (``leaving`` ones last), its digest
    checked, then written unchanged with RECOVERY_ADD (without HIGH_PRIORITY: background work,
    as BookKeeper's replicator sends it) to each new bookie, ``window`` entries in flight,
    paced by ``throttle``. Driven by the bookie connections' callbacks (no task per entry: the
    worker runs in the bookies' processes, and every copy's CPU is taken from their writers).
    ``run`` returns the bytes written, or raises ``ReplicationError`` at the first copy that
    cannot be made (the others are left to finish unwatched; what they wrote is harmless)."""

    def __init__(
        self,
        handle: ReadHandle,
        replacements: Mapping[int, str],
        entries: list[int],
        dead: set[str],
        leaving: set[str],
        window: int,
        throttle: Throttle,
        progress: Progress | None,
    ) -> None:
        self.handle = handle
        self.replacements = replacements
        self.entries = entries
        self.dead = dead
        self.leaving = leaving
        self.window = window
        self.throttle = throttle
        self.progress = progress
        metadata = handle.metadata
        self._size, self._quorum = metadata.ensemble_size, metadata.write_quorum_size
        self._bookies = handle.client.bookie_client
        self._next = 0  # index in ``entries`` of the next entry to start
        self._running = 0
        self._copied = 0
        self._done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def run(self) -> int:
        if not self.entries:
            return 0
        try:
            self._start_more()
            return await self._done
        finally:
            self._next = len(self.entries)  # (cancelled or failed) nothing more is started

    def _start_more(self) -> None:
        while self._running < self.window and self._next < len(self.entries):
            entry_id = self.entries[self._next]
            self._next += 1
            self._running += 1
            sources = self.handle.stored_entry_sources(entry_id, self.dead, self.leaving)
            self._read(entry_id, sources, 0, [])
        if self._running == 0 and not self._done.done():
            self._done.set_result(self._copied)

    def _fail(self, error: errors.BKError) -> None:
        if not self._done.done():
            self._done.set_exception(error)

    def _read(self, entry_id: int, sources: list[str], attempt: int, problems: list[str]) -> None:
        if self._done.done():
            return
        if attempt == len(sources):
            self._fail(
                errors.ReplicationError(
                    f"ledger {self.handle.ledger_id} entry {entry_id}: no replica outside "
                    f"{sorted(self.dead)} served it ({'; '.join(problems) or 'none left'}); the "
                    "ledger stays under-replicated until a replica returns"
                )
            )
            return
        bookie = sources[attempt]
        ledger_id = self.handle.ledger_id

        def answered(status: StatusCode | None, body: bytes | errors.BKError) -> None:
            if status is None or not isinstance(body, bytes):
                problems.append(f"{bookie}: {body!s}")
                self._read(entry_id, sources, attempt + 1, problems)
                return
            if status != StatusCode.EOK:
                problems.append(f"{bookie}: {status.name}")
                self._read(entry_id, sources, attempt + 1, problems)
                return
            try:
                self.handle.digest.verify(body, entry_id)
            except errors.DigestMismatchError as error:
                problems.append(f"{bookie}: {error}")
                self._read(entry_id, sources, attempt + 1, problems)
                return
            self._paced(entry_id, body)

        self._bookies.send(
            bookie,
            lambda connection: connection.read(ledger_id, entry_id, False, None, answered),
            answered,
        )

    def _paced(self, entry_id: int, data: bytes) -> None:
        if self._done.done():
            return
        members = write_set(entry_id, self._size, self._quorum)
        targets = [self.replacements[index] for index in members if index in self.replacements]
        delay = self.throttle.reserve(len(data) * len(targets))
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, self._write, entry_id, data, targets)
        else:
            self._write(entry_id, data, targets)

    def _write(self, entry_id: int, data: bytes, targets: list[str]) -> None:
        if self._done.done():
            return
        ledger_id = self.handle.ledger_id
        waiting = [len(targets)]

        def written(target: str, status: StatusCode | None, body: bytes | errors.BKError) -> None:
            if self._done.done():
                return
            if status is None:
                self._fail(
                    errors.ReplicationError(
                        f"ledger {ledger_id} entry {entry_id}: copying it to {target} failed "
                        f"({body!s})"
                    )
                )
                return
            if status != StatusCode.EOK:
                self._fail(
                    errors.ReplicationError(
                        f"ledger {ledger_id} entry {entry_id}: {target} refused the copy "
                        f"({status.name})"
                    )
                )
                return
            waiting[0] -= 1
            if not waiting[0]:
                self._copied_one(len(data) * len(targets))

        for target in targets:
            answered: Callback = partial(written, target)
            self._bookies.send(target, partial(self._add, entry_id, data, answered), answered)

    def _copied_one(self, size: int) -> None:
        """An entry is on every new bookie of its write set (``size`` bytes written)."""
        self._copied += size
        if self.progress is not None:
            self.progress.entries_done += 1
            self.progress.bytes_done += size
        self._running -= 1
        self._start_more()

    def _add(self, entry_id: int, data: bytes, answered: Callback, connection: Any) -> None:
        connection.add(
            self.handle.ledger_id,
            entry_id,
            self.handle.master_key,
            data,
            True,
            answered,
            high_priority=False,
        )
