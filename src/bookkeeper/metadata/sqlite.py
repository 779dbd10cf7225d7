"""The SQLite driver (``sqlite:///abs/path.db``): the embedded store for one machine.

Several processes share one database file safely: WAL journaling, a busy timeout, and every
write in a ``BEGIN IMMEDIATE`` transaction, so a process killed mid-transaction leaves the last
committed state. Ephemeral nodes belong to a *session row* whose lease a heartbeat thread renews;
a session whose lease ran out (its process died or hung) is purged with its nodes by the next
writer, and readers never see the nodes of an expired session.

Schema (see docs/formats/sqlite-metadata.md)::

    nodes(path TEXT PRIMARY KEY, parent TEXT, data BLOB, version INTEGER,
          session INTEGER NULL, child_counter INTEGER)
    sessions(id INTEGER PRIMARY KEY, expires_ms INTEGER)
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from bookkeeper.errors import MetadataStoreError, MetadataUnavailableError
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
INSERT OR IGNORE INTO nodes(path, parent, data, version) VALUES ('/', '', x'', 0);
COMMIT;
"""

_LIVE = "(session IS NULL OR session IN (SELECT id FROM sessions WHERE expires_ms >= ?))"


def _now_ms() -> int:
    return int(time.time() * 1000)


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
        self._lease_ms = int(lease_s * 1000)
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(
                path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as error:
            raise MetadataUnavailableError(
                f"cannot open SQLite metadata store {path}: {error}"
            ) from error
        with self._write() as db:
            cursor = db.execute(
                "INSERT INTO sessions(expires_ms) VALUES (?)", (_now_ms() + self._lease_ms,)
            )
            session = cursor.lastrowid
        assert session is not None
        self._session: int = session
        self._closed = threading.Event()
        self._heartbeat = threading.Thread(
            target=self._renew_lease, name="sqlite-metadata-lease", daemon=True
        )
        self._heartbeat.start()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; expired sessions and their nodes are purged first."""
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as error:
                raise MetadataStoreError(
                    f"SQLite metadata store busy or broken: {error}"
                ) from error
            try:
                now = _now_ms()
                db.execute(
                    "DELETE FROM nodes WHERE session IN (SELECT id FROM sessions WHERE expires_ms < ?)",
                    (now,),
                )
                db.execute("DELETE FROM sessions WHERE expires_ms < ?", (now,))
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            else:
                db.execute("COMMIT")

    def _renew_lease(self) -> None:
        interval = self._lease_ms / 3000.0
        while not self._closed.wait(interval):
            try:
                with self._write() as db:
                    cursor = db.execute(
                        "UPDATE sessions SET expires_ms = ? WHERE id = ?",
                        (_now_ms() + self._lease_ms, self._session),
                    )
                    if cursor.rowcount == 0:
                        # Our lease ran out (the process stalled); a new one cannot revive the
                        # ephemeral nodes, exactly as after a ZooKeeper session expiry.
                        log.error(
                            "SQLite metadata session %d expired; ephemeral nodes are gone",
                            self._session,
                        )
                        return
            except (MetadataStoreError, sqlite3.Error) as error:
                log.warning("could not renew SQLite metadata lease: %s", error)

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
                db.execute(
                    "UPDATE nodes SET child_counter = ? WHERE path = ?", (counter + 1, parent)
                )
                path = f"{path}{counter:010d}"
            try:
                db.execute(
                    "INSERT INTO nodes(path, parent, data, version, session) VALUES (?, ?, ?, 0, ?)",
                    (path, parent, bytes(data), self._session if ephemeral else None),
                )
            except sqlite3.IntegrityError as error:
                raise NodeExistsError(f"node {path} already exists") from error
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

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> int:
        with self._write() as db:
            row = db.execute("SELECT version FROM nodes WHERE path = ?", (path,)).fetchone()
            if row is None:
                raise NoNodeError(f"no node {path}")
            if version != ANY_VERSION and int(row[0]) != version:
                raise BadVersionError(f"{path} is at version {row[0]}, not {version}")
            db.execute(
                "UPDATE nodes SET data = ?, version = version + 1 WHERE path = ?",
                (bytes(data), path),
            )
            return int(row[0]) + 1

    def delete(self, path: str, version: int = ANY_VERSION) -> None:
        with self._write() as db:
            row = db.execute("SELECT version FROM nodes WHERE path = ?", (path,)).fetchone()
            if row is None:
                raise NoNodeError(f"no node {path}")
            if version != ANY_VERSION and int(row[0]) != version:
                raise BadVersionError(f"{path} is at version {row[0]}, not {version}")
            if db.execute("SELECT 1 FROM nodes WHERE parent = ? LIMIT 1", (path,)).fetchone():
                raise NotEmptyError(f"{path} has children")
            db.execute("DELETE FROM nodes WHERE path = ?", (path,))

    def children(self, path: str) -> list[str]:
        if self._row(path) is None:
            raise NoNodeError(f"no node {path}")
        prefix = "/" if path == "/" else path + "/"
        with self._lock:
            rows = self._db.execute(
                f"SELECT path FROM nodes WHERE parent = ? AND {_LIVE} ORDER BY path",
                (path, _now_ms()),
            ).fetchall()
        return [row[0][len(prefix) :] for row in rows]

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._heartbeat.join(timeout=5)
        try:
            with self._write() as db:
                db.execute("DELETE FROM nodes WHERE session = ?", (self._session,))
                db.execute("DELETE FROM sessions WHERE id = ?", (self._session,))
        finally:
            with self._lock:
                self._db.close()
