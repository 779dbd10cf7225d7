"""The dashboard's aiohttp application: the page, its static files, and the JSON API it polls.

Reading (GET, JSON):

* ``/api/overview``: the bookies (state, address, disks, latest rates), the cluster's counts and
  its chart points (adds/s, reads/s, p99 add latency) of the last minutes;
* ``/api/ledgers?after=ID&limit=N&q=DIGITS``: a page of ledgers (state, size, ensembles), ids
  after ``after``, those whose id contains ``q``; ``/api/ledgers/ID``: one ledger and its
  fragments; ``/api/ledgers/ID/entries?first=A&last=B``: entries read through the client;
* ``/api/recovery``: under-replicated ledgers and AutoRecovery; ``/api/logs``: the logs.

Actions (POST, a JSON body with ``"confirm": true``): ``/api/bookies/ID/readonly``
(``{"readOnly": bool}``), ``/api/bookies/ID/gc``, ``/api/ledgers/ID/delete``. They are refused
(403, one line) unless the dashboard was started with actions enabled.

With a secret, every request must carry it: ``Authorization: Bearer SECRET`` or HTTP Basic with
any user name and the secret as password (compared in constant time); else 401.

Errors are one line of text: 400 for malformed input, 404 for what does not exist. No answer
holds a ledger's password: ledgers are described field by field, never by their metadata whole.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import importlib.resources
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from bookkeeper_py.admin import CommandError
from bookkeeper_py.admin.ledger_reader import hex_dump, printable, read_entries
from bookkeeper_py.admin.service import ClusterAdmin
from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.dashboard import metrics
from bookkeeper_py.dashboard.collector import DOWN, READ_ONLY, READ_WRITE, Collector
from bookkeeper_py.errors import BKError
from bookkeeper_py.log.format import LogNotFoundError

CHART_POINTS = 300  # the chart's last 5 minutes at one point a second
RATE_WINDOW_MS = 60_000  # AutoRecovery's pace is measured over the last minute
LEDGER_PAGE = 25
MAX_LEDGER_PAGE = 200
MAX_ENTRIES = 100  # entries one read of the ledger page returns
SHOWN_BYTES = 1024  # of each entry's payload
LOG_PAGE = 25
MAX_LOG_PAGE = 100
MAX_NAMESPACE_PAGES = 1000  # pages of namespaces walked for one page of logs, at most
MAX_LEDGER_IDS = 10_000_000  # ids scanned for one page, at most
REALM = 'Basic realm="bookkeeper dashboard", charset="UTF-8"'
STATIC_FILES = {
    "/": ("index.html", "text/html"),
    "/static/dashboard.js": ("dashboard.js", "text/javascript"),
    "/static/dashboard.css": ("dashboard.css", "text/css"),
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

COLLECTOR = web.AppKey("collector", Collector)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _fail(kind: type[web.HTTPException], reason: str) -> web.HTTPException:
    """An error answer of one line of text."""
    return kind(text=reason.splitlines()[0] if reason else kind.__name__)


def _ledger_id(text: str) -> int:
    if not text.isdigit() or len(text) > 20:
        raise _fail(web.HTTPBadRequest, f"ledger id {text[:40]!r} is not a number")
    return int(text)


def _int_query(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise _fail(
            web.HTTPBadRequest, f"{name} must be a whole number, not {text[:40]!r}"
        ) from None
    if not low <= value <= high:
        raise _fail(web.HTTPBadRequest, f"{name} must be between {low} and {high}, not {value}")
    return value


def ledger_summary(metadata: LedgerMetadata) -> dict[str, Any]:
    """A ledger as the page shows it: everything but its password and custom values."""
    return {
        "id": metadata.ledger_id,
        "state": "closed" if metadata.is_closed else metadata.state.name.lower().replace("_", "-"),
        "length": metadata.length,
        "lastEntryId": metadata.last_entry_id,
        "ensembleSize": metadata.ensemble_size,
        "writeQuorumSize": metadata.write_quorum_size,
        "ackQuorumSize": metadata.ack_quorum_size,
        "digestType": metadata.digest_type.name if metadata.stores_password else None,
        "ctime": metadata.ctime_ms,
        "ensembles": [
            {"firstEntryId": first, "bookies": list(bookies)}
            for first, bookies in metadata.ensembles
        ],
    }


def ledger_fragments(metadata: LedgerMetadata) -> dict[str, Any]:
    """The ledger with its fragments as a table: a row per fragment (its entry range), a column
    per bookie that holds any, each cell the bookie's index in that ensemble (or None)."""
    found = ledger_summary(metadata)
    bookies = sorted({b for _, ensemble in metadata.ensembles for b in ensemble})
    rows = []
    for index, (first, ensemble) in enumerate(metadata.ensembles):
        following = (
            metadata.ensembles[index + 1][0] - 1 if index + 1 < len(metadata.ensembles) else None
        )
        last = (
            following
            if following is not None
            else (metadata.last_entry_id if metadata.is_closed else None)
        )
        rows.append(
            {
                "firstEntryId": first,
                "lastEntryId": last,
                "cells": [ensemble.index(b) if b in ensemble else None for b in bookies],
            }
        )
    found["fragmentBookies"] = bookies
    found["fragments"] = rows
    return found


class Dashboard:
    """The state behind the app's handlers."""

    def __init__(
        self,
        client: BookKeeper,
        collector: Collector,
        *,
        enable_actions: bool = False,
        secret: bytes | None = None,
    ) -> None:
        self.client = client
        self.admin: ClusterAdmin = collector.admin
        self.collector = collector
        self.enable_actions = enable_actions
        self.secret = secret
        self.under_replicated_history: deque[tuple[int, int]] = deque(maxlen=600)
        self._pages = {
            path: importlib.resources.files("bookkeeper_py.dashboard")
            .joinpath("static", name)
            .read_bytes()
            for path, (name, _) in STATIC_FILES.items()
        }

    # -- middleware ----------------------------------------------------------------------------

    def authorized(self, request: web.Request) -> bool:
        if self.secret is None:
            return True
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        given = b""
        if scheme.lower() == "bearer":
            given = value.strip().encode()
        elif scheme.lower() == "basic":
            try:
                given = base64.b64decode(value.strip(), validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                given = b""
        return hmac.compare_digest(given, self.secret)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.authorized(request):
            answer: web.StreamResponse = web.Response(
                status=401,
                text="the dashboard needs its secret (HTTP Basic password or a bearer token)",
                headers={"WWW-Authenticate": REALM},
            )
        else:
            try:
                answer = await handler(request)
            except web.HTTPException as error:  # answered as a plain response, one line
                answer = web.Response(
                    status=error.status,
                    text=(error.text or error.reason).strip() + "\n",
                    headers={
                        k: v
                        for k, v in error.headers.items()
                        if k not in ("Content-Type", "Content-Length")
                    },
                )
        for key, value in SECURITY_HEADERS.items():
            answer.headers.setdefault(key, value)
        return answer

    # -- the page ------------------------------------------------------------------------------

    async def static(self, request: web.Request) -> web.Response:
        path = request.path
        return web.Response(
            body=self._pages[path], content_type=STATIC_FILES[path][1], charset="utf-8"
        )

    # -- reading -------------------------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        collector = self.collector
        bookies = [view.as_json() for view in sorted(collector.bookies.values(), key=_by_id)]
        states = [b["state"] for b in bookies]
        chart = collector.cluster.since()[-CHART_POINTS:]
        return web.json_response(
            {
                "updatedMs": collector.updated_ms,
                "error": collector.error,
                "racksError": collector.racks_error,
                "actionsEnabled": self.enable_actions,
                "metadataRoot": self.admin.root,
                "cluster": {
                    "bookies": len(states),
                    "readWrite": states.count(READ_WRITE),
                    "readOnly": states.count(READ_ONLY),
                    "down": states.count(DOWN),
                },
                "bookies": bookies,
                "chart": [p.as_json() for p in chart],
            }
        )

    async def bookie(self, request: web.Request) -> web.Response:
        view = self.collector.bookie(request.match_info["bookie"])
        if view is None:
            raise _fail(web.HTTPNotFound, f"no bookie {request.match_info['bookie'][:80]} here")
        found = view.as_json()
        found["history"] = [p.as_json() for p in view.history.since()[-CHART_POINTS:]]
        return web.json_response(found)

    async def ledgers(self, request: web.Request) -> web.Response:
        after = _int_query(request, "after", -1, -1, 2**63 - 1)
        limit = _int_query(request, "limit", LEDGER_PAGE, 1, MAX_LEDGER_PAGE)
        search = request.query.get("q", "").strip()
        if search and (not search.isdigit() or len(search) > 20):
            raise _fail(
                web.HTTPBadRequest, f"search by ledger id: digits only, not {search[:40]!r}"
            )
        ids = await asyncio.to_thread(self._ledger_page, after, limit + 1, search)
        page, more = ids[:limit], len(ids) > limit
        described = await asyncio.gather(*(self._describe(ledger_id) for ledger_id in page))
        return web.json_response(
            {
                "ledgers": [found for found in described if found is not None],
                "next": page[-1] if more and page else None,
            }
        )

    def _ledger_page(self, after: int, count: int, search: str) -> list[int]:
        """Up to ``count`` ledger ids above ``after`` (containing ``search``), increasing."""
        found: list[int] = []
        for scanned, ledger_id in enumerate(self.admin.metadata.list_ledgers(after)):
            if scanned >= MAX_LEDGER_IDS or len(found) >= count:
                break
            if not search or search in str(ledger_id):
                found.append(ledger_id)
        return found

    async def _describe(self, ledger_id: int) -> dict[str, Any] | None:
        try:
            metadata, _ = await asyncio.to_thread(self.admin.ledger, ledger_id)
        except CommandError:
            return None  # deleted since it was listed
        return ledger_summary(metadata)

    async def ledger(self, request: web.Request) -> web.Response:
        ledger_id = _ledger_id(request.match_info["ledger"])
        try:
            metadata, _ = await asyncio.to_thread(self.admin.ledger, ledger_id)
        except CommandError as error:
            raise _fail(web.HTTPNotFound, str(error)) from None
        return web.json_response(ledger_fragments(metadata))

    async def entries(self, request: web.Request) -> web.Response:
        ledger_id = _ledger_id(request.match_info["ledger"])
        first = _int_query(request, "first", 0, 0, 2**63 - 1)
        last = _int_query(request, "last", first + 9, 0, 2**63 - 1)
        if last < first:
            raise _fail(web.HTTPBadRequest, f"the last entry {last} is before the first {first}")
        if last - first + 1 > MAX_ENTRIES:
            raise _fail(web.HTTPBadRequest, f"read at most {MAX_ENTRIES} entries at a time")
        try:
            await asyncio.to_thread(self.admin.ledger, ledger_id)
        except CommandError as error:
            raise _fail(web.HTTPNotFound, str(error)) from None
        found = []
        try:
            async for entry_id, data in read_entries(
                self.client, ledger_id, first, last, limit=MAX_ENTRIES
            ):
                shown = data[:SHOWN_BYTES]
                found.append(
                    {
                        "id": entry_id,
                        "size": len(data),
                        "text": printable(shown),
                        "hex": hex_dump(shown[:256]),
                        "truncated": len(data) > len(shown),
                    }
                )
        except CommandError as error:
            raise _fail(web.HTTPBadRequest, str(error)) from None
        except BKError as error:
            raise _fail(web.HTTPBadGateway, f"reading ledger {ledger_id} failed: {error}") from None
        return web.json_response({"ledger": ledger_id, "first": first, "entries": found})

    async def recovery(self, request: web.Request) -> web.Response:
        admin = self.admin
        marked = await asyncio.to_thread(admin.underreplicated)
        enabled = await asyncio.to_thread(admin.autorecovery)
        auditor = await asyncio.to_thread(admin.auditor)
        delay = await asyncio.to_thread(admin.lost_bookie_recovery_delay)
        now_ms = int(time.time() * 1000)
        self.under_replicated_history.append((now_ms, len(marked)))
        peak = max(count for _, count in self.under_replicated_history)
        # The workers' pace over the last minute (their counters, scraped from the bookies).
        pace = metrics.recovery_pace(
            self.collector.cluster.since(now_ms - RATE_WINDOW_MS), len(marked)
        )
        return web.json_response(
            {
                "autorecoveryEnabled": enabled,
                "auditor": auditor,
                "lostBookieRecoveryDelayS": delay,
                "underReplicated": [
                    {
                        "ledger": found.ledger_id,
                        "missing": list(found.missing_replicas),
                        "worker": found.replication_worker,
                        "markedMs": found.marked_ms,
                    }
                    for found in marked[:500]
                ],
                "count": len(marked),
                "beingReplicated": sum(1 for found in marked if found.replication_worker),
                # progress: how many were marked at most while this page watched, and now
                "peak": peak,
                "replicatedSincePeak": peak - len(marked),
                "ledgersPerS": round(pace.ledgers_per_s, 3),
                "bytesPerS": round(pace.bytes_per_s, 1),
                # at the last minute's pace; None while nothing is being copied
                "etaS": None if pace.eta_s is None else round(pace.eta_s, 1),
            }
        )

    async def logs(self, request: web.Request) -> web.Response:
        """A page of logs, in (namespace, name) order after ``after`` (``namespace/name``, the
        last of the previous page), each described (segments, writer, subscriptions)."""
        from bookkeeper_py.admin.log_report import description_dict
        from bookkeeper_py.log.namespace import LogNamespace, list_namespaces

        limit = _int_query(request, "limit", LOG_PAGE, 1, MAX_LOG_PAGE)
        after = request.query.get("after", "")
        after_namespace, _, after_log = after.partition("/")
        if after and (not after_namespace or not after_log):
            raise _fail(
                web.HTTPBadRequest,
                f"after: the last log of a page as namespace/name, not {after[:80]!r}",
            )
        wanted = limit + 1  # one more than the page says whether there is a next one
        names: list[tuple[str, str]] = []
        if after:
            found = await self._logs_of(after_namespace, after_log, wanted)
            names.extend((after_namespace, name) for name in found)
        cursor = after_namespace or None
        for _ in range(MAX_NAMESPACE_PAGES):
            if len(names) >= wanted:
                break
            namespaces = await list_namespaces(self.client, cursor, MAX_LOG_PAGE)
            for namespace_name in namespaces:
                found = await self._logs_of(namespace_name, None, wanted - len(names))
                names.extend((namespace_name, name) for name in found)
                if len(names) >= wanted:
                    break
            if len(namespaces) < MAX_LOG_PAGE:
                break
            cursor = namespaces[-1]
        page, more = names[:limit], len(names) > limit
        described: list[dict[str, Any]] = []
        for namespace_name, log_name in page:
            try:
                found_log = await LogNamespace(self.client, namespace_name).describe(log_name)
                described.append(description_dict(found_log))
            except (BKError, CommandError) as error:
                described.append(
                    {"namespace": namespace_name, "name": log_name, "error": str(error)}
                )
        last = page[-1] if page else None
        return web.json_response(
            {"logs": described, "next": f"{last[0]}/{last[1]}" if more and last else None}
        )

    async def _logs_of(self, namespace: str, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` log names of ``namespace`` after ``after`` (none if it is gone)."""
        from bookkeeper_py.log.namespace import LogNamespace

        try:
            return await LogNamespace(self.client, namespace).list_logs(after, limit)
        except LogNotFoundError:
            return []

    # -- actions -------------------------------------------------------------------------------

    async def _action_body(self, request: web.Request) -> dict[str, Any]:
        """The body of an action, once actions are enabled and it is confirmed."""
        if not self.enable_actions:
            raise _fail(
                web.HTTPForbidden,
                "actions are disabled: this dashboard is read-only (start it with --enable-actions)",
            )
        origin = request.headers.get("Origin")
        if origin is not None and origin.split("://", 1)[-1] != request.host:
            raise _fail(web.HTTPForbidden, f"an action from another site ({origin}) is refused")
        if request.content_type != "application/json":
            raise _fail(
                web.HTTPBadRequest, "an action's body is JSON (Content-Type: application/json)"
            )
        try:
            body = json.loads(await request.text())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise _fail(web.HTTPBadRequest, 'expected a JSON object with "confirm": true')
        if body.get("confirm") is not True:
            raise _fail(web.HTTPBadRequest, 'not confirmed: send "confirm": true')
        return body

    def _bookie_url(self, request: web.Request) -> tuple[str, str]:
        bookie_id = request.match_info["bookie"]
        view = self.collector.bookie(bookie_id)
        if view is None:
            raise _fail(web.HTTPNotFound, f"no bookie {bookie_id[:80]} here")
        if view.http_url is None or view.state == DOWN:
            raise _fail(web.HTTPConflict, f"bookie {bookie_id} is down or has no HTTP endpoint")
        return bookie_id, view.http_url

    async def _put(self, url: str, body: dict[str, Any] | None) -> Any:
        timeout = aiohttp.ClientTimeout(total=10)
        try:
            async with self.collector.session.put(url, json=body, timeout=timeout) as answer:
                text = await answer.text()
                if answer.status >= 400:
                    raise _fail(web.HTTPBadGateway, f"the bookie answered {answer.status}: {text}")
                return json.loads(text) if text else None
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _fail(web.HTTPBadGateway, f"the bookie did not answer: {error}") from None

    async def set_read_only(self, request: web.Request) -> web.Response:
        body = await self._action_body(request)
        wanted = body.get("readOnly")
        if not isinstance(wanted, bool):
            raise _fail(web.HTTPBadRequest, '"readOnly" must be true or false')
        bookie_id, url = self._bookie_url(request)
        answer = await self._put(url + "/api/v1/bookie/state/readonly", {"readOnly": wanted})
        return web.json_response({"bookie": bookie_id, "answer": answer})

    async def trigger_gc(self, request: web.Request) -> web.Response:
        await self._action_body(request)
        bookie_id, url = self._bookie_url(request)
        answer = await self._put(url + "/api/v1/bookie/gc", None)
        return web.json_response({"bookie": bookie_id, "answer": answer})

    async def delete_ledger(self, request: web.Request) -> web.Response:
        await self._action_body(request)
        ledger_id = _ledger_id(request.match_info["ledger"])
        try:
            await asyncio.to_thread(self.admin.delete_ledger, ledger_id)
        except CommandError as error:
            raise _fail(web.HTTPNotFound, str(error)) from None
        return web.json_response({"deleted": ledger_id})


def _by_id(view: Any) -> str:
    return str(view.bookie_id)


def make_app(dashboard: Dashboard) -> web.Application:
    """The application serving ``dashboard`` (its collector runs while the app does)."""
    app = web.Application(middlewares=[dashboard.middleware], client_max_size=64 * 1024)
    app[COLLECTOR] = dashboard.collector
    for path in STATIC_FILES:
        app.router.add_get(path, dashboard.static)
    app.router.add_get("/api/overview", dashboard.overview)
    app.router.add_get("/api/bookies/{bookie}", dashboard.bookie)
    app.router.add_get("/api/ledgers", dashboard.ledgers)
    app.router.add_get("/api/ledgers/{ledger}", dashboard.ledger)
    app.router.add_get("/api/ledgers/{ledger}/entries", dashboard.entries)
    app.router.add_get("/api/recovery", dashboard.recovery)
    app.router.add_get("/api/logs", dashboard.logs)
    app.router.add_post("/api/bookies/{bookie}/readonly", dashboard.set_read_only)
    app.router.add_post("/api/bookies/{bookie}/gc", dashboard.trigger_gc)
    app.router.add_post("/api/ledgers/{ledger}/delete", dashboard.delete_ledger)
    return app
