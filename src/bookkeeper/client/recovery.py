"""Open with recovery on asyncio: runs the instructions of ``bookkeeper.core.recovery`` (where
every decision is made, reference section 3.2) over the handle's bookie connections and the
metadata store, and feeds the answers back as events."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine

from bookkeeper import errors
from bookkeeper.client.connection import describe
from bookkeeper.client.ledger import ReadHandle
from bookkeeper.core.metadata import LedgerMetadata, LedgerState
from bookkeeper.core.recovery import (
    CloseInRecovery,
    Instruction,
    LedgerRecovery,
    MarkInRecovery,
    ReadRequest,
    RecoveryAdd,
    RecoveryDone,
    RecoveryFailed,
    ReplaceInRecovery,
)
from bookkeeper.wire.status import StatusCode

log = logging.getLogger(__name__)

Event = Callable[[LedgerRecovery], list[Instruction]]


async def recover(handle: ReadHandle) -> None:
    """Recovers and closes the ledger of ``handle`` (whose metadata is OPEN or IN_RECOVERY);
    raises the machine's error when it cannot, leaving the ledger IN_RECOVERY."""
    machine = LedgerRecovery(handle.ledger_id)
    events: asyncio.Queue[Event] = asyncio.Queue()
    tasks: set[asyncio.Task[None]] = set()

    def spawn(work: Coroutine[None, None, Event]) -> None:
        async def deliver() -> None:
            events.put_nowait(await work)

        task = asyncio.ensure_future(deliver())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    try:
        instructions = machine.start()
        # Every request carries a timeout and every answer is an event, so this loop ends with
        # the machine's verdict; the count bound is a safety net only.
        for _ in range(100_000_000):
            for instruction in instructions:
                if isinstance(instruction, RecoveryDone):
                    _adopt(handle, instruction.metadata)
                    return
                if isinstance(instruction, RecoveryFailed):
                    raise instruction.error
                spawn(_execute(handle, instruction))
            event = await events.get()
            instructions = event(machine)
        raise errors.LedgerRecoveryError(f"ledger {handle.ledger_id}: recovery did not end")
    finally:
        for task in tasks:
            task.cancel()


def _adopt(handle: ReadHandle, metadata: LedgerMetadata) -> None:
    handle.metadata = metadata
    handle.last_add_confirmed, handle.length = metadata.last_entry_id, metadata.length
    log.info(
        "ledger %d: recovered, closed at entry %d, length %d",
        handle.ledger_id,
        metadata.last_entry_id,
        metadata.length,
    )


async def _execute(handle: ReadHandle, instruction: Instruction) -> Event:
    """Carries out one instruction; returns the event that reports its outcome."""
    metadata_client = handle._client.metadata
    if isinstance(instruction, MarkInRecovery):
        marked, _ = await asyncio.to_thread(
            metadata_client.update_ledger_metadata,
            handle.ledger_id,
            lambda current: current.state == LedgerState.OPEN,
            lambda current: current.with_state(LedgerState.IN_RECOVERY),
        )
        handle.metadata = marked
        return lambda machine: machine.on_metadata(marked)
    if isinstance(instruction, CloseInRecovery):
        closed, _ = await asyncio.to_thread(
            metadata_client.update_ledger_metadata,
            handle.ledger_id,
            lambda current: current.state == LedgerState.IN_RECOVERY,
            instruction.closed,
        )
        return lambda machine: machine.on_metadata(closed)
    if isinstance(instruction, ReplaceInRecovery):
        return await _replace(handle, instruction)
    if isinstance(instruction, ReadRequest):
        return await _read(handle, instruction)
    assert isinstance(instruction, RecoveryAdd), instruction
    return await _write_back(handle, instruction)


async def _read(handle: ReadHandle, request: ReadRequest) -> Event:
    index, entry_id = request.bookie_index, request.entry_id
    try:
        status, body = await handle._read_from(request.bookie, entry_id, request.fence)
    except errors.BKError as error:
        problem = f"{request.bookie}: {error}"
        return lambda machine: machine.on_read(index, entry_id, None, problem=problem)
    if status != StatusCode.EOK:
        problem = f"{request.bookie}: {describe(status, body)}"
        return lambda machine: machine.on_read(index, entry_id, status, problem=problem)
    try:
        entry = handle._digest.verify_read(body, entry_id)
    except (ValueError, errors.DigestMismatchError) as error:
        # Corrupt data is an error, never an absence.
        problem = f"{request.bookie}: {error}"
        return lambda machine: machine.on_read(index, entry_id, None, problem=problem)
    return lambda machine: machine.on_read(index, entry_id, StatusCode.EOK, entry, body)


async def _replace(handle: ReadHandle, request: ReplaceInRecovery) -> Event:
    client = handle._client
    try:
        writable = await asyncio.to_thread(client.bookies.writable)
        ensemble = client.placement.replace(
            request.ensemble,
            request.failed,
            writable,
            quarantined=client.quarantine.quarantined(client.now_ms()),
            write_quorum_size=handle.metadata.write_quorum_size,
        )
    except errors.BKError as error:
        failure = error
        return lambda machine: machine.on_replacement_failed(failure)
    log.info(
        "ledger %d: recovery replaces %s with %s (in memory until the close)",
        handle.ledger_id,
        sorted(request.failed.values()),
        list(ensemble),
    )
    return lambda machine: machine.on_replacement(ensemble)


async def _write_back(handle: ReadHandle, add: RecoveryAdd) -> Event:
    index, entry_id = add.bookie_index, add.entry_id
    try:
        status, body = await handle._request(
            add.bookie,
            lambda connection, answered: connection.add(
                handle.ledger_id, entry_id, handle._master_key, add.payload, True, answered
            ),
        )
    except errors.BKError as error:
        problem = f"{add.bookie}: {error}"
        return lambda machine: machine.on_add(index, entry_id, None, problem, add.bookie)
    problem = "" if status == StatusCode.EOK else f"{add.bookie}: {describe(status, body)}"
    return lambda machine: machine.on_add(index, entry_id, status, problem, add.bookie)
