"""AutoRecovery as a service (BookKeeper's AutoRecoveryMain): an auditor candidate and a
replication worker. It runs in a bookie process (``autoRecoveryDaemonEnabled=true``) or alone
(``bookkeeper autorecovery``), on its own client and metadata session.

The election: each candidate holds an ephemeral sequential vote under
``underreplication/auditorelection``; the lowest vote audits. A candidate whose vote vanished
(its session expired) votes again; when the auditor's process dies its vote goes with its
session and the next candidate takes over within a poll. A candidate that runs in a bookie
whose address refuses connections is dead although its session lingers (until the ZooKeeper
session timeout or the SQLite lease runs out): the candidates behind it withdraw its vote, and
the next one audits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from bookkeeper_py import errors
from bookkeeper_py.autorecovery.auditor import Auditor, AuditorOptions
from bookkeeper_py.autorecovery.replication import cluster_bookies
from bookkeeper_py.autorecovery.worker import ReplicationWorker, WorkerOptions
from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.metadata.underreplication import UnderReplication
from bookkeeper_py.metrics import Metrics, NullMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutoRecoveryOptions:
    auditor: AuditorOptions = field(default_factory=AuditorOptions)
    worker: WorkerOptions = field(default_factory=WorkerOptions)
    election_poll_s: float = 0.5


class AutoRecovery:
    """Stands for auditor and replicates, as ``name`` (a bookie id or host:pid), through
    ``client`` (which it does not close)."""

    def __init__(
        self,
        client: BookKeeper,
        name: str,
        options: AutoRecoveryOptions | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.client = client
        self.name = name
        self.options = options or AutoRecoveryOptions()
        self.metrics = metrics or NullMetrics()
        self.markers = UnderReplication(client.metadata_port)
        self.worker = ReplicationWorker(
            client, self.markers, name, self.options.worker, self.metrics
        )
        self.auditor: Auditor | None = None  # while this process is the auditor
        self._auditor_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._vote: str | None = None

    async def start(self) -> None:
        await self.markers.ensure_layout()
        self._tasks = [
            asyncio.ensure_future(self._elect()),
            asyncio.ensure_future(self._work()),
        ]

    @property
    def is_auditor(self) -> bool:
        return self._auditor_task is not None and not self._auditor_task.done()

    async def _work(self) -> None:
        while True:
            try:
                await self.worker.run()
            except errors.BKError as error:
                log.warning("autorecovery %s: worker stopped (%s); restarting", self.name, error)
                await asyncio.sleep(self.options.worker.retry_s)

    async def _elect(self) -> None:
        while True:
            try:
                await self._elect_once()
            except errors.BKError as error:
                log.warning("autorecovery %s: election: %s; trying again", self.name, error)
            await asyncio.sleep(self.options.election_poll_s)

    async def _elect_once(self) -> None:
        if self._vote is None:
            self._vote = await self.markers.vote(self.name)
            log.info("autorecovery %s: stands for auditor (vote %s)", self.name, self._vote)
        votes = await self.markers.votes()
        names = [vote for vote, _ in votes]
        if self._vote not in names:  # the session that held it ended
            await self._stop_auditing()
            self._vote = None
            return
        ahead = votes[: names.index(self._vote)]
        if ahead and await self._withdraw_dead(ahead):
            names = [vote for vote, _ in await self.markers.votes()]
        leading = names[0] == self._vote
        task = self._auditor_task
        if task is not None and task.done():
            if not task.cancelled() and task.exception() is not None:
                log.warning("autorecovery %s: auditor stopped: %s", self.name, task.exception())
            self._auditor_task = None
        if leading and self._auditor_task is None:
            log.warning("autorecovery %s: elected auditor", self.name)
            self.auditor = Auditor(self.client, self.markers, self.options.auditor, self.metrics)
            self._auditor_task = asyncio.ensure_future(self.auditor.run())
        elif not leading and self._auditor_task is not None:
            await self._stop_auditing()

    async def _withdraw_dead(self, votes: list[tuple[str, str]]) -> bool:
        """Withdraws those of ``votes`` whose candidate is a bookie that refuses connections
        (its process died; its session, and with it the vote, would last until it expires):
        whether any was withdrawn. A candidate that is no bookie (a ``bookkeeper autorecovery``
        process) keeps its vote until its session ends."""
        refusing = (await cluster_bookies(self.client)).refusing
        dead = [(vote, candidate) for vote, candidate in votes if candidate in refusing]
        for vote, candidate in dead:
            log.warning(
                "autorecovery %s: candidate %s refuses connections (its process is gone); "
                "its vote %s is withdrawn",
                self.name,
                candidate,
                vote,
            )
            await self.markers.withdraw(vote)
        return bool(dead)

    async def _stop_auditing(self) -> None:
        task, self._auditor_task = self._auditor_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def stop(self) -> None:
        """Stops auditing and replicating (a ledger being copied is released) and withdraws
        the vote."""
        await self._stop_auditing()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._vote is not None:
            with contextlib.suppress(errors.BKError):
                await self.markers.withdraw(self._vote)
            self._vote = None
