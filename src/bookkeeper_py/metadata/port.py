"""The metadata port: what the asyncio runtime (the client's handles, recovery, a bookie's
background work) needs of the metadata store, as coroutines on the event loop.

``MetadataPort`` is the declared interface (a typing Protocol); ``ThreadedMetadata`` implements it
over a ``MetadataClient`` whose drivers block (kazoo for ZooKeeper, sqlite3): every call runs on
one thread of its own, so this is the one place where the loop hands metadata work to a thread.
Watches fire on that thread and are delivered on the loop. The simulator implements the same
port in virtual time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Protocol, TypeVar, runtime_checkable

from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.errors import MetadataUnavailableError, MetadataVersionError
from bookkeeper_py.metadata.bookie_watcher import BookieWatcher
from bookkeeper_py.metadata.driver import ANY_VERSION, BadVersionError
from bookkeeper_py.metadata.manager import MAX_UPDATE_ATTEMPTS, BookieEndpoint, MetadataClient

T = TypeVar("T")
log = logging.getLogger(__name__)


@runtime_checkable
class MetadataPort(Protocol):
    """Ledger metadata and the bookie registry, asynchronously. Errors are those of
    ``MetadataClient`` (``NoSuchLedgerError``, ``LedgerExistsError``, ``MetadataVersionError``,
    ``MetadataUnavailableError``...), raised in the caller's task."""

    async def generate_ledger_id(self) -> int:
        """A new ledger id from the cluster's counter (the layout's id generator)."""
        ...

    async def create_ledger_metadata(self, metadata: LedgerMetadata) -> int:
        """Stores a new ledger's metadata; its version."""
        ...

    async def read_ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """(metadata, version)."""
        ...

    async def write_ledger_metadata(self, metadata: LedgerMetadata, version: int) -> int:
        """Compare-and-swap: the new version; ``BadVersionError`` when ``version`` is stale,
        ``NoSuchLedgerError`` when the ledger was deleted. (Callers change metadata through
        ``update_ledger_metadata``, the loop over this.)"""
        ...

    async def delete_ledger_metadata(self, ledger_id: int, version: int = ANY_VERSION) -> None: ...

    async def list_ledgers(self) -> list[int]:
        """Every ledger id, increasing (the store is read a page at a time)."""
        ...

    async def writable_bookies(self) -> list[str]:
        """The writable bookies (kept current by watches)."""
        ...

    async def readonly_bookies(self) -> list[str]: ...

    async def bookies_now(self) -> tuple[list[str], list[str]]:
        """(writable, read-only) bookies as the store holds them at this moment, not from a
        cache: what the auditor polls (a registration whose session expired is gone here even
        when no watch fired)."""
        ...

    async def bookie_endpoint(self, bookie_id: str) -> BookieEndpoint:
        """Where a bookie listens (its registration, else its id as host:port)."""
        ...

    async def register_bookie(
        self,
        bookie_id: str,
        host: str,
        port: int,
        *,
        readonly: bool,
        incarnation: str,
        predecessors: Collection[str],
        http: tuple[str, int, str] | None = None,
    ) -> None:
        """An ephemeral registration of a serving bookie (``MetadataClient.register_bookie``)."""
        ...

    async def unregister_bookie(
        self, bookie_id: str, *, readonly: bool, incarnation: str | None = None
    ) -> None: ...

    def on_session_replaced(self, callback: Callable[[], None]) -> None:
        """Calls ``callback()`` on the loop each time an expired session was replaced (its
        ephemeral registrations are gone)."""
        ...

    # Plain versioned nodes, for what is built above ledgers (logs, subscriptions): absolute
    # paths; errors are the driver's (``NoNodeError``, ``NodeExistsError``, ``BadVersionError``,
    # ``NotEmptyError``).

    @property
    def ledgers_root(self) -> str:
        """The ledgers' root path (``/ledgers``); other trees are kept beside it."""
        ...

    async def get_node(self, path: str) -> tuple[bytes, int]:
        """(data, version) of ``path``."""
        ...

    async def create_node(self, path: str, data: bytes) -> int:
        """Creates ``path`` (and missing parents, empty); its version (0)."""
        ...

    async def set_node(self, path: str, data: bytes, version: int) -> int:
        """Compare-and-swap: the new version."""
        ...

    async def delete_node(self, path: str, version: int = ANY_VERSION) -> None: ...

    async def create_ephemeral(self, path: str, data: bytes, sequential: bool = False) -> str:
        """Creates ``path`` (missing parents too) as a node of this client's session: it
        vanishes when the session ends (the process died, or its ZooKeeper session or SQLite
        lease expired). With ``sequential``, a counter suffix is appended. The real path."""
        ...

    async def node_children(
        self, path: str, after: str | None = None, limit: int = 1000
    ) -> list[str]:
        """Up to ``limit`` child names of ``path`` greater than ``after``, sorted."""
        ...

    async def close(self) -> None: ...


V = TypeVar("V")


async def cas_update(
    what: str,
    read: Callable[[], Awaitable[tuple[V, int]]],
    write: Callable[[V, int], Awaitable[int]],
    needs_change: Callable[[V], bool],
    transform: Callable[[V], V],
) -> tuple[V, int]:
    """The one compare-and-swap loop (BookKeeper's MetadataUpdateLoop): read, check, transform,
    write at the version read; read again on a version conflict. The value as stored at the end
    (unchanged when ``needs_change`` said no). ``MetadataVersionError`` after
    ``MAX_UPDATE_ATTEMPTS`` conflicts in a row; ``transform`` may raise to give up."""
    for _ in range(MAX_UPDATE_ATTEMPTS):
        current, version = await read()
        if not needs_change(current):
            return current, version
        updated = transform(current)
        try:
            return updated, await write(updated, version)
        except BadVersionError:
            log.debug("%s: changed under us, retrying the update", what)
    raise MetadataVersionError(
        f"{what}: gave up updating metadata after {MAX_UPDATE_ATTEMPTS} version conflicts in a "
        "row (another process keeps changing it)"
    )


async def update_ledger_metadata(
    port: MetadataPort,
    ledger_id: int,
    needs_change: Callable[[LedgerMetadata], bool],
    transform: Callable[[LedgerMetadata], LedgerMetadata],
) -> tuple[LedgerMetadata, int]:
    """``cas_update`` of a ledger's metadata."""
    return await cas_update(
        f"ledger {ledger_id}",
        lambda: port.read_ledger_metadata(ledger_id),
        port.write_ledger_metadata,
        needs_change,
        transform,
    )


class ThreadedMetadata:
    """``MetadataPort`` over a blocking ``MetadataClient``, on one thread of its own.

    ``call(function, *args)`` runs any other blocking metadata work (registration, cookies,
    cluster initialisation) on the same thread. The bookie lists are kept by a ``BookieWatcher``
    (watches invalidate its cache; it is read on the metadata thread)."""

    def __init__(self, client: MetadataClient) -> None:
        self.client = client
        self.bookies = BookieWatcher(client)
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="metadata")

    @classmethod
    async def connect(cls, uri: str, **options: float | bool | None) -> ThreadedMetadata:
        """Connects to the store of ``uri`` (``MetadataClient.connect``'s options) without
        blocking the loop."""
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="metadata") as once:
            client = await asyncio.get_running_loop().run_in_executor(
                once,
                lambda: MetadataClient.connect(uri, **options),  # type: ignore[arg-type]
            )
        return cls(client)

    async def call(self, function: Callable[..., T], *args: object) -> T:
        """``function(*args)``, blocking metadata work, on the metadata thread."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, function, *args)

    async def generate_ledger_id(self) -> int:
        return await self.call(self.client.generate_ledger_id)

    async def create_ledger_metadata(self, metadata: LedgerMetadata) -> int:
        return await self.call(self.client.create_ledger_metadata, metadata)

    async def read_ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        return await self.call(self.client.read_ledger_metadata, ledger_id)

    async def write_ledger_metadata(self, metadata: LedgerMetadata, version: int) -> int:
        return await self.call(self.client.write_ledger_metadata, metadata, version)

    async def delete_ledger_metadata(self, ledger_id: int, version: int = ANY_VERSION) -> None:
        await self.call(self.client.delete_ledger_metadata, ledger_id, version)

    async def list_ledgers(self) -> list[int]:
        return await self.call(lambda: list(self.client.list_ledgers()))

    async def writable_bookies(self) -> list[str]:
        return await self.call(self.bookies.writable)

    async def readonly_bookies(self) -> list[str]:
        return await self.call(self.bookies.readonly)

    async def bookies_now(self) -> tuple[list[str], list[str]]:
        client = self.client
        return await self.call(lambda: (client.writable_bookies(), client.readonly_bookies()))

    async def bookie_endpoint(self, bookie_id: str) -> BookieEndpoint:
        return await self.call(self.client.bookie_endpoint, bookie_id)

    async def register_bookie(
        self,
        bookie_id: str,
        host: str,
        port: int,
        *,
        readonly: bool,
        incarnation: str,
        predecessors: Collection[str],
        http: tuple[str, int, str] | None = None,
    ) -> None:
        await self.call(
            lambda: self.client.register_bookie(
                bookie_id,
                host,
                port,
                readonly=readonly,
                incarnation=incarnation,
                predecessors=predecessors,
                http=http,
            )
        )

    async def unregister_bookie(
        self, bookie_id: str, *, readonly: bool, incarnation: str | None = None
    ) -> None:
        await self.call(
            lambda: self.client.unregister_bookie(
                bookie_id, readonly=readonly, incarnation=incarnation
            )
        )

    @property
    def ledgers_root(self) -> str:
        return self.client.root

    async def get_node(self, path: str) -> tuple[bytes, int]:
        return await self.call(self.client.store.get, path)

    async def create_node(self, path: str, data: bytes) -> int:
        await self.call(self.client.store.create, path, data)
        return 0

    async def set_node(self, path: str, data: bytes, version: int) -> int:
        return await self.call(self.client.store.set, path, data, version)

    async def delete_node(self, path: str, version: int = ANY_VERSION) -> None:
        await self.call(self.client.store.delete, path, version)

    async def create_ephemeral(self, path: str, data: bytes, sequential: bool = False) -> str:
        store = self.client.store
        return await self.call(
            lambda: store.create(
                path, data, make_parents=True, ephemeral=True, sequential=sequential
            )
        )

    async def node_children(
        self, path: str, after: str | None = None, limit: int = 1000
    ) -> list[str]:
        return await self.call(self.client.store.children_page, path, after, limit)

    def on_session_replaced(self, callback: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()

        def replaced() -> None:  # on a driver thread
            loop.call_soon_threadsafe(callback)

        self.client.store.add_session_listener(replaced)

    async def close(self) -> None:
        """Drops the watches, closes the store session and ends the thread."""
        try:
            await self.call(self.bookies.close)
            await self.call(self.client.close)
        finally:
            self._thread.shutdown(wait=False)


def run_blocking(client: MetadataClient, work: Callable[[MetadataPort], Awaitable[T]]) -> T:
    """``await work(port)`` from blocking code (the admin commands), over a port that borrows
    ``client``: the client stays open afterwards."""
    port = ThreadedMetadata(client)

    async def run() -> T:
        try:
            return await work(port)
        finally:
            await port.call(port.bookies.close)

    try:
        return asyncio.run(run())
    finally:
        port._thread.shutdown(wait=False)


class KnownBookies:
    """A metadata port that knows where some bookies listen and nothing else: the port of a
    client handed ledger metadata and endpoints (a Spark task reading a range the driver
    planned), which needs no metadata session. ``learn`` adds endpoints; every other operation
    raises ``MetadataUnavailableError``."""

    def __init__(self, endpoints: dict[str, tuple[str, int]] | None = None) -> None:
        self._endpoints: dict[str, tuple[str, int]] = dict(endpoints or {})

    def learn(self, endpoints: dict[str, tuple[str, int]]) -> None:
        self._endpoints.update(endpoints)

    def _refuse(self, what: str) -> MetadataUnavailableError:
        return MetadataUnavailableError(
            f"{what}: this client was made for known bookies only (no metadata service); "
            "use a client made with the metadata service URI"
        )

    async def bookie_endpoint(self, bookie_id: str) -> BookieEndpoint:
        try:
            host, port = self._endpoints[bookie_id]
        except KeyError:
            raise self._refuse(f"where bookie {bookie_id} listens") from None
        return BookieEndpoint(bookie_id, host, port)

    async def generate_ledger_id(self) -> int:
        raise self._refuse("a new ledger id")

    async def create_ledger_metadata(self, metadata: LedgerMetadata) -> int:
        raise self._refuse("creating a ledger")

    async def read_ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        raise self._refuse(f"the metadata of ledger {ledger_id}")

    async def write_ledger_metadata(self, metadata: LedgerMetadata, version: int) -> int:
        raise self._refuse(f"writing the metadata of ledger {metadata.ledger_id}")

    async def delete_ledger_metadata(self, ledger_id: int, version: int = ANY_VERSION) -> None:
        raise self._refuse(f"deleting ledger {ledger_id}")

    async def list_ledgers(self) -> list[int]:
        raise self._refuse("the list of ledgers")

    async def writable_bookies(self) -> list[str]:
        raise self._refuse("the writable bookies")

    async def readonly_bookies(self) -> list[str]:
        raise self._refuse("the read-only bookies")

    async def bookies_now(self) -> tuple[list[str], list[str]]:
        raise self._refuse("the registered bookies")

    async def register_bookie(
        self,
        bookie_id: str,
        host: str,
        port: int,
        *,
        readonly: bool,
        incarnation: str,
        predecessors: Collection[str],
        http: tuple[str, int, str] | None = None,
    ) -> None:
        raise self._refuse("registering a bookie")

    async def unregister_bookie(
        self, bookie_id: str, *, readonly: bool, incarnation: str | None = None
    ) -> None:
        raise self._refuse("unregistering a bookie")

    def on_session_replaced(self, callback: Callable[[], None]) -> None:
        pass  # no session

    @property
    def ledgers_root(self) -> str:
        return ""  # unknown; its nodes are refused below

    async def get_node(self, path: str) -> tuple[bytes, int]:
        raise self._refuse(f"reading {path}")

    async def create_node(self, path: str, data: bytes) -> int:
        raise self._refuse(f"creating {path}")

    async def set_node(self, path: str, data: bytes, version: int) -> int:
        raise self._refuse(f"writing {path}")

    async def delete_node(self, path: str, version: int = ANY_VERSION) -> None:
        raise self._refuse(f"deleting {path}")

    async def create_ephemeral(self, path: str, data: bytes, sequential: bool = False) -> str:
        raise self._refuse(f"creating {path}")

    async def node_children(
        self, path: str, after: str | None = None, limit: int = 1000
    ) -> list[str]:
        raise self._refuse(f"the children of {path}")

    async def close(self) -> None:
        pass
