"""The memory driver (``memory://name``): a tree shared by every session of one process.

For tests and the simulator. Sessions opened with the same name see the same tree; closing a
session removes its ephemeral nodes, as a ZooKeeper session expiry would.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

from bookkeeper.metadata.driver import (
    ANY_VERSION,
    BadVersionError,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    check_path,
    parent_of,
)


@dataclass(slots=True)
class _Node:
    data: bytes
    version: int
    owner: int | None  # session id of an ephemeral node
    child_counter: int = 0


class _Tree:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.nodes: dict[str, _Node] = {"/": _Node(b"", 0, None)}
        self.sessions = itertools.count(1)


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

    def _node(self, path: str) -> _Node:
        node = self._tree.nodes.get(path)
        if node is None:
            raise NoNodeError(f"no node {path}")
        return node

    def get(self, path: str) -> tuple[bytes, int]:
        with self._tree.lock:
            node = self._node(path)
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
        check_path(path)
        with self._tree.lock:
            parent = parent_of(path)
            if parent not in self._tree.nodes:
                if not make_parents:
                    raise NoNodeError(f"parent of {path} does not exist")
                self._create_parents(parent)
            parent_node = self._tree.nodes[parent]
            if parent_node.owner is not None:
                raise NoNodeError(f"{parent} is ephemeral and cannot have children")
            if sequential:
                path = f"{path}{parent_node.child_counter:010d}"
                parent_node.child_counter += 1
            elif path in self._tree.nodes:
                raise NodeExistsError(f"node {path} already exists")
            self._tree.nodes[path] = _Node(bytes(data), 0, self._session if ephemeral else None)
            return path

    def _create_parents(self, path: str) -> None:
        missing: list[str] = []
        while path not in self._tree.nodes:
            missing.append(path)
            path = parent_of(path)
        for each in reversed(missing):
            self._tree.nodes[each] = _Node(b"", 0, None)

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> int:
        with self._tree.lock:
            node = self._node(path)
            if version != ANY_VERSION and node.version != version:
                raise BadVersionError(f"{path} is at version {node.version}, not {version}")
            node.data = bytes(data)
            node.version += 1
            return node.version

    def delete(self, path: str, version: int = ANY_VERSION) -> None:
        with self._tree.lock:
            node = self._node(path)
            if version != ANY_VERSION and node.version != version:
                raise BadVersionError(f"{path} is at version {node.version}, not {version}")
            prefix = path.rstrip("/") + "/"
            if any(other.startswith(prefix) for other in self._tree.nodes):
                raise NotEmptyError(f"{path} has children")
            del self._tree.nodes[path]

    def children(self, path: str) -> list[str]:
        with self._tree.lock:
            self._node(path)
            prefix = "/" if path == "/" else path + "/"
            return sorted(
                other[len(prefix) :]
                for other in self._tree.nodes
                if other.startswith(prefix) and other != "/" and "/" not in other[len(prefix) :]
            )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._tree.lock:
            for path in [p for p, n in self._tree.nodes.items() if n.owner == self._session]:
                del self._tree.nodes[path]
