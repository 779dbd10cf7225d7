"""The blocking log API over a blocking ``bookkeeper_py.BookKeeper``: the same names as
``bookkeeper_py.log`` (asyncio), run on the client's event loop thread.

``LogWriter.append`` hands records to the loop in batches (one wake-up of the loop for all the
records appended while it was busy) and returns a ``concurrent.futures.Future`` of the position.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from bookkeeper_py.log import namespace as aio_namespace
from bookkeeper_py.log import reader as aio_reader
from bookkeeper_py.log import writer as aio_writer
from bookkeeper_py.log.format import (
    DUPLICATE,
    LogConfig,
    LogMetadata,
    LogRecord,
    Position,
    Subscription,
)

if TYPE_CHECKING:
    from bookkeeper_py.client.facade import BookKeeper, LoopThread

__all__ = ["LogNamespace", "LogReader", "LogWriter"]


class LogNamespace:
    """The logs of one namespace (see ``bookkeeper_py.log.LogNamespace``)."""

    def __init__(self, client: BookKeeper, name: str = "default", *, password: bytes = b""):
        self._runner: LoopThread = client._runner
        self._namespace = aio_namespace.LogNamespace(client.client, name, password=password)

    @property
    def name(self) -> str:
        return self._namespace.name

    @property
    def aio(self) -> aio_namespace.LogNamespace:
        return self._namespace

    def _run(self, coroutine: Any, timeout: float | None = None) -> Any:
        return self._runner.run(coroutine, timeout)

    def create(self, *, exist_ok: bool = True) -> None:
        self._run(self._namespace.create(exist_ok=exist_ok))

    def create_log(self, log_name: str, config: LogConfig | None = None) -> LogMetadata:
        return self._run(self._namespace.create_log(log_name, config))  # type: ignore[no-any-return]

    def list_logs(self, after: str | None = None, limit: int = 1000) -> list[str]:
        return self._run(self._namespace.list_logs(after, limit))  # type: ignore[no-any-return]

    def describe(self, log_name: str) -> aio_namespace.LogDescription:
        return self._run(self._namespace.describe(log_name))  # type: ignore[no-any-return]

    def delete_log(self, log_name: str) -> None:
        self._run(self._namespace.delete_log(log_name))

    def subscribe(self, log_name: str, name: str, *, at_latest: bool = False) -> Subscription:
        return self._run(  # type: ignore[no-any-return]
            self._namespace.subscribe(log_name, name, at_latest=at_latest)
        )

    def subscriptions(self, log_name: str) -> list[aio_namespace.SubscriptionInfo]:
        return self._run(self._namespace.subscriptions(log_name))  # type: ignore[no-any-return]

    def commit(self, log_name: str, name: str, position: Position, sequence: int) -> None:
        self._run(self._namespace.commit(log_name, name, position, sequence))

    def delete_subscription(self, log_name: str, name: str) -> None:
        self._run(self._namespace.delete_subscription(log_name, name))

    def truncate(self, log_name: str, before: Position, *, force: bool = False) -> int:
        return self._run(  # type: ignore[no-any-return]
            self._namespace.truncate(log_name, before, force=force)
        )

    def apply_retention(self, log_name: str, *, force: bool = False) -> int:
        return self._run(  # type: ignore[no-any-return]
            self._namespace.apply_retention(log_name, force=force)
        )

    def open_writer(self, log_name: str, **options: Any) -> LogWriter:
        writer = self._run(aio_writer.LogWriter.open(self._namespace, log_name, **options))
        return LogWriter(self._runner, writer)

    def open_reader(
        self, log_name: str, start: aio_reader.Start = "earliest", **options: Any
    ) -> LogReader:
        reader = self._run(aio_reader.LogReader.open(self._namespace, log_name, start, **options))
        return LogReader(self._runner, reader)


class LogWriter:
    """The blocking writer of a log (see ``bookkeeper_py.log.LogWriter``)."""

    def __init__(self, runner: LoopThread, writer: aio_writer.LogWriter) -> None:
        self._runner = runner
        self._writer = writer
        self._lock = threading.Lock()
        self._queue: list[tuple[bytes, int | None, int | None, concurrent.futures.Future[Position]]]
        self._queue = []

    @property
    def aio(self) -> aio_writer.LogWriter:
        return self._writer

    @property
    def last_writer_sequence(self) -> int:
        return self._writer.last_writer_sequence

    def append(
        self, data: bytes, *, txid: int | None = None, sequence: int | None = None
    ) -> concurrent.futures.Future[Position]:
        """Appends a record; the future gives its position once acknowledged (in order)."""
        if len(data) > self._writer.max_record_bytes:  # at once, not after later records
            self._writer.refuse_size(len(data))
        future: concurrent.futures.Future[Position] = concurrent.futures.Future()
        with self._lock:
            self._queue.append((bytes(data), txid, sequence, future))
            wake = len(self._queue) == 1
        if wake:
            self._runner.call_soon(self._hand_over)
        return future

    def write(
        self, data: bytes, *, txid: int | None = None, sequence: int | None = None
    ) -> Position:
        """Appends a record and waits until it is acknowledged."""
        return self.append(data, txid=txid, sequence=sequence).result()

    def _hand_over(self) -> None:
        """On the loop: every queued record to the asyncio writer; one callback per entry."""
        with self._lock:
            queued, self._queue = self._queue, []
        waiting: dict[
            int, tuple[aio_writer._Batch, list[tuple[int, concurrent.futures.Future[Position]]]]
        ] = {}
        for data, txid, sequence, future in queued:
            try:
                pending = self._writer.append(data, txid=txid, sequence=sequence)
            except BaseException as error:
                future.set_exception(error)
                continue
            batch = pending._batch
            if batch is None:
                future.set_result(DUPLICATE)
                continue
            entry = waiting.get(id(batch))
            if entry is None:
                waiting[id(batch)] = (batch, [(pending._slot, future)])
            else:
                entry[1].append((pending._slot, future))
        for batch, waiters in waiting.values():
            batch.future.add_done_callback(functools.partial(_complete, waiters=waiters))

    def flush(self) -> Position | None:
        """Waits until every record appended so far is acknowledged; the last one's position."""
        # (the records queued before this call reach the loop first: its callbacks run in order)
        return self._runner.run(self._writer.flush())

    def roll(self) -> None:
        self._runner.run(self._writer.roll())

    def close(self) -> None:
        self._runner.run(self._writer.close())

    def mark_end_of_stream(self) -> None:
        self._runner.run(self._writer.mark_end_of_stream())

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _complete(done: Any, waiters: list[tuple[int, concurrent.futures.Future[Position]]]) -> None:
    if done.cancelled() or done.exception() is not None:
        error = done.exception() if not done.cancelled() else concurrent.futures.CancelledError()
        for _, future in waiters:
            future.set_exception(error)
        return
    ledger_id, entry_id = done.result()
    for slot, future in waiters:
        future.set_result(Position(ledger_id, entry_id, slot))


class LogReader:
    """The blocking reader of a log (see ``bookkeeper_py.log.LogReader``); iterate it."""

    def __init__(self, runner: LoopThread, reader: aio_reader.LogReader) -> None:
        self._runner = runner
        self._reader = reader
        self._waiting: concurrent.futures.Future[list[LogRecord]] | None = None

    @property
    def aio(self) -> aio_reader.LogReader:
        return self._reader

    @property
    def last_position(self) -> Position:
        return self._reader.last_position

    def read_batch(self, timeout: float | None = None) -> list[LogRecord]:
        """The next records (one entry's); ``[]`` once the log ended. ``timeout`` (s) raises
        ``TimeoutError`` when nothing came (the reader stays usable)."""
        if self._waiting is None:
            self._waiting = self._runner.submit(self._reader.read_batch())
        records = self._waiting.result(timeout)  # a timeout leaves it waiting for the next call
        self._waiting = None
        return records

    def read_next(self, timeout: float | None = None) -> LogRecord | None:
        """The next record (None once the log ended)."""
        if self._waiting is not None:  # a batch asked for before: hand it out first
            self._reader._pending.extend(self.read_batch(timeout))
        return self._runner.run(self._reader.read_next(), timeout)

    def __iter__(self) -> Iterator[LogRecord]:
        while True:
            records = self.read_batch()
            if not records:
                return
            yield from records

    def commit(self, record: LogRecord | None = None) -> None:
        """See ``bookkeeper_py.log.LogReader.commit``."""
        self._runner.run(self._reader.commit(record))

    def close(self) -> None:
        if self._waiting is not None:
            self._waiting.cancel()
        if not self._runner.stopped:
            self._runner.run(self._reader.close())

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
