"""The bookie process: start storage, listen, register in the metadata store, stop cleanly."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import gc
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from bookkeeper_py import loop as event_loop
from bookkeeper_py.auth import bookie_provider
from bookkeeper_py.errors import BKError, MetadataStoreError, NoSuchLedgerError
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.metadata.port import ThreadedMetadata
from bookkeeper_py.metrics import Metrics
from bookkeeper_py.prometheus import PrometheusMetrics
from bookkeeper_py.server import config, limbo
from bookkeeper_py.server.bookie import Bookie, BookieConfig
from bookkeeper_py.server.connection import BookieConnection, Security
from bookkeeper_py.server.http import (
    add_cluster_routes,
    add_sanity_route,
    make_app,
    make_metrics_app,
    start_http,
)
from bookkeeper_py.server.ledger_http import add_ledger_routes
from bookkeeper_py.server.service import BookieService
from bookkeeper_py.storage.cookie import Cookie, verify_or_create
from bookkeeper_py.storage.disk import DirectoryLocks
from bookkeeper_py.storage.engine import StorageConfig, StorageEngine
from bookkeeper_py.storage.files import write_atomically
from bookkeeper_py.storage.gc import LedgerExists, ListLedgers
from bookkeeper_py.storage.journal import Callback as DurableCallback
from bookkeeper_py.tls import http_server_context

if TYPE_CHECKING:
    from bookkeeper_py.autorecovery.service import AutoRecovery, AutoRecoveryOptions

log = logging.getLogger(__name__)
DECOMMISSION_POLL_S = 1.0


class BookieServer:
    """A bookie listening on TCP and registered in the metadata store."""

    def __init__(
        self,
        config: BookieConfig,
        metadata_uri: str | None,
        autorecovery: AutoRecoveryOptions | None = None,
    ) -> None:
        self.config = config
        self.metadata_uri = metadata_uri
        self.autorecovery_options = autorecovery  # None: no AutoRecovery in this process
        self.autorecovery: AutoRecovery | None = None
        self.metadata: ThreadedMetadata | None = None
        self.bookie: Bookie | None = None
        self._engine: StorageEngine | None = None
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[BookieConnection] = set()
        self._registered_read_only: bool | None = None
        self.metrics = PrometheusMetrics(config.metrics_style, config.metrics_rollover_s)
        self._http: web.AppRunner | None = None
        self._metrics_http: web.AppRunner | None = None  # prometheusStatsHttpPort
        self._disk_task: asyncio.Task[None] | None = None
        self._idle_task: asyncio.Task[None] | None = None
        self._reregistration: asyncio.Future[None] | None = None
        self._limbo_task: asyncio.Task[None] | None = None
        self._decommission_task: asyncio.Task[None] | None = None
        self.stop_requested = asyncio.Event()  # decommissioned, or disks full: the process ends
        self.failure: BKError | None = None  # why the process is to end with an error
        self._locks = DirectoryLocks(
            {"bookie_id": config.effective_bookie_id, "address": f"{config.host}:{config.port}"}
        )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        storage = self.config.storage
        # The port first: a bookie that cannot serve touches nothing on disk.
        listener = listening_socket(self.config.host, self.config.port)
        try:
            # Then the directories, locked before anything in them is read: a second process on
            # a live bookie's directories would replay, trim and delete its journal.
            self._locks.acquire_all(lock_directories(self.config))
            if self.metadata_uri:
                self.metadata = metadata = await ThreadedMetadata.connect(
                    self.metadata_uri, session_timeout_s=self.config.metadata_session_timeout_s
                )
                await metadata.call(metadata.client.init_cluster)
                # No other live process may serve under this id (a copy of these directories
                # elsewhere): asked before the journal is replayed.
                await metadata.call(
                    metadata.client.claim_bookie_id,
                    self.config.effective_bookie_id,
                    self._locks.predecessors,
                )
            # Cookies first: nothing of the directories is read or written until they are known to
            # belong to this bookie in this cluster.
            if self.metadata is not None:
                await self.metadata.call(check_cookies, self.config, self.metadata.client)
            else:
                await asyncio.to_thread(check_cookies, self.config, None)
            self.bookie = Bookie(self.config, loop, self.metrics, self._make_engine)
            await asyncio.to_thread(self.bookie.start)
            await asyncio.to_thread(self.bookie.check_disks)
            full = self._disks_full_error()
            if full is not None:
                raise full
            bookie = self.bookie
            security = Security(
                tls_context=self.config.tls.server_context() if self.config.tls else None,
                auth=bookie_provider(self.config.auth_provider, self.config.settings),
                tls_required=self.config.tls is not None and self.config.tls.client_authentication,
            )
            self._server = await loop.create_server(
                lambda: BookieConnection(bookie, self._connections, security),
                sock=listener,
                backlog=1024,
            )
        except BaseException:
            listener.close()  # not taken over by a server: released here
            if self.bookie is None:
                self._locks.release()
            raise
        if self.metadata is not None:
            await self._register()

            self.metadata.on_session_replaced(self._session_replaced)
            list_ledgers, ledger_exists = await self.metadata.call(
                gc_metadata_view, self.metadata.client
            )
            self.engine.start_gc(list_ledgers, ledger_exists, self.config.gc)
        if self.autorecovery_options is not None and self.metadata_uri:
            self.autorecovery = await start_autorecovery(
                self.metadata_uri,
                self.config.effective_bookie_id,
                self.autorecovery_options,
                self.metrics,
                self.config.metadata_session_timeout_s,
            )
        if self.bookie.limbo.active and self.metadata_uri:
            self._limbo_task = asyncio.ensure_future(self._repair_limbo())
        elif self.bookie.limbo.active:
            log.warning("limbo: no metadata store to repair from (--standalone); staying in it")
        self._disk_task = asyncio.ensure_future(self._watch_disks())
        if self.metadata is not None:
            self._decommission_task = asyncio.ensure_future(self._watch_decommission())
        if self.config.idle_connection_timeout_s > 0:
            self._idle_task = asyncio.ensure_future(self._close_idle_connections())
        if self.config.http_port is not None:
            service = BookieService(
                self.bookie, self.engine, self.config.effective_bookie_id, self._state_changed
            )
            app = make_app(service, self.metrics, self.config.settings)
            if self.metadata is not None and self.metadata_uri:
                from bookkeeper_py.server.autorecovery_http import add_routes

                add_routes(app, self.metadata, self.metadata_uri)
                add_cluster_routes(app, self.metadata, self.metadata_uri)
                add_sanity_route(app, service, self.metadata_uri)
                add_ledger_routes(app, self.metadata, self.metadata_uri)
            self._http = await start_http(
                app,
                self.config.http_host or self.config.host,
                self.config.http_port,
                http_server_context(*self.config.http_tls) if self.config.http_tls else None,
            )
        if self.config.metrics_port is not None:
            self._metrics_http = await start_http(
                make_metrics_app(self.metrics),
                self.config.metrics_host or self.config.host,
                self.config.metrics_port,
            )
        log.info(
            "bookie %s serving on %s:%d (journal %s, ledgers %s)",
            self.config.effective_bookie_id,
            self.config.host,
            self.config.port,
            ", ".join(storage.journal_directories),
            ", ".join(storage.ledger_directories),
        )

    def _make_engine(
        self, storage: StorageConfig, synced: DurableCallback, metrics: Metrics
    ) -> StorageEngine:
        """The real engine, kept for what only it has (garbage collection, its files)."""
        self._engine = StorageEngine(storage, synced, metrics)
        return self._engine

    @property
    def engine(self) -> StorageEngine:
        assert self._engine is not None, "the bookie is not started"
        return self._engine

    async def _repair_limbo(self) -> None:
        """Repairs the ledgers from the other replicas (``server.limbo``), then leaves limbo."""
        assert self.bookie is not None and self.metadata_uri is not None
        from bookkeeper_py.client.client import BookKeeper  # the client only where it is used

        try:
            async with BookKeeper(self.metadata_uri) as client:
                await limbo.repair(self.bookie, client, self.config.effective_bookie_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("limbo repair failed; the bookie stays in limbo until it restarts")

    def _http_endpoint(self) -> tuple[str, int, str] | None:
        """(host, port, protocol) of the HTTP endpoint, published in the registration (a
        wildcard listening address is published as the bookie's own host)."""
        if self.config.http_port is None:
            return None
        host = self.config.http_host or self.config.host
        if host in ("0.0.0.0", "::", ""):
            host = self.config.host
        return host, self.config.http_port, "https" if self.config.http_tls else "http"

    async def _register(self) -> None:
        """Registers as writable or read-only, moving the registration when the mode changed."""
        assert self.metadata is not None and self.bookie is not None
        read_only = self.bookie.read_only
        if read_only == self._registered_read_only:
            return
        bookie_id = self.config.effective_bookie_id
        if self._registered_read_only is not None:
            await self.metadata.unregister_bookie(
                bookie_id,
                readonly=self._registered_read_only,
                incarnation=self._locks.incarnation,
            )
        await self.metadata.register_bookie(
            bookie_id,
            self.config.host,
            self.config.port,
            readonly=read_only,
            incarnation=self._locks.incarnation,
            predecessors=self._locks.predecessors | {self._locks.incarnation},
            http=self._http_endpoint(),
        )
        self._registered_read_only = read_only
        log.info("bookie %s registered as %s", bookie_id, "read-only" if read_only else "writable")

    def _session_replaced(self) -> None:
        """The metadata session expired and a new one began: the registration (ephemeral) is
        gone with the old session; register again."""
        log.warning(
            "metadata session replaced; registering bookie %s again",
            self.config.effective_bookie_id,
        )
        self._registered_read_only = None
        self._reregistration = asyncio.ensure_future(self._register_until_done())

    async def _register_until_done(self) -> None:
        for attempt in range(1, 61):
            try:
                await self._register()
                return
            except Exception as error:
                log.warning("re-registration attempt %d failed: %s", attempt, error)
                await asyncio.sleep(1.0)
        log.error(
            "bookie %s could not register again; it is not in available/",
            self.config.effective_bookie_id,
        )

    async def _state_changed(self) -> None:
        if self.metadata is not None:
            await self._register()

    async def _watch_disks(self) -> None:
        assert self.bookie is not None
        while True:
            await asyncio.sleep(self.config.disk_check_interval_s)
            try:
                await asyncio.to_thread(self.bookie.check_disks)
                self.failure = self._disks_full_error()
                if self.failure is not None:
                    log.error("%s", self.failure)
                    self.stop_requested.set()
                    return
                if self.metadata is not None:
                    await self._register()
            except Exception:
                log.exception("disk check or re-registration failed; retrying at the next check")

    def _disks_full_error(self) -> DisksFullError | None:
        """Why the bookie stops, when its disks are full while readOnlyModeEnabled=false: it
        then stops instead of turning read-only, as in BookKeeper."""
        assert self.bookie is not None
        if self.config.read_only_mode_enabled or not self.bookie.disk_full:
            return None
        return DisksFullError(
            f"bookie {self.config.effective_bookie_id}: its disks are full (past "
            f"diskUsageThreshold={self.config.disk.usage_threshold}) and readOnlyModeEnabled=false, "
            "so it stops rather than serve reads only: free space, or set readOnlyModeEnabled=true"
        )

    async def _watch_decommission(self) -> None:
        """Follows ``bookkeeper shell decommissionbookie`` of this bookie: while it drains, the
        bookie is read-only (writers move their ledgers away, placement skips it, its data can
        still be read); once done, the process stops."""
        from bookkeeper_py.metadata.underreplication import UnderReplication

        assert self.metadata is not None and self.bookie is not None
        markers = UnderReplication(self.metadata)
        bookie_id = self.config.effective_bookie_id
        while True:
            try:
                state = await markers.decommission_state(bookie_id)
                if state == "draining" and not self.bookie.read_only:
                    log.warning("bookie %s is being decommissioned: read-only", bookie_id)
                    self.bookie.set_forced_read_only(True)
                    await self._state_changed()
                elif state == "done":
                    log.warning("bookie %s is decommissioned: stopping", bookie_id)
                    self.stop_requested.set()
                    return
            except Exception:
                log.exception("reading this bookie's decommission state failed; retrying")
            await asyncio.sleep(DECOMMISSION_POLL_S)

    async def _close_idle_connections(self) -> None:
        """Closes connections with nothing in flight that sent nothing for the idle timeout."""
        timeout = self.config.idle_connection_timeout_s
        while True:
            await asyncio.sleep(min(timeout / 4, 10.0))
            deadline = time.monotonic() - timeout
            for connection in list(self._connections):
                if connection.pending <= 0 and connection.last_activity < deadline:
                    log.info("closing a connection idle for %.0f s", timeout)
                    connection.close()

    async def stop(self, drain_timeout_s: float = 10.0) -> None:
        """Graceful shutdown: stop accepting connections and reading requests, unregister,
        answer parked long polls, let requests in flight finish (adds wait for their journal
        sync) for up to ``drain_timeout_s``, checkpoint, then close the connections (what is
        still unanswered fails on the client's side as a closed connection)."""
        for task in (
            self._disk_task,
            self._idle_task,
            self._reregistration,
            self._limbo_task,
            self._decommission_task,
        ):
            if task is not None:
                task.cancel()
        if self.autorecovery is not None:
            await stop_autorecovery(self.autorecovery)
        if self._http is not None:
            await self._http.cleanup()
        if self._metrics_http is not None:
            await self._metrics_http.cleanup()
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.stop_reading()
        if self.bookie is not None:
            self.bookie.begin_shutdown()
        if self.metadata is not None and self._registered_read_only is not None:
            with contextlib.suppress(Exception):
                await self.metadata.unregister_bookie(
                    self.config.effective_bookie_id,
                    readonly=self._registered_read_only,
                    incarnation=self._locks.incarnation,
                )
        await self._drain(drain_timeout_s)
        if self.metadata is not None:
            await self.metadata.close()
        if self.bookie is not None:
            await asyncio.to_thread(self.bookie.close)
            await asyncio.sleep(0)  # deliver the last completions queued by the journal
        for connection in list(self._connections):
            connection.close()
        if self._server is not None:
            await self._server.wait_closed()
        self._locks.release()

    async def _drain(self, timeout_s: float) -> None:
        """Waits until no connection has a request in flight, or ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            in_flight = sum(max(0, connection.pending) for connection in self._connections)
            if in_flight == 0:
                return
            await asyncio.sleep(0.01)
        log.warning(
            "requests still in flight after %.0f s of shutdown; their connections will close",
            timeout_s,
        )


class DisksFullError(BKError):
    """The disks are full and readOnlyModeEnabled=false: the bookie stops."""


class ListenError(BKError):
    """The bookie's address cannot be listened on (taken, or not an address of this host)."""


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not listening yet); ``ListenError`` saying why not."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        if error.errno == errno.EADDRINUSE:
            advice = "another process holds that port: stop it or pick another (--port, bookiePort)"
        else:
            advice = "name an address of this host (--host, listeningInterface/advertisedAddress)"
        raise ListenError(
            f"cannot listen on {host}:{port}: {error.strerror or error}; {advice}"
        ) from None
    return listener


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
        ledger_dirs=storage.ledger_directories,
        instance_id=metadata.instance_id() if metadata is not None else None,
    )
    directories = [*storage.journal_directories, *storage.ledger_directories]
    store = MetadataCookieStore(metadata) if metadata is not None else None
    if verify_or_create(expected, directories, store):
        log.info(
            "new bookie %s: cookies written to %s",
            config.effective_bookie_id,
            ", ".join(directories),
        )


def lock_directories(config: BookieConfig) -> list[tuple[str, str]]:
    """(directory, role) of every directory the bookie writes, in locking order."""
    storage = config.storage
    return [
        *(
            (directory, "journal directory (journalDirectories)")
            for directory in storage.journal_directories
        ),
        *(
            (directory, "ledger directory (ledgerDirectories)")
            for directory in storage.ledger_directories
        ),
    ]


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


async def start_autorecovery(
    metadata_uri: str,
    name: str,
    options: AutoRecoveryOptions,
    metrics: Metrics,
    session_timeout_s: float | None = None,
) -> AutoRecovery:
    """AutoRecovery on a client (and metadata session, of ``session_timeout_s``: zkTimeout) of its
    own: its locks and vote end with it."""
    from bookkeeper_py.autorecovery.service import AutoRecovery  # client code only when used
    from bookkeeper_py.client.client import BookKeeper
    from bookkeeper_py.client.config import ClientConfig

    config = ClientConfig(metadata_session_timeout_s=session_timeout_s)
    client = await BookKeeper.connect(metadata_uri, config)
    try:
        service = AutoRecovery(client, name, options, metrics)
        await service.start()
    except BaseException:
        await client.close()
        raise
    log.info("autorecovery %s: running", name)
    return service


async def stop_autorecovery(service: AutoRecovery) -> None:
    try:
        await service.stop()
    finally:
        await service.client.close()


def _nothing() -> None:
    pass


PARENT_CHECK_S = 1.0  # how often a bookie without pidfds looks whether --stop-with-pid lives


def watch_process(pid: int, gone: Callable[[], None]) -> Callable[[], None]:
    """Calls ``gone()`` on the running loop once process ``pid`` exited (at once if it is not
    running now); returns what stops watching. A pidfd where the system has them (Linux 5.3+:
    readable when the process exits, nothing to poll), else a look every ``PARENT_CHECK_S``."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        loop.call_soon(gone)
        return _nothing
    except (AttributeError, OSError):  # no pidfds here: look now and then
        handle: asyncio.TimerHandle | None = None

        def look() -> None:
            nonlocal handle
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                gone()
                return
            except PermissionError:
                pass  # alive, someone else's
            handle = loop.call_later(PARENT_CHECK_S, look)

        look()

        def stop_looking() -> None:
            if handle is not None:
                handle.cancel()

        return stop_looking

    watching = True

    def stop_watching() -> None:
        nonlocal watching
        if watching:  # once: the fd's number may be another file's after it is closed
            watching = False
            loop.remove_reader(fd)
            os.close(fd)

    def exited() -> None:
        stop_watching()
        gone()

    loop.add_reader(fd, exited)
    return stop_watching


async def serve(
    config: BookieConfig,
    metadata_uri: str | None,
    ready_file: str | None,
    autorecovery: AutoRecoveryOptions | None = None,
    stop_with_pid: int | None = None,
) -> None:
    server = BookieServer(config, metadata_uri, autorecovery)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    unwatch: Callable[[], None] = _nothing
    if stop_with_pid is not None:

        def parent_gone() -> None:
            log.warning("process %d, which this bookie stops with, exited: stopping", stop_with_pid)
            stop.set()

        unwatch = watch_process(stop_with_pid, parent_gone)
    await server.start()
    # What start-up built (modules, protobuf descriptors, configuration: ~50,000 objects) lives
    # as long as the process: moved out of the collector's sight, a full collection takes ~0.3
    # ms instead of 15-40 ms, a pause every add in flight would wait for.
    gc.collect()
    gc.freeze()
    if ready_file:
        await asyncio.to_thread(
            write_atomically,
            ready_file,
            (config.effective_bookie_id + "\n").encode(),
            durable=False,
        )
    await asyncio.wait(
        [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(server.stop_requested.wait())],
        return_when=asyncio.FIRST_COMPLETED,
    )
    log.info("bookie %s stopping", config.effective_bookie_id)
    unwatch()
    await server.stop()
    if server.failure is not None:
        raise server.failure


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser)


def main(args: argparse.Namespace) -> None:
    values = config.resolve(args)
    bookie_config = config.build(values)
    metadata_uri = values["metadataServiceUri"]
    if not metadata_uri and not args.standalone:
        raise config.ConfigError(
            "no metadata service: clients find bookies in the metadata store, so this bookie "
            "would serve unseen; pass --metadata-uri URI (metadataServiceUri in --conf), or "
            "--standalone to serve without registering"
        )
    if metadata_uri and args.standalone:
        raise config.ConfigError(
            "--standalone and a metadata service URI exclude each other; drop one of them"
        )
    autorecovery = (
        config.autorecovery_options(values) if values["autoRecoveryDaemonEnabled"] else None
    )
    if autorecovery is not None and not metadata_uri:
        raise config.ConfigError(
            "autoRecoveryDaemonEnabled needs the metadata store it audits; pass --metadata-uri "
            "or set autoRecoveryDaemonEnabled=false"
        )
    if args.stop_with_pid is not None and args.stop_with_pid <= 0:
        raise config.ConfigError(
            f"--stop-with-pid must be a process id (above 0), got {args.stop_with_pid}"
        )
    apply_scheduling_policy(config.scheduling_policy(values))
    event_loop.run(
        serve(bookie_config, metadata_uri, args.ready_file, autorecovery, args.stop_with_pid)
    )


def apply_scheduling_policy(policy: str) -> None:
    """``batch``: this thread, and so every thread the bookie starts after it (they inherit
    it), runs under Linux's SCHED_BATCH. A thread woken under that policy does not preempt the
    one running: where bookies share CPUs with their clients (a local cluster), a client's send
    no longer hands its CPU to the bookie it wakes in the middle of its pass, and the bookie
    takes the request when the client waits. (Measured in ``docs/performance.md``, step 87.)
    Alone on its machine a bookie sees no difference. Unprivileged: no capability needed."""
    if policy == "normal":
        return
    setter = getattr(os, "sched_setscheduler", None)
    batch = getattr(os, "SCHED_BATCH", None)
    if setter is None or batch is None:
        raise config.ConfigError(
            "cpuSchedulingPolicy=batch needs Linux's SCHED_BATCH, which this system lacks; "
            "set it to normal"
        )
    try:
        setter(0, batch, os.sched_param(0))
    except OSError as error:
        raise config.ConfigError(
            f"cpuSchedulingPolicy=batch: cannot switch to SCHED_BATCH ({error}); set it to normal"
        ) from error
