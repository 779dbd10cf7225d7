"""Reading the last add confirmed from the last ensemble (reference sections 3.1 and 3.2 step 3),
as a sans-IO state machine shared by ``read_last_add_confirmed`` and recovery's fencing.

A read of entry -1 returns each bookie's last entry, which carries the LAC its writer had then.
OK, "no such entry" and "no such ledger" make a bookie *known*; the answer is final once every
write set of the ensemble has Qw-Qa+1 known members (the ensemble is covered): no entry can be
acknowledged later without one of them, so the largest LAC seen is the LAC. ``EUA`` ends the read
at once; if every bookie answered and the ensemble is still not covered, the read fails."""

from __future__ import annotations

from dataclasses import dataclass, field

from bookkeeper_py import errors
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.core.quorum import CoverageSet
from bookkeeper_py.wire.digest import Entry
from bookkeeper_py.wire.status import StatusCode

LAC_ENTRY = -1  # a read of entry -1 returns the bookie's last entry
NEGATIVE_ANSWERS = frozenset({StatusCode.ENOENTRY, StatusCode.ENOLEDGER})


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """Read ``entry_id`` (-1: the last entry) from the bookie at ``bookie_index`` of the
    fragment holding it, fencing the ledger when ``fence`` is set."""

    bookie_index: int
    bookie: str
    entry_id: int
    fence: bool


@dataclass(slots=True)
class LastConfirmed:
    """The outcome: the LAC, and the ledger length at each last entry the bookies returned."""

    lac: int = -1
    lengths: dict[int, int] = field(default_factory=dict)


class LastConfirmedRead:
    """One read of the LAC. ``start()`` gives the requests; feed each answer to ``on_answer``
    until it returns a ``LastConfirmed`` or raises."""

    def __init__(self, metadata: LedgerMetadata, *, fence: bool) -> None:
        self.metadata = metadata
        self.fence = fence
        self.result = LastConfirmed()
        self._coverage = CoverageSet(
            metadata.ensemble_size, metadata.write_quorum_size, metadata.ack_quorum_size
        )
        self._answered: set[int] = set()
        self.problems: list[str] = []  # the answers that were neither yes nor no
        self.done = False

    def start(self) -> list[ReadRequest]:
        _, ensemble = self.metadata.last_ensemble
        return [
            ReadRequest(index, bookie, LAC_ENTRY, self.fence)
            for index, bookie in enumerate(ensemble)
        ]

    def on_answer(
        self, index: int, status: StatusCode | None, entry: Entry | None, problem: str = ""
    ) -> LastConfirmed | None:
        """An answer (``status`` None: transport error, timeout or bad digest); the outcome once
        the ensemble is covered, else None. Raises ``UnauthorizedAccessError`` on EUA and
        ``LedgerRecoveryError`` when every bookie answered without covering the ensemble."""
        if self.done or index in self._answered:
            return None  # settled already, or a duplicate
        self._answered.add(index)
        if status == StatusCode.EOK and entry is not None:
            self.result.lengths[entry.entry_id] = entry.length
            self.result.lac = max(self.result.lac, entry.last_add_confirmed)
            self._coverage.add_known(index)
        elif status in NEGATIVE_ANSWERS:
            self._coverage.add_known(index)
        elif status == StatusCode.EUA:
            self.done = True
            raise errors.UnauthorizedAccessError(
                f"a bookie refused to {'fence' if self.fence else 'read'} ledger "
                f"{self.metadata.ledger_id}: the password does not match"
            )
        else:
            self.problems.append(f"bookie #{index}: {problem or status}")
        if self._coverage.covered:
            self.done = True
            return self.result
        if len(self._answered) == self.metadata.ensemble_size:
            self.done = True
            first_entry, ensemble = self.metadata.last_ensemble
            raise errors.LedgerRecoveryError(
                f"ledger {self.metadata.ledger_id}: could not reach enough bookies of ensemble "
                f"{list(ensemble)} (first entry {first_entry}) to learn the last add confirmed"
                f"{' and stop the writer' if self.fence else ''}: {'; '.join(self.problems)}"
            )
        return None
