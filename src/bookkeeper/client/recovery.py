"""Open with recovery, as reference section 3.2 describes it.

1. Mark the metadata IN_RECOVERY (CAS, only from OPEN); a live writer's next metadata change fails.
2. Fence and read the LAC from every bookie of the last ensemble until the ensemble is covered.
3. Start from max(LAC, first entry of the last fragment - 1): earlier fragments are immutable.
4. Read forward with fencing reads; an entry is absent only once Qw-Qa+1 bookies of its write set
   say so explicitly (errors are not absence); every entry found is written back with
   RECOVERY_ADD to its whole write set and must reach Qa acks.
5. Close with a CAS that only applies while the ledger is IN_RECOVERY; if someone else closed it,
   their close stands.
"""

from __future__ import annotations

import asyncio
import logging

from bookkeeper import errors
from bookkeeper.client.connection import describe
from bookkeeper.client.ledger import RECOVERY_READ_WINDOW, ReadHandle
from bookkeeper.core.metadata import LedgerMetadata, LedgerState
from bookkeeper.core.quorum import AckSet, negative_threshold, write_set
from bookkeeper.wire.digest import Entry
from bookkeeper.wire.status import StatusCode

log = logging.getLogger(__name__)

_ABSENT = None


async def recover(handle: ReadHandle) -> None:
    """Recovers and closes the ledger of ``handle`` (whose metadata is OPEN or IN_RECOVERY)."""
    client = handle._client
    ledger_id = handle.ledger_id
    metadata, _ = await asyncio.to_thread(
        client.metadata.update_ledger_metadata,
        ledger_id,
        lambda current: current.state == LedgerState.OPEN,
        lambda current: current.with_state(LedgerState.IN_RECOVERY),
    )
    handle.metadata = metadata
    if metadata.is_closed:
        handle.last_add_confirmed, handle.length = metadata.last_entry_id, metadata.length
        return

    seen_lac, last_entry_lengths = await handle._last_confirmed(fence=True)
    first_of_last, _ = metadata.last_ensemble
    lac = max(seen_lac, first_of_last - 1)
    if lac < 0:
        length = 0
    elif lac in last_entry_lengths:
        length = last_entry_lengths[lac]
    else:
        length = (await handle.read_entry_from_replicas(lac)).length
    log.info("ledger %d: recovery starts after entry %d (length %d)", ledger_id, lac, length)

    last, length = await _read_forward(handle, metadata, lac, length)

    def still_in_recovery(current: LedgerMetadata) -> bool:
        return current.state == LedgerState.IN_RECOVERY

    metadata, _ = await asyncio.to_thread(
        client.metadata.update_ledger_metadata,
        ledger_id,
        still_in_recovery,
        lambda current: current.closed_at(last, length),
    )
    handle.metadata = metadata
    handle.last_add_confirmed, handle.length = metadata.last_entry_id, metadata.length
    log.info(
        "ledger %d: recovered and closed at entry %d, length %d",
        ledger_id,
        metadata.last_entry_id,
        metadata.length,
    )


async def _read_forward(
    handle: ReadHandle, metadata: LedgerMetadata, lac: int, length: int
) -> tuple[int, int]:
    """Reads entries after ``lac`` until the first absent one, writing each back; returns (last, length)."""
    last = lac
    reads: dict[int, asyncio.Future[tuple[Entry, bytes] | None]] = {}
    writes: list[asyncio.Future[None]] = []
    next_to_schedule = lac + 1
    try:
        while True:
            while next_to_schedule <= last + RECOVERY_READ_WINDOW:
                reads[next_to_schedule] = asyncio.ensure_future(
                    _recovery_read(handle, metadata, next_to_schedule)
                )
                next_to_schedule += 1
            found = await reads.pop(last + 1)
            if found is _ABSENT:
                break
            entry, raw = found
            if entry.entry_id != last + 1:
                raise errors.LedgerRecoveryError(
                    f"ledger {handle.ledger_id}: expected entry {last + 1} in recovery, read {entry.entry_id}"
                )
            writes.append(
                asyncio.ensure_future(_recovery_write(handle, metadata, entry.entry_id, raw))
            )
            last, length = entry.entry_id, entry.length
        await asyncio.gather(*writes)
    finally:
        for read in reads.values():
            read.cancel()
        for write in writes:
            write.cancel()
    return last, length


async def _recovery_read(
    handle: ReadHandle, metadata: LedgerMetadata, entry_id: int
) -> tuple[Entry, bytes] | None:
    """The entry from any replica (fencing reads), or None once enough replicas said it is absent."""
    ensemble = metadata.ensemble_at(entry_id)
    members = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum_size)
    threshold = negative_threshold(metadata.write_quorum_size, metadata.ack_quorum_size)
    negatives = 0
    problems: list[str] = []

    async def ask(bookie: str) -> tuple[str, StatusCode | None, bytes | Exception]:
        try:
            status, body = await handle._read_from(bookie, entry_id, True)
            return bookie, status, body
        except errors.BKError as error:
            return bookie, None, error

    pending = {asyncio.ensure_future(ask(ensemble[index])) for index in members}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                bookie, status, body = task.result()
                if status == StatusCode.EOK:
                    assert isinstance(body, bytes)
                    try:
                        return handle._digest.verify(body, entry_id), body
                    except errors.DigestMismatchError as error:
                        problems.append(f"{bookie}: {error}")
                elif status in (StatusCode.ENOENTRY, StatusCode.ENOLEDGER):
                    negatives += 1
                    if negatives >= threshold:
                        return _ABSENT
                elif status == StatusCode.EUA:
                    raise errors.UnauthorizedAccessError(
                        f"bookie {bookie} refused ledger {handle.ledger_id}: wrong password"
                    )
                else:
                    problems.append(f"{bookie}: {describe(status, body)}")
    finally:
        for task in pending:
            task.cancel()
    raise errors.LedgerRecoveryError(
        f"ledger {handle.ledger_id}: cannot tell whether entry {entry_id} exists: only {negatives} of "
        f"{threshold} needed bookies said it is absent, others failed ({'; '.join(problems)}); "
        "the ledger stays IN_RECOVERY, retry when the bookies are back"
    )


async def _recovery_write(
    handle: ReadHandle, metadata: LedgerMetadata, entry_id: int, raw: bytes
) -> None:
    """Writes ``raw`` back with RECOVERY_ADD to the whole write set; returns once Qa acked it."""
    ensemble = metadata.ensemble_at(entry_id)
    members = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum_size)
    acks = AckSet(metadata.write_quorum_size, metadata.ack_quorum_size)
    problems: list[str] = []

    async def write(index: int) -> tuple[int, StatusCode | None, object]:
        bookie = ensemble[index]
        try:
            status, _ = await handle._request(
                bookie,
                lambda connection, answered: connection.add(
                    handle.ledger_id, entry_id, handle._master_key, raw, True, answered
                ),
            )
            return index, status, None
        except errors.BKError as error:
            return index, None, error

    pending = {asyncio.ensure_future(write(index)) for index in members}
    try:
        while pending and not acks.complete:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                index, status, problem = task.result()
                if status == StatusCode.EOK:
                    acks.ack(index)
                else:
                    acks.fail(index)
                    problems.append(f"{ensemble[index]}: {describe(status, problem)}")
    finally:
        for task in pending:
            task.cancel()
    if not acks.complete:
        raise errors.LedgerRecoveryError(
            f"ledger {handle.ledger_id}: recovery write of entry {entry_id} did not reach its ack quorum: "
            f"{'; '.join(problems)}"
        )
