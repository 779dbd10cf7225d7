"""The client's metrics, in BookKeeper's names (its ``BookKeeperClientStats`` under the
``bookkeeper_client_`` scope), recorded when the client is given a ``Metrics``
(``ClientConfig.metrics``: for instance the application's ``prometheus.PrometheusMetrics``):

* ``bookkeeper_client_ADD_ENTRY``: each add, from the call to its completion (or failure);
* ``bookkeeper_client_ADD_ENTRY_UR``: adds under-replicated, as Java's ``PendingAddOp`` counts
  them: a failed answer (error status, lost connection, timeout) from a bookie of the entry's
  write set, not replaced since, once the entry had its Qa acks (``core.writer`` rule 8);
* ``bookkeeper_client_READ_ENTRY``: each read request (a range of entries), call to answer;
* ``bookkeeper_client_READ_ENTRY_DM``: entries a bookie returned to a read (a range read, a long
  poll's piggybacked entry, a copy read for re-replication) whose digest did not match;
* ``bookkeeper_client_LAC_UPDATE_HITS`` / ``_MISSES``: a LAC bookies told a reader (a long
  poll's answer, ``read_last_add_confirmed``, ``read_explicit_last_add_confirmed``, the LAC read
  of an open without recovery) that advanced the handle's LAC / that did not. Java also counts
  the LAC on every entry read (-1 over v2, so a miss per entry); our range reads leave the LAC
  alone and count neither;
* ``bookkeeper_client_LEDGER_CREATE``, ``_OPEN`` (with recovery when the ledger is open),
  ``_DELETE``, ``_RECOVER``;
* ``bookkeeper_client_NUM_ENSEMBLE_CHANGE``: bookies replaced in writers' ensembles;
* ``bookkeeper_client_SPECULATIVE_READ_COUNT``: reads sent to another replica because one was
  slow;
* ``bookkeeper_client_NUM_PENDING_ADD``: adds called and not completed, over the open writers.

With ``ClientConfig.per_bookie_metrics`` (BookKeeper's ``limitStatsLogging=false``; off by
default, as there), ``ChannelStats`` per bookie, labelled ``bookie="<bookie id>"``:

* ``per_channel_bookie_client_ADD_ENTRY``, ``_READ_ENTRY`` (entry, batch and long-poll reads),
  ``_WRITE_LAC``, ``_FORCE``, ``_READ_LAC``, ``_GET_BOOKIE_INFO``: each request from when it was
  written to the connection to the bookie's answer; success when it answered EOK, failure for
  another status, a timeout or a lost connection;
* ``per_channel_bookie_client_TIMEOUT_<the same>``: the requests that timed out (as successes, as
  Java records them);
* ``per_channel_bookie_client_CLIENT_CONNECT_TIMER``: connecting (with TLS and authentication);
* ``per_channel_bookie_client_FAILED_CONNECTION_COUNTER``: connections that could not be made.

Without ``ClientConfig.metrics`` nothing is recorded and an add costs nothing more; without
``per_bookie_metrics`` a connection checks one attribute per batch of answers."""

from __future__ import annotations

import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Protocol

from bookkeeper_py.metrics import CounterMetric, Metrics, OpStats

if TYPE_CHECKING:
    from bookkeeper_py.client.client import BookKeeper


class _Writer(Protocol):
    @property
    def ensemble_changes(self) -> int: ...

    @property
    def pending_adds(self) -> int: ...


CHANNEL_SCOPE = "per_channel_bookie_client_"  # BookKeeper's, under the root scope


class ChannelStats:
    """BookKeeper's per-channel stats of one bookie (``PerChannelBookieClient``'s), shared by the
    client's connections to it (v2 and v3). Each request kind has a pair: its answers (success:
    EOK) and its timeouts."""

    __slots__ = (
        "add",
        "bookie_info",
        "connect",
        "failed_connections",
        "force",
        "read",
        "read_lac",
        "write_lac",
    )

    def __init__(self, metrics: Metrics, bookie_id: str) -> None:
        labels = {"bookie": bookie_id}

        def pair(name: str, what: str) -> tuple[OpStats, OpStats]:
            return (
                metrics.op_stats(
                    CHANNEL_SCOPE + name, f"{what}, request to answer (s)", (), labels
                ),
                metrics.op_stats(
                    f"{CHANNEL_SCOPE}TIMEOUT_{name}", f"{what} that timed out (s)", (), labels
                ),
            )

        self.add = pair("ADD_ENTRY", "adds sent to this bookie")
        self.read = pair("READ_ENTRY", "entry, batch and long-poll reads sent to this bookie")
        self.write_lac = pair("WRITE_LAC", "explicit LAC writes sent to this bookie")
        self.force = pair("FORCE", "FORCE_LEDGER requests sent to this bookie")
        self.read_lac = pair("READ_LAC", "READ_LAC requests sent to this bookie")
        self.bookie_info = pair("GET_BOOKIE_INFO", "GET_BOOKIE_INFO requests sent to this bookie")
        self.connect: OpStats = metrics.op_stats(
            CHANNEL_SCOPE + "CLIENT_CONNECT_TIMER",
            "connecting to this bookie, with TLS and authentication (s)",
            (),
            labels,
        )
        self.failed_connections: CounterMetric = metrics.counter(
            CHANNEL_SCOPE + "FAILED_CONNECTION_COUNTER",
            "connections to this bookie that could not be made",
            labels,
        )


class ClientMetrics:
    """The op stats, counters and gauges of one client; ``channel`` the per-bookie stats."""

    def __init__(self, client: BookKeeper, metrics: Metrics) -> None:
        self._metrics = metrics
        self._channels: dict[str, ChannelStats] = {}
        stats = metrics.op_stats
        self.add: OpStats = stats("bookkeeper_client_ADD_ENTRY", "adds, call to completion (s)")
        self.read: OpStats = stats("bookkeeper_client_READ_ENTRY", "read requests (s)")
        counter = metrics.counter
        self.add_under_replicated = counter(
            "bookkeeper_client_ADD_ENTRY_UR",
            "adds a write-set bookie failed after the ack quorum acknowledged them",
        )
        self.read_digest_mismatches = counter(
            "bookkeeper_client_READ_ENTRY_DM", "entries read whose digest did not match"
        )
        self.lac_update_hits = counter(
            "bookkeeper_client_LAC_UPDATE_HITS", "LACs told by bookies that advanced a reader's"
        )
        self.lac_update_misses = counter(
            "bookkeeper_client_LAC_UPDATE_MISSES",
            "LACs told by bookies that did not advance a reader's",
        )
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

    def channel(self, bookie_id: str) -> ChannelStats:
        """The per-channel stats of ``bookie_id`` (registered on first use)."""
        channel = self._channels.get(bookie_id)
        if channel is None:
            channel = self._channels[bookie_id] = ChannelStats(self._metrics, bookie_id)
        return channel

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
