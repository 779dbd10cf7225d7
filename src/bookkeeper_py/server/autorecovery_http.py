"""The ``/api/v1/autorecovery/*`` endpoints of BookKeeper's admin API (reference section 1.16), on a
bookie's HTTP port: same paths, methods, parameters and bodies as BookKeeper's HttpRouter.

* ``GET|PUT status`` (``?enabled=true|false``): {"enabled": bool}.
* ``GET list_under_replicated_ledger`` (``missingreplica``, ``excludingmissingreplica``,
  ``printmissingreplica``): a JSON list of ledger ids, or {ledger: [missing bookies]}; 404 "No
  under replicated ledgers found".
* ``GET who_is_auditor``: "Auditor: <id>"; ``PUT trigger_audit``.
* ``GET|PUT lost_bookie_recovery_delay`` (PUT body {"delay_seconds": N}).
* ``PUT bookie`` (body {"bookie_src": [ids], "delete_cookie": bool}): recovers those bookies'
  data in the background; ``PUT decommission`` (body {"bookie_src": id}): decommissions it in
  the background. As in BookKeeper they answer at once, but first refuse an id the cluster does
  not know (no cookie, not registered, in no ledger's ensemble) with 404, and one that cannot
  be a bookie id with 400: nothing is started.
* ``GET progress`` (ours, as BookKeeper's users asked in its issue 4071): the recoveries and
  decommissions this bookie started, with ledgers, entries, bytes, rate and ETA.

The background operations run on a client of their own (made for each, closed after).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bookkeeper_py import errors
from bookkeeper_py.autorecovery.replication import Progress
from bookkeeper_py.metadata.port import MetadataPort
from bookkeeper_py.metadata.underreplication import UnderReplication

log = logging.getLogger(__name__)
PREFIX = "/api/v1/autorecovery"


@dataclass
class Operation:
    number: int
    kind: str  # "recover" or "decommission"
    bookies: list[str]
    started: float = field(default_factory=time.time)
    progress: Progress = field(default_factory=Progress)
    state: str = "running"  # running, done, failed
    message: str = ""

    def as_json(self) -> dict[str, Any]:
        progress = self.progress
        return {
            "id": self.number,
            "operation": self.kind,
            "bookies": self.bookies,
            "state": self.state,
            "message": self.message,
            "startedAt": int(self.started * 1000),
            "ledgersTotal": progress.ledgers_total,
            "ledgersDone": progress.ledgers_done,
            "entriesTotal": progress.entries_total,
            "entriesDone": progress.entries_done,
            "bytesCopied": progress.bytes_done,
            "bytesPerSecond": round(progress.rate()),
            "etaSeconds": progress.eta_s(),
        }


def add_routes(app: web.Application, port: MetadataPort, metadata_uri: str) -> None:
    """Adds the endpoints over ``port`` (the bookie's metadata session); background operations
    connect to ``metadata_uri``."""
    operations: list[Operation] = []
    numbers = itertools.count(1)
    tasks: set[asyncio.Task[None]] = set()

    async def markers() -> UnderReplication:
        return await UnderReplication(port).ensure_layout()

    async def status(request: web.Request) -> web.Response:
        found = await markers()
        if request.method == "PUT":
            wanted = request.query.get("enabled", "").lower()
            if wanted not in ("true", "false"):
                raise web.HTTPBadRequest(text="give ?enabled=true or ?enabled=false")
            await found.set_enabled(wanted == "true")
        return web.json_response({"enabled": await found.is_enabled()})

    async def list_under_replicated(request: web.Request) -> web.Response:
        found = await markers()
        including = request.query.get("missingreplica")
        excluding = request.query.get("excludingmissingreplica")
        detailed = "printmissingreplica" in request.query
        ledgers: dict[str, list[str]] = {}
        for ledger_id in await found.marked():
            replicas = await found.missing_replicas(ledger_id)
            if replicas is None:
                continue
            if including and including not in replicas:
                continue
            if excluding and excluding in replicas:
                continue
            ledgers[str(ledger_id)] = replicas
        if not ledgers:
            raise web.HTTPNotFound(text="No under replicated ledgers found")
        if detailed:
            return web.json_response(ledgers)
        return web.json_response([int(ledger_id) for ledger_id in ledgers])

    async def who_is_auditor(request: web.Request) -> web.Response:
        auditor = await (await markers()).auditor()
        if auditor is None:
            raise web.HTTPNotFound(text="No auditor elected")
        return web.Response(text=f"Auditor: {auditor}")

    async def trigger_audit(request: web.Request) -> web.Response:
        await (await markers()).trigger_audit()
        return web.Response(text="Success trigger audit.")

    async def lost_bookie_recovery_delay(request: web.Request) -> web.Response:
        found = await markers()
        if request.method == "PUT":
            body = await _json(request)
            delay = body.get("delay_seconds") if isinstance(body, dict) else None
            if not isinstance(delay, int) or isinstance(delay, bool) or delay < 0:
                raise web.HTTPBadRequest(
                    text='expected a JSON body {"delay_seconds": N} with N seconds, 0 or more'
                )
            await found.set_lost_bookie_recovery_delay(delay)
            return web.Response(text=f"Success set lostBookieRecoveryDelay to {delay}")
        delay, _ = await found.lost_bookie_recovery_delay()
        return web.Response(text=f"lostBookieRecoveryDelay value: {delay}")

    async def refuse_unknown(bookies: list[str]) -> None:
        from bookkeeper_py.autorecovery import admin

        try:
            await admin.check_known(port, bookies)
        except admin.UnknownBookieError as error:
            raise web.HTTPNotFound(text=str(error)) from None
        except errors.IncorrectParameterError as error:
            raise web.HTTPBadRequest(text=str(error)) from None

    def start(kind: str, bookies: list[str], work: Any) -> Operation:
        operation = Operation(next(numbers), kind, bookies)
        operations.append(operation)
        del operations[:-100]  # the newest hundred

        async def run() -> None:
            from bookkeeper_py.client.client import BookKeeper

            try:
                async with BookKeeper(metadata_uri) as client:
                    operation.message = await work(client, operation)
                operation.state = "done"
            except (errors.BKError, OSError) as error:
                operation.state, operation.message = "failed", str(error)
                log.warning("%s of %s failed: %s", kind, ", ".join(bookies), error)
            finally:
                operation.progress.finish()  # its rate is that of the whole run from now on

        task = asyncio.ensure_future(run())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return operation

    async def recover_bookie(request: web.Request) -> web.Response:
        from bookkeeper_py.autorecovery import admin

        body = await _json(request)
        sources = body.get("bookie_src") if isinstance(body, dict) else None
        if isinstance(sources, str):
            sources = [sources]
        if not sources or not all(isinstance(one, str) for one in sources):
            raise web.HTTPBadRequest(
                text='expected a JSON body {"bookie_src": ["host:port", ...], '
                '"delete_cookie": false}'
            )
        delete_cookie = bool(body.get("delete_cookie", False))
        await refuse_unknown(sources)

        async def work(client: Any, operation: Operation) -> str:
            report = await admin.recover(
                client, sources, on_progress=lambda p: setattr(operation, "progress", p)
            )
            if report.failed:
                raise errors.ReplicationError(
                    f"{len(report.failed)} ledgers could not be recovered: "
                    + "; ".join(f"{lid}: {why}" for lid, why in report.failed.items())
                )
            if delete_cookie:
                for bookie in sources:
                    try:
                        await client.metadata_port.delete_node(
                            f"{client.metadata_port.ledgers_root}/cookies/{bookie}"
                        )
                    except errors.BKError:
                        pass
            return f"recovered {len(report.whole)} of {len(report.planned)} ledgers"

        operation = start("recover", list(sources), work)
        return web.json_response(
            {"message": "Success send recovery request command.", "id": operation.number}
        )

    async def decommission(request: web.Request) -> web.Response:
        from bookkeeper_py.autorecovery import admin

        body = await _json(request)
        bookie = body.get("bookie_src") if isinstance(body, dict) else None
        if not isinstance(bookie, str) or not bookie:
            raise web.HTTPBadRequest(text='expected a JSON body {"bookie_src": "host:port"}')
        await refuse_unknown([bookie])

        async def work(client: Any, operation: Operation) -> str:
            report = await admin.decommission(
                client, bookie, on_progress=lambda p: setattr(operation, "progress", p)
            )
            return f"decommissioned in {report.rounds} rounds"

        operation = start("decommission", [bookie], work)
        return web.json_response(
            {
                "message": f"Success send decommission Bookie command {bookie}",
                "id": operation.number,
            }
        )

    async def progress(request: web.Request) -> web.Response:
        return web.json_response([operation.as_json() for operation in operations])

    router = app.router
    router.add_route("GET", f"{PREFIX}/status", status)
    router.add_route("PUT", f"{PREFIX}/status", status)
    router.add_get(f"{PREFIX}/list_under_replicated_ledger", list_under_replicated)
    router.add_get(f"{PREFIX}/who_is_auditor", who_is_auditor)
    router.add_put(f"{PREFIX}/trigger_audit", trigger_audit)
    router.add_route("GET", f"{PREFIX}/lost_bookie_recovery_delay", lost_bookie_recovery_delay)
    router.add_route("PUT", f"{PREFIX}/lost_bookie_recovery_delay", lost_bookie_recovery_delay)
    router.add_put(f"{PREFIX}/bookie", recover_bookie)
    router.add_put(f"{PREFIX}/decommission", decommission)
    router.add_get(f"{PREFIX}/progress", progress)


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError as error:
        raise web.HTTPBadRequest(text=f"the request body is not JSON: {error}") from error
