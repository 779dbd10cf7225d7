"""Reading a ledger's entries as an administrator (BookKeeper's ``shell readledger`` and the
``/api/v1/ledger/read`` endpoint): through the client (the entries up to the last confirmed one,
without fencing a live writer, or after recovering the ledger), or as one bookie stores them.
The ledger's own password comes from its metadata (legacy ledgers, whose metadata keeps none,
need it given). Every entry's digest is checked."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from bookkeeper_py import errors
from bookkeeper_py.admin import CommandError
from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.wire.digest import DigestManager, DigestType
from bookkeeper_py.wire.status import StatusCode

# Entries asked of the client at a time: bounded memory for a range of any length.
READ_CHUNK = 1000
HEX_LINE = 16  # bytes per line of a hex dump


async def ledger_metadata(client: BookKeeper, ledger_id: int) -> LedgerMetadata:
    try:
        return await client.get_ledger_metadata(ledger_id)
    except errors.NoSuchLedgerError:
        raise CommandError(
            f"ledger {ledger_id} does not exist (see listledgers for the ledgers there are)"
        ) from None


async def read_entries(
    client: BookKeeper,
    ledger_id: int,
    first: int = 0,
    last: int = -1,
    *,
    recover: bool = False,
    password: bytes = b"",
    limit: int | None = None,
    on_total: Callable[[int], None] | None = None,
) -> AsyncIterator[tuple[int, bytes]]:
    """(entry id, payload) of entries ``first``..``last`` (-1: up to the last confirmed entry,
    and never past it), in order. Without ``recover`` a live writer is not disturbed (its
    confirmed entries are read); with it the ledger is fenced, recovered and closed first. A
    range of more than ``limit`` entries is refused before any is read. ``on_total`` hears how
    many entries will come, once the ledger is open."""
    check_range(first, last)
    metadata = await ledger_metadata(client, ledger_id)
    key = metadata.password if metadata.stores_password else password
    try:
        if recover:
            handle = await client.open_ledger(ledger_id, key)
        else:
            handle = await client.open_ledger_no_recovery(ledger_id, key)
    except errors.UnauthorizedAccessError:
        raise CommandError(
            f"ledger {ledger_id} keeps no password in its metadata (a legacy ledger) and the "
            "one given is wrong: pass the ledger's password"
        ) from None
    async with handle:
        confirmed = handle.last_add_confirmed
        end = confirmed if last < 0 else min(last, confirmed)
        if limit is not None and end - first + 1 > limit:
            raise CommandError(
                f"{end - first + 1} entries ({first}..{end}) asked for; read at most {limit} at "
                "a time (give a last entry id, or a page)"
            )
        if on_total is not None:
            on_total(max(0, end - first + 1))
        for start in range(first, end + 1, READ_CHUNK):
            for entry in await handle.read_entries(start, min(start + READ_CHUNK - 1, end)):
                yield entry.entry_id, entry.data


async def read_from_bookie(
    client: BookKeeper,
    ledger_id: int,
    bookie_id: str,
    first: int = 0,
    last: int = -1,
    *,
    password: bytes = b"",
    on_total: Callable[[int], None] | None = None,
) -> AsyncIterator[tuple[int, bytes | str]]:
    """(entry id, payload or why it could not be read) of each entry ``first``..``last`` that
    ``bookie_id`` should hold by the ledger's ensembles and striping (``last`` -1: up to the last
    entry that bookie holds), read from that bookie alone, whatever the LAC says. ``on_total``
    hears how many entries will come, once the last is known."""
    check_range(first, last)
    metadata = await ledger_metadata(client, ledger_id)
    if not any(bookie_id in bookies for _, bookies in metadata.ensembles):
        held = sorted({bookie for _, bookies in metadata.ensembles for bookie in bookies})
        raise CommandError(
            f"bookie {bookie_id} holds no fragment of ledger {ledger_id} (its bookies: "
            f"{', '.join(held)})"
        )
    key = metadata.password if metadata.stores_password else password
    digest_type = metadata.digest_type if metadata.stores_password else DigestType.CRC32
    digest = DigestManager(ledger_id, digest_type, key)
    bookies = client.bookie_client
    if last < 0:
        status, body = await bookies.read_entry(bookie_id, ledger_id, -1)
        if status in (StatusCode.ENOENTRY, StatusCode.ENOLEDGER):
            return  # it holds no entry of the ledger
        if status is not StatusCode.EOK:
            raise CommandError(
                f"bookie {bookie_id} could not say its last entry of ledger {ledger_id}: "
                f"{status.name}"
            )
        last = digest.verify(body, int.from_bytes(body[8:16], "big", signed=True)).entry_id

    def holds(entry_id: int) -> bool:
        ensemble = metadata.ensemble_at(entry_id)
        if bookie_id not in ensemble:
            return False
        index = ensemble.index(bookie_id)
        return index in write_set(entry_id, metadata.ensemble_size, metadata.write_quorum_size)

    if on_total is not None:
        on_total(sum(1 for entry_id in range(first, last + 1) if holds(entry_id)))
    for entry_id in range(first, last + 1):
        if not holds(entry_id):
            continue
        status, body = await bookies.read_entry(bookie_id, ledger_id, entry_id)
        if status is not StatusCode.EOK:
            yield entry_id, f"not read: {status.name}"
            continue
        try:
            yield entry_id, digest.payload(body, entry_id)
        except errors.DigestMismatchError as error:
            yield entry_id, f"not read: {error}"


def check_range(first: int, last: int) -> None:
    if first < 0:
        raise CommandError(f"the first entry id must be 0 or more, not {first}")
    if last < -1:
        raise CommandError(f"the last entry id must be -1 (the end) or more, not {last}")
    if last >= 0 and first > last:
        raise CommandError(f"the first entry id {first} is past the last, {last}")


def hex_dump(data: bytes) -> str:
    """``data`` as BookKeeper's hex entry formatter prints it: per 16 bytes, the offset (8 hex
    digits), the bytes in hex, then the printable ones (others as ``.``)."""
    lines = []
    for offset in range(0, len(data), HEX_LINE):
        chunk = data[offset : offset + HEX_LINE]
        hexes = " ".join(f"{byte:02X}" for byte in chunk).ljust(HEX_LINE * 3 - 1)
        text = "".join(chr(byte) if 0x20 <= byte < 0x7F else "." for byte in chunk)
        lines.append(f"{offset:08X} {hexes} {text}")
    return "\n".join(lines)


# Control characters other than newline and tab, which a terminal could take for commands.
_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F) if code not in (9, 10)}


def printable(data: bytes) -> str:
    """``data`` as text (UTF-8), with bytes that are not UTF-8 and control characters other than
    newline and tab shown as ``\\xNN`` escapes."""
    return data.decode("utf-8", errors="backslashreplace").translate(_CONTROLS)
