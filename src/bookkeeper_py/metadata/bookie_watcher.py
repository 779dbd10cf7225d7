"""The client's view of the cluster's bookies, kept current by watches (BookKeeper's BookieWatcher)."""

from __future__ import annotations

import logging
import threading

from bookkeeper_py.metadata.driver import NoNodeError, Watch
from bookkeeper_py.metadata.manager import MetadataClient

log = logging.getLogger(__name__)


class BookieWatcher:
    """The writable and read-only bookies, read once and then re-read only after a watch on
    ``available/`` or ``available/readonly/`` reports a change.

    When the metadata session is replaced (a ZooKeeper session expiry, a lost SQLite lease) the
    cached lists and the watches are dropped and made again on the next use, so no change made
    while the session was gone is missed. Blocking and thread-safe; call it off the event loop."""

    def __init__(self, metadata: MetadataClient) -> None:
        self._metadata = metadata
        self._lock = threading.Lock()
        self._watch_lock = threading.Lock()  # one thread (re)makes the watches
        self._generation = 0  # bumped by every change; a read only caches if none came meanwhile
        self._cached: tuple[list[str], list[str]] | None = None
        self._watches: list[Watch] = []
        self._closed = False
        metadata.store.add_session_listener(self._session_replaced)

    def writable(self) -> list[str]:
        return self.snapshot()[0]

    def readonly(self) -> list[str]:
        return self.snapshot()[1]

    def snapshot(self) -> tuple[list[str], list[str]]:
        """(writable, read-only) bookie ids."""
        with self._lock:
            if self._cached is not None:
                return self._cached
        watching = self._ensure_watches()
        with self._lock:
            generation = self._generation
        lists = (self._metadata.writable_bookies(), self._metadata.readonly_bookies())
        with self._lock:
            # Cache only what no change overtook: the watches were in place before the reads.
            if watching and generation == self._generation and not self._closed:
                self._cached = lists
        return lists

    def _ensure_watches(self) -> bool:
        with self._watch_lock:
            if self._watches:
                return True
            if self._closed:
                return False
            try:
                watches = self._metadata.watch_bookies(self._changed)
            except NoNodeError:
                return False  # no cluster yet: read every time until there is one
            self._watches = watches
            return True

    def _changed(self) -> None:
        with self._lock:
            self._generation += 1
            self._cached = None

    def _session_replaced(self) -> None:
        log.info("metadata session replaced: reading and watching the bookie list again")
        with self._watch_lock:
            watches, self._watches = self._watches, []
            for watch in watches:
                watch.cancel()
            self._changed()

    def close(self) -> None:
        with self._watch_lock:
            self._closed = True
            watches, self._watches = self._watches, []
        for watch in watches:
            watch.cancel()
        self._changed()
