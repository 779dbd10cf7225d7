"""The ``/api/v1/ledger/*`` endpoints of BookKeeper's admin API on a bookie's HTTP port: same
paths, methods and parameters as its HttpRouter, the same JSON keys.

* ``DELETE delete?ledger_id=N``: "Deleted ledger: N".
* ``GET list`` (``print_metadata=true``, ``decode_meta=true``, ``page=N``, 100 ledgers a
  page): {ledger id: null}, or each ledger's metadata: as JSON with ``decode_meta=true``,
  else its stored bytes in base64.
* ``GET metadata?ledger_id=N``: {N: metadata} (``admin.service.ledger_metadata_json``).
* ``GET read?ledger_id=N`` (``start_entry_id``, ``end_entry_id`` inclusive, -1 the last
  confirmed entry; ``page=N``, 1,000 entries a page): {entry id: payload as text}, read without
  fencing a live writer, at most ``READ_LIMIT`` entries an answer.

Where BookKeeper answers bad input with a bare 500 or 404 (a malformed number, an unknown
ledger, a range backwards), these answer 400 or 404 with a one-line reason, and change nothing;
a method an endpoint does not serve is 405.
"""

from __future__ import annotations

import base64
import json
from functools import partial

from aiohttp import web

from bookkeeper_py import aio
from bookkeeper_py.admin import CommandError
from bookkeeper_py.admin.ledger_reader import ledger_metadata, read_entries
from bookkeeper_py.admin.service import ledger_metadata_json
from bookkeeper_py.errors import NoSuchLedgerError
from bookkeeper_py.metadata.format import serialize
from bookkeeper_py.metadata.port import MetadataPort

PREFIX = "/api/v1/ledger"
LIST_PAGE = 100  # ledgers a page of list (BookKeeper's LIST_LEDGER_BATCH_SIZE)
READ_PAGE = 1000  # entries a page of read (BookKeeper's ENTRIES_PER_PAE)
READ_LIMIT = 10_000  # entries one read answers at most: a bookie's memory is not a ledger's size


def _number(request: web.Request, name: str, default: int | None = None) -> int:
    """Query parameter ``name`` as an integer (``default`` when absent; required without one)."""
    text = request.query.get(name)
    if text is None:
        if default is None:
            raise web.HTTPBadRequest(text=f"missing parameter {name}: pass {name}=<number>")
        return default
    try:
        return int(text)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be a number, not {text!r}") from None


def _json(value: object) -> web.Response:
    return web.json_response(value, dumps=partial(json.dumps, indent=2))


def add_ledger_routes(app: web.Application, port: MetadataPort, metadata_uri: str) -> None:
    """Adds the endpoints over ``port`` (the bookie's metadata session); reads connect a client
    of their own to ``metadata_uri`` (as BookKeeper's do), closed after the answer."""

    async def delete(request: web.Request) -> web.Response:
        ledger_id = _number(request, "ledger_id")
        try:
            await port.read_ledger_metadata(ledger_id)
            await port.delete_ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            raise web.HTTPNotFound(text=f"ledger {ledger_id} does not exist") from None
        return _json(f"Deleted ledger: {ledger_id}")

    async def list_ledgers(request: web.Request) -> web.Response:
        with_metadata = request.query.get("print_metadata") == "true"
        decoded = request.query.get("decode_meta") == "true"
        # checked even where it pages nothing (without print_metadata, as BookKeeper's), so a
        # malformed page is a 400 rather than silently the whole list
        page = _number(request, "page", 0)
        ledger_ids = await port.list_ledgers()
        if not with_metadata:
            return _json({str(ledger_id): None for ledger_id in ledger_ids})
        if page > 0:
            ledger_ids = ledger_ids[(page - 1) * LIST_PAGE : page * LIST_PAGE]
        found: dict[str, object] = {}
        for ledger_id in ledger_ids:
            try:
                metadata, _ = await port.read_ledger_metadata(ledger_id)
            except NoSuchLedgerError:
                continue  # deleted since it was listed
            found[str(ledger_id)] = (
                ledger_metadata_json(metadata)
                if decoded
                else base64.b64encode(serialize(metadata)).decode()
            )
        return _json(found)

    async def metadata(request: web.Request) -> web.Response:
        ledger_id = _number(request, "ledger_id")
        try:
            found, _ = await port.read_ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            raise web.HTTPNotFound(text=f"ledger {ledger_id} does not exist") from None
        return _json({str(ledger_id): ledger_metadata_json(found)})

    async def read(request: web.Request) -> web.Response:
        ledger_id = _number(request, "ledger_id")
        start = _number(request, "start_entry_id", 0)
        end = _number(request, "end_entry_id", -1)
        page = _number(request, "page", -1)
        answer: dict[str, str] = {}
        if page > 0:
            first_of_page = (page - 1) * READ_PAGE
            start = max(start, first_of_page)
            end = (
                first_of_page + READ_PAGE - 1
                if end < 0
                else min(end, first_of_page + READ_PAGE - 1)
            )
            answer["Entries for page: "] = str(page)
        if start < 0 or end < -1 or (end >= 0 and start > end):
            raise web.HTTPBadRequest(
                text=f"start_entry_id {start} and end_entry_id {end} do not make a range"
                + (f" within page {page}" if page > 0 else "")
            )
        async with await aio.BookKeeper.connect(metadata_uri) as client:
            try:
                await ledger_metadata(client, ledger_id)
            except CommandError as error:
                raise web.HTTPNotFound(text=str(error)) from None
            try:
                async for entry_id, payload in read_entries(
                    client, ledger_id, start, end, limit=READ_LIMIT
                ):
                    answer[str(entry_id)] = payload.decode("utf-8", errors="replace")
            except CommandError as error:
                raise web.HTTPBadRequest(text=str(error)) from None
        return _json(answer)

    app.router.add_delete(f"{PREFIX}/delete", delete)
    app.router.add_get(f"{PREFIX}/list", list_ledgers)
    app.router.add_get(f"{PREFIX}/metadata", metadata)
    app.router.add_get(f"{PREFIX}/read", read)
