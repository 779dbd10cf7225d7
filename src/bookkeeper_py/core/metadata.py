"""The ledger-metadata value object: what the metadata store holds for one ledger.

It is immutable; every change produces a new value that is written back with a compare-and-swap.
Field meanings follow ``LedgerMetadataFormat`` (reference section 1.7).
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from bookkeeper_py.wire.digest import DigestType


class LedgerState(enum.IntEnum):
    """A ledger's state, numbered as in ``LedgerMetadataFormat.State``."""

    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3


NO_ENTRY = -1


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    """A ledger's metadata. ``ensembles`` maps the first entry id of each fragment to its bookies."""

    ledger_id: int
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    digest_type: DigestType
    password: bytes
    ensembles: tuple[tuple[int, tuple[str, ...]], ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = NO_ENTRY
    length: int = 0
    ctime_ms: int = 0
    custom_metadata: Mapping[str, bytes] = field(default_factory=dict)
    c_token: int = 0
    format_version: int = 3
    # False for metadata written without a password and digest type (format v1, or v2 from
    # early clients): the opener supplies both, as BookKeeper's openLedger(id, digest, password).
    stores_password: bool = True

    def __post_init__(self) -> None:
        if not self.ensembles:
            raise ValueError(f"ledger {self.ledger_id}: metadata needs at least one ensemble")
        starts = [first for first, _ in self.ensembles]
        if starts != sorted(starts) or len(set(starts)) != len(starts):
            raise ValueError(
                f"ledger {self.ledger_id}: fragment starts must strictly grow: {starts}"
            )
        for first, bookies in self.ensembles:
            if len(bookies) != self.ensemble_size:
                raise ValueError(
                    f"ledger {self.ledger_id}: fragment at {first} has {len(bookies)} bookies, "
                    f"ensemble size is {self.ensemble_size}"
                )

    @property
    def is_closed(self) -> bool:
        return self.state == LedgerState.CLOSED

    @property
    def last_ensemble(self) -> tuple[int, tuple[str, ...]]:
        """(first entry id, bookies) of the last fragment."""
        return self.ensembles[-1]

    def ensemble_at(self, entry_id: int) -> tuple[str, ...]:
        """The bookies of the fragment that holds ``entry_id``."""
        return self.fragment_of(entry_id)[1]

    def fragment_of(self, entry_id: int) -> tuple[int, tuple[str, ...]]:
        """(first entry, bookies) of the fragment that holds ``entry_id``."""
        last = self.ensembles[-1]
        if entry_id >= last[0]:
            return last  # the writer's case: every entry it sends is in the last fragment
        starts = [first for first, _ in self.ensembles]
        return self.ensembles[max(0, bisect.bisect_right(starts, entry_id) - 1)]

    def bookies(self) -> set[str]:
        """Every bookie that holds a fragment of this ledger."""
        return {bookie for _, members in self.ensembles for bookie in members}

    def with_state(self, state: LedgerState) -> LedgerMetadata:
        return replace(self, state=state)

    def with_fragment(self, first_entry: int, bookies: tuple[str, ...]) -> LedgerMetadata:
        """This metadata with a fragment from ``first_entry``: it replaces the last fragment if
        that starts there too, else it is appended. Raises ``ValueError`` for a fragment that
        would start before the last one (earlier fragments are immutable)."""
        last_start = self.ensembles[-1][0]
        if first_entry < last_start:
            raise ValueError(
                f"ledger {self.ledger_id}: a fragment at entry {first_entry} would start before "
                f"the last fragment ({last_start}): earlier fragments are immutable"
            )
        kept = self.ensembles[:-1] if first_entry == last_start else self.ensembles
        return replace(self, ensembles=(*kept, (first_entry, bookies)))

    def with_members(self, first_entry: int, replacements: Mapping[int, str]) -> LedgerMetadata:
        """This metadata with the bookies at ``replacements``' ensemble indices of the fragment
        starting at ``first_entry`` replaced: re-replication, the one change of an earlier
        fragment (its entries were copied to the new bookies first). ``ValueError`` when there
        is no such fragment or a bookie would appear twice in it."""
        ensembles = list(self.ensembles)
        for position, (first, members) in enumerate(ensembles):
            if first == first_entry:
                changed = list(members)
                for index, bookie in replacements.items():
                    changed[index] = bookie
                if len(set(changed)) != len(changed):
                    raise ValueError(
                        f"ledger {self.ledger_id}: replacing {dict(replacements)} in the fragment "
                        f"at {first_entry} ({list(members)}) would name a bookie twice"
                    )
                ensembles[position] = (first, tuple(changed))
                return replace(self, ensembles=tuple(ensembles))
        raise ValueError(f"ledger {self.ledger_id} has no fragment starting at {first_entry}")

    def closed_at(self, last_entry_id: int, length: int) -> LedgerMetadata:
        """This metadata, closed with the given last entry and length."""
        return replace(self, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)
