"""The memory driver (``memory://name``): a tree shared by every session of one process.

For tests and the simulator. Sessions opened with the same name see the same tree; closing a
session removes its ephemeral nodes, as a ZooKeeper session expiry would. Each node keeps its
children's names in a sorted list, so listings and pages cost what they return. Watch callbacks
run on one notifier thread per tree, in the order of the changes.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bookkeeper_py.metadata.driver import (
    ANY_VERSION,
    BadVersionError,
    ChangeCallback,
    CheckOp,
    CreateOp,
    DeleteOp,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    Operation,
    SessionCallback,
    SetOp,
    Watch,
    check_path,
    parent_of,
    sequence_suffix,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Node:
    data: bytes
    version: int
    owner: int | None  # session id of an ephemeral node
    child_counter: int = 0
    children: list[str] = field(default_factory=list)  # names, sorted


def _name(path: str) -> str:
    return path.rsplit("/", 1)[1]


class _MemoryWatch:
    def __init__(self, tree: _Tree, key: tuple[str, bool], callback: ChangeCallback) -> None:
        self._tree = tree
        self._key = key
        self.callback = callback

    def cancel(self) -> None:
        with self._tree.lock:
            watches = self._tree.watches.get(self._key, [])
            if self in watches:
                watches.remove(self)


class _Tree:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.nodes: dict[str, _Node] = {"/": _Node(b"", 0, None)}
        self.sessions = itertools.count(1)
        self.watches: dict[tuple[str, bool], list[_MemoryWatch]] = {}
        self._events: queue.SimpleQueue[ChangeCallback] = queue.SimpleQueue()
        self._notifier: threading.Thread | None = None

    def changed(self, path: str, *, children: bool) -> None:
        """Queues the callbacks of ``path``'s watches (call with the lock held)."""
        for watch in self.watches.get((path, children), ()):
            self._events.put(watch.callback)
        if self._notifier is None and self.watches:
            self._notifier = threading.Thread(
                target=self._notify, name="memory-metadata-watches", daemon=True
            )
            self._notifier.start()

    def _notify(self) -> None:
        while True:
            callback = self._events.get()
            try:
                callback()
            except Exception:
                log.exception("a metadata watch callback failed")

    # -- changes, with the lock held; each validates before it changes anything ----------------

    def node(self, path: str) -> _Node:
        node = self.nodes.get(path)
        if node is None:
            raise NoNodeError(f"no node {path}")
        return node

    def create(
        self, path: str, data: bytes, owner: int | None, sequential: bool, make_parents: bool
    ) -> str:
        check_path(path)
        parent = parent_of(path)
        if parent not in self.nodes:
            if not make_parents:
                raise NoNodeError(f"parent of {path} does not exist")
            self._create_parents(parent)
        parent_node = self.nodes[parent]
        if parent_node.owner is not None:
            raise NoNodeError(f"{parent} is ephemeral and cannot have children")
        if sequential:
            path = path + sequence_suffix(parent_node.child_counter)
            parent_node.child_counter += 1
        if path in self.nodes:
            raise NodeExistsError(f"node {path} already exists")
        self.nodes[path] = _Node(bytes(data), 0, owner)
        bisect.insort(parent_node.children, _name(path))
        self.changed(path, children=False)
        self.changed(parent, children=True)
        return path

    def _create_parents(self, path: str) -> None:
        missing: list[str] = []
        while path not in self.nodes:
            missing.append(path)
            path = parent_of(path)
        for each in reversed(missing):
            self.create(each, b"", None, False, False)

    def set(self, path: str, data: bytes, version: int) -> int:
        node = self.node(path)
        if version != ANY_VERSION and node.version != version:
            raise BadVersionError(f"{path} is at version {node.version}, not {version}")
        node.data = bytes(data)
        node.version += 1
        self.changed(path, children=False)
        return node.version

    def check_delete(self, path: str, version: int) -> None:
        node = self.node(path)
        if version != ANY_VERSION and node.version != version:
            raise BadVersionError(f"{path} is at version {node.version}, not {version}")
        if node.children:
            raise NotEmptyError(f"{path} has children")

    def delete(self, path: str, version: int) -> None:
        self.check_delete(path, version)
        del self.nodes[path]
        parent = parent_of(path)
        children = self.nodes[parent].children
        del children[bisect.bisect_left(children, _name(path))]
        self.changed(path, children=False)
        self.changed(parent, children=True)

    def reinsert(self, path: str, node: _Node) -> None:
        """Puts back a node a failed transaction deleted."""
        self.nodes[path] = node
        bisect.insort(self.nodes[parent_of(path)].children, _name(path))
        self.changed(path, children=False)
        self.changed(parent_of(path), children=True)


def _restore(node: _Node, data: bytes, version: int) -> None:
    node.data, node.version = data, version


_TREES: dict[str, _Tree] = {}
_TREES_LOCK = threading.Lock()


def _tree(name: str) -> _Tree:
    with _TREES_LOCK:
        return _TREES.setdefault(name, _Tree())


class MemoryStore(MetadataStore):
    """A session on the in-process tree called ``name``."""

    def __init__(self, name: str) -> None:
        self._tree = _tree(name)
        self._session = next(self._tree.sessions)
        self._closed = False
        self._watches: list[_MemoryWatch] = []

    def get(self, path: str) -> tuple[bytes, int]:
        with self._tree.lock:
            node = self._tree.node(path)
            return node.data, node.version

    def exists(self, path: str) -> int | None:
        with self._tree.lock:
            node = self._tree.nodes.get(path)
            return None if node is None else node.version

    def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = True,
    ) -> str:
        with self._tree.lock:
            owner = self._session if ephemeral else None
            return self._tree.create(path, data, owner, sequential, make_parents)

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> int:
        with self._tree.lock:
            return self._tree.set(path, data, version)

    def delete(self, path: str, version: int = ANY_VERSION) -> None:
        with self._tree.lock:
            self._tree.delete(path, version)

    def children(self, path: str) -> list[str]:
        with self._tree.lock:
            return list(self._tree.node(path).children)

    def children_page(self, path: str, after: str | None = None, limit: int = 1000) -> list[str]:
        with self._tree.lock:
            names = self._tree.node(path).children
            start = 0 if after is None else bisect.bisect_right(names, after)
            return names[start : start + limit]

    def watch(self, path: str, callback: ChangeCallback, *, children: bool = False) -> Watch:
        with self._tree.lock:
            if children:
                self._tree.node(path)
            watch = _MemoryWatch(self._tree, (path, children), callback)
            self._tree.watches.setdefault((path, children), []).append(watch)
            self._watches.append(watch)
            return watch

    def multi(self, operations: Sequence[Operation]) -> list[str | int | None]:
        tree = self._tree
        with tree.lock:
            undo: list[Callable[[], None]] = []  # applied in reverse when an operation fails
            results: list[str | int | None] = []
            try:
                for operation in operations:
                    if isinstance(operation, CreateOp):
                        owner = self._session if operation.ephemeral else None
                        path = tree.create(operation.path, operation.data, owner, False, False)
                        undo.append(functools.partial(tree.delete, path, ANY_VERSION))
                        results.append(path)
                    elif isinstance(operation, SetOp):
                        node = tree.node(operation.path)
                        undo.append(functools.partial(_restore, node, node.data, node.version))
                        results.append(tree.set(operation.path, operation.data, operation.version))
                    elif isinstance(operation, DeleteOp):
                        node = tree.node(operation.path)
                        tree.delete(operation.path, operation.version)
                        undo.append(functools.partial(tree.reinsert, operation.path, node))
                        results.append(None)
                    elif isinstance(operation, CheckOp):
                        version = tree.node(operation.path).version
                        if version != operation.version:
                            raise BadVersionError(
                                f"{operation.path} is at version {version}, not {operation.version}"
                            )
                        results.append(None)
            except BaseException:
                for step in reversed(undo):  # watch callbacks already queued may fire spuriously
                    step()
                raise
            return results

    def add_session_listener(self, callback: SessionCallback) -> None:
        """Memory sessions end only when closed: there is never a replacement to report."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._tree.lock:
            for watch in self._watches:
                watch.cancel()
            owned = [p for p, n in self._tree.nodes.items() if n.owner == self._session]
            for path in sorted(owned, reverse=True):
                self._tree.delete(path, ANY_VERSION)
