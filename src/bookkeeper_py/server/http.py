"""The bookie's HTTP port: ``/heartbeat``, ``/metrics`` (Prometheus text format) and the read-only
``/api/v1/bookie/*`` endpoints of BookKeeper's admin API (reference section 1.16)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

from aiohttp import web

from bookkeeper_py.prometheus import PrometheusMetrics
from bookkeeper_py.server.bookie import Bookie
from bookkeeper_py.storage.entry_log import log_name
from bookkeeper_py.storage.journal import journal_name, list_journal_ids

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def make_app(
    bookie: Bookie,
    metrics: PrometheusMetrics,
    bookie_id: str,
    state_changed: Callable[[], Awaitable[None]] | None = None,
) -> web.Application:
    storage = bookie.config.storage

    async def heartbeat(request: web.Request) -> web.Response:
        return web.Response(text="OK\n")

    async def prometheus(request: web.Request) -> web.Response:
        return web.Response(
            body=metrics.render(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE}
        )

    async def info(request: web.Request) -> web.Response:
        total, free = bookie.disk_info()
        return web.json_response(
            {
                "bookieId": bookie_id,
                "totalSpace": total,
                "freeSpace": free,
                "readOnly": bookie.read_only,
                "journalDirectories": list(storage.journal_directories),
                "ledgerDirectories": [storage.ledger_directory],
            }
        )

    async def state(request: web.Request) -> web.Response:
        failed = bookie.engine.failure is not None
        return web.json_response(
            {
                "running": True,
                "readOnly": bookie.read_only,
                "shuttingDown": False,
                "availableForHighPriorityWrites": not failed,
            }
        )

    async def set_read_only(request: web.Request) -> web.Response:
        """PUT {"readOnly": true|false}: the operator's read-only switch (BookKeeper's state/readonly)."""
        try:
            wanted = (await request.json())["readOnly"]
        except (ValueError, KeyError, TypeError) as error:
            raise web.HTTPBadRequest(
                text=f'expected a JSON body {{"readOnly": true|false}}: {error}'
            ) from error
        if not isinstance(wanted, bool):
            raise web.HTTPBadRequest(text='"readOnly" must be true or false')
        bookie.set_forced_read_only(wanted)
        if state_changed is not None:
            await state_changed()
        return web.json_response({"readOnly": bookie.read_only})

    async def last_log_mark(request: web.Request) -> web.Response:
        marks = {}
        for journal, mark in zip(
            storage.journal_directories, bookie.engine.last_marks, strict=True
        ):
            marks[journal] = (
                "no LastLogMark yet"
                if mark is None
                else f"LogMark: logFileId - {mark[0]} , logFileOffset - {mark[1]}"
            )
        return web.json_response(marks)

    async def list_disk_file(request: web.Request) -> web.Response:
        journals = [
            os.path.join(directory, journal_name(file_id))
            for directory in storage.journal_directories
            for file_id in list_journal_ids(directory)
        ]
        logger = bookie.engine.storage.entry_logger
        logs = [
            os.path.join(storage.ledger_directory, log_name(log_id)) for log_id in logger.log_ids()
        ]
        index = [os.path.join(storage.ledger_directory, name) for name in ("data.mdb", "lock.mdb")]
        return web.json_response(
            {
                "journal files": ", ".join(journals),
                "entrylog files": ", ".join(logs),
                "index files": ", ".join(index),
            }
        )

    app = web.Application()
    app.router.add_get("/heartbeat", heartbeat)
    app.router.add_get("/metrics", prometheus)
    app.router.add_get("/api/v1/bookie/info", info)
    app.router.add_get("/api/v1/bookie/state", state)
    app.router.add_put("/api/v1/bookie/state/readonly", set_read_only)
    app.router.add_get("/api/v1/bookie/last_log_mark", last_log_mark)
    app.router.add_get("/api/v1/bookie/list_disk_file", list_disk_file)
    return app


async def start_http(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    return runner
