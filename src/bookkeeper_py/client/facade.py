"""The blocking API: a private event loop in a thread runs the asyncio client.

Every method waits for its coroutine on that loop. ``add_entry_async`` returns a
``concurrent.futures.Future`` that completes in entry-id order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from bookkeeper_py import errors
from bookkeeper_py.client import client as aio_client
from bookkeeper_py.client import ledger as aio_ledger
from bookkeeper_py.client.config import ClientConfig
from bookkeeper_py.client.ledger import LedgerEntry
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.metadata.driver import parse_uri
from bookkeeper_py.wire.digest import DigestType

T = TypeVar("T")
CLOSED = "this BookKeeper client is closed: make a new one to go on"
log = logging.getLogger(__name__)

__all__ = ["BookKeeper", "LedgerEntry", "LedgerHandle", "LedgerHandleAdv", "ReadHandle"]


class LoopThread:
    """An asyncio loop (uvloop when installed) running in a daemon thread."""

    def __init__(self) -> None:
        try:
            import uvloop

            self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            self.loop = asyncio.new_event_loop()
        self.stopped = False
        self._thread = threading.Thread(target=self._run, name="bookkeeper-client", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Runs the loop until ``stop``; then, on this thread, cancels what is left (a
        connection still being made, a spawned task) and closes the loop. An unfinished task
        holding a socket would otherwise keep the loop's close waiting for ever."""
        try:
            self.loop.run_forever()
        finally:
            try:
                left = asyncio.all_tasks(self.loop)
                for task in left:
                    task.cancel()
                if left:
                    self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.submit(coroutine).result(timeout)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Starts ``coroutine`` on the loop; its future."""
        if self.stopped:
            coroutine.close()
            raise errors.ClientClosedError(CLOSED)
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call_soon(self, callback: Callable[[], object]) -> None:
        if self.stopped:
            raise errors.ClientClosedError(CLOSED)
        self.loop.call_soon_threadsafe(callback)

    def stop(self) -> None:
        self.stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            log.warning("the client's event loop did not stop within 10 s; leaving its thread")


class ReadHandle:
    """Blocking view of :class:`bookkeeper_py.aio.ReadHandle`."""

    def __init__(self, runner: LoopThread, handle: aio_ledger.ReadHandle) -> None:
        self._runner = runner
        self._handle = handle

    @property
    def ledger_id(self) -> int:
        return self._handle.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._handle.last_add_confirmed

    @property
    def length(self) -> int:
        return self._handle.length

    @property
    def metadata(self) -> LedgerMetadata:
        return self._handle.metadata

    @property
    def is_closed(self) -> bool:
        return self._handle.is_closed

    def read_entries(self, first: int, last: int) -> list[LedgerEntry]:
        return self._runner.run(self._handle.read_entries(first, last))

    def read_unconfirmed_entries(self, first: int, last: int) -> list[LedgerEntry]:
        return self._runner.run(self._handle.read_unconfirmed_entries(first, last))

    def read_last_add_confirmed(self) -> int:
        return self._runner.run(self._handle.read_last_add_confirmed())

    def read_explicit_last_add_confirmed(self) -> int:
        return self._runner.run(self._handle.read_explicit_last_add_confirmed())

    def read_entry(self, entry_id: int) -> LedgerEntry:
        return self._runner.run(self._handle.read_entry(entry_id))

    def read_last_add_confirmed_and_entry(
        self, entry_id: int, timeout_ms: int, parallel: bool = False
    ) -> tuple[int, LedgerEntry | None]:
        """Long poll: see :meth:`bookkeeper_py.aio.ReadHandle.read_last_add_confirmed_and_entry`."""
        return self._runner.run(
            self._handle.read_last_add_confirmed_and_entry(entry_id, timeout_ms, parallel)
        )

    def refresh_metadata(self) -> LedgerMetadata:
        return self._runner.run(self._handle.refresh_metadata())

    def follow(self, start: int = 0, *, timeout_ms: int = 10_000) -> Iterator[LedgerEntry]:
        """Every entry from ``start`` on as it is confirmed (long polls); ends after the last
        entry once the ledger is closed. Never fences."""
        entries = self._handle.follow(start, timeout_ms=timeout_ms)
        done = object()

        async def step() -> LedgerEntry | object:
            return await anext(entries, done)

        try:
            while (entry := self._runner.run(step())) is not done:
                assert isinstance(entry, LedgerEntry)
                yield entry
        finally:
            self._runner.run(entries.aclose())

    def close(self) -> None:
        self._runner.run(self._handle.close())

    def __enter__(self) -> ReadHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _WriteHandle(ReadHandle):
    _handle: aio_ledger.WriteHandle

    def __init__(self, runner: LoopThread, handle: aio_ledger.WriteHandle) -> None:
        super().__init__(runner, handle)

    def force(self) -> int:
        """DEFERRED_SYNC: makes the acknowledged entries durable and confirmed; the LAC."""
        return self._runner.run(self._handle.force())

    def _add_async(self, data: bytes, entry_id: int | None) -> concurrent.futures.Future[int]:
        result: concurrent.futures.Future[int] = concurrent.futures.Future()
        data = bytes(data)

        def start() -> None:
            try:
                future = self._handle._add(data, entry_id)
            except BaseException as error:
                result.set_exception(error)
                return

            def copy(done: asyncio.Future[int]) -> None:
                if done.cancelled():
                    result.cancel()
                elif done.exception() is not None:
                    result.set_exception(done.exception())
                else:
                    result.set_result(done.result())

            future.add_done_callback(copy)

        self._runner.call_soon(start)
        return result


class LedgerHandleAdv(_WriteHandle):
    """Blocking view of :class:`bookkeeper_py.aio.LedgerHandleAdv` (caller-chosen entry ids)."""

    def add_entry(self, entry_id: int, data: bytes) -> int:
        return self._add_async(data, entry_id).result()

    def add_entry_async(self, entry_id: int, data: bytes) -> concurrent.futures.Future[int]:
        return self._add_async(data, entry_id)


class LedgerHandle(_WriteHandle):
    """Blocking view of :class:`bookkeeper_py.aio.LedgerHandle`."""

    @property
    def last_add_pushed(self) -> int:
        return self._handle.last_add_pushed

    @property
    def ensemble_changes(self) -> int:
        """Ensemble changes this writer made (a failed or slow bookie replaced)."""
        return self._handle.ensemble_changes

    def add_entry(self, data: bytes) -> int:
        """Adds ``data``; returns its entry id once Qa bookies made it durable."""
        return self.add_entry_async(data).result()

    def add_entry_async(self, data: bytes) -> concurrent.futures.Future[int]:
        """Sends ``data``; the future gives its entry id once acknowledged (in entry-id order)."""
        return self._add_async(data, None)


class BookKeeper:
    """A blocking client of one BookKeeper cluster, named by its metadata service URI.

    >>> bk = BookKeeper("sqlite:///tmp/bk/metadata.db")   # doctest: +SKIP
    """

    def __init__(self, metadata_uri: str, config: ClientConfig | None = None, **options: Any):
        """``options``: ``bookkeeper_py.client.config.ClientConfig`` fields (timeouts, throttle,
        TLS, authentication, speculative reads, placement policy...). A malformed URI raises
        ``ValueError`` before anything starts."""
        parse_uri(metadata_uri)
        self._runner = LoopThread()
        try:
            self._client = self._runner.run(
                aio_client.BookKeeper.connect(metadata_uri, config, **options)
            )
        except BaseException:
            self._runner.stop()
            raise

    def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum_size: int = 2,
        ack_quorum_size: int = 2,
        digest_type: DigestType = DigestType.CRC32C,
        password: str | bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        deferred_sync: bool = False,
    ) -> LedgerHandle:
        handle = self._runner.run(
            self._client.create_ledger(
                ensemble_size,
                write_quorum_size,
                ack_quorum_size,
                digest_type,
                password,
                custom_metadata,
                deferred_sync,
            )
        )
        return LedgerHandle(self._runner, handle)

    def create_ledger_adv(
        self,
        ensemble_size: int = 3,
        write_quorum_size: int = 2,
        ack_quorum_size: int = 2,
        digest_type: DigestType = DigestType.CRC32C,
        password: str | bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        deferred_sync: bool = False,
        ledger_id: int | None = None,
    ) -> LedgerHandleAdv:
        """A ledger whose writer chooses the entry ids (and, with ``ledger_id``, its id)."""
        handle = self._runner.run(
            self._client.create_ledger_adv(
                ensemble_size,
                write_quorum_size,
                ack_quorum_size,
                digest_type,
                password,
                custom_metadata,
                deferred_sync,
                ledger_id,
            )
        )
        return LedgerHandleAdv(self._runner, handle)

    def open_ledger(
        self, ledger_id: int, password: str | bytes = b"", digest_type: DigestType | None = None
    ) -> ReadHandle:
        return ReadHandle(
            self._runner,
            self._runner.run(self._client.open_ledger(ledger_id, password, digest_type)),
        )

    def open_ledger_no_recovery(
        self, ledger_id: int, password: str | bytes = b"", digest_type: DigestType | None = None
    ) -> ReadHandle:
        return ReadHandle(
            self._runner,
            self._runner.run(
                self._client.open_ledger_no_recovery(ledger_id, password, digest_type)
            ),
        )

    def delete_ledger(self, ledger_id: int) -> None:
        self._runner.run(self._client.delete_ledger(ledger_id))

    def list_ledgers(self) -> list[int]:
        return self._runner.run(self._client.list_ledgers())

    def get_ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return self._runner.run(self._client.get_ledger_metadata(ledger_id))

    @property
    def client(self) -> aio_client.BookKeeper:
        """The asyncio client underneath (its counters, placement policy and configuration)."""
        return self._client

    def close(self) -> None:
        """Closes the client (again: nothing); see :meth:`bookkeeper_py.aio.BookKeeper.close`."""
        if self._runner.stopped:
            return
        try:
            self._runner.run(self._client.close(), timeout=30)
        finally:
            self._runner.stop()

    def __enter__(self) -> BookKeeper:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
