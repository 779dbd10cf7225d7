"""What runs in Spark's Python workers: reading planned ranges straight from the bookies into
Arrow batches, and the clients and event loop that does it.

Python workers are reused across tasks (``spark.python.worker.reuse``), so each keeps one event
loop thread and one client per client configuration for its life (``runtime()``); a reading
task needs no metadata session: its client knows the bookies' endpoints from the range
(``KnownBookies``). Reads run on the loop thread a few chunks ahead of the task's thread, which
turns each chunk into an Arrow batch meanwhile.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from bookkeeper_py import errors
from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.client.facade import LoopThread
from bookkeeper_py.client.ledger import ReadHandle
from bookkeeper_py.metadata.port import KnownBookies
from bookkeeper_py.spark.arrow import ledger_batch, log_batch
from bookkeeper_py.spark.options import client_config
from bookkeeper_py.spark.planning import DataLossError, ReadRange

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 * 1024 * 1024  # entries read (and turned into one batch) at a time
MAX_CHUNK_ENTRIES = 4096
READ_AHEAD = 3  # chunks in flight ahead of the one being converted
READ_TIMEOUT_S = 300.0


class Runtime:
    """One loop thread and the clients of this worker process."""

    def __init__(self) -> None:
        self.loop = LoopThread()
        self._clients: dict[tuple[Any, ...], BookKeeper] = {}
        self._ports: dict[tuple[Any, ...], KnownBookies] = {}  # of the reading clients
        self._lock = threading.Lock()

    @staticmethod
    def _key(client_options: Mapping[str, Any], *more: Any) -> tuple[Any, ...]:
        return (*more, *sorted((k, repr(v)) for k, v in client_options.items()))

    def reading_client(
        self, client_options: Mapping[str, Any], endpoints: tuple[tuple[str, str, int], ...]
    ) -> BookKeeper:
        """A client that knows the bookies of ``endpoints`` and has no metadata session (a
        reading task's)."""
        key = self._key(client_options)
        with self._lock:
            if key not in self._clients:
                self._ports[key] = KnownBookies()
                self._clients[key] = BookKeeper(self._ports[key], client_config(client_options))
            client, port = self._clients[key], self._ports[key]
        port.learn({bookie: (host, number) for bookie, host, number in endpoints})
        return client

    async def client(self, uri: str, client_options: Mapping[str, Any]) -> BookKeeper:
        """A connected client of the metadata service at ``uri``, kept for the life of this
        Python worker (planning, a writing task, the commits of a streaming query's batches:
        one metadata session, not one per call); on the runtime's loop."""
        key = self._key(client_options, uri)
        with self._lock:
            if key not in self._clients:
                self._clients[key] = BookKeeper(uri, client_config(client_options))
            client = self._clients[key]
        return await client

    def close(self) -> None:
        for client in self._clients.values():
            try:
                self.loop.run(client.close(), 10)
            except Exception:
                pass
        self.loop.stop()


_RUNTIME: Runtime | None = None
_RUNTIME_LOCK = threading.Lock()


def runtime() -> Runtime:
    global _RUNTIME
    with _RUNTIME_LOCK:
        if _RUNTIME is None:
            _RUNTIME = Runtime()
            atexit.register(_RUNTIME.close)
        return _RUNTIME


def read_range(
    part: ReadRange, client_options: Mapping[str, Any], password: bytes, include_metadata: bool
) -> Iterator[pa.RecordBatch]:
    """The records (or raw entries) of ``part`` as Arrow batches, in order."""
    run = runtime()
    client = run.reading_client(client_options, part.endpoints)
    handle = ReadHandle(client, part.metadata, password)
    per_chunk = max(1, min(MAX_CHUNK_ENTRIES, CHUNK_BYTES // max(1, part.entry_bytes)))
    spans = deque(
        (low, min(part.last_entry, low + per_chunk - 1))
        for low in range(part.first_entry, part.last_entry + 1, per_chunk)
    )
    reads: deque[concurrent.futures.Future[list[Any]]] = deque()

    def read_next() -> None:
        if spans:
            low, high = spans.popleft()
            reads.append(run.loop.submit(handle.read_unconfirmed_entries(low, high)))

    try:
        for _ in range(READ_AHEAD + 1):
            read_next()
        while reads:
            try:
                entries = reads.popleft().result(READ_TIMEOUT_S)
            except (errors.NoSuchLedgerError, errors.NoSuchEntryError) as error:
                lost = (
                    f"{part.log or 'ledger ' + str(part.ledger_id)}: entries "
                    f"{part.first_entry}-{part.last_entry} of ledger {part.ledger_id} are gone "
                    f"({error})"
                )
                if part.fail_on_data_loss:
                    raise DataLossError(
                        f"{lost}: the log was truncated or the ledger deleted under the query; "
                        "set failOnDataLoss=false to skip what is lost"
                    ) from None
                log.warning("%s: skipped (failOnDataLoss=false)", lost)
                return
            read_next()
            pairs = [(entry.entry_id, entry.data) for entry in entries]
            if not part.log:
                yield ledger_batch(part.ledger_id, pairs)
                continue
            batch = log_batch(
                part.log,
                part.ledger_id,
                pairs,
                part.start_sequence,
                part.end_sequence,
                segment=part.segment,
                bases=part.bases,
                include_metadata=include_metadata,
            )
            if batch is not None:
                yield batch
    finally:
        for pending in reads:
            pending.cancel()
