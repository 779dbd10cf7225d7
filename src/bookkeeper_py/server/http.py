"""The bookie's HTTP port: ``/heartbeat``, ``/metrics`` (Prometheus text format) and the read-only
``/api/v1/bookie/*`` endpoints of BookKeeper's admin API (reference section 1.16); and the
Prometheus port of its own (``prometheusStatsHttpPort``), ``/metrics`` alone."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from bookkeeper_py import aio
from bookkeeper_py.admin.bookie_info import disk_space, readable
from bookkeeper_py.admin.sanity import sanity_test
from bookkeeper_py.admin.service import cluster_info
from bookkeeper_py.errors import BKError
from bookkeeper_py.metadata.port import MetadataPort
from bookkeeper_py.prometheus import PrometheusMetrics
from bookkeeper_py.server.service import BookieService, GcNotRunning, StateChangeRefused

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


log = logging.getLogger(__name__)


def _metrics_handler(
    metrics: PrometheusMetrics,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def prometheus(request: web.Request) -> web.Response:
        names = request.query.getall("name[]", ())  # only the families of these names
        return web.Response(
            body=metrics.render(names), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE}
        )

    return prometheus


def make_metrics_app(metrics: PrometheusMetrics) -> web.Application:
    """``/metrics`` alone, for the Prometheus port (``prometheusStatsHttpPort``)."""

    app = web.Application()
    app.router.add_get("/metrics", _metrics_handler(metrics))
    return app


def _json_object(text: str, shape: str) -> dict[str, Any]:
    """``text`` as a JSON object; a 400 that says ``shape`` was expected otherwise."""
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise web.HTTPBadRequest(text=f"expected {shape}")
    return found


def make_app(
    service: BookieService, metrics: PrometheusMetrics, settings: Mapping[str, Any]
) -> web.Application:
    """The bookie's own endpoints; ``settings``: its bk_server.conf keys as resolved."""

    async def heartbeat(request: web.Request) -> web.Response:
        return web.Response(text="OK\n")

    async def is_ready(request: web.Request) -> web.Response:
        found = service.state()
        if found.running and not found.shutting_down:
            return web.Response(text="OK")
        return web.Response(status=503, text="Bookie is not fully started yet")

    async def server_config(request: web.Request) -> web.Response:
        """BookKeeper's config/server_config: every key set, after defaults, the file and the
        command line. Read-only here (BookKeeper's PUT sets keys in memory, most of which then
        have no effect): a PUT is refused."""
        return web.json_response(dict(sorted(settings.items())))

    async def info(request: web.Request) -> web.Response:
        found = service.info()
        return web.json_response(
            {
                "bookieId": found.bookie_id,
                "totalSpace": found.total_bytes,
                "freeSpace": found.free_bytes,
                "readOnly": found.read_only,
                "journalDirectories": list(found.journal_directories),
                "ledgerDirectories": list(found.ledger_directories),
                # not in BookKeeper's answer: each directory's file system, for the dashboard
                "directoryUsage": [
                    {"kind": kind, "path": path, "totalSpace": total, "freeSpace": free}
                    for kind, path, total, free in found.directory_usage
                ],
            }
        )

    async def state(request: web.Request) -> web.Response:
        found = service.state()
        return web.json_response(
            {
                "running": found.running,
                "readOnly": found.read_only,
                "shuttingDown": found.shutting_down,
                "availableForHighPriorityWrites": found.writable_for_high_priority,
            }
        )

    async def read_only_state(request: web.Request) -> web.Response:
        """PUT {"readOnly": true|false}: the operator's read-only switch; GET: the mode in force
        (BookKeeper's state/readonly)."""
        if request.method == "GET":
            return web.json_response({"readOnly": service.state().read_only})
        try:
            wanted = (await request.json())["readOnly"]
        except (ValueError, KeyError, TypeError) as error:
            raise web.HTTPBadRequest(
                text=f'expected a JSON body {{"readOnly": true|false}}: {error}'
            ) from error
        if not isinstance(wanted, bool):
            raise web.HTTPBadRequest(text='"readOnly" must be true or false')
        try:
            return web.json_response({"readOnly": await service.set_read_only(wanted)})
        except StateChangeRefused as error:
            raise web.HTTPBadRequest(text=str(error)) from error

    async def last_log_mark(request: web.Request) -> web.Response:
        return web.json_response(
            {
                journal: "no LastLogMark yet"
                if mark is None
                else f"LogMark: logFileId - {mark[0]} , logFileOffset - {mark[1]}"
                for journal, mark in service.last_log_marks().items()
            }
        )

    async def list_disk_file(request: web.Request) -> web.Response:
        """The bookie's files; ``?file_type=journal|entrylog|index``: those only."""
        kind = request.query.get("file_type")
        if kind not in (None, "journal", "entrylog", "index"):
            raise web.HTTPBadRequest(
                text=f"file_type must be journal, entrylog or index, not {kind!r}"
            )
        files = service.disk_files()
        listed = {
            "journal": ("journal files", files.journals),
            "entrylog": ("entrylog files", files.entry_logs),
            "index": ("index files", files.index),
        }
        return web.json_response(
            {key: ", ".join(names) for name, (key, names) in listed.items() if kind in (None, name)}
        )

    def gc_service() -> BookieService:
        """The service, once its garbage collection runs (503 with the reason before)."""
        try:
            service.gc_in_force()
        except GcNotRunning as error:
            raise web.HTTPServiceUnavailable(text=str(error)) from None
        return service

    async def gc(request: web.Request) -> web.Response:
        """BookKeeper's bookie/gc: GET {"is_in_force_gc": "true"|"false"}; PUT (no body, or
        {"forceMajor": bool, "forceMinor": bool}) runs a round now, in the background."""
        running = gc_service()
        if request.method == "GET":
            return web.json_response({"is_in_force_gc": str(running.gc_in_force()).lower()})
        text = (await request.text()).strip()
        major = minor = None
        if text:
            asked = _json_object(
                text,
                'no body or a JSON object {"forceMajor": true|false, "forceMinor": true|false}',
            )
            # BookKeeper's reading: true or "true" (any case) is true, anything else false
            if "forceMajor" in asked:
                major = str(asked["forceMajor"]).lower() == "true"
            if "forceMinor" in asked:
                minor = str(asked["forceMinor"]).lower() == "true"
        running.force_gc(major, minor)
        return web.json_response(f"Triggered GC on BookieServer: {running.info().bookie_id}")

    async def gc_details(request: web.Request) -> web.Response:
        return web.json_response([status.as_json() for status in gc_service().gc_status()])

    async def compaction(request: web.Request) -> web.Response:
        """BookKeeper's bookie/gc/suspend_compaction (GET: what is suspended) and
        resume_compaction: PUT {"suspendMajor"|"resumeMajor": bool, ...Minor: bool}; true acts,
        false leaves that kind as it is."""
        running = gc_service()
        suspend = request.path.endswith("/suspend_compaction")
        if request.method == "GET":
            major, minor = running.gc_suspended()
            return web.json_response(
                {"isMinorGcSuspended": str(minor).lower(), "isMajorGcSuspended": str(major).lower()}
            )
        verb = "suspend" if suspend else "resume"
        text = (await request.text()).strip()
        if not text:
            raise web.HTTPBadRequest(text="Empty request body")
        asked = _json_object(
            text, f'a JSON object {{"{verb}Major": true|false, "{verb}Minor": true|false}}'
        )
        flags = {kind: asked.get(f"{verb}{kind}") for kind in ("Major", "Minor")}
        if all(value is None for value in flags.values()):
            raise web.HTTPBadRequest(text=f"No {verb}Major or {verb}Minor params found")
        if any(value is not None and not isinstance(value, bool) for value in flags.values()):
            raise web.HTTPBadRequest(text=f"{verb}Major and {verb}Minor must be true or false")
        major, minor = flags["Major"] is True, flags["Minor"] is True
        if suspend:
            running.suspend_gc(major=major, minor=minor)
        else:
            running.resume_gc(major=major, minor=minor)
        name = running.describe()
        said = f"{verb.capitalize()} majorGC on BookieServer: {name}" if major else ""
        if minor:
            said += f", {verb.capitalize()} minorGC on BookieServer: {name}"
        return web.json_response(said)

    app = web.Application()
    app.router.add_get("/heartbeat", heartbeat)
    app.router.add_get("/metrics", _metrics_handler(metrics))
    app.router.add_get("/api/v1/bookie/info", info)
    app.router.add_get("/api/v1/bookie/is_ready", is_ready)
    app.router.add_get("/api/v1/config/server_config", server_config)
    app.router.add_get("/api/v1/bookie/state", state)
    app.router.add_put("/api/v1/bookie/state/readonly", read_only_state)
    app.router.add_get("/api/v1/bookie/state/readonly", read_only_state)
    app.router.add_get("/api/v1/bookie/last_log_mark", last_log_mark)
    app.router.add_get("/api/v1/bookie/list_disk_file", list_disk_file)
    app.router.add_get("/api/v1/bookie/gc", gc)
    app.router.add_put("/api/v1/bookie/gc", gc)
    app.router.add_get("/api/v1/bookie/gc_details", gc_details)
    app.router.add_get("/api/v1/bookie/gc/suspend_compaction", compaction)
    app.router.add_put("/api/v1/bookie/gc/suspend_compaction", compaction)
    app.router.add_put("/api/v1/bookie/gc/resume_compaction", compaction)
    return app


def add_sanity_route(app: web.Application, service: BookieService, metadata_uri: str) -> None:
    """BookKeeper's bookie/sanity: {"passed": bool, "readOnly": bool}, the sanity test of this
    bookie (``admin.sanity``) on a client connected for it; one test at a time. A read-only
    bookie is not tested (it takes no adds): passed false."""
    one_at_a_time = asyncio.Lock()

    async def sanity(request: web.Request) -> web.Response:
        info = service.info()
        if info.read_only:
            return web.json_response({"passed": False, "readOnly": True})
        async with (
            one_at_a_time,
            await aio.BookKeeper.connect(metadata_uri, request_timeout_s=1.0) as client,
        ):
            result = await sanity_test(client, info.bookie_id)
        if not result.passed:
            log.warning("sanity test of bookie %s failed: %s", info.bookie_id, result.message)
        return web.json_response({"passed": result.passed, "readOnly": False})

    app.router.add_get("/api/v1/bookie/sanity", sanity)


def add_cluster_routes(app: web.Application, port: MetadataPort, metadata_uri: str) -> None:
    """The endpoints that read the cluster through the bookie's metadata session (and, to ask
    the bookies, a client connected for the request to ``metadata_uri``, as BookKeeper's)."""

    async def list_bookie_info(request: web.Request) -> web.Response:
        """BookKeeper's bookie/list_bookie_info: {bookie: ": {Free: F(..), Total: T(..)},", ...,
        "ClusterInfo: ": "{Free: F, Total: T}"} (its odd strings kept); 404 when no bookie
        answers."""
        async with await aio.BookKeeper.connect(metadata_uri) as client:
            found = await disk_space(client)
        if not found:
            raise web.HTTPNotFound(text="Not found any Bookie info.")
        answer = {
            bookie_id: f": {{Free: {space.free}{readable(space.free)}, "
            f"Total: {space.total}{readable(space.total)}}},"
            for bookie_id, space in found.items()
        }
        free = sum(space.free for space in found.values())
        total = sum(space.total for space in found.values())
        answer["ClusterInfo: "] = (
            f"{{Free: {free}{readable(free)}, Total: {total}{readable(total)}}}"
        )
        return web.json_response(answer)

    async def list_bookies(request: web.Request) -> web.Response:
        """BookKeeper's bookie/list_bookies: ?type=rw (the default) or ro, and with
        ?print_hostnames=true each bookie's host; {bookie id: host or null}."""
        kind = request.query.get("type", "rw")
        if kind not in ("rw", "ro"):
            raise web.HTTPBadRequest(text=f"type must be rw or ro, not {kind!r}")
        bookies = await (port.readonly_bookies() if kind == "ro" else port.writable_bookies())
        hosts = request.query.get("print_hostnames") == "true"
        found: dict[str, str | None] = {}
        for bookie_id in bookies:
            host = None
            if hosts:
                try:
                    host = (await port.bookie_endpoint(bookie_id)).host
                except BKError:  # gone since it was listed
                    pass
            found[bookie_id] = host
        return web.json_response(found)

    async def cluster_info_json(request: web.Request) -> web.Response:
        """BookKeeper's bookie/cluster_info."""
        return web.json_response((await cluster_info(port)).as_json())

    app.router.add_get("/api/v1/bookie/list_bookies", list_bookies)
    app.router.add_get("/api/v1/bookie/cluster_info", cluster_info_json)
    app.router.add_get("/api/v1/bookie/list_bookie_info", list_bookie_info)


async def start_http(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True, ssl_context=ssl_context).start()
    return runner
