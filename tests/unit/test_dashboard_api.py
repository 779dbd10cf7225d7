"""The dashboard's JSON API over a real server on loopback and a metadata store in memory (no
bookie processes: registrations, cookies and ledgers are written straight to the store), and the
rate and percentile arithmetic of ``dashboard.metrics``."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.dashboard import metrics
from bookkeeper_py.dashboard.command import serving
from bookkeeper_py.dashboard.options import Options
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.wire.digest import DigestType

PASSWORD = b"digest-password-never-shown"
_names = itertools.count()
Call = Callable[..., Awaitable[tuple[int, Any]]]


def _ledger(ledger_id: int, closed: bool = False) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=2,
        write_quorum_size=2,
        ack_quorum_size=2,
        digest_type=DigestType.CRC32C,
        password=PASSWORD,
        ensembles=(
            (0, ("127.0.0.1:3181", "127.0.0.1:3182")),
            (5, ("127.0.0.1:3181", "127.0.0.1:3183")),
        ),
        state=LedgerState.CLOSED if closed else LedgerState.OPEN,
        last_entry_id=9 if closed else -1,
        length=1234 if closed else 0,
    )


@asynccontextmanager
async def dashboard(**options: Any) -> AsyncIterator[tuple[MetadataClient, Call]]:
    """A cluster in memory (two registered bookies, one known by its cookie alone, ledgers 1, 2,
    12 and 20) and a dashboard over it; yields the store and ``call(method, path, **kw)`` ->
    (status, JSON or text)."""
    uri = f"memory://dashboard-api-{next(_names)}"
    store = MetadataClient.connect(uri, create=True)
    store.init_cluster()
    store.register_bookie("127.0.0.1:3181", "127.0.0.1", 3181)
    store.register_bookie("127.0.0.1:3182", "127.0.0.1", 3182, readonly=True)
    store.create_cookie("127.0.0.1:3183", b"a cookie")
    for ledger_id in (1, 2, 12, 20):
        store.create_ledger_metadata(_ledger(ledger_id, closed=ledger_id % 2 == 0))
    try:
        async with (
            serving(Options(uri, port=0, tick_s=0.1, **options)) as address,
            aiohttp.ClientSession() as session,
        ):

            async def call(method: str, path: str, **kw: Any) -> tuple[int, Any]:
                async with session.request(method, address.rstrip("/") + path, **kw) as answer:
                    text = await answer.text()
                    assert PASSWORD.decode() not in text
                    assert base64.b64encode(PASSWORD).decode() not in text
                    if answer.content_type == "application/json":
                        return answer.status, json.loads(text)
                    return answer.status, text

            yield store, call
    finally:
        store.close()


async def _overview(call: Call) -> dict[str, Any]:
    """The overview once the collector polled (bounded wait)."""
    for _ in range(100):
        status, found = await call("GET", "/api/overview")
        assert status == 200
        if found["updatedMs"] is not None and len(found["bookies"]) == 3:
            return dict(found)
        await asyncio.sleep(0.05)
    raise AssertionError(f"the dashboard never polled: {found}")


def test_overview_states_of_bookies() -> None:
    async def main() -> None:
        async with dashboard() as (store, call):
            found = await _overview(call)
            states = {b["id"]: (b["state"], b["reason"]) for b in found["bookies"]}
            assert states["127.0.0.1:3181"] == ("read-write", "")
            assert states["127.0.0.1:3182"] == ("read-only", "")
            assert states["127.0.0.1:3183"][0] == "down"
            assert "cookie" in states["127.0.0.1:3183"][1]
            assert found["cluster"] == {"bookies": 3, "readWrite": 1, "readOnly": 1, "down": 1}
            assert found["actionsEnabled"] is False
            status, _ = await call("GET", "/api/bookies/127.0.0.1:3181")
            assert status == 200
            status, text = await call("GET", "/api/bookies/nobody:1")
            assert status == 404 and "\n" not in text.strip()
            # decommissioned (its cookie deleted, not registered): no longer listed
            store.delete_cookie("127.0.0.1:3183")
            for _ in range(200):
                status, found = await call("GET", "/api/overview")
                if len(found["bookies"]) == 2:
                    break
                await asyncio.sleep(0.05)
            assert [b["id"] for b in found["bookies"]] == ["127.0.0.1:3181", "127.0.0.1:3182"]

    asyncio.run(main())


def test_ledgers_paging_search_and_detail_without_password() -> None:
    async def main() -> None:
        async with dashboard() as (_, call):
            status, page = await call("GET", "/api/ledgers?limit=2")
            assert status == 200
            assert [ledger["id"] for ledger in page["ledgers"]] == [1, 2] and page["next"] == 2
            status, page = await call("GET", "/api/ledgers?limit=2&after=2")
            assert [ledger["id"] for ledger in page["ledgers"]] == [12, 20] and page["next"] is None
            status, page = await call("GET", "/api/ledgers?q=2")
            assert [ledger["id"] for ledger in page["ledgers"]] == [2, 12, 20]
            first = page["ledgers"][0]
            assert first["state"] == "closed" and first["length"] == 1234
            assert first["ensembles"][1] == {
                "firstEntryId": 5,
                "bookies": ["127.0.0.1:3181", "127.0.0.1:3183"],
            }
            assert "password" not in first
            status, ledger = await call("GET", "/api/ledgers/2")
            assert status == 200
            assert ledger["fragmentBookies"] == [
                "127.0.0.1:3181",
                "127.0.0.1:3182",
                "127.0.0.1:3183",
            ]
            assert ledger["fragments"] == [
                {"firstEntryId": 0, "lastEntryId": 4, "cells": [0, 1, None]},
                {"firstEntryId": 5, "lastEntryId": 9, "cells": [0, None, 1]},
            ]
            status, ledger = await call("GET", "/api/ledgers/1")
            assert ledger["state"] == "open" and ledger["fragments"][-1]["lastEntryId"] is None

    asyncio.run(main())


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/ledgers/999", 404),
        ("/api/ledgers/999/entries?first=0&last=1", 404),
        ("/api/ledgers/abc", 400),
        ("/api/ledgers/-1", 400),
        ("/api/ledgers/1x/entries", 400),
        ("/api/ledgers/1/entries?first=a", 400),
        ("/api/ledgers/1/entries?first=5&last=2", 400),
        ("/api/ledgers/1/entries?first=0&last=1000", 400),
        ("/api/ledgers?after=x", 400),
        ("/api/ledgers?limit=0", 400),
        ("/api/ledgers?limit=100000", 400),
        ("/api/ledgers?q=1%20or%201", 400),
        ("/api/nothing", 404),
    ],
)
def test_bad_input(path: str, status: int) -> None:
    async def main() -> None:
        async with dashboard() as (_, call):
            found, text = await call("GET", path)
            assert found == status, text
            assert isinstance(text, str) and len(text.strip().splitlines()) == 1

    asyncio.run(main())


def test_actions_refused_unless_enabled() -> None:
    async def main() -> None:
        async with dashboard() as (store, call):
            await _overview(call)
            confirmed = {"json": {"confirm": True, "readOnly": True}}
            for path in (
                "/api/bookies/127.0.0.1:3181/readonly",
                "/api/bookies/127.0.0.1:3181/gc",
                "/api/ledgers/1/delete",
            ):
                status, text = await call("POST", path, **confirmed)
                assert status == 403
                assert text.strip() == (
                    "actions are disabled: this dashboard is read-only (start it with "
                    "--enable-actions)"
                )
            assert 1 in list(store.list_ledgers())

    asyncio.run(main())


def test_actions_enabled_need_confirmation_and_valid_targets() -> None:
    async def main() -> None:
        async with dashboard(enable_actions=True) as (store, call):
            await _overview(call)
            status, _ = await call("POST", "/api/ledgers/1/delete", json={})
            assert status == 400  # not confirmed
            status, _ = await call("POST", "/api/ledgers/1/delete", data="confirm")
            assert status == 400  # not JSON
            status, _ = await call(
                "POST",
                "/api/ledgers/1/delete",
                json={"confirm": True},
                headers={"Origin": "http://elsewhere.example"},
            )
            assert status == 403  # from another site
            status, _ = await call("POST", "/api/ledgers/999/delete", json={"confirm": True})
            assert status == 404
            status, _ = await call("POST", "/api/ledgers/x/delete", json={"confirm": True})
            assert status == 400
            status, found = await call("POST", "/api/ledgers/1/delete", json={"confirm": True})
            assert (status, found) == (200, {"deleted": 1})
            assert 1 not in list(store.list_ledgers())
            status, _ = await call(
                "POST", "/api/bookies/nobody:1/readonly", json={"confirm": True, "readOnly": True}
            )
            assert status == 404
            status, _ = await call(
                "POST",
                "/api/bookies/127.0.0.1:3181/readonly",
                json={"confirm": True, "readOnly": 1},
            )
            assert status == 400
            # registered, but it publishes no HTTP endpoint to ask
            status, _ = await call("POST", "/api/bookies/127.0.0.1:3181/gc", json={"confirm": True})
            assert status == 409

    asyncio.run(main())


def test_secret(tmp_path: Path) -> None:
    secret = "s3cret-of-at-least-16-bytes"
    path = tmp_path / "secret"
    path.write_text(secret + "\n")

    async def main() -> None:
        async with dashboard(secret_file=str(path)) as (_, call):
            for headers in (
                {},
                {"Authorization": "Bearer wrong-secret-of-16-bytes"},
                {"Authorization": "Basic " + base64.b64encode(b"admin:wrong").decode()},
                {"Authorization": "Basic %%%"},
            ):
                for page in ("/", "/api/overview", "/static/dashboard.js"):
                    status, _ = await call("GET", page, headers=headers)
                    assert status == 401, (page, headers)
            status, _ = await call(
                "GET", "/api/overview", headers={"Authorization": "Bearer " + secret}
            )
            assert status == 200
            basic = base64.b64encode(f"anyone:{secret}".encode()).decode()
            status, page = await call("GET", "/", headers={"Authorization": "Basic " + basic})
            assert status == 200 and "<html" in page

    asyncio.run(main())


def test_page_and_files_load_nothing_from_elsewhere() -> None:
    async def main() -> None:
        async with dashboard() as (_, call):
            for path in ("/", "/static/dashboard.js", "/static/dashboard.css"):
                status, text = await call("GET", path)
                assert status == 200
                assert "https://" not in text and "//cdn" not in text
            status, page = await call("GET", "/")
            assert 'src="/static/dashboard.js"' in page and 'href="/static/dashboard.css"' in page

    asyncio.run(main())


HISTOGRAM = """# TYPE bookkeeper_server_ADD_ENTRY_REQUEST histogram
bookkeeper_server_ADD_ENTRY_REQUEST_bucket{{le="0.001",success="true"}} {a}
bookkeeper_server_ADD_ENTRY_REQUEST_bucket{{le="0.01",success="true"}} {b}
bookkeeper_server_ADD_ENTRY_REQUEST_bucket{{le="+Inf",success="true"}} {b}
bookkeeper_server_ADD_ENTRY_REQUEST_count{{success="true"}} {b}
bookkeeper_server_ADD_ENTRY_REQUEST_sum{{success="true"}} 0.1
bookkeeper_server_ADD_ENTRY_REQUEST_count{{success="false"}} 7
# TYPE bookkeeper_server_READ_ENTRY_REQUEST histogram
bookkeeper_server_READ_ENTRY_REQUEST_bucket{{le="+Inf",success="true"}} {r}
bookkeeper_server_READ_ENTRY_REQUEST_count{{success="true"}} {r}
bookkeeper_server_READ_ENTRY_REQUEST_sum{{success="true"}} 0.0
"""


def test_rates_and_p99_from_two_scrapes() -> None:
    before = metrics.parse_scrape(HISTOGRAM.format(a=0, b=0, r=0), at_s=10.0)
    # 100 adds in 2 s: 90 under 1 ms, 10 between 1 and 10 ms; 50 reads
    after = metrics.parse_scrape(HISTOGRAM.format(a=90, b=100, r=50), at_s=12.0)
    interval = metrics.interval(before, after)
    assert interval is not None
    point = metrics.point([interval], time_ms=1)
    assert point.adds_per_s == 50.0 and point.reads_per_s == 25.0
    # rank 99 of 100: the 9th of 10 in (1 ms, 10 ms]: 1 + 9 * 0.9 = 9.1 ms
    assert point.add_p99_ms is not None and math.isclose(point.add_p99_ms, 9.1)
    # two bookies alike: the same p99, twice the rates
    both = metrics.point([interval, interval], time_ms=1)
    assert both.adds_per_s == 100.0 and both.add_p99_ms == point.add_p99_ms
    # a restarted bookie (counts went down) gives no interval
    assert (
        metrics.interval(after, metrics.parse_scrape(HISTOGRAM.format(a=1, b=1, r=0), 13.0)) is None
    )


def test_p99_of_summaries_and_idle_intervals() -> None:
    summary = """# TYPE bookkeeper_server_ADD_ENTRY_REQUEST summary
bookkeeper_server_ADD_ENTRY_REQUEST{{success="true",quantile="0.99"}} {p}
bookkeeper_server_ADD_ENTRY_REQUEST_count{{success="true"}} {n}
bookkeeper_server_ADD_ENTRY_REQUEST_sum{{success="true"}} 1.0
"""
    before = metrics.parse_scrape(summary.format(p="NaN", n=0), 0.0)
    after = metrics.parse_scrape(summary.format(p=4.5, n=10), 1.0)
    interval = metrics.interval(before, after)
    assert interval is not None
    assert metrics.point([interval], 0).add_p99_ms == 4.5
    idle = metrics.interval(after, metrics.parse_scrape(summary.format(p=4.5, n=10), 2.0))
    assert idle is not None
    found = metrics.point([idle], 0)
    assert found.adds_per_s == 0.0 and found.add_p99_ms is None
    assert metrics.quantile_ms(()) is None
    assert metrics.quantile_ms(((0.001, 0.0), (math.inf, 10.0))) == 1.0  # all above the last bound


def test_events_over_a_bound_are_counted_from_the_buckets() -> None:
    cumulative = ((0.001, 2.0), (0.01, 5.0), (0.025, 7.0), (math.inf, 10.0))
    assert metrics.count_over(cumulative, 0.025) == 3.0  # a bound: the events above it
    assert metrics.count_over(cumulative, 0.005) == 5.0  # the next bound up, 10 ms
    assert metrics.count_over(cumulative, 0.0) == 8.0
    assert metrics.count_over(((0.025, 0.0), (math.inf, 0.0)), 0.025) == 0.0  # no events
    assert metrics.count_over((), 0.025) is None  # no buckets: no bound at or above it


def test_history_keeps_the_last_points() -> None:
    history = metrics.History(limit=3)
    for t in range(5):
        history.add(metrics.Point(t, 0.0, 0.0, None, None))
    assert [p.time_ms for p in history.since()] == [2, 3, 4]
    assert [p.time_ms for p in history.since(3)] == [4]


CHECKPOINTS = """# TYPE bookie_CHECKPOINT histogram
bookie_CHECKPOINT_bucket{{le="+Inf",success="true"}} {n}
bookie_CHECKPOINT_count{{success="true"}} {n}
bookie_CHECKPOINT_sum{{success="true"}} {s}
# TYPE replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED gauge
replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED {ledgers}
# TYPE replication_worker_NUM_BYTES_WRITTEN gauge
replication_worker_NUM_BYTES_WRITTEN {copied}
"""


def test_checkpoint_latency_and_recovery_pace() -> None:
    def scrape(n: int, s: float, ledgers: int, copied: int, at_s: float) -> metrics.Scrape:
        text = CHECKPOINTS.format(n=n, s=s, ledgers=ledgers, copied=copied)
        return metrics.parse_scrape(text, at_s)

    # two checkpoints of 0.2 and 0.4 s end in a 2 s interval; 6 ledgers and 4 MB copied
    interval = metrics.interval(scrape(3, 1.0, 4, 1000, 0.0), scrape(5, 1.6, 10, 4_001_000, 2.0))
    assert interval is not None
    point = metrics.point([interval], time_ms=1)
    assert point.checkpoint_ms is not None and math.isclose(point.checkpoint_ms, 300.0)
    assert point.replicated_ledgers_per_s == 3.0 and point.replicated_bytes_per_s == 2_000_000.0
    # no checkpoint in the next interval: no latency rather than zero
    idle = metrics.interval(scrape(5, 1.6, 10, 4_001_000, 2.0), scrape(5, 1.6, 10, 4_001_000, 3.0))
    assert idle is not None and metrics.point([idle], 2).checkpoint_ms is None
    # a worker that restarted counts from zero: no negative pace
    restarted = metrics.interval(scrape(5, 1.6, 10, 4_001_000, 3.0), scrape(6, 1.7, 1, 10, 4.0))
    assert restarted is not None and metrics.point([restarted], 3).replicated_ledgers_per_s == 0.0
    # the pace over points, and the time left for 30 waiting ledgers at 3 a second
    pace = metrics.recovery_pace([point, metrics.point([idle], 2)], waiting=30)
    assert (pace.ledgers_per_s, pace.bytes_per_s) == (1.5, 1_000_000.0) and pace.eta_s == 20.0
    assert metrics.recovery_pace([metrics.point([idle], 2)], waiting=30).eta_s is None
    assert metrics.recovery_pace([], waiting=0) == metrics.Pace(0.0, 0.0, None)


def test_logs_paged_across_namespaces() -> None:
    from bookkeeper_py.client.client import BookKeeper
    from bookkeeper_py.log.namespace import LogNamespace

    async def main() -> None:
        async with dashboard() as (store, call):
            client = BookKeeper(store)
            names = {"alpha": ["a1", "a2", "a3"], "beta": ["b1"], "gamma": ["g1", "g2"]}
            for namespace, logs in names.items():
                created = LogNamespace(client, namespace)
                await created.create()
                for log_name in logs:
                    await created.create_log(log_name)
            seen: list[str] = []
            after = ""
            for _ in range(10):  # 6 logs, 4 a page: two pages
                query = "?limit=4" + (f"&after={after}" if after else "")
                status, page = await call("GET", "/api/logs" + query)
                assert status == 200
                seen += [f"{found['namespace']}/{found['name']}" for found in page["logs"]]
                if page["next"] is None:
                    break
                after = page["next"]
            assert seen == [f"{ns}/{name}" for ns, logs in names.items() for name in logs]
            status, page = await call("GET", "/api/logs?limit=2&after=alpha/a3")
            assert [found["name"] for found in page["logs"]] == ["b1", "g1"]
            assert page["next"] == "gamma/g1"
            for bad in ("/api/logs?after=nonamespace", "/api/logs?limit=0", "/api/logs?after=/x"):
                status, text = await call("GET", bad)
                assert status == 400 and len(text.strip().splitlines()) == 1, text
            await client.close()

    asyncio.run(main())


def test_racks_shown_and_malformed_racks_said() -> None:
    from bookkeeper_py.metadata import racks
    from bookkeeper_py.metadata.port import ThreadedMetadata

    async def main() -> None:
        async with dashboard() as (store, call):
            port = ThreadedMetadata(store)
            await racks.set_rack(port, "127.0.0.1:3181", "/eu/rack-1", hostname="bookie-1")
            for _ in range(100):
                found = await _overview(call)
                placed = {b["id"]: b["rack"] for b in found["bookies"]}
                if placed["127.0.0.1:3181"] == "/eu/rack-1":
                    break
                await asyncio.sleep(0.05)
            assert placed == {
                "127.0.0.1:3181": "/eu/rack-1",
                "127.0.0.1:3182": None,
                "127.0.0.1:3183": None,
            }
            assert found["racksError"] is None
            _, version = store.store.get(racks.racks_path(port))
            store.store.set(racks.racks_path(port), b"{not json", version)
            for _ in range(100):
                found = await _overview(call)
                if found["racksError"]:
                    break
                await asyncio.sleep(0.05)
            assert "not JSON" in found["racksError"] and "/bookies" in found["racksError"]
            # the racks last read stay shown
            assert {b["id"]: b["rack"] for b in found["bookies"]}["127.0.0.1:3181"] == "/eu/rack-1"

    asyncio.run(main())
