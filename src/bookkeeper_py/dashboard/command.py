"""``bookkeeper dashboard``: serves the dashboard until Ctrl-C (or SIGTERM), and
``DashboardThread``, the same on a thread of its own (``localbookie`` starts one)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import threading
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from bookkeeper_py.admin import CommandError
from bookkeeper_py.admin.service import ClusterAdmin
from bookkeeper_py.auth import SharedSecretClientAuthProvider, read_secret
from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.dashboard.app import Dashboard, make_app
from bookkeeper_py.dashboard.collector import Collector
from bookkeeper_py.dashboard.options import Options
from bookkeeper_py.errors import BKError

START_TIMEOUT_S = 60.0


@contextlib.asynccontextmanager
async def serving(options: Options) -> AsyncIterator[str]:
    """Serves the dashboard while in the block; yields its address (``http://host:port/``)."""
    secret = read_secret(options.secret_file) if options.secret_file else None
    # The same secret authenticates the dashboard to bookies that ask for it (their
    # authSharedSecretFile), so that its entry reads work on such a cluster too.
    auth = SharedSecretClientAuthProvider(secret, "dashboard") if secret is not None else None
    client = await BookKeeper.connect(options.metadata_uri, auth=auth)
    session = aiohttp.ClientSession()
    collector_task: asyncio.Task[None] | None = None
    runner: web.AppRunner | None = None
    try:
        collector = Collector(
            client.metadata_port, ClusterAdmin(client.metadata), session, tick_s=options.tick_s
        )
        dashboard = Dashboard(
            client, collector, enable_actions=options.enable_actions, secret=secret
        )
        runner = web.AppRunner(make_app(dashboard), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, options.host, options.port, reuse_address=True)
        try:
            await site.start()
        except OSError as error:
            raise CommandError(
                f"the dashboard cannot listen on {options.host}:{options.port}: "
                f"{error.strerror or error}; pick another --port"
            ) from None
        collector_task = asyncio.ensure_future(collector.run())
        host, port = _bound(runner, options)
        shown = f"[{host}]" if ":" in host else host
        yield f"http://{shown}:{port}/"
    finally:
        if collector_task is not None:
            collector_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collector_task
        if runner is not None:
            await runner.cleanup()
        await session.close()
        await client.close()


def _bound(runner: web.AppRunner, options: Options) -> tuple[str, int]:
    """Where the site listens (the port the system chose when ``options.port`` is 0)."""
    for server in runner.sites:
        sockets = getattr(getattr(server, "_server", None), "sockets", None) or ()
        for sock in sockets:
            name = sock.getsockname()
            return str(name[0]), int(name[1])
    return options.host, options.port


def run(args: argparse.Namespace, metadata_uri: str) -> None:
    """Serves until SIGINT or SIGTERM; prints the address once it listens."""
    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port must be 0 to 65535, not {args.port}")
    options = Options(metadata_uri, args.host, args.port, args.enable_actions, args.secret_file)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        async with serving(options) as address:
            mode = "actions enabled" if options.enable_actions else "read-only"
            print(f"dashboard: {address} ({mode}); Ctrl-C to stop", flush=True)
            await stop.wait()
        print("dashboard stopped", flush=True)

    asyncio.run(serve())


class DashboardThread:
    """The dashboard served from a thread of its own, for programs that block (``localbookie``):
    ``start()`` returns its address once it listens; ``stop()`` ends it."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.address: str | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="dashboard", daemon=True)

    def start(self) -> str:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise CommandError(f"the dashboard did not start within {START_TIMEOUT_S:.0f} s")
        if self._error is not None:
            if isinstance(self._error, CommandError | BKError | OSError):
                raise self._error
            raise CommandError(f"the dashboard did not start: {self._error}")
        assert self.address is not None
        return self.address

    def _main(self) -> None:
        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with serving(self.options) as address:
                self.address = address
                self._ready.set()
                await self._stop.wait()

        try:
            asyncio.run(serve())
        except BaseException as error:
            self._error = error
        finally:
            self._ready.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # its loop ended meanwhile
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout_s)
