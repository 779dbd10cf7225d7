"""The auditor: the one process of a cluster (elected, see ``service``) that notices lost bookies
and marks the ledgers that had copies on them (reference section 1.14).

* It polls the registered bookies, and probes them (``cluster_bookies``). A bookie that was
  registered and is gone, or that refuses connections (its process died: its registration
  lasts until its metadata session expires; it is audited again when the registration goes,
  for the ensembles writers gave it meanwhile), is *lost* from that moment; once it stays away
  ``lostBookieRecoveryDelay`` seconds (a value in the metadata store, changed at run time by
  the shell), every ledger with a fragment on it is marked under-replicated, naming it. A
  bookie that comes back within the delay causes nothing (a restart). A bookie named by
  ledgers that was never seen registered counts as lost from the auditor's start.
* Rewriting the delay (``triggeraudit`` rewrites the value in force) makes it audit every lost
  bookie at once, delay or not.
* Periodic checks: every ``auditorPeriodicBookieCheckInterval`` the lost-bookie audit again (for
  ledgers made since); every ``auditorPeriodicCheckInterval`` every closed ledger against the
  bookies' contents (the first and last entry each live bookie of a fragment should hold are
  read; one that answers "no such entry/ledger" is marked missing); every
  ``auditorPeriodicPlacementPolicyCheckInterval`` (0: never) the ensembles against the placement
  policy, counted. When each last ran is kept in the metadata store (BookKeeper's
  ``checkallledgersctime`` and ``placementpolicycheckctime``): a newly elected auditor runs a
  check one interval after its last run by any auditor, at once when that is past (or after
  ``shell forceauditchecks`` set it to 0).
* Gauges: ledgers marked, fragments and bytes they are short of, placement violations.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass

from bookkeeper_py import errors
from bookkeeper_py.autorecovery.replication import (
    Fragment,
    cluster_bookies,
    fragments,
    missing_on,
    short_fragments,
)
from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.metadata.underreplication import (
    CHECK_ALL_LEDGERS,
    PLACEMENT_POLICY_CHECK,
    UnderReplication,
)
from bookkeeper_py.metrics import Metrics, NullMetrics, attribute_gauges

log = logging.getLogger(__name__)

DAY_S = 86_400.0


@dataclass(frozen=True)
class AuditorOptions:
    poll_s: float = 0.5  # how often the registered bookies and the delay are read
    bookie_check_interval_s: float = DAY_S  # auditorPeriodicBookieCheckInterval
    ledger_check_interval_s: float = 7 * DAY_S  # auditorPeriodicCheckInterval (0: never)
    placement_check_interval_s: float = 0.0  # auditorPeriodicPlacementPolicyCheckInterval
    initial_delay_s: int = 0  # lostBookieRecoveryDelay of the configuration, used until one is set


class Auditor:
    """Audits the cluster of ``client`` while ``run`` runs (only the elected one runs it)."""

    def __init__(
        self,
        client: BookKeeper,
        markers: UnderReplication,
        options: AuditorOptions | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.client = client
        self.markers = markers
        self.options = options or AuditorOptions()
        self.lost_since: dict[str, float] = {}  # bookie -> loop time it was first seen gone
        self.audited: set[str] = set()  # lost bookies whose ledgers were marked
        self.audited_registered: set[str] = set()  # of those, audited while still registered
        self.seen: set[str] = set()  # bookies seen registered while this auditor ran
        # lost bookie -> the ledgers this auditor marked for it (see ``mark_cleared_again``)
        self.marked_for: dict[str, set[int]] = {}
        self.marked_ledgers = 0
        self.short_fragments = 0
        self.short_bytes = 0
        self.placement_violations = 0
        self.audits = 0
        self.first_mark_at: float | None = None  # loop time of this auditor's first mark
        metrics = metrics or NullMetrics()
        attribute_gauges(
            metrics,
            self,
            (
                ("auditor_NUM_UNDER_REPLICATED_LEDGERS", "ledgers marked", "marked_ledgers"),
                ("auditor_NUM_UNDER_REPLICATED_FRAGMENTS", "fragments short", "short_fragments"),
                (
                    "auditor_UNDER_REPLICATED_LEDGERS_TOTAL_SIZE",
                    "bytes of the short fragments (estimated from ledger lengths)",
                    "short_bytes",
                ),
                (
                    "auditor_NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY",
                    "ledgers whose ensembles break the placement policy",
                    "placement_violations",
                ),
            ),
        )

    async def run(self) -> None:
        """Audits until cancelled."""
        loop = asyncio.get_running_loop()
        options = self.options
        started = loop.time()
        _, delay_version = await self.markers.lost_bookie_recovery_delay()
        if delay_version == -1 and options.initial_delay_s:
            await self.markers.set_lost_bookie_recovery_delay(options.initial_delay_s)
            _, delay_version = await self.markers.lost_bookie_recovery_delay()
        bookies = await cluster_bookies(self.client)
        self.seen |= bookies.registered
        # Bookies that ledgers name and that are not live: lost since now.
        for bookie in await self._named_bookies():
            if bookie not in bookies.live:
                self.lost_since.setdefault(bookie, started)
        next_bookie_check = started + options.bookie_check_interval_s
        next_ledger_check = await self._first_check(
            CHECK_ALL_LEDGERS, options.ledger_check_interval_s, started
        )
        next_placement_check = await self._first_check(
            PLACEMENT_POLICY_CHECK, options.placement_check_interval_s, started
        )
        while True:
            now = loop.time()
            bookies = await cluster_bookies(self.client)
            live = bookies.live
            for bookie in self.seen - live:
                if bookie not in self.lost_since:
                    log.warning("auditor: bookie %s is gone", bookie)
                    self.lost_since[bookie] = now
            for bookie in list(self.lost_since):
                if bookie in live:
                    log.info("auditor: bookie %s is back", bookie)
                    del self.lost_since[bookie]
                    self.audited.discard(bookie)
                    self.audited_registered.discard(bookie)
                    self.marked_for.pop(bookie, None)
            # Registered ones too: one that refuses connections is lost now, and audited again
            # when its registration goes (writers may give it a place in ensembles meanwhile).
            self.seen |= bookies.registered
            delay, version = await self.markers.lost_bookie_recovery_delay()
            triggered = version != delay_version
            delay_version = version
            periodic = now >= next_bookie_check
            if periodic:
                next_bookie_check = now + options.bookie_check_interval_s
            if triggered or periodic:
                due = set(self.lost_since)
            else:
                due = {
                    bookie
                    for bookie, since in self.lost_since.items()
                    if now - since >= delay and bookie not in self.audited
                }
            due |= self.deregistered_since_audit(bookies.registered)
            if (due or self.marked_for) and await self.markers.is_enabled():
                if due:
                    await self.audit_bookies(due)
                    self.audited |= due
                    self.audited_registered |= due & bookies.registered
                await self.mark_cleared_again()
            if next_ledger_check is not None and now >= next_ledger_check:
                await self.check_ledgers()
                await self.markers.set_check_ctime(CHECK_ALL_LEDGERS, int(time.time() * 1000))
                next_ledger_check = now + options.ledger_check_interval_s
            if next_placement_check is not None and now >= next_placement_check:
                await self.check_placement()
                await self.markers.set_check_ctime(PLACEMENT_POLICY_CHECK, int(time.time() * 1000))
                next_placement_check = now + options.placement_check_interval_s
            await asyncio.sleep(options.poll_s)

    async def _first_check(self, check: str, interval_s: float, started: float) -> float | None:
        """When this auditor first runs a periodic check (loop time; None: the check is off):
        one interval after it last ran in this cluster, by any auditor (at once when that is
        past, or after ``forceauditchecks``), else one interval after this auditor started."""
        if not interval_s:
            return None
        last_ms = await self.markers.check_ctime(check)
        if last_ms is None:
            return started + interval_s
        return started + max(0.0, last_ms / 1000 + interval_s - time.time())

    def deregistered_since_audit(self, registered: Collection[str]) -> set[str]:
        """The lost bookies audited while their registration stayed (their processes refused
        connections) whose registration is gone now: they are audited again, since writers
        could still choose them for ensembles until then."""
        gone = {bookie for bookie in self.audited_registered if bookie not in registered}
        self.audited_registered -= gone
        return gone & set(self.lost_since)

    async def _live(self) -> set[str]:
        return (await cluster_bookies(self.client)).live

    async def _ledgers(self) -> list[tuple[int, LedgerMetadata]]:
        found = []
        port = self.client.metadata_port
        for ledger_id in await port.list_ledgers():
            try:
                metadata, _ = await port.read_ledger_metadata(ledger_id)
            except errors.NoSuchLedgerError:
                continue  # deleted while we listed
            found.append((ledger_id, metadata))
        return found

    async def _named_bookies(self) -> set[str]:
        named: set[str] = set()
        for _, metadata in await self._ledgers():
            named |= metadata.bookies()
        return named

    async def audit_bookies(self, lost: Collection[str]) -> int:
        """Marks every ledger with a fragment on a ``lost`` bookie: the number marked. Each is
        marked as soon as its metadata is read (the first mark does not wait for the scan)."""
        lost = set(lost)
        log.warning("auditor: marking the ledgers of lost bookies %s", sorted(lost))
        loop = asyncio.get_running_loop()
        port = self.client.metadata_port
        marked = fragments_short = short_bytes = 0
        for ledger_id in await port.list_ledgers():
            try:
                metadata, _ = await port.read_ledger_metadata(ledger_id)
            except errors.NoSuchLedgerError:
                continue
            named = metadata.bookies() & lost
            if not named:
                continue
            await self.markers.mark(ledger_id, sorted(named))
            for bookie in named:
                self.marked_for.setdefault(bookie, set()).add(ledger_id)
            if self.first_mark_at is None:
                self.first_mark_at = loop.time()
            marked += 1
            short, open_short = short_fragments(metadata, lambda bookie: bookie in lost)
            fragments_short += len(short) + open_short
            short_bytes += _estimated_bytes(metadata, short)
        self.audits += 1
        self.marked_ledgers = len(await self.markers.marked())
        self.short_fragments = fragments_short
        self.short_bytes = short_bytes
        log.warning("auditor: %d ledgers marked under-replicated", marked)
        return marked

    async def mark_cleared_again(self) -> int:
        """Marks again the ledgers marked for a lost bookie whose marker a worker cleared while
        they still name it: the bookie came back and left again between two polls (to this
        auditor it never came back, so it would not audit it again), and the worker found the
        ledger whole while it was back. The number marked again."""
        still_marked = set(await self.markers.marked())
        port = self.client.metadata_port
        again = 0
        for bookie, ledgers in list(self.marked_for.items()):
            for ledger_id in sorted(ledgers - still_marked):
                try:
                    metadata, _ = await port.read_ledger_metadata(ledger_id)
                except errors.NoSuchLedgerError:
                    metadata = None
                if metadata is None or bookie not in metadata.bookies():
                    ledgers.discard(ledger_id)  # copied elsewhere (or deleted)
                    continue
                log.warning("auditor: ledger %d still names lost bookie %s", ledger_id, bookie)
                await self.markers.mark(ledger_id, [bookie])
                again += 1
            if not ledgers:
                del self.marked_for[bookie]  # every copy on it made again: nothing to watch
        return again

    async def check_ledgers(self) -> int:
        """Reads, from each live bookie of each fragment of every closed ledger, the first and
        last entry it should hold; marks the ledgers where one says it has no such entry (lost
        data on a live bookie: a replaced disk). The number marked."""
        live = await self._live()
        marked = 0
        for ledger_id, metadata in await self._ledgers():
            if not metadata.is_closed:
                continue
            missing = set().union(*(await missing_on(self.client, metadata, live)).values())
            if missing:
                log.warning(
                    "auditor: ledger %d has entries missing on %s", ledger_id, sorted(missing)
                )
                await self.markers.mark(ledger_id, sorted(missing))
                marked += 1
        self.marked_ledgers = len(await self.markers.marked())
        return marked

    async def check_placement(self) -> int:
        """Counts the ledgers whose ensembles break the placement policy (logged)."""
        adheres = getattr(self.client.placement, "adheres", None)
        if adheres is None:
            return 0
        violations = 0
        for ledger_id, metadata in await self._ledgers():
            if any(
                not adheres(members, metadata.write_quorum_size)
                for _, _, members in fragments(metadata)
            ):
                violations += 1
                log.warning("auditor: ledger %d breaks the placement policy", ledger_id)
        self.placement_violations = violations
        return violations


def _estimated_bytes(metadata: LedgerMetadata, short: list[Fragment]) -> int:
    """Bytes of the short fragments' missing copies, from the ledger's average entry size."""
    if not metadata.is_closed or metadata.last_entry_id < 0:
        return 0
    average = metadata.length / (metadata.last_entry_id + 1)
    return int(
        sum(len(fragment.entries(metadata.write_quorum_size)) for fragment in short) * average
    )
