"""The ZooKeeper driver, through kazoo: BookKeeper's own metadata store for clusters."""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError as KazooBadVersion,
)
from kazoo.exceptions import (
    KazooException,
    ZookeeperError,
)
from kazoo.exceptions import (
    NodeExistsError as KazooNodeExists,
)
from kazoo.exceptions import (
    NoNodeError as KazooNoNode,
)
from kazoo.exceptions import (
    NotEmptyError as KazooNotEmpty,
)
from kazoo.handlers.threading import KazooTimeoutError

from bookkeeper.errors import MetadataStoreError, MetadataUnavailableError
from bookkeeper.metadata.driver import (
    ANY_VERSION,
    BadVersionError,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    check_path,
)

log = logging.getLogger(__name__)


class ZooKeeperStore(MetadataStore):
    """A ZooKeeper session; ephemeral nodes live as long as it does."""

    def __init__(self, hosts: str, connect_timeout_s: float, session_timeout_s: float) -> None:
        self._hosts = hosts
        self._client = KazooClient(
            hosts=hosts, timeout=session_timeout_s, connection_retry={"max_tries": 3}
        )
        try:
            self._client.start(timeout=connect_timeout_s)
        except (KazooTimeoutError, KazooException) as error:
            self._client.stop()
            self._client.close()
            raise MetadataUnavailableError(
                f"could not connect to ZooKeeper at {hosts} within {connect_timeout_s:.0f} s; "
                "check that it runs and that the metadata URI names it"
            ) from error

    def _call(self, what: str, path: str, function, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return function(*args, **kwargs)
        except KazooNoNode as error:
            raise NoNodeError(f"no node {path}") from error
        except KazooNodeExists as error:
            raise NodeExistsError(f"node {path} already exists") from error
        except KazooBadVersion as error:
            raise BadVersionError(f"{path}: version changed") from error
        except KazooNotEmpty as error:
            raise NotEmptyError(f"{path} has children") from error
        except (ZookeeperError, KazooException, KazooTimeoutError) as error:
            raise MetadataStoreError(
                f"ZooKeeper {what} {path} at {self._hosts} failed: {error!r}"
            ) from error

    def get(self, path: str) -> tuple[bytes, int]:
        data, stat = self._call("get", path, self._client.get, path)
        return bytes(data or b""), int(stat.version)

    def exists(self, path: str) -> int | None:
        stat = self._call("exists", path, self._client.exists, path)
        return None if stat is None else int(stat.version)

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
        return str(
            self._call(
                "create",
                path,
                self._client.create,
                path,
                bytes(data),
                ephemeral=ephemeral,
                sequence=sequential,
                makepath=make_parents,
            )
        )

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> int:
        stat = self._call("set", path, self._client.set, path, bytes(data), version=version)
        return int(stat.version)

    def delete(self, path: str, version: int = ANY_VERSION) -> None:
        self._call("delete", path, self._client.delete, path, version=version)

    def children(self, path: str) -> list[str]:
        return sorted(self._call("list", path, self._client.get_children, path))

    def close(self) -> None:
        try:
            self._client.stop()
        finally:
            self._client.close()
