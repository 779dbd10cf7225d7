"""The dashboard's poller: once a tick (a second) it reads the bookies' registrations and cookies
from the metadata store, scrapes each bookie's HTTP endpoint (``/metrics``, ``/api/v1/bookie/info``
and, every few ticks, ``gc_details``), and keeps per bookie and for the cluster the points of the
last minutes (``metrics.History``).

A bookie's state: ``read-write`` or ``read-only`` as registered; ``down`` when only its cookie
knows it (not registered), or when it is registered but its HTTP endpoint failed
``DOWN_AFTER_FAILURES`` scrapes in a row (a killed bookie's registration outlives it until its
metadata session expires). Where its HTTP endpoint is comes from its registration's service info
(the ``httpserver`` endpoint); the last one seen is remembered after it goes down. Its rack comes
from the racks node (``metadata.racks``); racks and cookies are read every ``SLOW_EVERY_TICKS``.
A bookie neither registered nor with a cookie (decommissioned) leaves the list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bookkeeper_py.admin.service import ClusterAdmin, bookies_with_cookies
from bookkeeper_py.dashboard import metrics
from bookkeeper_py.dashboard.options import TICK_S
from bookkeeper_py.errors import BKError
from bookkeeper_py.metadata import racks
from bookkeeper_py.metadata.manager import HTTP_ENDPOINT_ID
from bookkeeper_py.metadata.port import MetadataPort

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 1.5  # a bookie that takes longer for one endpoint counts as not answering
DOWN_AFTER_FAILURES = 2
GC_EVERY_TICKS = 5
SLOW_EVERY_TICKS = 5  # cookies and racks are read every this many ticks
MAX_BOOKIES = 1000  # bookies scraped per tick, at most

READ_WRITE, READ_ONLY, DOWN = "read-write", "read-only", "down"


@dataclass
class BookieView:
    """What the dashboard knows of one bookie."""

    bookie_id: str
    state: str = DOWN
    reason: str = ""
    rack: str | None = None  # as the racks node says; None: the default rack
    http_url: str | None = None
    info: dict[str, Any] | None = None
    gc: list[dict[str, Any]] | None = None
    failures: int = 0
    last_answer_ms: int | None = None
    last_scrape: metrics.Scrape | None = None
    last_checkpoint: tuple[float, int] | None = None  # its mean latency (ms), when (epoch ms)
    history: metrics.History = field(default_factory=metrics.History)

    def as_json(self) -> dict[str, Any]:
        latest = self.history.latest()
        return {
            "id": self.bookie_id,
            "state": self.state,
            "reason": self.reason,
            "rack": self.rack,
            "http": self.http_url,
            "lastAnswerMs": self.last_answer_ms,
            "disks": _disks(self.info),
            "totalSpace": (self.info or {}).get("totalSpace"),
            "freeSpace": (self.info or {}).get("freeSpace"),
            "gc": self.gc,
            "lastCheckpointMs": None if self.last_checkpoint is None else self.last_checkpoint[0],
            "lastCheckpointAt": None if self.last_checkpoint is None else self.last_checkpoint[1],
            "latest": None if latest is None else latest.as_json(),
        }


def _disks(info: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each directory's use, from the info endpoint (its ``directoryUsage``, else the totals)."""
    if not info:
        return []
    found = info.get("directoryUsage")
    if isinstance(found, list):
        return [d for d in found if isinstance(d, dict)]
    return [
        {"kind": "ledger", "path": path, "totalSpace": info.get("totalSpace"), "freeSpace": None}
        for path in info.get("ledgerDirectories", [])
    ]


class Collector:
    """Polls the cluster every ``tick_s`` seconds while ``run`` runs."""

    def __init__(
        self,
        port: MetadataPort,
        admin: ClusterAdmin,
        session: aiohttp.ClientSession,
        *,
        tick_s: float = TICK_S,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.port = port
        self.admin = admin
        self.session = session
        self.tick_s = tick_s
        self.monotonic = monotonic
        self.wall_ms = wall_ms
        self.bookies: dict[str, BookieView] = {}
        self.cluster = metrics.History()
        self.ticks = 0
        self.updated_ms: int | None = None
        self.error: str | None = None  # why the last tick failed, if it did
        self.racks_error: str | None = None  # why the racks node could not be read, if so
        self.cookies: set[str] = set()  # bookies with a cookie, as last read

    async def run(self) -> None:
        """Ticks until cancelled; a failed tick is logged and shown, and the next one tried."""
        while True:
            started = self.monotonic()
            try:
                await self.tick()
                self.error = None
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("dashboard: cluster poll failed: %s", error)
                self.error = f"{type(error).__name__}: {error}"
            await asyncio.sleep(max(0.05, self.tick_s - (self.monotonic() - started)))

    async def tick(self) -> None:
        self.ticks += 1
        writable, read_only = await self.port.bookies_now()
        if self.ticks % SLOW_EVERY_TICKS == 1:  # cookies and racks change rarely
            self.cookies = await bookies_with_cookies(self.port)
        known = sorted({*writable, *read_only, *self.cookies})[:MAX_BOOKIES]
        # a bookie neither registered nor with a cookie (decommissioned) is not shown any more
        self.bookies = {b: self.bookies.get(b) or BookieView(b) for b in known}
        registered = {*writable, *read_only}
        if self.ticks % SLOW_EVERY_TICKS == 1:
            await self._read_racks()
        for view in self.bookies.values():
            if view.bookie_id in registered and (view.http_url is None or self.ticks % 10 == 1):
                view.http_url = await self._http_url(view.bookie_id) or view.http_url
        gc = self.ticks % GC_EVERY_TICKS == 1
        views = list(self.bookies.values())
        answers = await asyncio.gather(*(self._scrape(view, gc) for view in views))
        now_ms = self.wall_ms()
        intervals = []
        for view, found in zip(views, answers, strict=True):
            if found is not None:
                intervals.append(found)
            view.state, view.reason = self._state(view, writable, read_only)
        if intervals:
            self.cluster.add(metrics.point(intervals, now_ms))
        self.updated_ms = now_ms

    async def _read_racks(self) -> None:
        try:
            found = await racks.read_placements(self.port)
        except BKError as error:  # a malformed node: said on the page, the rest goes on
            self.racks_error = str(error)
            return
        self.racks_error = None
        for view in self.bookies.values():
            place = found.get(view.bookie_id)
            view.rack = None if place is None else place.rack

    @staticmethod
    def _state(view: BookieView, writable: list[str], read_only: list[str]) -> tuple[str, str]:
        registered = view.bookie_id in writable or view.bookie_id in read_only
        if not registered:
            return DOWN, "not registered (known by its cookie)"
        if view.failures >= DOWN_AFTER_FAILURES:
            return DOWN, f"registered, but its HTTP endpoint failed {view.failures} polls in a row"
        if view.bookie_id in read_only:
            return READ_ONLY, ""
        return READ_WRITE, ""

    async def _http_url(self, bookie_id: str) -> str | None:
        info = await asyncio.to_thread(self.admin.metadata.bookie_service_info, bookie_id)
        for endpoint in info.endpoints if info is not None else ():
            if endpoint.id == HTTP_ENDPOINT_ID and endpoint.protocol in ("http", "https"):
                host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
                return f"{endpoint.protocol}://{host}:{endpoint.port}"
        return None

    async def _get(self, url: str) -> Any:
        timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
        async with self.session.get(url, timeout=timeout) as answer:
            answer.raise_for_status()
            if answer.content_type == "application/json":
                return await answer.json()
            return await answer.text()

    async def _scrape(self, view: BookieView, gc: bool) -> metrics.Interval | None:
        """Scrapes one bookie; the interval since its last scrape, if there is one."""
        if view.http_url is None:
            return None
        try:
            text = await self._get(view.http_url + "/metrics")
            at_s = self.monotonic()
            info = await self._get(view.http_url + "/api/v1/bookie/info")
            if gc or view.gc is None:
                with contextlib.suppress(aiohttp.ClientResponseError):  # 503: no GC yet
                    view.gc = await self._get(view.http_url + "/api/v1/bookie/gc_details")
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            view.failures += 1
            view.last_scrape = None
            log.debug("dashboard: bookie %s did not answer: %s", view.bookie_id, error)
            return None
        view.failures = 0
        view.last_answer_ms = self.wall_ms()
        view.info = info if isinstance(info, dict) else None
        scrape = metrics.parse_scrape(str(text), at_s)
        before, view.last_scrape = view.last_scrape, scrape
        if before is None:
            return None
        found = metrics.interval(before, scrape)
        if found is not None:
            added = metrics.point([found], self.wall_ms())
            view.history.add(added)
            if added.checkpoint_ms is not None:
                view.last_checkpoint = (round(added.checkpoint_ms, 3), added.time_ms)
        return found

    def bookie(self, bookie_id: str) -> BookieView | None:
        return self.bookies.get(bookie_id)
