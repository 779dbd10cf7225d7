"""Requests to single bookies, addressed by bookie id: BookKeeper's ``BookieClient``.

"Read entries a..b of ledger L from bookie B", "add this entry with RECOVERY_ADD", "read the
LAC", "fence": what ledger handles, recovery, the coming replication worker and the Spark reader
send, usable without a ledger handle. The endpoints come from the ``BookiePool``'s resolver: the
metadata port's registrations in a ``BookKeeper`` client, or a fixed map of bookie ids to
``(host, port)`` (``BookieClient.for_endpoints``: a Spark executor that was handed pickled
ledger metadata and endpoints needs no metadata session).

Two layers: ``send(bookie, issue, answered)`` issues a request on the bookie's connection (made
first if needed) with a callback, the hot path of reads, adds and recovery (no task per request
when the connection is open); the coroutines (``request``, ``read_entry``, ``fence``,
``recovery_add``, ``read_lac``) wait for one answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Coroutine, Mapping
from typing import Any

from bookkeeper_py import errors
from bookkeeper_py.client.connection import BookieConnection, BookiePool, Callback
from bookkeeper_py.wire.status import StatusCode

Issue = Callable[[BookieConnection], None]  # sends one request on a connection


class BookieClient:
    """Requests by bookie id over ``pool``'s connections."""

    def __init__(self, pool: BookiePool) -> None:
        self.pool = pool
        self._tasks: set[asyncio.Future[None]] = set()  # connects in progress

    @classmethod
    def for_endpoints(
        cls, endpoints: Mapping[str, tuple[str, int]], **pool_options: Any
    ) -> BookieClient:
        """A bookie client for known endpoints (bookie id -> (host, port)); ``pool_options``
        are ``BookiePool``'s (``use_v3``, timeouts, ``tls``, ``auth``, ``clock``)."""
        known = dict(endpoints)

        async def resolve(bookie_id: str) -> tuple[str, int]:
            try:
                return known[bookie_id]
            except KeyError:
                raise errors.BookieHandleNotAvailableError(
                    f"no endpoint known for bookie {bookie_id}: pass it in the endpoints map"
                ) from None

        return cls(BookiePool(resolve, **pool_options))

    # -- the callback layer --------------------------------------------------------------------

    def send(self, bookie_id: str, issue: Issue, answered: Callback, v3: bool = False) -> None:
        """``issue(connection)`` sends a request to ``bookie_id``: at once on an open
        connection, else once one is made; a connection that cannot be made is the request's
        answer (``answered(None, error)``). With ``v3``, on a connection speaking v3."""
        connection = self.pool.ready(bookie_id, v3)
        if connection is not None:
            issue(connection)
            return

        async def connect_then_send() -> None:
            try:
                connection = await self.pool.get(bookie_id, v3)
            except errors.BKError as error:
                answered(None, error)
                return
            issue(connection)

        self.spawn(connect_then_send())

    def spawn(self, coroutine: Coroutine[object, object, None]) -> None:
        """Runs ``coroutine`` as a task this client keeps until it ends (asyncio holds tasks
        weakly)."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def refusing(self, bookies: Collection[str], timeout_s: float = 1.0) -> set[str]:
        """Those of ``bookies`` whose address refuses connections (``BookiePool.refuses``): dead
        processes, known at once, where their registrations vanish only when their metadata
        sessions expire. Probed at once; an open connection costs no probe."""
        probed = sorted(bookies)
        refused = await asyncio.gather(*(self.pool.refuses(b, timeout_s) for b in probed))
        return {bookie for bookie, no in zip(probed, refused, strict=True) if no}

    # -- one request, one answer ---------------------------------------------------------------

    async def request(
        self,
        bookie_id: str,
        issue: Callable[[BookieConnection, Callback], None],
        v3: bool = False,
    ) -> tuple[StatusCode, bytes]:
        """One request (``issue(connection, answered)`` sends it): the bookie's status and body;
        connection and timeout failures raise."""
        future: asyncio.Future[tuple[StatusCode, bytes]] = (
            asyncio.get_running_loop().create_future()
        )

        def answered(status: StatusCode | None, body: bytes | errors.BKError) -> None:
            if future.done():
                return
            if status is None:
                future.set_exception(
                    body if isinstance(body, errors.BKError) else errors.BKError(str(body))
                )
            else:
                assert isinstance(body, bytes)
                future.set_result((status, body))

        self.send(bookie_id, lambda connection: issue(connection, answered), answered, v3)
        return await future

    async def read_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
    ) -> tuple[StatusCode, bytes]:
        """Entry ``entry_id`` as the bookie stores it (-1: its last entry of the ledger); a
        fencing read needs the ledger's ``master_key``."""
        if fence and master_key is None:
            raise errors.IncorrectParameterError("a fencing read needs the ledger's master key")
        return await self.request(
            bookie_id,
            lambda connection, answered: connection.read(
                ledger_id, entry_id, fence, master_key if fence else None, answered
            ),
        )

    async def fence(
        self, bookie_id: str, ledger_id: int, master_key: bytes
    ) -> tuple[StatusCode, bytes]:
        """Fences the ledger on the bookie (no add is taken after this answer) and reads its
        last entry: what recovery starts with."""
        return await self.read_entry(bookie_id, ledger_id, -1, fence=True, master_key=master_key)

    async def recovery_add(
        self, bookie_id: str, ledger_id: int, entry_id: int, master_key: bytes, entry: bytes
    ) -> StatusCode:
        """Writes a packaged ``entry`` with RECOVERY_ADD (taken on a fenced ledger)."""
        status, _ = await self.request(
            bookie_id,
            lambda connection, answered: connection.add(
                ledger_id, entry_id, master_key, entry, True, answered
            ),
        )
        return status

    async def bookie_info(self, bookie_id: str) -> tuple[int, int]:
        """GET_BOOKIE_INFO (v3): the bookie's (total disk capacity, free disk space) in bytes;
        ``BKError`` when it cannot say."""
        future: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()

        def answered(
            status: StatusCode | None, total: int, free: int, error: errors.BKError | None
        ) -> None:
            if future.done():
                return
            if status is StatusCode.EOK:
                future.set_result((total, free))
            else:
                future.set_exception(
                    error
                    or errors.BKError(
                        f"bookie {bookie_id} did not give its disk space: "
                        f"{status.name if status is not None else 'no answer'}"
                    )
                )

        def failed(_status: StatusCode | None, error: bytes | errors.BKError) -> None:
            answered(None, 0, 0, error if isinstance(error, errors.BKError) else None)

        self.send(bookie_id, lambda connection: connection.bookie_info(answered), failed, v3=True)
        return await future

    async def read_lac(self, bookie_id: str, ledger_id: int) -> tuple[StatusCode, bytes, bytes]:
        """READ_LAC (v3): (status, the explicit LAC the writer sent, the bookie's last entry)."""
        future: asyncio.Future[tuple[StatusCode, bytes, bytes]] = (
            asyncio.get_running_loop().create_future()
        )

        def answered(
            status: StatusCode | None, lac_body: bytes, body: bytes | BaseException
        ) -> None:
            if future.done():
                return
            if status is None:
                future.set_exception(
                    body if isinstance(body, BaseException) else errors.ReadError(bookie_id)
                )
            else:
                assert isinstance(body, bytes)
                future.set_result((status, lac_body, body))

        def failed(_status: StatusCode | None, error: bytes | errors.BKError) -> None:
            answered(None, b"", error if isinstance(error, errors.BKError) else errors.BKError())

        self.send(
            bookie_id, lambda connection: connection.read_lac(ledger_id, answered), failed, v3=True
        )
        return await future
