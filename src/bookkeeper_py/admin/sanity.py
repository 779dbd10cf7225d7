"""BookKeeper's bookie sanity test (``shell bookiesanity``, ``/api/v1/bookie/sanity``): a ledger
of one entry copy on the bookie under test alone, a few entries written, the ledger closed,
opened again with recovery, read back and compared, then deleted."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bookkeeper_py import errors
from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.wire.digest import DigestType


class _OnlyThisBookie:
    """A placement policy that puts every ensemble on one bookie (BookKeeper's
    ``LocalBookieEnsemblePlacementPolicy``, for a bookie named here)."""

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id

    def new_ensemble(
        self,
        size: int,
        writable: Iterable[str],
        quarantined: Iterable[str] = (),
        write_quorum_size: int | None = None,
    ) -> tuple[str, ...]:
        if size != 1 or self.bookie_id not in set(writable):
            raise errors.NotEnoughBookiesError(
                f"bookie {self.bookie_id} is not writable (not registered, or read-only)"
            )
        return (self.bookie_id,)

    def replace(
        self,
        ensemble: Sequence[str],
        failed: Mapping[int, str],
        writable: Iterable[str],
        quarantined: Iterable[str] = (),
        exclude: Iterable[str] = (),
        write_quorum_size: int | None = None,
    ) -> tuple[str, ...]:
        raise errors.NotEnoughBookiesError(f"bookie {self.bookie_id} failed; no other is tried")

    def read_order(self, replicas: Sequence[tuple[int, str]]) -> Sequence[tuple[int, str]]:
        return replicas


@dataclass(frozen=True)
class SanityResult:
    bookie_id: str
    passed: bool
    message: str  # what was done, or what failed


async def sanity_test(client: BookKeeper, bookie_id: str, entries: int = 10) -> SanityResult:
    """Runs the test on ``bookie_id`` with ``client`` (whose placement it changes: a client of
    its own). Never raises for a failing bookie: the result says what failed."""
    client.placement = _OnlyThisBookie(bookie_id)
    step = "creating a ledger on it"
    ledger_id = None
    try:
        handle = await client.create_ledger(1, 1, 1, DigestType.MAC, b"")
        ledger_id = handle.ledger_id
        step = f"writing {entries} entries to ledger {ledger_id}"
        written = [f"entry-{number}".encode() for number in range(entries)]
        for data in written:
            await handle.add_entry(data)
        await handle.close()
        step = f"opening ledger {ledger_id} again with recovery"
        reader = await client.open_ledger(ledger_id, b"")
        async with reader:
            if reader.last_add_confirmed != entries - 1:
                return SanityResult(
                    bookie_id,
                    False,
                    f"ledger {ledger_id}: last confirmed entry {reader.last_add_confirmed} after "
                    f"recovery, not {entries - 1}",
                )
            step = f"reading ledger {ledger_id} back"
            read = [entry.data for entry in await reader.read_entries(0, entries - 1)]
        if read != written:
            return SanityResult(
                bookie_id, False, f"ledger {ledger_id}: the entries read back differ"
            )
    except errors.BKError as error:
        return SanityResult(bookie_id, False, f"failed {step}: {error}")
    finally:
        if ledger_id is not None:
            try:
                await client.delete_ledger(ledger_id)
            except errors.BKError:
                pass  # the test's answer stands; the ledger is left for GC to find
    return SanityResult(
        bookie_id, True, f"wrote, recovered and read back {entries} entries of ledger {ledger_id}"
    )
