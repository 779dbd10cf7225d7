"""The metadata store interface every driver implements, and the URI that picks a driver.

The interface is ZooKeeper's data model, which BookKeeper's layout is written for: a tree of
paths, each holding bytes and a version that every write increments; creates that fail when the
path exists; compare-and-swap writes and deletes by version; ephemeral nodes that vanish when the
session that made them ends (or, for SQLite, when its lease stops being renewed); sequential
nodes whose names end in a 10-digit counter of their parent. The ledger layout, id generation
and bookie registry are written once on top of it (``manager.py``).

URIs (as BookKeeper's ``metadataServiceUri``):
``zk+hierarchical://host:2181[;host2:2181]/ledgers`` (also ``zk://``), ``sqlite:///abs/path.db``,
``memory://name``. A ZooKeeper URI may add ``?digestAuthFile=/path``: the session authenticates
with the ``user:password`` in that file and every node it creates is readable and writable only
by sessions with the same identity (ledger passwords are then not world-readable).
"""

from __future__ import annotations

import abc
import bisect
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from bookkeeper_py.errors import IncorrectParameterError, MetadataStoreError

ANY_VERSION = -1


class NoNodeError(MetadataStoreError):
    """The path does not exist."""


class NodeExistsError(MetadataStoreError):
    """The path already exists."""


class BadVersionError(MetadataStoreError):
    """The path's version is not the one the compare-and-swap expected."""


class NotEmptyError(MetadataStoreError):
    """The path has children and cannot be deleted."""


@dataclass(frozen=True, slots=True)
class CreateOp:
    path: str
    data: bytes = b""
    ephemeral: bool = False


@dataclass(frozen=True, slots=True)
class SetOp:
    path: str
    data: bytes
    version: int = ANY_VERSION


@dataclass(frozen=True, slots=True)
class DeleteOp:
    path: str
    version: int = ANY_VERSION


@dataclass(frozen=True, slots=True)
class CheckOp:
    """Holds the transaction unless ``path`` is at ``version``."""

    path: str
    version: int


Operation = CreateOp | SetOp | DeleteOp | CheckOp


class Watch(Protocol):
    def cancel(self) -> None:
        """No more callbacks after this returns (one already running may finish)."""


ChangeCallback = Callable[[], None]
SessionCallback = Callable[[], None]


class MetadataStore(abc.ABC):
    """A session on a metadata store. Thread-safe; blocking calls (run them off the event loop).

    Watches are change notifications: after a change the callback is called (on a thread of the
    driver; it must not block) and re-reads what it needs; changes close together may be
    reported once, but a change is never missed. A session that expires (its process stalled
    past the ZooKeeper session timeout or the SQLite lease) is replaced by a new one; its
    ephemeral nodes are gone, and the session listeners are called so that their owners
    re-create them.
    """

    # How long an ephemeral node outlives a process that died without closing its session.
    session_timeout_s: float = 0.0

    @abc.abstractmethod
    def get(self, path: str) -> tuple[bytes, int]:
        """(data, version) of ``path``; raises ``NoNodeError``."""

    @abc.abstractmethod
    def exists(self, path: str) -> int | None:
        """The version of ``path``, or None when it does not exist."""

    @abc.abstractmethod
    def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = True,
    ) -> str:
        """Creates ``path`` (with a counter suffix when ``sequential``) and returns the real path.

        Raises ``NodeExistsError`` when it exists, ``NoNodeError`` when its parent does not and
        ``make_parents`` is false.
        """

    @abc.abstractmethod
    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> int:
        """Replaces the data when the version matches (or ``ANY_VERSION``); returns the new version."""

    @abc.abstractmethod
    def delete(self, path: str, version: int = ANY_VERSION) -> None:
        """Deletes a childless ``path`` when the version matches; raises ``NoNodeError``."""

    @abc.abstractmethod
    def children(self, path: str) -> list[str]:
        """Names of the children of ``path``, sorted; raises ``NoNodeError``."""

    def children_page(self, path: str, after: str | None = None, limit: int = 1000) -> list[str]:
        """Up to ``limit`` child names of ``path`` greater than ``after``, sorted."""
        names = self.children(path)
        start = 0 if after is None else bisect.bisect_right(names, after)
        return names[start : start + limit]

    def iter_children(self, path: str, page_size: int = 1000) -> Iterator[str]:
        """Every child name of ``path``, sorted, read ``page_size`` at a time."""
        after: str | None = None
        while True:
            page = self.children_page(path, after, page_size)
            yield from page
            if len(page) < page_size:
                return
            after = page[-1]

    @abc.abstractmethod
    def watch(self, path: str, callback: ChangeCallback, *, children: bool = False) -> Watch:
        """Calls ``callback()`` after every change of ``path``'s data or existence, or with
        ``children``, of its list of children (which needs ``path`` to exist: ``NoNodeError``)."""

    @abc.abstractmethod
    def multi(self, operations: Sequence[Operation]) -> list[str | int | None]:
        """Applies every operation or none. Results in order: the created path, the new
        version, None for deletes and checks. Raises the error of the first operation that
        fails (``NodeExistsError``, ``NoNodeError``, ``BadVersionError``, ``NotEmptyError``)."""

    @abc.abstractmethod
    def add_session_listener(self, callback: SessionCallback) -> None:
        """Calls ``callback()`` (on a driver thread) each time an expired session was replaced."""

    @abc.abstractmethod
    def close(self) -> None:
        """Ends the session: its ephemeral nodes disappear."""


@dataclass(frozen=True, slots=True)
class StoreAddress:
    """A parsed metadata service URI."""

    scheme: str  # "zk", "sqlite" or "memory"
    layout: str  # "hierarchical", "flat" or "longhierarchical"
    location: str  # ZooKeeper connect string, SQLite file path or memory store name
    root: str  # the ledgers root path in the tree, e.g. "/ledgers"
    digest_auth_file: str | None = None  # ZooKeeper: "user:password" file; nodes creator-only


ACCEPTED_URIS = (
    "zk+hierarchical://host:2181/ledgers (also zk://, zk+flat://, zk+longhierarchical://), "
    "sqlite:///abs/path/metadata.db or memory://name"
)


def parse_uri(uri: str) -> StoreAddress:
    """Parses a metadata service URI; raises ``IncorrectParameterError`` (a ``ValueError``)
    naming the accepted forms for anything else."""

    def bad(problem: str) -> IncorrectParameterError:
        return IncorrectParameterError(
            f"{problem} in metadata service URI {uri!r}; use {ACCEPTED_URIS}"
        )

    if not isinstance(uri, str):
        raise IncorrectParameterError(
            f"a metadata service URI is a string, got {type(uri).__name__}; use {ACCEPTED_URIS}"
        )
    parts = urllib.parse.urlsplit(uri)
    scheme, _, layout = parts.scheme.partition("+")
    layout = layout or "hierarchical"
    if scheme not in ("zk", "sqlite", "memory"):
        raise bad(f"unsupported scheme {parts.scheme!r}" if parts.scheme else "no scheme")
    if layout not in ("hierarchical", "flat", "longhierarchical"):
        raise bad(f"unknown ledger layout {layout!r} (hierarchical, flat or longhierarchical)")
    if scheme == "zk":
        if not parts.netloc:
            raise bad("no ZooKeeper servers")
        root = parts.path.rstrip("/") or "/ledgers"
        query = urllib.parse.parse_qs(parts.query)
        unknown = set(query) - {"digestAuthFile"}
        if unknown:
            raise bad(f"unknown option(s) {', '.join(sorted(unknown))} (known: digestAuthFile)")
        digest_file = query.get("digestAuthFile", [None])[-1]
        return StoreAddress("zk", layout, parts.netloc.replace(";", ","), root, digest_file)
    if scheme == "sqlite":
        if not parts.path or parts.netloc:
            raise bad("SQLite URIs take an absolute path (sqlite:///abs/path.db)")
        return StoreAddress("sqlite", layout, parts.path, "/ledgers")
    name = parts.netloc + parts.path
    if not name:
        raise bad("memory URIs need a name (memory://name)")
    return StoreAddress("memory", layout, name, "/ledgers")


# How long a dead process's ephemeral nodes (a bookie's registration, AutoRecovery's vote and
# locks) outlive it unless ``session_timeout_s`` (zkTimeout) says otherwise: ZooKeeper's session
# timeout, BookKeeper's default; the SQLite lease, shorter (one machine, no network between the
# processes and the file).
ZOOKEEPER_SESSION_TIMEOUT_S = 10.0
SQLITE_LEASE_S = 5.0


def open_store(
    uri: str,
    *,
    create: bool = False,
    connect_timeout_s: float = 10.0,
    session_timeout_s: float | None = None,
    operation_timeout_s: float = 30.0,
) -> tuple[MetadataStore, StoreAddress]:
    """Connects to the store named by ``uri``.

    ``create`` allows a new SQLite file; otherwise a missing store is an error.
    ``session_timeout_s`` (zkTimeout): the ZooKeeper session timeout, or the SQLite lease
    (None: ``ZOOKEEPER_SESSION_TIMEOUT_S``, ``SQLITE_LEASE_S``). Raises
    ``MetadataUnavailableError`` when the store cannot be reached within ``connect_timeout_s``,
    and (ZooKeeper) when a request is not answered within ``operation_timeout_s``.
    """
    address = parse_uri(uri)
    if address.scheme == "memory":
        from bookkeeper_py.metadata.memory import MemoryStore

        return MemoryStore(address.location), address
    if address.scheme == "sqlite":
        from bookkeeper_py.metadata.sqlite import SqliteStore

        lease_s = SQLITE_LEASE_S if session_timeout_s is None else session_timeout_s
        return SqliteStore(address.location, create=create, lease_s=lease_s), address
    from bookkeeper_py.metadata.zookeeper import ZooKeeperStore

    return ZooKeeperStore(
        address.location,
        connect_timeout_s,
        ZOOKEEPER_SESSION_TIMEOUT_S if session_timeout_s is None else session_timeout_s,
        address.digest_auth_file,
        operation_timeout_s,
    ), address


def parent_of(path: str) -> str:
    """The parent path ("/" for top-level paths)."""
    head, _, _ = path.rstrip("/").rpartition("/")
    return head or "/"


def sequence_suffix(counter: int) -> str:
    """The name suffix of the ``counter``-th sequential child: ZooKeeper's ``%010d`` of a signed
    32-bit counter, which wraps to ``-2147483648`` after ``2147483647``. Every driver names
    sequential nodes so, and the ledger id generators rely on the wrap to detect overflow."""
    wrapped = (counter + 2**31) % 2**32 - 2**31
    return f"{wrapped:010d}"


def check_path(path: str) -> None:
    """Raises ``IncorrectParameterError`` for paths the tree does not accept."""
    if not path.startswith("/") or (path != "/" and path.endswith("/")) or "//" in path:
        raise IncorrectParameterError(f"invalid metadata path {path!r}")
