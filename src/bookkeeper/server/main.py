"""The bookie process: start storage, listen, register in the metadata store, stop cleanly."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket

from bookkeeper.errors import MetadataStoreError, NoSuchLedgerError
from bookkeeper.metadata.manager import MetadataClient
from bookkeeper.server.bookie import Bookie, BookieConfig
from bookkeeper.server.connection import BookieConnection
from bookkeeper.storage.cookie import Cookie, verify_or_create
from bookkeeper.storage.disk import DiskThresholds
from bookkeeper.storage.engine import StorageConfig
from bookkeeper.storage.gc import GcConfig, LedgerExists, ListLedgers

log = logging.getLogger(__name__)


class BookieServer:
    """A bookie listening on TCP and registered in the metadata store."""

    def __init__(self, config: BookieConfig, metadata_uri: str | None) -> None:
        self.config = config
        self.metadata_uri = metadata_uri
        self.metadata: MetadataClient | None = None
        self.bookie: Bookie | None = None
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[BookieConnection] = set()
        self._registered_read_only: bool | None = None
        self._disk_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        storage = self.config.storage
        if self.metadata_uri:
            self.metadata = await asyncio.to_thread(MetadataClient.connect, self.metadata_uri)
            await asyncio.to_thread(self.metadata.init_cluster)
        # Cookies first: nothing of the directories is read or written until they are known to
        # belong to this bookie in this cluster.
        await asyncio.to_thread(check_cookies, self.config, self.metadata)
        self.bookie = Bookie(self.config, loop)
        await asyncio.to_thread(self.bookie.start)
        await asyncio.to_thread(self.bookie.check_disks)
        bookie = self.bookie
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.config.host, self.config.port))
        self._server = await loop.create_server(
            lambda: BookieConnection(bookie, self._connections), sock=listener, backlog=1024
        )
        if self.metadata is not None:
            await self._register()
            list_ledgers, ledger_exists = await asyncio.to_thread(gc_metadata_view, self.metadata)
            self.bookie.engine.start_gc(list_ledgers, ledger_exists, self.config.gc)
        self._disk_task = asyncio.ensure_future(self._watch_disks())
        log.info(
            "bookie %s serving on %s:%d (journal %s, ledgers %s)",
            self.config.effective_bookie_id,
            self.config.host,
            self.config.port,
            ", ".join(storage.journal_directories),
            storage.ledger_directory,
        )

    async def _register(self) -> None:
        """Registers as writable or read-only, moving the registration when the mode changed."""
        assert self.metadata is not None and self.bookie is not None
        read_only = self.bookie.read_only
        if read_only == self._registered_read_only:
            return
        bookie_id = self.config.effective_bookie_id
        if self._registered_read_only is not None:
            await asyncio.to_thread(
                self.metadata.unregister_bookie, bookie_id, readonly=self._registered_read_only
            )
        await asyncio.to_thread(
            self.metadata.register_bookie,
            bookie_id,
            self.config.host,
            self.config.port,
            readonly=read_only,
        )
        self._registered_read_only = read_only
        log.info("bookie %s registered as %s", bookie_id, "read-only" if read_only else "writable")

    async def _watch_disks(self) -> None:
        assert self.bookie is not None
        while True:
            await asyncio.sleep(self.config.disk_check_interval_s)
            try:
                await asyncio.to_thread(self.bookie.check_disks)
                if self.metadata is not None:
                    await self._register()
            except Exception:
                log.exception("disk check or re-registration failed; retrying at the next check")

    async def stop(self) -> None:
        """Stops accepting, unregisters, lets queued journal writes finish, closes connections."""
        if self._disk_task is not None:
            self._disk_task.cancel()
        if self._server is not None:
            self._server.close()
        if self.metadata is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    self.metadata.unregister_bookie,
                    self.config.effective_bookie_id,
                    readonly=bool(self._registered_read_only),
                )
            await asyncio.to_thread(self.metadata.close)
        if self.bookie is not None:
            await asyncio.to_thread(self.bookie.close)
            await asyncio.sleep(0)  # deliver the last completions queued by the journal
        for connection in list(self._connections):
            connection.close()
        if self._server is not None:
            await self._server.wait_closed()


class MetadataCookieStore:
    """The metadata store's copy of cookies, for ``verify_or_create``."""

    def __init__(self, metadata: MetadataClient) -> None:
        self._metadata = metadata

    def read(self, bookie_id: str) -> Cookie | None:
        found = self._metadata.read_cookie(bookie_id)
        return (
            None
            if found is None
            else Cookie.decode(found[0], f"the metadata store's cookies/{bookie_id}")
        )

    def create(self, cookie: Cookie) -> None:
        self._metadata.create_cookie(cookie.bookie_id, cookie.encode())


def check_cookies(config: BookieConfig, metadata: MetadataClient | None) -> None:
    """Raises ``InvalidCookieError`` unless the directories belong to this bookie and cluster."""
    storage = config.storage
    expected = Cookie(
        bookie_id=config.effective_bookie_id,
        journal_dirs=storage.journal_directories,
        ledger_dirs=(storage.ledger_directory,),
        instance_id=metadata.instance_id() if metadata is not None else None,
    )
    directories = [*storage.journal_directories, storage.ledger_directory]
    for directory in directories:
        os.makedirs(directory, exist_ok=True)
    store = MetadataCookieStore(metadata) if metadata is not None else None
    if verify_or_create(expected, directories, store):
        log.info(
            "new bookie %s: cookies written to %s",
            config.effective_bookie_id,
            ", ".join(directories),
        )


def gc_metadata_view(metadata: MetadataClient) -> tuple[ListLedgers, LedgerExists]:
    """The two metadata questions garbage collection asks, answered so that it errs on keeping.

    The listing fails unless the cluster's instance id is still the one seen at start: an emptied
    or replaced metadata store must not look like "every ledger was deleted"."""
    instance = metadata.instance_id()

    def list_ledgers() -> list[int]:
        current = metadata.instance_id()
        if instance is None or current != instance:
            raise MetadataStoreError(
                f"cluster instance id is {current!r}, the bookie started with {instance!r}; not collecting"
            )
        return list(metadata.list_ledgers())

    def ledger_exists(ledger_id: int) -> bool:
        try:
            metadata.read_ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            return False
        return True

    return list_ledgers, ledger_exists


async def serve(config: BookieConfig, metadata_uri: str | None, ready_file: str | None) -> None:
    server = BookieServer(config, metadata_uri)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await server.start()
    if ready_file:
        await asyncio.to_thread(_write_atomically, ready_file, config.effective_bookie_id + "\n")
    await stop.wait()
    log.info("bookie %s stopping", config.effective_bookie_id)
    await server.stop()


def _write_atomically(path: str, text: str) -> None:
    temporary = path + ".tmp"
    with open(temporary, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def run_event_loop(coroutine) -> None:  # type: ignore[no-untyped-def]
    """Runs ``coroutine`` on uvloop when it is installed, else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coroutine)
    else:
        uvloop.run(coroutine)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metadata-uri", help="metadataServiceUri, e.g. sqlite:///tmp/bk/metadata.db"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on and advertise")
    parser.add_argument("--port", type=int, default=3181, help="bookiePort")
    parser.add_argument(
        "--journal-dir",
        required=True,
        action="append",
        help="journalDirectories (repeat for several)",
    )
    parser.add_argument(
        "--ledger-dir", help="ledgerDirectories (default: a 'ledgers' directory beside the journal)"
    )
    parser.add_argument(
        "--flush-interval-ms", type=int, default=10_000, help="flushInterval: checkpoint period"
    )
    parser.add_argument(
        "--write-cache-mb", type=int, default=256, help="dbStorage_writeCacheMaxSizeMb"
    )
    parser.add_argument("--journal-max-size-mb", type=int, default=2048, help="journalMaxSizeMB")
    parser.add_argument(
        "--journal-max-group-wait-ms",
        type=float,
        default=0.0,
        help="journalMaxGroupWaitMSec (0: write when idle)",
    )
    parser.add_argument("--journal-prealloc-mb", type=int, default=16, help="journalPreAllocSizeMB")
    parser.add_argument("--log-size-limit-mb", type=int, default=1024, help="logSizeLimit in MiB")
    parser.add_argument("--gc-wait-time-ms", type=int, default=600_000, help="gcWaitTime")
    parser.add_argument(
        "--disk-usage-threshold", type=float, default=0.95, help="diskUsageThreshold"
    )
    parser.add_argument(
        "--disk-usage-warn-threshold", type=float, default=0.90, help="diskUsageWarnThreshold"
    )
    parser.add_argument(
        "--disk-usage-lwm-threshold", type=float, default=None, help="diskUsageLwmThreshold"
    )
    parser.add_argument(
        "--disk-check-interval-ms", type=int, default=10_000, help="diskCheckInterval"
    )
    parser.add_argument(
        "--minor-compaction-threshold", type=float, default=0.2, help="minorCompactionThreshold"
    )
    parser.add_argument(
        "--minor-compaction-interval-s", type=float, default=3600, help="minorCompactionInterval"
    )
    parser.add_argument(
        "--major-compaction-threshold", type=float, default=0.8, help="majorCompactionThreshold"
    )
    parser.add_argument(
        "--major-compaction-interval-s", type=float, default=86400, help="majorCompactionInterval"
    )
    parser.add_argument(
        "--compaction-rate-bytes",
        type=int,
        default=100 * 1024 * 1024,
        help="compactionRateByBytes (per second)",
    )
    parser.add_argument("--bookie-id", help="bookieId (default host:port)")
    parser.add_argument("--ready-file", help="file to write the bookie id to once serving")
    parser.add_argument(
        "--no-journal-sync", action="store_true", help="journalSyncData=false (unsafe)"
    )


def main(args: argparse.Namespace) -> None:
    journal_directories = [os.path.abspath(directory) for directory in args.journal_dir]
    journal_directory = journal_directories[0]
    ledger_directory = os.path.abspath(
        args.ledger_dir or os.path.join(os.path.dirname(journal_directory), "ledgers")
    )
    storage = StorageConfig(
        journal_directory=journal_directory,
        extra_journal_directories=tuple(journal_directories[1:]),
        ledger_directory=ledger_directory,
        journal_sync_data=not args.no_journal_sync,
        journal_max_size_bytes=args.journal_max_size_mb * 1024 * 1024,
        journal_max_group_wait_s=args.journal_max_group_wait_ms / 1000.0,
        journal_preallocate_bytes=args.journal_prealloc_mb * 1024 * 1024,
        log_size_limit=args.log_size_limit_mb * 1024 * 1024,
        write_cache_max_bytes=args.write_cache_mb * 1024 * 1024,
        flush_interval_s=args.flush_interval_ms / 1000.0,
    )
    gc = GcConfig(
        gc_wait_time_s=args.gc_wait_time_ms / 1000.0,
        minor_compaction_threshold=args.minor_compaction_threshold,
        minor_compaction_interval_s=args.minor_compaction_interval_s,
        major_compaction_threshold=args.major_compaction_threshold,
        major_compaction_interval_s=args.major_compaction_interval_s,
        compaction_rate_bytes=args.compaction_rate_bytes,
    )
    disk = DiskThresholds(
        usage_threshold=args.disk_usage_threshold,
        warn_threshold=args.disk_usage_warn_threshold,
        lwm_threshold=args.disk_usage_lwm_threshold,
    )
    config = BookieConfig(
        storage=storage,
        gc=gc,
        disk=disk,
        disk_check_interval_s=args.disk_check_interval_ms / 1000.0,
        host=args.host,
        port=args.port,
        bookie_id=args.bookie_id,
    )
    run_event_loop(serve(config, args.metadata_uri, args.ready_file))
