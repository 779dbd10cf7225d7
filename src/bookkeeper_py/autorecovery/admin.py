"""The operator's re-replication: ``recover`` (copy a lost bookie's data now, synchronously, with
progress and ETA, or list what would be copied) and ``decommission`` (move a bookie's data away,
then remove it from the cluster). The shell and the REST API call these.

Decommissioning a *live* bookie (BookKeeper refuses one) goes through the metadata store: the
bookie is told it is draining and turns read-only, so writers move their ledgers away and
placement skips it; its data is copied to other bookies (it stays a source meanwhile); once no
ledger names it its cookie is deleted and it is told it is done, and its process stops.

An id this cluster does not know (no cookie, no registration, in no ledger's ensemble) is refused
before anything starts, by ``check_known``: ``decommission`` calls it, and so do the shell and the
REST API before they call ``plan`` or ``recover`` (which would "recover 0 of 0 ledgers" for a
mistyped id, as if it had worked).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field

from bookkeeper_py import errors
from bookkeeper_py.autorecovery.replication import (
    Fragment,
    Progress,
    ReplicationOptions,
    Replicator,
    short_fragments,
)
from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.metadata.driver import NoNodeError
from bookkeeper_py.metadata.port import MetadataPort
from bookkeeper_py.metadata.underreplication import UnderReplication

log = logging.getLogger(__name__)

ProgressCallback = Callable[[Progress], None]


# A bookie id names nodes in the metadata store (its cookie, its registration): no "/", no blanks
# or control characters (and it cannot be "readonly", the read-only registrations' node).
_NOT_IN_AN_ID = re.compile(r"[/\s\x00-\x1f\x7f]")


class UnknownBookieError(errors.IncorrectParameterError):
    """Bookie ids this cluster does not know (no cookie, not registered, in no ledger's
    ensemble): refused before anything starts."""

    def __init__(self, bookie_ids: Sequence[str]) -> None:
        self.bookie_ids = tuple(bookie_ids)
        super().__init__(
            f"no bookie {', '.join(self.bookie_ids)} in this cluster (not registered, no cookie, "
            "in no ledger's ensemble): nothing was started; check the id with listbookies"
        )


async def check_known(port: MetadataPort, bookies: Collection[str]) -> None:
    """Refuses what is not the id of a bookie this cluster knows: ``IncorrectParameterError``
    for an id that cannot be one (empty, blank, a "/"), ``UnknownBookieError`` for ids with no
    cookie, no registration (available or read-only) and in no ledger's ensemble. A bookie that
    is stopped but still in ensembles, or still has its cookie, is known. Changes nothing; reads
    every ledger's metadata only for ids with neither a cookie nor a registration."""
    wanted = list(dict.fromkeys(bookies))
    for bookie in wanted:
        if not bookie or bookie == "readonly" or _NOT_IN_AN_ID.search(bookie):
            raise errors.IncorrectParameterError(
                f"{bookie!r} is not a bookie id (host:port, or the bookieId a bookie was given)"
            )
    writable, readonly = await port.bookies_now()
    registered = {*writable, *readonly}
    unknown = []
    for bookie in wanted:
        if bookie in registered:
            continue
        try:
            await port.get_node(f"{port.ledgers_root}/cookies/{bookie}")
        except NoNodeError:
            unknown.append(bookie)
    if unknown:
        named = await _in_ensembles(port, set(unknown))
        unknown = [bookie for bookie in unknown if bookie not in named]
    if unknown:
        raise UnknownBookieError(unknown)


async def _in_ensembles(port: MetadataPort, bookies: set[str]) -> set[str]:
    """Those of ``bookies`` that some ledger's ensembles (any fragment) hold."""
    found: set[str] = set()
    for ledger_id in await port.list_ledgers():
        try:
            metadata, _ = await port.read_ledger_metadata(ledger_id)
        except errors.NoSuchLedgerError:
            continue  # deleted while we listed
        found |= metadata.bookies() & bookies
        if found == bookies:
            break
    return found


@dataclass(frozen=True)
class PlannedLedger:
    """A ledger with copies on the bookies being recovered: its short fragments, whether it is
    open with its writer's fragment on them, and the entries to copy."""

    ledger_id: int
    closed: bool
    fragments: tuple[Fragment, ...]
    open_short: bool
    entries: int


@dataclass
class RecoveryReport:
    planned: list[PlannedLedger] = field(default_factory=list)
    whole: list[int] = field(default_factory=list)  # ledgers no longer on the bookies
    left_open: list[int] = field(default_factory=list)  # open, their writer's part skipped
    failed: dict[int, str] = field(default_factory=dict)  # ledger -> why
    progress: Progress = field(default_factory=Progress)


async def plan(
    client: BookKeeper, bookies: Collection[str], ledger_id: int | None = None
) -> list[PlannedLedger]:
    """The ledgers (or the one ``ledger_id``) with a fragment on ``bookies``, and what of them
    would be copied. Changes nothing."""
    leaving = set(bookies)
    port = client.metadata_port
    ids = [ledger_id] if ledger_id is not None else await port.list_ledgers()
    found = []
    for one in ids:
        try:
            metadata, _ = await port.read_ledger_metadata(one)
        except errors.NoSuchLedgerError:
            if ledger_id is not None:
                raise
            continue
        if not metadata.bookies() & leaving:
            continue
        short, open_short = short_fragments(metadata, lambda bookie: bookie in leaving)
        entries = sum(len(fragment.entries(metadata.write_quorum_size)) for fragment in short)
        found.append(PlannedLedger(one, metadata.is_closed, tuple(short), open_short, entries))
    return found


async def recover(
    client: BookKeeper,
    bookies: Collection[str],
    *,
    skip_open: bool = False,
    ledger_id: int | None = None,
    options: ReplicationOptions | None = None,
    on_progress: ProgressCallback | None = None,
    progress_interval_s: float = 1.0,
) -> RecoveryReport:
    """Copies every copy that ``bookies`` held to other bookies now (BookKeeper's
    ``recoverBookieData``), ledger by ledger. Open ledgers whose writer's fragment is on them are
    fenced and recovered first, unless ``skip_open`` (their other fragments are still copied).
    A ledger that cannot be made whole is reported in ``failed`` and the others go on.
    ``on_progress(progress)`` is called every ``progress_interval_s`` and at the end. The ids
    are not checked here: callers refuse unknown ones first with ``check_known``."""
    leaving = set(bookies)
    report = RecoveryReport()
    report.planned = await plan(client, leaving, ledger_id)
    progress = report.progress
    progress.ledgers_total = len(report.planned)
    progress.entries_total = sum(ledger.entries for ledger in report.planned)
    replicator = Replicator(client, options)
    ticker = _ticker(progress, on_progress, progress_interval_s)
    try:
        for planned in report.planned:
            try:
                outcome = await replicator.replicate(
                    planned.ledger_id, leaving, fence_open=not skip_open, progress=progress
                )
            except errors.BKError as error:
                report.failed[planned.ledger_id] = str(error)
                log.warning("recover: ledger %d: %s", planned.ledger_id, error)
            else:
                if outcome.whole:
                    report.whole.append(planned.ledger_id)
                elif outcome.waiting_for_writer:
                    report.left_open.append(planned.ledger_id)
                else:
                    report.failed[planned.ledger_id] = (
                        "still names a lost bookie after copying (another bookie was lost "
                        "meanwhile?); run recover again"
                    )
            progress.ledgers_done += 1
    finally:
        ticker.cancel()
        if on_progress is not None:
            on_progress(progress)
    return report


def _ticker(
    progress: Progress, on_progress: ProgressCallback | None, interval_s: float
) -> asyncio.Task[None]:
    async def tick() -> None:
        while on_progress is not None:
            await asyncio.sleep(interval_s)
            on_progress(progress)

    return asyncio.ensure_future(tick())


@dataclass
class DecommissionReport:
    bookie_id: str
    was_live: bool
    rounds: int = 0
    recovery: RecoveryReport = field(default_factory=RecoveryReport)


async def decommission(
    client: BookKeeper,
    bookie_id: str,
    *,
    open_ledger_grace_s: float = 30.0,
    timeout_s: float = 3600.0,
    options: ReplicationOptions | None = None,
    on_progress: ProgressCallback | None = None,
) -> DecommissionReport:
    """Moves every copy ``bookie_id`` holds to other bookies and removes it from the cluster
    (its cookie; a live bookie is made read-only first and told to stop at the end). Open
    ledgers on it get ``open_ledger_grace_s`` for their writers to move away before they are
    fenced. ``ReplicationError`` when its data could not all be moved within ``timeout_s``
    (the bookie stays, read-only if it was live: run the command again)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    port = client.metadata_port
    await check_known(port, [bookie_id])
    markers = await UnderReplication(port).ensure_layout()
    writable, readonly = await port.bookies_now()
    report = DecommissionReport(bookie_id, bookie_id in writable or bookie_id in readonly)
    if report.was_live:
        await markers.set_decommission_state(bookie_id, "draining")
        await _wait_for(
            lambda: _registered_read_only(client, bookie_id),
            30.0,
            f"bookie {bookie_id} did not turn read-only within 30 s (is it an older version?)",
        )
    while True:
        report.rounds += 1
        elapsed = loop.time() - started
        report.recovery = await recover(
            client,
            {bookie_id},
            skip_open=elapsed < open_ledger_grace_s,
            options=options,
            on_progress=on_progress,
        )
        if not await plan(client, {bookie_id}):
            break
        if loop.time() - started > timeout_s:
            raise errors.ReplicationError(
                f"bookie {bookie_id}: ledgers still name it after {timeout_s:.0f} s "
                f"({', '.join(map(str, report.recovery.failed)) or 'open ledgers'}); it stays "
                "in the cluster: run decommissionbookie again"
            )
        await asyncio.sleep(1.0)
    try:
        await port.delete_node(f"{port.ledgers_root}/cookies/{bookie_id}")
    except NoNodeError:
        pass
    if report.was_live:
        await markers.set_decommission_state(bookie_id, "done")
        await _wait_for(
            lambda: _registered_at_all(client, bookie_id, negate=True),
            60.0,
            f"bookie {bookie_id} holds no data and its cookie is gone, but its process did not "
            "stop within 60 s; stop it by hand",
        )
    await markers.set_decommission_state(bookie_id, None)
    return report


async def _registered_read_only(client: BookKeeper, bookie_id: str) -> bool:
    _, readonly = await client.metadata_port.bookies_now()
    return bookie_id in readonly


async def _registered_at_all(client: BookKeeper, bookie_id: str, negate: bool = False) -> bool:
    writable, readonly = await client.metadata_port.bookies_now()
    return (bookie_id in writable or bookie_id in readonly) != negate


async def _wait_for(check: Callable[[], Awaitable[bool]], timeout_s: float, failure: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        if loop.time() > deadline:
            raise errors.ReplicationError(failure)
        await asyncio.sleep(0.1)
