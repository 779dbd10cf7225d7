"""The two status tables of docs/operations.md against the code: every command of BookKeeper's
shell marked done is a subcommand of ``bookkeeper shell``, every endpoint of its HTTP router
marked done is a route of the bookie's HTTP app, and every other row says why it does not apply
(as ``test_config`` checks the table of ``bk_server.conf`` keys)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, cast

from aiohttp import web

from bookkeeper_py.admin.cli import build_parser
from bookkeeper_py.metadata.port import MetadataPort
from bookkeeper_py.prometheus import PrometheusMetrics
from bookkeeper_py.server.autorecovery_http import add_routes
from bookkeeper_py.server.http import add_cluster_routes, add_sanity_route, make_app
from bookkeeper_py.server.ledger_http import add_ledger_routes
from bookkeeper_py.server.service import BookieService

GUIDE = Path(__file__).parent.parent.parent / "docs" / "operations.md"
COMMANDS = "#### Every command of BookKeeper 4.18's `bin/bookkeeper shell`"
ENDPOINTS = "#### Every endpoint of BookKeeper 4.18's HTTP router"
# "done", optionally for one method ("GET done; PUT refused..."), or "not applicable: <reason>"
DONE = re.compile(r"^(?:(?P<method>GET|PUT|POST|DELETE) )?done\b")
NOT_APPLICABLE = re.compile(r"^not applicable: \S.{10,}$")


def table(heading: str) -> list[tuple[list[str], str]]:
    """The rows of the table under ``heading``: (the names of its first cell, its status)."""
    lines = GUIDE.read_text().splitlines()
    start = lines.index(heading)
    rows: list[tuple[list[str], str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break  # the next section
        if not line.startswith("| `"):
            continue  # the prose, the header and its rule
        first, status = (cell.strip() for cell in line.strip("|").split(" | ", 1))
        # each name is the first `quoted` word of an item: "`help` (`--help`)" names help
        quoted = [re.match(r"`([^`]+)`", item) for item in first.split(", ")]
        names = [match.group(1) for match in quoted if match is not None]
        assert len(names) == len(quoted), line
        rows.append((names, status.strip()))
    assert rows, f"no table under {heading!r}"
    return rows


def status_of(names: list[str], status: str) -> str | None:
    """The method a row is done for ("" for every method), or None when not applicable; fails
    on any other status."""
    done = DONE.match(status)
    if done:
        return done.group("method") or ""
    assert NOT_APPLICABLE.match(status), (names, status)
    return None


def test_the_statuses_are_done_or_not_applicable_with_a_reason() -> None:
    for heading in (COMMANDS, ENDPOINTS):
        statuses = [status_of(names, status) for names, status in table(heading)]
        assert any(status is not None for status in statuses), heading


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_command_marked_done_is_a_shell_subcommand() -> None:
    shell = subcommands(build_parser())["shell"]
    commands = subcommands(shell)
    checked = 0
    for names, status in table(COMMANDS):
        if status_of(names, status) is None:
            for name in names:  # not applicable: not offered either
                assert name not in commands, (name, status)
            continue
        for name in names:
            if name == "help":  # BookKeeper's help command is --help here (the table says so)
                assert "--help" in shell._option_string_actions
            else:
                assert name in commands, f"shell {name} is marked done but is no subcommand"
            checked += 1
    assert checked >= 40  # every row read (none lost to a format change)


def bookie_app() -> web.Application:
    """The bookie's HTTP app as its server assembles it (``server.main``), with stand-ins for
    the objects the handlers use: routes are only listed here, never called."""
    service = cast(BookieService, object())
    port = cast(MetadataPort, object())
    uri = "memory://operations-tables"
    app = make_app(service, PrometheusMetrics(), {})
    add_routes(app, port, uri)
    add_cluster_routes(app, port, uri)
    add_sanity_route(app, service, uri)
    add_ledger_routes(app, port, uri)
    return app


def endpoint_paths(names: list[str]) -> list[str]:
    """The row's endpoints as full paths: after a full ``/api/v1/<area>/...`` path, a name like
    ``/bookie`` is relative to ``/api/v1/<area>``."""
    paths, area = [], None
    for name in names:
        if name.startswith("/api/"):
            area = "/".join(name.split("/")[:4])
            paths.append(name)
        else:
            paths.append(name if area is None else area + name)
    return paths


def test_every_endpoint_marked_done_is_a_route_of_the_bookie() -> None:
    routes: dict[str, set[str]] = {}
    for route in bookie_app().router.routes():
        canonical = cast(Any, route.resource).canonical
        routes.setdefault(canonical, set()).add(route.method)
    checked = 0
    for names, status in table(ENDPOINTS):
        method = status_of(names, status)
        for path in endpoint_paths(names):
            if method is None:
                assert path not in routes, (path, status)
                continue
            assert path in routes, f"{path} is marked done but the bookie serves no such route"
            if method:
                assert method in routes[path], (path, status, routes[path])
            checked += 1
    assert checked >= 25  # every row read
    # the one row done for a method only: the others answer 405
    assert routes["/api/v1/config/server_config"] == {"GET", "HEAD"}
