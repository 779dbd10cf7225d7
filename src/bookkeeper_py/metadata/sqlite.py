"""The SQLite driver (``sqlite:///abs/path.db``): the embedded store for one machine.

Several processes share one database file safely: WAL journaling, a busy timeout, and every
write in a ``BEGIN IMMEDIATE`` transaction, so a process killed mid-transaction leaves the last
committed state. Ephemeral nodes belong to a *session row* whose lease a heartbeat thread renews;
a session whose lease ran out (its process died or hung) is purged with its nodes by the next
writer (the heartbeats of live sessions write every lease/3), and readers never see the nodes of
an expired session. A process whose own lease ran out (it stalled) gets a new session and calls
its session listeners, which re-create what was ephemeral.

Watches: a process that watches registers a Unix datagram socket (Linux abstract namespace,
nothing on disk) in the ``watchers`` table; every write transaction that changed something sends
one byte to each registered socket after it commits, and the watching thread then compares the
versions of what it watches. A one-second re-check covers a lost datagram.

Schema (see docs/formats/sqlite-metadata.md)::

    nodes(path TEXT PRIMARY KEY, parent TEXT, data BLOB, version INTEGER,
          session INTEGER NULL, child_counter INTEGER, cversion INTEGER)
    sessions(id INTEGER PRIMARY KEY, expires_ms INTEGER)
    watchers(address TEXT PRIMARY KEY, session INTEGER)
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

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
    parent_of,
    sequence_suffix,
)

log = logging.getLogger(__name__)

_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS nodes (
    path TEXT PRIMARY KEY,
    parent TEXT NOT NULL,
    data BLOB NOT NULL,
    version INTEGER NOT NULL,
    session INTEGER,
    child_counter INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS nodes_by_parent ON nodes(parent, path);
CREATE INDEX IF NOT EXISTS nodes_by_session ON nodes(session) WHERE session IS NOT NULL;
CREATE TABLE IF NOT EXISTS sessions (id INTEGER PRIMARY KEY AUTOINCREMENT, expires_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS watchers (address TEXT PRIMARY KEY, session INTEGER NOT NULL);
INSERT OR IGNORE INTO nodes(path, parent, data, version) VALUES ('/', '', x'', 0);
COMMIT;
"""

_LIVE = "(session IS NULL OR session IN (SELECT id FROM sessions WHERE expires_ms >= ?))"
_RECHECK_S = 1.0  # watches re-check this often even without a wake-up datagram
_watch_addresses = itertools.count()


def _now_ms() -> int:
    return int(time.time() * 1000)


class _SqliteWatch:
    def __init__(
        self, store: SqliteStore, path: str, children: bool, callback: ChangeCallback
    ) -> None:
        self.path = path
        self.children = children
        self.callback = callback
        self.state: tuple[int, int] | None = None
        self._store = store

    def cancel(self) -> None:
        self._store._cancel(self)


class SqliteStore(MetadataStore):
    """A session on a SQLite metadata database shared by the processes of one machine."""

    def __init__(self, path: str, *, create: bool = False, lease_s: float = 5.0) -> None:
        if not os.path.isabs(path):
            raise MetadataUnavailableError(f"SQLite metadata path must be absolute, got {path!r}")
        if not create and not os.path.exists(path):
            raise MetadataUnavailableError(
                f"no metadata store at {path}: start one with 'bookkeeper localbookie' or create it "
                "with 'bookkeeper shell initnewcluster'"
            )
        self._path = path
        self._lease_ms = int(lease_s * 1000)
        self.session_timeout_s = lease_s
        self._lock = threading.RLock()
        self._db = self._connect()
        try:
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(nodes)")}
            if "cversion" not in columns:  # stores made before watches existed
                self._db.execute("ALTER TABLE nodes ADD COLUMN cversion INTEGER NOT NULL DEFAULT 0")
        except sqlite3.Error as error:
            raise MetadataUnavailableError(
                f"cannot open SQLite metadata store {path}: {error}"
            ) from error
        # One unbound datagram socket sends every wake-up (sendto is thread-safe).
        self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sender.setblocking(False)
        self._session = self._new_session()
        self._session_listeners: list[SessionCallback] = []
        self._watches: list[_SqliteWatch] = []
        self._watch_socket: socket.socket | None = None
        self._watch_address: str | None = None
        self._watch_thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._heartbeat = threading.Thread(
            target=self._renew_lease, name="sqlite-metadata-lease", daemon=True
        )
        self._heartbeat.start()

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(
                self._path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error as error:
            raise MetadataUnavailableError(
                f"cannot open SQLite metadata store {self._path}: {error}"
            ) from error
        return db

    def _new_session(self) -> int:
        with self._write(notify=False) as db:
            cursor = db.execute(
                "INSERT INTO sessions(expires_ms) VALUES (?)", (_now_ms() + self._lease_ms,)
            )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    @contextmanager
    def _write(self, notify: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction; expired sessions and their nodes are purged first. Watchers
        are woken after the commit when it changed something (``notify``, or a purge)."""
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as error:
                raise MetadataStoreError(
                    f"SQLite metadata store busy or broken: {error}"
                ) from error
            try:
                notify = self._purge_expired(db) or notify
                yield db
                watchers = (
                    [row[0] for row in db.execute("SELECT address FROM watchers")] if notify else []
                )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            else:
                db.execute("COMMIT")
        for address in watchers:
            self._wake(address)

    @staticmethod
    def _purge_expired(db: sqlite3.Connection) -> bool:
        now = _now_ms()
        if (
            db.execute("SELECT 1 FROM sessions WHERE expires_ms < ? LIMIT 1", (now,)).fetchone()
            is None
        ):
            return False
        expired = "SELECT id FROM sessions WHERE expires_ms < ?"
        db.execute(
            "UPDATE nodes SET cversion = cversion + 1 WHERE path IN "
            f"(SELECT parent FROM nodes WHERE session IN ({expired}))",
            (now,),
        )
        db.execute(f"DELETE FROM nodes WHERE session IN ({expired})", (now,))
        db.execute(f"DELETE FROM watchers WHERE session IN ({expired})", (now,))
        db.execute("DELETE FROM sessions WHERE expires_ms < ?", (now,))
        return True

    def _wake(self, address: str) -> None:
        try:
            self._sender.sendto(b"!", "\0" + address)
        except (ConnectionRefusedError, FileNotFoundError):
            pass  # its process is gone; the row goes with its session
        except BlockingIOError:
            pass  # its queue is full: it has wake-ups enough

    def _renew_lease(self) -> None:
        interval = self._lease_ms / 3000.0
        while not self._closed.wait(interval):
            try:
                with self._write(notify=False) as db:
                    cursor = db.execute(
                        "UPDATE sessions SET expires_ms = ? WHERE id = ?",
                        (_now_ms() + self._lease_ms, self._session),
                    )
                    renewed = cursor.rowcount > 0
                if not renewed:
                    self._replace_session()
            except (MetadataStoreError, sqlite3.Error) as error:
                log.warning("could not renew SQLite metadata lease: %s", error)

    def _replace_session(self) -> None:
        """Our lease ran out (the process stalled): its ephemeral nodes are gone, exactly as
        after a ZooKeeper session expiry. A new session; listeners re-create what they need."""
        old = self._session
        self._session = self._new_session()
        log.error(
            "SQLite metadata session %d expired; ephemeral nodes are gone; new session %d",
            old,
            self._session,
        )
        if self._watch_address is not None:
            with self._write(notify=False) as db:
                db.execute(
                    "INSERT OR REPLACE INTO watchers(address, session) VALUES (?, ?)",
                    (self._watch_address, self._session),
                )
        for listener in list(self._session_listeners):
            try:
                listener()
            except Exception:
                log.exception("a metadata session listener failed")

    def add_session_listener(self, callback: SessionCallback) -> None:
        self._session_listeners.append(callback)

    # -- reads ---------------------------------------------------------------------------------

    def _row(self, path: str) -> tuple[bytes, int] | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT data, version FROM nodes WHERE path = ? AND {_LIVE}", (path, _now_ms())
            ).fetchone()
        return None if row is None else (bytes(row[0]), int(row[1]))

    def get(self, path: str) -> tuple[bytes, int]:
        row = self._row(path)
        if row is None:
            raise NoNodeError(f"no node {path}")
        return row

    def exists(self, path: str) -> int | None:
        row = self._row(path)
        return None if row is None else row[1]

    def children(self, path: str) -> list[str]:
        return self.children_page(path, None, -1)

    def children_page(self, path: str, after: str | None = None, limit: int = 1000) -> list[str]:
        if self._row(path) is None:
            raise NoNodeError(f"no node {path}")
        prefix = "/" if path == "/" else path + "/"
        with self._lock:
            rows = self._db.execute(
                f"SELECT path FROM nodes WHERE parent = ? AND path > ? AND {_LIVE} "
                "ORDER BY path LIMIT ?",
                (path, prefix + after if after is not None else "", _now_ms(), limit),
            ).fetchall()
        return [row[0][len(prefix) :] for row in rows]

    # -- writes --------------------------------------------------------------------------------

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
        with self._write() as db:
            return self._create_in(db, path, data, ephemeral, sequential, make_parents)

    def _create_in(
        self,
        db: sqlite3.Connection,
        path: str,
        data: bytes,
        ephemeral: bool,
        sequential: bool,
        make_parents: bool,
    ) -> str:
        parent = parent_of(path)
        parent_row = db.execute(
            "SELECT session, child_counter FROM nodes WHERE path = ?", (parent,)
        ).fetchone()
        if parent_row is None:
            if not make_parents:
                raise NoNodeError(f"parent of {path} does not exist")
            self._create_parents(db, parent)
            parent_row = (None, 0)
        if parent_row[0] is not None:
            raise NoNodeError(f"{parent} is ephemeral and cannot have children")
        if sequential:
            counter = int(parent_row[1])
            db.execute("UPDATE nodes SET child_counter = ? WHERE path = ?", (counter + 1, parent))
            path = path + sequence_suffix(counter)
        try:
            db.execute(
                "INSERT INTO nodes(path, parent, data, version, session) VALUES (?, ?, ?, 0, ?)",
                (path, parent, bytes(data), self._session if ephemeral else None),
            )
        except sqlite3.IntegrityError as error:
            raise NodeExistsError(f"node {path} already exists") from error
        db.execute("UPDATE nodes SET cversion = cversion + 1 WHERE path = ?", (parent,))
        return path

    @staticmethod
    def _create_parents(db: sqlite3.Connection, path: str) -> None:
        missing: list[str] = []
        while db.execute("SELECT 1 FROM nodes WHERE path = ?", (path,)).fetchone() is None:
            missing.append(path)
            path = parent_of(path)
        for each in reversed(missing):
            db.execute(
                "INSERT INTO nodes(path, parent, data, version) VALUES (?, ?, x'', 0)",
                (each, parent_of(each)),
            )
            db.execute(
                "UPDATE nodes SET cversion = cversion + 1 WHERE path = ?", (parent_of(each),)
            )

    @staticmethod
    def _version_of(db: sqlite3.Connection, path: str, expected: int) -> int:
        row = db.execute("SELECT version FROM nodes WHERE path = ?", (path,)).fetchone()
        if row is None:
            raise NoNodeError(f"no node {path}")
        if expected != ANY_VERSION and int(row[0]) != expected:
            raise BadVersionError(f"{path} is at version {row[0]}, not {expected}")
        return int(row[0])

    def _set_in(self, db: sqlite3.Connection, path: str, data: bytes, version: int) -> int:
        current = self._version_of(db, path, version)
        db.execute(
            "UPDATE nodes SET data = ?, version = version + 1 WHERE path = ?", (bytes(data), path)
        )
        return current + 1

    def _delete_in(self, db: sqlite3.Connection, path: str, version: int) -> None:
        self._version_of(db, path, version)
        if db.execute("SELECT 1 FROM nodes WHERE parent = ? LIMIT 1", (path,)).fetchone():
            raise NotEmptyError(f"{path} has children")
        db.execute("DELETE FROM nodes WHERE path = ?", (path,))
        db.execute("UPDATE nodes SET cversion = cversion + 1 WHERE path = ?", (parent_of(path),))

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> int:
        with self._write() as db:
            return self._set_in(db, path, data, version)

    def delete(self, path: str, version: int = ANY_VERSION) -> None:
        with self._write() as db:
            self._delete_in(db, path, version)

    def multi(self, operations: Sequence[Operation]) -> list[str | int | None]:
        for operation in operations:
            if isinstance(operation, CreateOp):
                check_path(operation.path)
        results: list[str | int | None] = []
        with self._write() as db:
            for operation in operations:
                if isinstance(operation, CreateOp):
                    results.append(
                        self._create_in(
                            db, operation.path, operation.data, operation.ephemeral, False, False
                        )
                    )
                elif isinstance(operation, SetOp):
                    results.append(
                        self._set_in(db, operation.path, operation.data, operation.version)
                    )
                elif isinstance(operation, DeleteOp):
                    self._delete_in(db, operation.path, operation.version)
                    results.append(None)
                elif isinstance(operation, CheckOp):
                    self._version_of(db, operation.path, operation.version)
                    results.append(None)
        return results

    # -- watches -------------------------------------------------------------------------------

    def watch(self, path: str, callback: ChangeCallback, *, children: bool = False) -> Watch:
        watch = _SqliteWatch(self, path, children, callback)
        with self._lock:
            watch.state = self._watch_state(self._db, watch)
            if children and watch.state is None:
                raise NoNodeError(f"no node {path} to watch the children of")
            self._watches.append(watch)
            if self._watch_thread is None:
                self._start_watching()
        return watch

    def _cancel(self, watch: _SqliteWatch) -> None:
        with self._lock:
            if watch in self._watches:
                self._watches.remove(watch)

    @staticmethod
    def _watch_state(db: sqlite3.Connection, watch: _SqliteWatch) -> tuple[int, int] | None:
        row = db.execute(
            f"SELECT version, cversion FROM nodes WHERE path = ? AND {_LIVE}",
            (watch.path, _now_ms()),
        ).fetchone()
        if row is None:
            return None
        return (0, int(row[1])) if watch.children else (int(row[0]), 0)

    def _start_watching(self) -> None:
        self._watch_address = f"pybk-metadata-{os.getpid()}-{next(_watch_addresses)}-{id(self)}"
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        receiver.bind("\0" + self._watch_address)
        receiver.settimeout(_RECHECK_S)
        self._watch_socket = receiver
        with self._write(notify=False) as db:
            db.execute(
                "INSERT OR REPLACE INTO watchers(address, session) VALUES (?, ?)",
                (self._watch_address, self._session),
            )
        self._watch_thread = threading.Thread(
            target=self._watch_loop, name="sqlite-metadata-watches", daemon=True
        )
        self._watch_thread.start()

    def _watch_loop(self) -> None:
        receiver = self._watch_socket
        assert receiver is not None
        db = self._connect()  # its own connection: reads never wait for the store's lock
        try:
            while not self._closed.is_set():
                self._wait_for_wake_up(receiver)
                if self._closed.is_set():
                    return
                with self._lock:
                    watches = list(self._watches)
                for watch in watches:
                    try:
                        state = self._watch_state(db, watch)
                    except sqlite3.Error as error:
                        log.warning("metadata watch on %s could not read: %s", watch.path, error)
                        continue
                    if state != watch.state:
                        watch.state = state
                        try:
                            watch.callback()
                        except Exception:
                            log.exception("a metadata watch callback failed")
        finally:
            db.close()
            receiver.close()

    @staticmethod
    def _wait_for_wake_up(receiver: socket.socket) -> None:
        """Returns on a wake-up (draining those queued meanwhile) or after the re-check period."""
        receiver.settimeout(_RECHECK_S)
        try:
            receiver.recv(16)
        except TimeoutError:
            return
        receiver.setblocking(False)
        try:
            for _ in range(10_000):
                receiver.recv(16)
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._heartbeat.join(timeout=5)
        try:
            with self._write() as db:
                db.execute(
                    "UPDATE nodes SET cversion = cversion + 1 WHERE path IN "
                    "(SELECT parent FROM nodes WHERE session = ?)",
                    (self._session,),
                )
                db.execute("DELETE FROM nodes WHERE session = ?", (self._session,))
                db.execute("DELETE FROM watchers WHERE session = ?", (self._session,))
                db.execute("DELETE FROM sessions WHERE id = ?", (self._session,))
        finally:
            if self._watch_thread is not None and self._watch_address is not None:
                self._wake(self._watch_address)  # the thread sees the close and ends
                self._watch_thread.join(timeout=5)
            with self._lock:
                self._db.close()
            self._sender.close()
