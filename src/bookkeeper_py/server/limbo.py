"""Limbo: a bookie that lost journal records it may have acknowledged does not answer "no such
entry" for them (the design's rule: absence is not evidence) until it has repaired its ledgers
from the other replicas. Apache BookKeeper calls this state limbo and repairs it with its
data-integrity checker.

A bookie enters limbo when journal replay cut a damaged tail off (a torn write, or a corrupt
group that was acknowledged: the two cannot be told apart) or found journal files missing after
the LastLogMark. The state is kept in ``<ledger directory>/limbo`` (one JSON line: when and why),
written before the bookie serves and deleted once every ledger is repaired, so a crash during
the repair keeps it. While in limbo, a read whose answer would be absence (ENOENTRY, ENOLEDGER),
a read of "the last entry", and a listing of a ledger's entries answer EUNKNOWNLEDGERSTATE for
every ledger not repaired yet; entries the bookie holds are served as usual. Readers and
recovery count that answer as an error, never as absence.

The repair (``repair``) runs in the bookie process: for each ledger of the metadata store with
this bookie in a fragment, every entry the bookie should hold (its write sets) and does not is
read as stored from another replica, its digest checked, and stored here as a recovery add; then
the ledger is repaired. In the last fragment of an open ledger "should hold" means up to the
highest entry another member of the fragment holds: with Qa >= 2 an entry acknowledged with this
bookie's copy has another copy there. Open ledgers with Qa = 1 wait for their close (their
entry could have been acknowledged by this bookie alone). Ledgers deleted meanwhile, or without
this bookie, need nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time

from bookkeeper_py import errors
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.storage.files import fsync_directory, write_atomically
from bookkeeper_py.wire.digest import master_key
from bookkeeper_py.wire.status import StatusCode

log = logging.getLogger(__name__)

LIMBO_FILE = "limbo"
RETRY_INTERVAL_S = 5.0


class Limbo:
    """The persisted limbo state of one bookie, and the ledgers repaired so far."""

    def __init__(self, ledger_directory: str) -> None:
        self.path = os.path.join(ledger_directory, LIMBO_FILE)
        self.active = os.path.exists(self.path)
        self.reason = ""
        if self.active:
            try:
                with open(self.path, encoding="utf-8") as handle:
                    self.reason = str(json.loads(handle.read() or "{}").get("reason", ""))
            except (OSError, ValueError):
                self.reason = "(unreadable limbo file)"
        self.repaired: set[int] = set()

    def enter(self, reason: str) -> None:
        """Persists the state (before the bookie serves anything)."""
        line = json.dumps({"since": time.time(), "reason": reason}) + "\n"
        write_atomically(self.path, line.encode())
        self.active, self.reason = True, reason
        self.repaired.clear()

    def unknown(self, ledger_id: int) -> bool:
        """Whether this bookie's absence answers for ``ledger_id`` cannot be trusted."""
        return self.active and ledger_id not in self.repaired

    def leave(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        fsync_directory(os.path.dirname(self.path))
        self.active = False


async def repair(bookie, client, bookie_id: str) -> None:  # type: ignore[no-untyped-def]
    """Repairs every ledger of ``bookie`` (a ``server.bookie.Bookie`` in limbo) from the other
    replicas, through ``client`` (an ``aio.BookKeeper``), until none is left; then leaves limbo.
    Runs until done or cancelled (the bookie stops)."""
    limbo: Limbo = bookie.limbo
    metadata = client.metadata_port
    rounds = 0
    while limbo.active:
        rounds += 1
        waiting = 0
        ledger_ids = await metadata.list_ledgers()
        for ledger_id in ledger_ids:
            if ledger_id in limbo.repaired:
                continue
            try:
                ledger, _ = await metadata.read_ledger_metadata(ledger_id)
            except errors.NoSuchLedgerError:
                limbo.repaired.add(ledger_id)  # deleted: nothing to answer for
                continue
            if not any(bookie_id in ensemble for _, ensemble in ledger.ensembles):
                limbo.repaired.add(ledger_id)
                continue
            if not ledger.stores_password:
                waiting += 1  # no password in the metadata: its digests cannot be checked
                continue
            try:
                copied = await _repair_ledger(bookie, client, bookie_id, ledger)
            except _NotYet as error:
                waiting += 1
                log.debug("limbo: %s", error)
                continue
            except errors.BKError as error:
                waiting += 1
                log.warning("limbo: ledger %d not repaired yet: %s", ledger_id, error)
                continue
            limbo.repaired.add(ledger_id)
            if copied:
                log.info("limbo: ledger %d repaired, %d entries copied back", ledger_id, copied)
        if waiting == 0:
            await asyncio.to_thread(limbo.leave)
            log.warning(
                "limbo: every ledger repaired (%d rounds); absence answers are trusted again",
                rounds,
            )
            return
        log.info(
            "limbo: %d ledgers wait for their close or a replica; next round in %.0f s",
            waiting,
            RETRY_INTERVAL_S,
        )
        await asyncio.sleep(RETRY_INTERVAL_S)


class _NotYet(errors.BKError):
    """The ledger cannot be repaired yet; it stays in limbo until a later round."""


async def _repair_ledger(bookie, client, bookie_id: str, ledger: LedgerMetadata) -> int:  # type: ignore[no-untyped-def]
    """Copies back the entries of ``ledger`` this bookie should hold and does not: every entry
    of its write sets in the fragments that ended (all of them once the ledger is closed), and,
    in the last fragment of an open ledger, those up to the highest entry any other member of
    that fragment holds. With Qa >= 2 an entry this bookie acknowledged was acknowledged by
    another member too, so nothing acknowledged lies beyond that; with Qa = 1 it may have been
    this bookie's alone, and the ledger waits for its close."""
    ledger_id = ledger.ledger_id
    try:
        held = set(await asyncio.to_thread(lambda: list(bookie.engine.entry_ids(ledger_id))))
    except Exception:  # NoLedgerError: the ledger itself was lost here
        held = set()
    handle = await client.open_ledger_no_recovery(ledger_id, ledger.password)
    starts = [start for start, _ in ledger.ensembles]
    wanted: list[int] = []
    for position, (start, ensemble) in enumerate(ledger.ensembles):
        if bookie_id not in ensemble:
            continue
        if position + 1 < len(starts):
            end = starts[position + 1] - 1
        elif ledger.is_closed:
            end = ledger.last_entry_id
        elif ledger.ack_quorum_size < 2:
            raise _NotYet(f"ledger {ledger_id} is open with Qa = 1: waiting for its close")
        else:
            others = [member for member in ensemble if member != bookie_id]
            end = max([-1, *[await handle.last_entry_on(member) for member in others]])
        index = ensemble.index(bookie_id)
        for entry_id in range(start, end + 1):
            if entry_id not in held and index in write_set(
                entry_id, ledger.ensemble_size, ledger.write_quorum_size
            ):
                wanted.append(entry_id)
    key = master_key(ledger.password)
    loop = asyncio.get_running_loop()
    for entry_id in wanted:
        stored = await handle.read_stored_entry(entry_id, exclude={bookie_id})
        answer: asyncio.Future[StatusCode] = loop.create_future()
        bookie.add_entry(ledger_id, entry_id, key, stored, True, answer.set_result)
        status = await answer
        if status != StatusCode.EOK:
            raise errors.BookieIOError(
                f"ledger {ledger_id} entry {entry_id}: storing the copy failed ({status.name})"
            )
    return len(wanted)
