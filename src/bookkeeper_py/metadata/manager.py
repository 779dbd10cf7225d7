"""BookKeeper's metadata layout on any store: cluster init, ledger ids, ledger metadata, bookies.

Paths follow the ZooKeeper tree of reference section 1.9, whatever the driver, so that a
ZooKeeper-backed cluster is laid out as Apache BookKeeper's tools expect.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.errors import (
    BookieIdInUseError,
    LedgerExistsError,
    LedgerIdOverflowError,
    MetadataStoreError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from bookkeeper_py.metadata import format as metadata_format
from bookkeeper_py.metadata.driver import (
    ANY_VERSION,
    BadVersionError,
    CreateOp,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    StoreAddress,
    Watch,
    open_store,
    parent_of,
)
from bookkeeper_py.metadata.layout import SHORT_ID_LIMIT, iter_ledger_ids, ledger_path
from bookkeeper_py.wire.proto import data_formats_pb2 as formats

log = logging.getLogger(__name__)

LAYOUT_FORMAT_VERSION = 2
LAYOUT_FACTORIES = {
    "hierarchical": "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1",
    "flat": "org.apache.bookkeeper.meta.FlatLedgerManagerFactory:1",
    "longhierarchical": "org.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory:1",
}
MAX_UPDATE_ATTEMPTS = 100
# The registration property naming one run of a bookie process (ours; Java ignores it).
INCARNATION_PROPERTY = "bookkeeper-py.incarnation"
_MAX_DELETE_PAGES = 1_000_000


@dataclass(frozen=True, slots=True)
class BookieEndpoint:
    """Where a registered bookie listens."""

    bookie_id: str
    host: str
    port: int


HTTP_ENDPOINT_ID = "httpserver"  # the endpoint id of a bookie's HTTP server, as Java's


def parse_bookie_id(bookie_id: str) -> tuple[str, int]:
    """(host, port) of a ``host:port`` bookie id."""
    host, _, port = bookie_id.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bookie id {bookie_id!r} is not host:port")
    return host, int(port)


class MetadataClient:
    """BookKeeper's metadata operations on a store session. Blocking; thread-safe."""

    def __init__(self, store: MetadataStore, address: StoreAddress) -> None:
        self.store = store
        self.address = address
        self.root = address.root
        self.layout = address.layout
        self._long_ids = False  # idgen-long seen: only metaformat or a nuke removes it

    @classmethod
    def connect(
        cls,
        uri: str,
        *,
        create: bool = False,
        connect_timeout_s: float = 10.0,
        operation_timeout_s: float = 30.0,
        session_timeout_s: float | None = None,
    ) -> MetadataClient:
        store, address = open_store(
            uri,
            create=create,
            connect_timeout_s=connect_timeout_s,
            operation_timeout_s=operation_timeout_s,
            session_timeout_s=session_timeout_s,
        )
        return cls(store, address)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> MetadataClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- cluster -------------------------------------------------------------------------------

    def init_cluster(self) -> bool:
        """Creates the cluster's nodes when missing (root, available, readonly, INSTANCEID, LAYOUT).

        Returns True when this call made a new cluster. Safe to race: creators that lose see the
        winner's instance id.
        """
        created = False
        base = (self.root, f"{self.root}/available", f"{self.root}/available/readonly")
        instance_id = str(uuid.uuid4()).encode()
        try:
            # As BookKeeper's initnewcluster: the base nodes and the instance id in one multi.
            self._make_parents(self.root)
            self.store.multi(
                [CreateOp(path) for path in base]
                + [CreateOp(f"{self.root}/INSTANCEID", instance_id)]
            )
            created = True
        except NodeExistsError:  # an existing (or half-made) cluster: fill in what is missing
            for path in base:
                try:
                    self.store.create(path)
                except NodeExistsError:
                    pass
            try:
                self.store.create(f"{self.root}/INSTANCEID", instance_id)
                created = True
            except NodeExistsError:
                pass
        layout = f"{LAYOUT_FORMAT_VERSION}\n{LAYOUT_FACTORIES[self.layout]}".encode()
        try:
            self.store.create(f"{self.root}/LAYOUT", layout)
        except NodeExistsError:
            pass
        return created

    def _make_parents(self, path: str) -> None:
        """Creates the ancestors of ``path`` (a chroot-like root such as ``/bk/ledgers``)."""
        parent = parent_of(path)
        if parent != "/" and self.store.exists(parent) is None:
            try:
                self.store.create(parent)
            except NodeExistsError:
                pass

    def instance_id(self) -> str | None:
        try:
            return self.store.get(f"{self.root}/INSTANCEID")[0].decode()
        except NoNodeError:
            return None

    # -- ledgers -------------------------------------------------------------------------------

    def generate_ledger_id(self) -> int:
        """A cluster-unique ledger id, as BookKeeper's generators make them.

        31-bit ids come from the sequence of an ephemeral sequential ``idgen/ID-`` node
        (ZkLedgerIdGenerator; ``<root>/ID-`` in the flat layout, as Java's). Once that sequence
        overflows, the hierarchical layouts go on with 63-bit ids (LongZkLedgerIdGenerator):
        ``idgen-long/HOB-<high 32 bits>`` holds a sequence of its own for the low bits, and a
        full one is followed by the next HOB node.
        The ``idgen-long`` node, once made, tells every client to stay on long ids."""
        long_root = f"{self.root}/idgen-long"
        if self.layout != "flat" and (self._long_ids or self.store.exists(long_root) is not None):
            self._long_ids = True
            return self._long_ledger_id(long_root)
        # Java's FlatLedgerManagerFactory counts flat-layout ids under <root>/ID- itself (no
        # idgen node), the hierarchical ones under <root>/idgen/ID-: the same, so that both kinds
        # of client draw from one counter.
        short = self._sequence_id(self.root if self.layout == "flat" else f"{self.root}/idgen")
        if short is not None:
            return short
        if self.layout == "flat":
            raise LedgerIdOverflowError(
                f"{self.root}: every 31-bit ledger id is used and the flat layout has no others; "
                "move the ledgers to a hierarchical layout"
            )
        log.warning("%s: 31-bit ledger ids are used up; switching to 63-bit ids", self.root)
        try:
            self.store.create(long_root, make_parents=True)
        except NodeExistsError:
            pass
        self._long_ids = True
        return self._long_ledger_id(long_root)

    def _sequence_id(self, parent: str) -> int | None:
        """The sequence number of a new ``<parent>/ID-`` node (deleted at once), or None when
        the 31-bit sequence is used up."""
        path = self.store.create(
            f"{parent}/ID-", ephemeral=True, sequential=True, make_parents=True
        )
        try:
            self.store.delete(path)
        except NoNodeError:
            pass
        number = int(path.rsplit("ID-", 1)[1])
        return number if 0 <= number < SHORT_ID_LIMIT else None

    def _long_ledger_id(self, long_root: str) -> int:
        for _ in range(MAX_UPDATE_ATTEMPTS):
            highs = [
                int(name[4:])
                for name in self.store.children(long_root)
                if name.startswith("HOB-") and name[4:].lstrip("-").isdigit()
            ]
            high = max(highs, default=0)
            if high > 0:
                low = self._sequence_id(f"{long_root}/HOB-{high:010d}")
                if low is not None:
                    return (high << 32) | low
            try:  # the first HOB node, or the next one after a full sequence
                self.store.create(f"{long_root}/HOB-{high + 1:010d}")
            except NodeExistsError:
                pass  # another client made it first
        raise MetadataStoreError(f"{long_root}: could not generate a ledger id; retry")

    def _path(self, ledger_id: int) -> str:
        return ledger_path(self.root, self.layout, ledger_id)

    def create_ledger_metadata(self, metadata: LedgerMetadata) -> int:
        """Stores the metadata of a new ledger; returns its version."""
        try:
            self.store.create(self._path(metadata.ledger_id), metadata_format.serialize(metadata))
        except NodeExistsError as error:
            raise LedgerExistsError(f"ledger {metadata.ledger_id} already exists") from error
        return 0

    def read_ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """(metadata, version) of a ledger; raises ``NoSuchLedgerError``."""
        try:
            data, version = self.store.get(self._path(ledger_id))
        except NoNodeError as error:
            raise NoSuchLedgerError(
                f"ledger {ledger_id} does not exist in the metadata store"
            ) from error
        return metadata_format.deserialize(ledger_id, data), version

    def write_ledger_metadata(self, metadata: LedgerMetadata, version: int) -> int:
        """Compare-and-swap write; raises ``BadVersionError`` when ``version`` is stale."""
        try:
            return self.store.set(
                self._path(metadata.ledger_id), metadata_format.serialize(metadata), version
            )
        except NoNodeError as error:
            raise NoSuchLedgerError(f"ledger {metadata.ledger_id} was deleted") from error

    def delete_ledger_metadata(self, ledger_id: int, version: int = ANY_VERSION) -> None:
        try:
            self.store.delete(self._path(ledger_id), version)
        except NoNodeError as error:
            raise NoSuchLedgerError(
                f"ledger {ledger_id} does not exist in the metadata store"
            ) from error

    def list_ledgers(self, after: int = -1) -> Iterator[int]:
        """Every ledger id above ``after``, increasing, read one directory at a time (the
        directories of ids up to ``after`` are not read)."""
        try:
            yield from iter_ledger_ids(self.root, self.layout, self.store.iter_children, after)
        except NoNodeError:
            return

    # -- cookies -------------------------------------------------------------------------------

    def read_cookie(self, bookie_id: str) -> tuple[bytes, int] | None:
        """(cookie text, version) stored for a bookie at ``cookies/<bookieId>``, if any."""
        try:
            return self.store.get(f"{self.root}/cookies/{bookie_id}")
        except NoNodeError:
            return None

    def create_cookie(self, bookie_id: str, data: bytes) -> None:
        self.store.create(f"{self.root}/cookies/{bookie_id}", data)

    def update_cookie(self, bookie_id: str, data: bytes, version: int = ANY_VERSION) -> int:
        """Replaces a bookie's cookie (CAS on ``version``); ``NoNodeError`` when it has none."""
        return self.store.set(f"{self.root}/cookies/{bookie_id}", data, version)

    def delete_cookie(self, bookie_id: str, version: int = ANY_VERSION) -> None:
        self.store.delete(f"{self.root}/cookies/{bookie_id}", version)

    def delete_cluster(
        self, instance_id: str | None, on_delete: Callable[[], None] | None = None
    ) -> int:
        """Deletes the whole cluster tree under the root (ledger metadata, registrations,
        cookies, ids) when its instance id is ``instance_id`` (None: whatever it is). Returns
        the number of nodes deleted (``on_delete`` hears of each, for progress). Raises
        ``MetadataVersionError`` on an instance id mismatch."""
        current = self.instance_id()
        if instance_id is not None and current != instance_id:
            raise MetadataVersionError(
                f"the cluster at {self.root} has instance id {current!r}, not {instance_id!r}; "
                "nothing deleted"
            )
        if self.store.exists(self.root) is None:
            return 0
        return delete_tree(self.store, self.root, on_delete)

    # -- bookies -------------------------------------------------------------------------------

    def register_bookie(
        self,
        bookie_id: str,
        host: str,
        port: int,
        *,
        readonly: bool = False,
        incarnation: str | None = None,
        predecessors: Collection[str] = (),
        wait_s: float | None = None,
        http: tuple[str, int, str] | None = None,
    ) -> None:
        """Registers a live bookie as an ephemeral node holding its service info (and, in its
        properties, ``incarnation``: a token of this run of the bookie process). ``http``:
        (host, port, protocol ``http`` or ``https``) of its HTTP endpoint, published as Apache
        BookKeeper's bookie does (endpoint id ``httpserver``), where the dashboard finds it.

        A registration already there is replaced only when it is one of ``predecessors`` (an
        earlier run on the same directories, known dead because the directory locks were free).
        Any other is waited on for up to ``wait_s`` (default: the store's session timeout), the
        time a crashed process's session takes to expire; if it is still there, another live
        process uses this bookie id: ``BookieIdInUseError``, and nothing is changed."""
        info = formats.BookieServiceInfoFormat()
        info.endpoints.add(id="bookie", port=port, host=host, protocol="bookie-rpc")
        if http is not None:
            info.endpoints.add(id=HTTP_ENDPOINT_ID, host=http[0], port=http[1], protocol=http[2])
        if incarnation is not None:
            info.properties[INCARNATION_PROPERTY] = incarnation
        data = info.SerializeToString()
        path = self._bookie_path(bookie_id, readonly)
        deadline = time.monotonic() + (self.store.session_timeout_s if wait_s is None else wait_s)
        while True:
            try:
                self.store.create(path, data, ephemeral=True)
                return
            except NodeExistsError:
                self._claim(bookie_id, path, predecessors, deadline)

    def claim_bookie_id(
        self, bookie_id: str, predecessors: Collection[str], wait_s: float | None = None
    ) -> None:
        """Returns once no live process is registered (writable or read-only) as ``bookie_id``:
        registrations of ``predecessors`` are removed, others waited on for up to ``wait_s``
        (default: the session timeout), then ``BookieIdInUseError``. A bookie asks this before
        it reads its directories; ``register_bookie`` asks again."""
        deadline = time.monotonic() + (self.store.session_timeout_s if wait_s is None else wait_s)
        for readonly in (False, True):
            self._claim(bookie_id, self._bookie_path(bookie_id, readonly), predecessors, deadline)

    def _claim(
        self, bookie_id: str, path: str, predecessors: Collection[str], deadline: float
    ) -> None:
        while True:
            try:
                existing, version = self.store.get(path)
            except NoNodeError:
                return
            holder = formats.BookieServiceInfoFormat.FromString(existing)
            if holder.properties.get(INCARNATION_PROPERTY) in predecessors:
                # An earlier run on our directories whose session has not expired: replace it.
                with contextlib.suppress(NoNodeError, BadVersionError):
                    self.store.delete(path, version)
                continue
            if time.monotonic() >= deadline:
                where = ", ".join(f"{e.host}:{e.port}" for e in holder.endpoints) or "?"
                raise BookieIdInUseError(
                    f"bookie id {bookie_id} is registered by another live process (serving on "
                    f"{where}); stop that bookie first, or give this one another --bookie-id"
                )
            time.sleep(0.2)

    def unregister_bookie(
        self, bookie_id: str, *, readonly: bool = False, incarnation: str | None = None
    ) -> None:
        """Removes the registration; with ``incarnation``, only when it is that run's."""
        path = self._bookie_path(bookie_id, readonly)
        try:
            if incarnation is None:
                self.store.delete(path)
                return
            existing, version = self.store.get(path)
            holder = formats.BookieServiceInfoFormat.FromString(existing)
            if holder.properties.get(INCARNATION_PROPERTY) == incarnation:
                self.store.delete(path, version)
        except (NoNodeError, BadVersionError):
            pass

    def _bookie_path(self, bookie_id: str, readonly: bool) -> str:
        return (
            f"{self.root}/available/readonly/{bookie_id}"
            if readonly
            else f"{self.root}/available/{bookie_id}"
        )

    def writable_bookies(self) -> list[str]:
        try:
            return [
                name for name in self.store.children(f"{self.root}/available") if name != "readonly"
            ]
        except NoNodeError:
            return []

    def watch_bookies(self, callback: Callable[[], None]) -> list[Watch]:
        """Calls ``callback()`` whenever a bookie registers, unregisters or changes mode (after
        ``init_cluster``); re-read ``writable_bookies`` / ``readonly_bookies`` in it."""
        return [
            self.store.watch(f"{self.root}/available", callback, children=True),
            self.store.watch(f"{self.root}/available/readonly", callback, children=True),
        ]

    def readonly_bookies(self) -> list[str]:
        try:
            return self.store.children(f"{self.root}/available/readonly")
        except NoNodeError:
            return []

    def bookie_service_info(self, bookie_id: str) -> formats.BookieServiceInfoFormat | None:
        """The service info a live bookie registered (its endpoints and properties, as
        BookKeeper's ``getBookieServiceInfo``); None if it is not registered."""
        for readonly in (False, True):
            try:
                data, _ = self.store.get(self._bookie_path(bookie_id, readonly))
            except NoNodeError:
                continue
            info = formats.BookieServiceInfoFormat()
            info.ParseFromString(data)
            return info
        return None

    def bookie_endpoint(self, bookie_id: str) -> BookieEndpoint:
        """Where ``bookie_id`` listens: its registered service info, or its host:port id."""
        info = self.bookie_service_info(bookie_id)
        for endpoint in info.endpoints if info is not None else ():
            if endpoint.protocol == "bookie-rpc":
                return BookieEndpoint(bookie_id, endpoint.host, endpoint.port)
        host, port = parse_bookie_id(bookie_id)
        return BookieEndpoint(bookie_id, host, port)


def delete_tree(
    store: MetadataStore, path: str, on_delete: Callable[[], None] | None = None
) -> int:
    """Deletes ``path`` and everything under it, depth first, a page of children at a time;
    the number of nodes deleted (``on_delete`` hears of each). Nodes that vanish meanwhile are
    skipped."""
    deleted = 0
    for _ in range(_MAX_DELETE_PAGES):
        try:
            page = store.children_page(path, None, 1000)
        except NoNodeError:
            return deleted
        if not page:
            break
        for name in page:
            deleted += delete_tree(store, f"{path.rstrip('/')}/{name}", on_delete)
    else:
        raise MetadataStoreError(f"{path} keeps getting new children; stopped deleting it")
    if path == "/":
        return deleted
    try:
        store.delete(path)
        deleted += 1
        if on_delete is not None:
            on_delete()
    except NoNodeError:
        pass
    return deleted
