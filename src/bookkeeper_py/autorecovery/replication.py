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

from bookkeeper_py import errors
from bookkeeper_py.client.client import BookKeeper
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
    metadata: LedgerMetadata, gone: Callable[[str], bool]
) -> tuple[list[Fragment], bool]:
    """(the fragments with a known end whose ensemble names a bookie ``gone`` says is gone,
    whether the open ledger's last fragment names one too)."""
    found = []
    open_short = False
    for first, last, members in fragments(metadata):
        missing = {index: bookie for index, bookie in enumerate(members) if gone(bookie)}
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
) -> set[str]:
    """Those of ``bookies`` (live ones) that answer "no such entry" or "no such ledger" for the
    first or last entry they should hold of a fragment with a known end (BookKeeper's
    LedgerChecker): lost data on a live bookie, a replaced disk. A bookie that cannot be reached
    is not counted (the lost-bookie audit covers it)."""
    missing: set[str] = set()
    for first, last, members in fragments(metadata):
        if last is None or last < first:
            continue
        for index, bookie in enumerate(members):
            if bookie not in bookies or bookie in missing:
                continue
            for entry_id in set(_held(index, first, last, metadata)):
                try:
                    status, _ = await client.bookie_client.read_entry(
                        bookie, metadata.ledger_id, entry_id
                    )
                except errors.BKError:
                    continue
                if status in (StatusCode.ENOENTRY, StatusCode.ENOLEDGER):
                    missing.add(bookie)
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

    async def take(self, size: int) -> None:
        if self.bytes_per_second <= 0:
            return
        now = time.monotonic()
        start = max(self._free_at, now)
        self._free_at = start + size / self.bytes_per_second
        if start > now:
            await asyncio.sleep(start - now)


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

    def rate(self) -> float:
        """Bytes copied per second so far."""
        elapsed = time.monotonic() - self.started
        return self.bytes_done / elapsed if elapsed > 0 else 0.0

    def eta_s(self) -> float | None:
        """Seconds left at the rate so far (None before anything was copied)."""
        if self.entries_done == 0 or self.entries_total <= self.entries_done:
            return None if self.entries_done == 0 else 0.0
        elapsed = time.monotonic() - self.started
        return elapsed * (self.entries_total - self.entries_done) / self.entries_done

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
        self, ledger_id: int, leaving: Collection[str], live: Collection[str]
    ) -> tuple[LedgerMetadata, list[Fragment], bool] | None:
        """(metadata, short fragments, whether the open last fragment is short) of a ledger;
        None when it does not exist."""
        try:
            metadata, _ = await self.client.metadata_port.read_ledger_metadata(ledger_id)
        except errors.NoSuchLedgerError:
            return None

        def gone(bookie: str) -> bool:
            return bookie in leaving or bookie not in live

        found, open_short = short_fragments(metadata, gone)
        return metadata, found, open_short

    async def replicate(
        self,
        ledger_id: int,
        leaving: Collection[str] = (),
        *,
        fence_open: bool = False,
        progress: Progress | None = None,
    ) -> LedgerOutcome:
        """Makes again every copy of ``ledger_id`` that is on a bookie not live or in
        ``leaving``. An open ledger whose last fragment names such a bookie is fenced and
        recovered first when ``fence_open``, else that fragment is left to its writer. Raises
        ``ReplicationError`` (or the client's errors) when a copy cannot be made now; what was
        finished stays finished."""
        outcome = LedgerOutcome(ledger_id)
        leaving = set(leaving)
        live, writable = await self.registered()
        planned = await self.plan(ledger_id, leaving, live)
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
            planned = await self.plan(ledger_id, leaving, live)
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
        after = await self.plan(ledger_id, leaving, live)
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
        copied = 0
        window = max(1, self.options.entries_in_flight)
        running: set[asyncio.Task[int]] = set()

        async def settle(until: int) -> None:
            """Waits until at most ``until`` copies run, counting those that ended."""
            nonlocal running, copied
            while len(running) > until:
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.exception()  # every failed copy's error retrieved, not only the first
                for task in done:
                    size = task.result()  # raises the copy's error
                    copied += size
                    if progress is not None:
                        progress.entries_done += 1
                        progress.bytes_done += size

        try:
            for entry_id in entries:
                await settle(window - 1)
                copy = self._entry(handle, fragment, replacements, entry_id, leaving, live)
                running.add(asyncio.ensure_future(copy))
            await settle(0)
        finally:
            for task in running:
                task.cancel()
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

    async def _entry(
        self,
        handle: ReadHandle,
        fragment: Fragment,
        replacements: Mapping[int, str],
        entry_id: int,
        leaving: set[str],
        live: Collection[str],
    ) -> int:
        """Copies one entry from a surviving replica to the new bookies of its write set; the
        bytes written."""
        metadata = handle.metadata
        ledger_id = handle.ledger_id
        members = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum_size)
        # A leaving bookie that still runs is a good source, but the others are asked first.
        dead = [bookie for bookie in fragment.missing.values() if bookie not in live]
        try:
            data = await handle.read_stored_entry(entry_id, exclude=dead, last=leaving)
        except errors.ReadError as error:
            raise errors.ReplicationError(
                f"{error}; the ledger stays under-replicated until a replica returns"
            ) from error
        client = self.client.bookie_client
        targets = [replacements[index] for index in members if index in replacements]
        await self.throttle.take(len(data) * len(targets))
        for target in targets:
            try:
                status = await client.recovery_add(
                    target, ledger_id, entry_id, handle.master_key, data
                )
            except errors.BKError as error:
                raise errors.ReplicationError(
                    f"ledger {ledger_id} entry {entry_id}: copying it to {target} failed ({error})"
                ) from error
            if status != StatusCode.EOK:
                raise errors.ReplicationError(
                    f"ledger {ledger_id} entry {entry_id}: {target} refused the copy "
                    f"({status.name})"
                )
        return len(data) * len(targets)

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
