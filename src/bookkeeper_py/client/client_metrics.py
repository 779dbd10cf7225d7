"""The client's metrics, in BookKeeper's names (its ``BookKeeperClientStats`` under the
``bookkeeper_client_`` scope), recorded when the client is given a ``Metrics``
(``ClientConfig.metrics``: for instance the application's ``prometheus.PrometheusMetrics``):

* ``bookkeeper_client_ADD_ENTRY``: each add, from the call to its completion (or failure);
* ``bookkeeper_client_READ_ENTRY``: each read request (a range of entries), call to answer;
* ``bookkeeper_client_LEDGER_CREATE``, ``_OPEN`` (with recovery when the ledger is open),
  ``_DELETE``, ``_RECOVER``;
* ``bookkeeper_client_NUM_ENSEMBLE_CHANGE``: bookies replaced in writers' ensembles;
* ``bookkeeper_client_SPECULATIVE_READ_COUNT``: reads sent to another replica because one was
  slow;
* ``bookkeeper_client_NUM_PENDING_ADD``: adds called and not completed, over the open writers.

Without ``ClientConfig.metrics`` nothing is recorded and an add costs nothing more."""

from __future__ import annotations

import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Protocol

from bookkeeper_py.metrics import Metrics, OpStats

if TYPE_CHECKING:
    from bookkeeper_py.client.client import BookKeeper


class _Writer(Protocol):
    @property
    def ensemble_changes(self) -> int: ...

    @property
    def pending_adds(self) -> int: ...


class ClientMetrics:
    """The op stats, counters and gauges of one client."""

    def __init__(self, client: BookKeeper, metrics: Metrics) -> None:
        stats = metrics.op_stats
        self.add: OpStats = stats("bookkeeper_client_ADD_ENTRY", "adds, call to completion (s)")
        self.read: OpStats = stats("bookkeeper_client_READ_ENTRY", "read requests (s)")
        self.create = stats("bookkeeper_client_LEDGER_CREATE", "ledger creations (s)")
        self.open = stats("bookkeeper_client_LEDGER_OPEN", "ledger opens (s)")
        self.delete = stats("bookkeeper_client_LEDGER_DELETE", "ledger deletions (s)")
        self.recover = stats("bookkeeper_client_LEDGER_RECOVER", "ledger recoveries (s)")
        self._writers: weakref.WeakSet[_Writer] = weakref.WeakSet()
        self._closed_changes = 0  # ensemble changes of writers no longer open
        metrics.counter_function(
            "bookkeeper_client_SPECULATIVE_READ_COUNT",
            "reads sent to another replica because one was slow",
            lambda: float(client.speculative_reads),
        )
        metrics.counter_function(
            "bookkeeper_client_NUM_ENSEMBLE_CHANGE",
            "bookies replaced in writers' ensembles",
            lambda: float(
                self._closed_changes
                + sum(writer.ensemble_changes for writer in list(self._writers))
            ),
        )
        metrics.gauge_function(
            "bookkeeper_client_NUM_PENDING_ADD",
            "adds called and not completed, over the open writers",
            lambda: float(sum(writer.pending_adds for writer in list(self._writers))),
        )

    def writer_opened(self, writer: _Writer) -> None:
        self._writers.add(writer)

    def writer_closed(self, writer: _Writer) -> None:
        if writer in self._writers:
            self._writers.discard(writer)
            self._closed_changes += writer.ensemble_changes


@asynccontextmanager
async def timed(stats: OpStats | None) -> AsyncIterator[None]:
    """Records the time of the block under ``stats`` (success, or failure when it raises)."""
    if stats is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    except BaseException:
        stats.failure(time.perf_counter() - started)
        raise
    stats.success(time.perf_counter() - started)
