"""The replication worker (reference section 1.14): takes marked ledgers one at a time under a
lock that dies with it, makes their missing copies again (``replication.Replicator``) and clears
the marker only when no fragment names a gone bookie any more.

* The lock is an ephemeral node: a worker that dies mid-copy frees the ledger for another one;
  what it copied and swapped into the metadata stays, the rest is found short again.
* An open ledger's last fragment is its writer's. When it names a gone bookie the worker copies
  the other fragments, releases the ledger and looks again later; once the ledger stayed so for
  ``openLedgerRereplicationGracePeriod`` (its writer is presumed gone), it fences and recovers
  the ledger, then copies.
* A ledger that fails (no replica answered, no bookie to copy to) is released and tried again
  after a pause; its marker stays.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field

from bookkeeper_py import errors
from bookkeeper_py.autorecovery.replication import (
    Progress,
    ReplicationOptions,
    Replicator,
    missing_on,
)
from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.metadata.underreplication import UnderReplication
from bookkeeper_py.metrics import Metrics, NullMetrics, attribute_gauges

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerOptions:
    replication: ReplicationOptions = field(default_factory=ReplicationOptions)
    open_ledger_grace_s: float = 30.0  # openLedgerRereplicationGracePeriod
    poll_s: float = 1.0  # how often the markers are listed when there was nothing to do
    retry_s: float = 5.0  # pause before a ledger that failed is tried again
    # Ledgers one worker replicates at once: two, so that one ledger's store round trips (its
    # lock, marker, metadata, compare-and-swap, unmark: ~8 of them) overlap the other's copies
    # (1,000 ledgers of 1 MiB each, 3 -> 4 bookies: 52 -> 60-66 MB/s).
    ledgers_in_parallel: int = 2


class ReplicationWorker:
    """Replicates marked ledgers of ``client``'s cluster while ``run`` runs."""

    def __init__(
        self,
        client: BookKeeper,
        markers: UnderReplication,
        name: str,
        options: WorkerOptions | None = None,
        metrics: Metrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.markers = markers
        self.name = name
        self.options = options or WorkerOptions()
        self.replicator = Replicator(client, self.options.replication)
        self.progress = Progress()  # everything this worker copied
        self.ledgers_replicated = 0
        self.failures = 0
        self._not_before: dict[int, float] = {}  # ledger -> loop time to look at it again
        self._open_since: dict[int, float] = {}  # ledger -> loop time its writer's part was short
        self._unreleased: set[int] = set()  # ledgers whose lock a failed release may have kept
        self._rng = rng or random.Random()
        self._wake = asyncio.Event()
        metrics = metrics or NullMetrics()
        self._op = metrics.op_stats("replication_worker_REREPLICATE_OP", "one ledger's replication")
        attribute_gauges(
            metrics,
            self.progress,
            (
                ("replication_worker_NUM_ENTRIES_WRITTEN", "entries copied", "entries_done"),
                ("replication_worker_NUM_BYTES_WRITTEN", "bytes copied", "bytes_done"),
            ),
        )
        attribute_gauges(
            metrics,
            self,
            (
                (
                    "replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED",
                    "ledgers whose copies were made again",
                    "ledgers_replicated",
                ),
            ),
        )

    def wake(self) -> None:
        """Looks at the markers now rather than at the next poll."""
        self._wake.set()

    async def run(self) -> None:
        """Works until cancelled."""
        await asyncio.gather(
            *(self._lane() for _ in range(max(1, self.options.ledgers_in_parallel)))
        )

    async def _lane(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            worked = False
            try:
                for ledger_id in sorted(self._unreleased):
                    await self.markers.release(ledger_id)
                    self._unreleased.discard(ledger_id)
                if await self.markers.is_enabled():
                    marked = await self.markers.marked()
                    self._rng.shuffle(marked)  # workers of several bookies spread out
                    for ledger_id in marked:
                        if self._not_before.get(ledger_id, 0.0) > loop.time():
                            continue
                        if not await self.markers.acquire(ledger_id, self.name):
                            continue
                        worked = True
                        try:
                            await self.replicate(ledger_id)
                        except errors.BKError:
                            # Its release (or unmark) failed: the lock may be held still, and a
                            # lock of this live session would keep every worker off the ledger.
                            self._unreleased.add(ledger_id)
                            raise
            except errors.BKError as error:
                log.warning("replication worker %s: %s; trying again", self.name, error)
            if not worked:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.options.poll_s)
                except TimeoutError:
                    pass

    async def _lost_data(self, ledger_id: int) -> dict[int, set[str]]:
        """The live bookies the ledger's marker names that really lost its entries (the
        periodic check marks those), by fragment; a bookie marked lost that came back holding
        them is left alone."""
        marker = await self.markers.marker(ledger_id)
        if marker is None:
            return {}
        live, _ = await self.replicator.registered()
        suspects = set(marker[0]) & live
        if not suspects:
            return {}
        try:
            metadata, _ = await self.client.metadata_port.read_ledger_metadata(ledger_id)
        except errors.NoSuchLedgerError:
            return {}
        return await missing_on(self.client, metadata, suspects)

    async def replicate(self, ledger_id: int) -> bool:
        """Replicates one ledger whose lock this worker holds; releases or clears it. True when
        the ledger is whole again (its marker cleared)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        open_since = self._open_since.get(ledger_id)
        fence = open_since is not None and started - open_since >= self.options.open_ledger_grace_s
        try:
            lost = await self._lost_data(ledger_id)
            outcome = await self.replicator.replicate(
                ledger_id, lost=lost, fence_open=fence, progress=self.progress
            )
        except (errors.BKError, OSError) as error:
            self.failures += 1
            self._op.failure(loop.time() - started)
            log.warning(
                "replication worker %s: ledger %d: %s; retrying in %.0f s",
                self.name,
                ledger_id,
                error,
                self.options.retry_s,
            )
            self._not_before[ledger_id] = loop.time() + self.options.retry_s
            await self.markers.release(ledger_id)
            return False
        except BaseException:
            await asyncio.shield(self.markers.release(ledger_id))
            raise
        self._op.success(loop.time() - started)
        if outcome.fragments:
            self.ledgers_replicated += 1
        if outcome.whole:
            self._open_since.pop(ledger_id, None)
            self._not_before.pop(ledger_id, None)
            await self.markers.unmark(ledger_id)
            log.info(
                "replication worker %s: ledger %d is whole again (%d fragments, %d bytes)",
                self.name,
                ledger_id,
                outcome.fragments,
                outcome.bytes,
            )
            return True
        if outcome.waiting_for_writer:
            since = self._open_since.setdefault(ledger_id, started)
            wait = max(0.5, since + self.options.open_ledger_grace_s - loop.time())
            self._not_before[ledger_id] = loop.time() + min(wait, self.options.poll_s * 5)
        else:
            self._not_before[ledger_id] = loop.time() + self.options.retry_s
        await self.markers.release(ledger_id)
        return False
