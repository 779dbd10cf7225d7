"""The ZooKeeper driver, through kazoo: BookKeeper's own metadata store for clusters."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError as KazooBadVersion,
)
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    RolledBackError,
    SessionExpiredError,
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
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.security import CREATOR_ALL_ACL

from bookkeeper_py.errors import MetadataStoreError, MetadataUnavailableError
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
)

log = logging.getLogger(__name__)


class ZooKeeperStore(MetadataStore):
    """A ZooKeeper session; ephemeral nodes live as long as it does."""

    def __init__(
        self,
        hosts: str,
        connect_timeout_s: float,
        session_timeout_s: float,
        digest_auth_file: str | None = None,
        operation_timeout_s: float = 30.0,
    ) -> None:
        self._hosts = hosts
        # How long one request may wait for ZooKeeper's answer (it is queued while reconnecting).
        self.operation_timeout_s = operation_timeout_s
        self.session_timeout_s = session_timeout_s + 1.0  # and a tick of the server's clock
        self._session_listeners: list[SessionCallback] = []
        self._session_lost = False
        self._closing = False
        # Reconnect for as long as it takes (a ZooKeeper restart, a partition): giving up would
        # leave a bookie running but unregistered. start() below bounds the first connection.
        secured: dict[str, object] = {}
        if digest_auth_file is not None:
            credentials = _read_digest(digest_auth_file)
            secured = {"auth_data": [("digest", credentials)], "default_acl": CREATOR_ALL_ACL}
        self._client = KazooClient(
            hosts=hosts,
            timeout=session_timeout_s,
            connection_retry={"max_tries": -1, "delay": 0.2, "max_delay": 2.0},
            **secured,
        )
        self._client.add_listener(self._state_changed)
        try:
            self._client.start(timeout=connect_timeout_s)
        except (KazooTimeoutError, KazooException) as error:
            self._client.stop()
            self._client.close()
            raise MetadataUnavailableError(
                f"could not connect to ZooKeeper at {hosts} within {connect_timeout_s:.0f} s; "
                "check that it runs and that the metadata URI names it"
            ) from error

    @property
    def hosts(self) -> str:
        """The ZooKeeper connection string."""
        return self._hosts

    @property
    def session(self) -> tuple[int, bytes]:
        """The session's id and password (what a second connection needs to take it over)."""
        session_id, password = self._client.client_id
        return session_id, password

    def _wait(self, what: str, path: str, function, *args, **kwargs):  # type: ignore[no-untyped-def]
        """Runs a kazoo ``*_async`` call and waits for its answer for at most the operation
        timeout: kazoo queues requests while it reconnects, for as long as ZooKeeper is away,
        and no caller may wait for ever."""
        timeout = self.operation_timeout_s

        def call():  # type: ignore[no-untyped-def]
            try:
                return function(*args, **kwargs).get(timeout=timeout)
            except KazooTimeoutError:
                raise MetadataUnavailableError(
                    f"no answer from ZooKeeper at {self._hosts} within {timeout:.0f} s to "
                    f"{what} {path}: it is down or unreachable; the operation's outcome is "
                    "unknown, retry once ZooKeeper is back"
                ) from None

        return self._call(what, path, call)

    def _call(self, what: str, path: str, function, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return function(*args, **kwargs)
        except MetadataUnavailableError:
            raise
        except (ConnectionLoss, SessionExpiredError, ConnectionClosedError) as error:
            raise MetadataUnavailableError(
                f"ZooKeeper at {self._hosts} lost the connection during {what} {path} "
                f"({type(error).__name__}): the operation's outcome is unknown, retry once "
                "ZooKeeper is back"
            ) from error
        except KazooNoNode as error:
            raise NoNodeError(f"no node {path}") from error
        except KazooNodeExists as error:
            raise NodeExistsError(f"node {path} already exists") from error
        except KazooBadVersion as error:
            raise BadVersionError(f"{path}: version changed") from error
        except KazooNotEmpty as error:
            raise NotEmptyError(f"{path} has children") from error
        except NoAuthError as error:
            raise MetadataStoreError(
                f"ZooKeeper refused to {what} {path}: not authorised; its ACL needs the identity "
                "of the digestAuthFile the cluster was created with"
            ) from error
        except (ZookeeperError, KazooException, KazooTimeoutError) as error:
            raise MetadataStoreError(
                f"ZooKeeper {what} {path} at {self._hosts} failed: {error!r}"
            ) from error

    def get(self, path: str) -> tuple[bytes, int]:
        data, stat = self._wait("get", path, self._client.get_async, path)
        return bytes(data or b""), int(stat.version)

    def exists(self, path: str) -> int | None:
        stat = self._wait("exists", path, self._client.exists_async, path)
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
            self._wait(
                "create",
                path,
                self._client.create_async,
                path,
                bytes(data),
                ephemeral=ephemeral,
                sequence=sequential,
                makepath=make_parents,
            )
        )

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> int:
        stat = self._wait("set", path, self._client.set_async, path, bytes(data), version=version)
        return int(stat.version)

    def delete(self, path: str, version: int = ANY_VERSION) -> None:
        self._wait("delete", path, self._client.delete_async, path, version=version)

    def children(self, path: str) -> list[str]:
        return sorted(self._wait("list", path, self._client.get_children_async, path))

    # -- watches, transactions, sessions ------------------------------------------------------

    def watch(self, path: str, callback: ChangeCallback, *, children: bool = False) -> Watch:
        watch = _ZooKeeperWatch(callback)
        if children:
            if self.exists(path) is None:
                raise NoNodeError(f"no node {path} to watch the children of")
            self._call("watch", path, ChildrenWatch, self._client, path, watch.children_changed)
        else:
            self._call("watch", path, DataWatch, self._client, path, watch.data_changed)
        return watch

    def multi(self, operations: Sequence[Operation]) -> list[str | int | None]:
        transaction = self._client.transaction()
        for operation in operations:
            if isinstance(operation, CreateOp):
                check_path(operation.path)
                transaction.create(
                    operation.path, bytes(operation.data), ephemeral=operation.ephemeral
                )
            elif isinstance(operation, SetOp):
                transaction.set_data(operation.path, bytes(operation.data), operation.version)
            elif isinstance(operation, DeleteOp):
                transaction.delete(operation.path, operation.version)
            elif isinstance(operation, CheckOp):
                transaction.check(operation.path, operation.version)
        results = self._wait(
            "multi", operations[0].path if operations else "/", transaction.commit_async
        )
        failures = [
            (operation, result)
            for operation, result in zip(operations, results, strict=True)
            if isinstance(result, Exception) and not isinstance(result, RolledBackError)
        ]
        if failures:
            operation, failure = failures[0]
            self._call("multi", operation.path, _raise, failure)
        answers: list[str | int | None] = []
        for operation, result in zip(operations, results, strict=True):
            if isinstance(operation, CreateOp):
                answers.append(str(result))  # the path created
            elif isinstance(operation, SetOp):
                answers.append(int(result.version))  # a ZnodeStat
            else:
                answers.append(None)
        return answers

    def add_session_listener(self, callback: SessionCallback) -> None:
        self._session_listeners.append(callback)

    def _state_changed(self, state: str) -> None:
        # Called on kazoo's event thread; must not block.
        if self._closing:
            return
        if state == KazooState.LOST:
            self._session_lost = True
            log.warning("ZooKeeper session to %s expired; ephemeral nodes are gone", self._hosts)
        elif state == KazooState.CONNECTED and self._session_lost:
            self._session_lost = False
            log.info("new ZooKeeper session to %s; re-creating ephemeral nodes", self._hosts)
            for listener in list(self._session_listeners):
                # a listener writes to ZooKeeper: not on the event thread it would wait for
                threading.Thread(target=_run_listener, args=(listener,), daemon=True).start()

    def close(self) -> None:
        self._closing = True
        try:
            self._client.stop()
        finally:
            self._client.close()


def _read_digest(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            credentials = handle.read().strip()
    except OSError as error:
        raise MetadataUnavailableError(
            f"cannot read ZooKeeper digestAuthFile {path}: {error}"
        ) from error
    user, _, password = credentials.partition(":")
    if not user or not password:
        raise MetadataUnavailableError(f"ZooKeeper digestAuthFile {path} must hold user:password")
    return credentials


def _raise(error: Exception) -> None:
    raise error


def _run_listener(listener: SessionCallback) -> None:
    try:
        listener()
    except Exception:
        log.exception("a metadata session listener failed")


class _ZooKeeperWatch:
    """Adapts kazoo's ChildrenWatch / DataWatch (called at once, then on each change, until
    they return False) to change notifications."""

    def __init__(self, callback: ChangeCallback) -> None:
        self._callback = callback
        self._cancelled = False
        self._primed = False

    def cancel(self) -> None:
        self._cancelled = True

    def _fire(self) -> bool:
        if self._cancelled:
            return False
        if not self._primed:  # kazoo's first call reports the current state, not a change
            self._primed = True
            return True
        try:
            self._callback()
        except Exception:
            log.exception("a metadata watch callback failed")
        return True

    def children_changed(self, children: list[str]) -> bool:
        return self._fire()

    def data_changed(self, data: bytes | None, stat: object) -> bool:
        return self._fire()
