"""Open with recovery on asyncio: runs the instructions of ``bookkeeper_py.core.recovery`` (where
every decision is made, reference section 3.2) over the handle's bookie connections and the
metadata store, and feeds the answers back as events."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Coroutine

from bookkeeper_py import errors
from bookkeeper_py.client.connection import BookieConnection, Callback, describe
from bookkeeper_py.client.ledger import ReadHandle
from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.core.recovery import (
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
from bookkeeper_py.metadata.port import update_ledger_metadata
from bookkeeper_py.wire.status import StatusCode

log = logging.getLogger(__name__)

Event = Callable[[LedgerRecovery], list[Instruction]]
Issue = Callable[[BookieConnection, Callback], None]  # sends one request on a connection


async def recover(handle: ReadHandle) -> None:
    """Recovers and closes the ledger of ``handle`` (whose metadata is OPEN or IN_RECOVERY);
    raises the machine's error when it cannot, leaving the ledger IN_RECOVERY.

    Reads and write-backs (nearly every instruction) go straight to the bookie connections with
    a callback that queues the answer as an event; metadata work and replacements run as tasks.
    (A task per read and per write-back was most of recovery's time.)"""
    machine = LedgerRecovery(handle.ledger_id)
    loop = asyncio.get_running_loop()
    events: collections.deque[Event] = collections.deque()
    waiting: list[asyncio.Future[None]] = []
    tasks: set[asyncio.Future[None]] = set()

    def deliver(event: Event) -> None:
        events.append(event)
        if waiting and not waiting[0].done():
            waiting[0].set_result(None)

    def spawn(work: Coroutine[None, None, Event]) -> None:
        async def run() -> None:
            try:
                event = await work
            except errors.BKError as error:
                # A metadata step that failed (the store away, a conflict past the loop's
                # bound): recovery ends with that error, the ledger left as it is for a retry.
                # (Lost here, the loop below would wait for an event for ever.)
                def failed(
                    _machine: LedgerRecovery, error: errors.BKError = error
                ) -> list[Instruction]:
                    raise error

                event = failed
            deliver(event)

        task = asyncio.ensure_future(run())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        task.add_done_callback(lambda _task: work.close())  # cancelled before it began: closed

    def send(bookie: str, issue: Issue, answered: Callback, v3: bool = False) -> None:
        handle.client.bookie_client.send(
            bookie, lambda connection: issue(connection, answered), answered, v3
        )

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
                if isinstance(instruction, ReadRequest):
                    _read(handle, instruction, send, deliver)
                elif isinstance(instruction, RecoveryAdd):
                    _write_back(handle, instruction, send, deliver)
                else:
                    spawn(_execute(handle, instruction))
            while not events:
                waiting[:] = [loop.create_future()]
                await waiting[0]
            instructions = events.popleft()(machine)
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
    metadata = handle.client.metadata_port
    if isinstance(instruction, MarkInRecovery):
        marked, _ = await update_ledger_metadata(
            metadata,
            handle.ledger_id,
            lambda current: current.state == LedgerState.OPEN,
            lambda current: current.with_state(LedgerState.IN_RECOVERY),
        )
        handle.metadata = marked
        return lambda machine: machine.on_metadata(marked)
    if isinstance(instruction, CloseInRecovery):
        closed, _ = await update_ledger_metadata(
            metadata,
            handle.ledger_id,
            lambda current: current.state == LedgerState.IN_RECOVERY,
            instruction.closed,
        )
        return lambda machine: machine.on_metadata(closed)
    assert isinstance(instruction, ReplaceInRecovery), instruction
    return await _replace(handle, instruction)


def _read(
    handle: ReadHandle,
    request: ReadRequest,
    send: Callable[[str, Issue, Callback], None],
    deliver: Callable[[Event], None],
) -> None:
    index, entry_id = request.bookie_index, request.entry_id
    key = handle.master_key if request.fence else None

    def answered(status: StatusCode | None, body: bytes | errors.BKError) -> None:
        if status is None:
            problem = f"{request.bookie}: {body!s}"
            deliver(lambda machine: machine.on_read(index, entry_id, None, problem=problem))
            return
        assert isinstance(body, bytes)
        if status != StatusCode.EOK:
            problem = f"{request.bookie}: {describe(status, body)}"
            deliver(lambda machine: machine.on_read(index, entry_id, status, problem=problem))
            return
        try:
            entry = handle.digest.verify_read(body, entry_id)
        except (ValueError, errors.DigestMismatchError) as error:
            # Corrupt data is an error, never an absence.
            problem = f"{request.bookie}: {error}"
            deliver(lambda machine: machine.on_read(index, entry_id, None, problem=problem))
            return
        deliver(lambda machine: machine.on_read(index, entry_id, StatusCode.EOK, entry, body))

    send(
        request.bookie,
        lambda connection, answer: connection.read(
            handle.ledger_id, entry_id, request.fence, key, answer
        ),
        answered,
    )


async def _replace(handle: ReadHandle, request: ReplaceInRecovery) -> Event:
    client = handle.client
    try:
        writable = await client.metadata_port.writable_bookies()
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


def _write_back(
    handle: ReadHandle,
    add: RecoveryAdd,
    send: Callable[[str, Issue, Callback, bool], None],
    deliver: Callable[[Event], None],
) -> None:
    index, entry_id = add.bookie_index, add.entry_id

    def answered(status: StatusCode | None, body: bytes | errors.BKError) -> None:
        if status is None:
            problem = f"{add.bookie}: {body!s}"
        elif status != StatusCode.EOK:
            problem = f"{add.bookie}: {describe(status, body)}"
        else:
            problem = ""
        deliver(lambda machine: machine.on_add(index, entry_id, status, problem, add.bookie))

    # Over v3, whose answers are matched by transaction id: v2 matches an add's answer by
    # (ledger, entry), and a writer of this ledger in the same client may still have its add of
    # the same entry in flight, answered EFENCED at once, which would be taken for this one's.
    send(
        add.bookie,
        lambda connection, answer: connection.add(
            handle.ledger_id, entry_id, handle.master_key, add.payload, True, answer
        ),
        answered,
        True,
    )
