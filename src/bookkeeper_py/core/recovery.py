"""Open with recovery as a sans-IO state machine (reference section 3.2).

The rules, in the order the machine applies them:

1. **Mark.** The metadata goes OPEN -> IN_RECOVERY by CAS (``MarkInRecovery``); from then on a
   live writer's next metadata change fails. Metadata already CLOSED ends the recovery: that
   close stands.
2. **Fence and read the LAC** (``ReadRequest`` of entry -1 with the fence flag) from every bookie
   of the last ensemble. OK, "no such entry" and "no such ledger" make a bookie *known*; once
   every write set has Qw-Qa+1 known members (the ensemble is covered) no write set can gather
   Qa acks any more without one of them, so the old writer is stopped. The LAC is the largest
   one piggybacked on the last entries returned. ``EUA`` ends the recovery; if every bookie has
   answered and the ensemble is still not covered, recovery fails and the ledger stays
   IN_RECOVERY for a later attempt.
3. **Start** after max(LAC, first entry of the last fragment - 1): earlier fragments are
   immutable, and an empty last fragment is not read at all (the #2615 fix).
4. **Read forward**, a window of entries at a time, each from its whole write set, every read
   fencing (the #2614 fix). An entry is *found* from the first OK answer; it is *absent* only
   when Qw-Qa+1 members of its write set said "no such entry / ledger" explicitly. An error or a
   timeout is not absence (the #2908 fix): when every member answered and the entry is neither
   found nor absent, recovery fails rather than truncate the ledger.
5. **Write back** each found entry, in order, with RECOVERY_ADD to its whole write set; each
   must reach Qa acks.
6. **Replace failed bookies in memory.** A write-back that fails (an error, a lost connection, a
   timeout) asks for a replacement (``ReplaceInRecovery``, answered by ``on_replacement``): a
   new fragment from the lowest entry still being written back, kept in memory only, to which
   the unacknowledged write-backs are re-sent and later ones go. Reads keep using the stored
   ensembles (that is where the entries are).
7. **Close** (``CloseInRecovery``) at the last entry before the first absent one, once every
   write-back is acked, with a CAS that applies only while the ledger is IN_RECOVERY and adds
   the in-memory fragments that hold entries; if someone else closed it, their close stands.

Events in (``on_*`` methods), instructions out (lists of frozen dataclasses). Nothing here
reads a clock or does I/O: timeouts reach the machine as failed answers.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from bookkeeper_py import errors
from bookkeeper_py.core.lac import (
    LAC_ENTRY,
    NEGATIVE_ANSWERS,
    LastConfirmed,
    LastConfirmedRead,
    ReadRequest,
)
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.core.quorum import AckSet, negative_threshold, write_set
from bookkeeper_py.wire.digest import Entry
from bookkeeper_py.wire.status import StatusCode

__all__ = [
    "LAC_ENTRY",
    "CloseInRecovery",
    "Instruction",
    "LedgerRecovery",
    "MarkInRecovery",
    "ReadRequest",
    "RecoveryAdd",
    "RecoveryDone",
    "RecoveryFailed",
    "ReplaceInRecovery",
]

DEFAULT_READ_WINDOW = (
    64  # entries read ahead during recovery (16: 20,000 entries in 1.8 s, 64: 1.5 s)
)


# -- instructions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MarkInRecovery:
    """CAS the metadata from OPEN to IN_RECOVERY (no change if it is already in recovery or
    closed); answer with ``on_metadata``."""


@dataclass(frozen=True, slots=True)
class RecoveryAdd:
    """Write the packaged entry ``payload`` back with the RECOVERY_ADD flag; answer with
    ``on_add``."""

    bookie_index: int
    bookie: str
    entry_id: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class CloseInRecovery:
    """CAS the metadata to CLOSED at (``last_entry_id``, ``length``) with ``fragments`` (first
    entry, bookies) added, only while it is IN_RECOVERY (keep a close made by someone else);
    answer with ``on_metadata``. ``closed(current)`` makes the new metadata."""

    last_entry_id: int
    length: int
    fragments: tuple[tuple[int, tuple[str, ...]], ...] = ()

    def closed(self, current: LedgerMetadata) -> LedgerMetadata:
        closed = current.closed_at(self.last_entry_id, self.length)
        for first, bookies in self.fragments:
            try:
                closed = closed.with_fragment(first, bookies)
            except ValueError as error:  # BookKeeper's #2615; the LAC floor keeps it away
                raise errors.LedgerRecoveryError(str(error)) from error
        return closed


@dataclass(frozen=True, slots=True)
class ReplaceInRecovery:
    """Pick bookies outside ``ensemble`` for its ``failed`` indices (index -> bookie); answer
    with ``on_replacement(new ensemble)`` or ``on_replacement_failed(error)``."""

    ensemble: tuple[str, ...]
    failed: Mapping[int, str]


@dataclass(frozen=True, slots=True)
class RecoveryDone:
    """The ledger is closed; ``metadata`` is its final metadata."""

    metadata: LedgerMetadata


@dataclass(frozen=True, slots=True)
class RecoveryFailed:
    error: errors.BKError


Instruction = (
    MarkInRecovery
    | ReadRequest
    | RecoveryAdd
    | CloseInRecovery
    | ReplaceInRecovery
    | RecoveryDone
    | RecoveryFailed
)


# -- state -------------------------------------------------------------------------------------


class Phase(enum.Enum):
    MARKING = "marking"
    FENCING = "fencing"
    READING = "reading"
    CLOSING = "closing"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class _EntryRead:
    """The answers one entry's recovery read has collected."""

    answered: set[int] = field(default_factory=set)
    negatives: int = 0
    problems: list[str] = field(default_factory=list)


class LedgerRecovery:
    """Recovers one ledger. Feed it events until it returns ``RecoveryDone`` or
    ``RecoveryFailed``; answers that come after that are ignored."""

    def __init__(self, ledger_id: int, read_window: int = DEFAULT_READ_WINDOW) -> None:
        if read_window < 1:
            raise ValueError(f"the recovery read window holds at least one entry: {read_window}")
        self.ledger_id = ledger_id
        self.read_window = read_window
        self.phase = Phase.MARKING
        self.metadata: LedgerMetadata | None = None
        self._fencing: LastConfirmedRead | None = None
        self.last_entry_id = -1  # the last entry found and consumed, in order
        self.length = 0
        self._length_known = True
        self._next_to_read = 0
        self._reads: dict[int, _EntryRead] = {}
        self._found: dict[int, tuple[Entry, bytes]] = {}
        self._first_absent: int | None = None
        self._writes: dict[int, tuple[AckSet, list[str], bytes]] = {}
        self._fragments: list[tuple[int, tuple[str, ...]]] = []  # in memory until the close
        # Write-backs completed above the lowest one still pending (they complete out of
        # order): a replacement fragment from that lowest entry covers them too.
        self._written: dict[int, bytes] = {}
        self._failed: dict[int, str] = {}  # write-back failures to replace
        self._replacing = False

    # -- events --------------------------------------------------------------------------------

    def start(self) -> list[Instruction]:
        return [MarkInRecovery()]

    def on_metadata(self, metadata: LedgerMetadata) -> list[Instruction]:
        """The metadata after ``MarkInRecovery`` or ``CloseInRecovery``."""
        if self.phase == Phase.MARKING:
            if metadata.is_closed:
                return self._finish(metadata)
            self.metadata = metadata
            self.phase = Phase.FENCING
            self._fencing = LastConfirmedRead(metadata, fence=True)
            return list(self._fencing.start())
        if self.phase == Phase.CLOSING:
            return self._finish(metadata)
        return []

    def on_read(
        self,
        bookie_index: int,
        entry_id: int,
        status: StatusCode | None,
        entry: Entry | None = None,
        payload: bytes = b"",
        problem: str = "",
    ) -> list[Instruction]:
        """A read's answer: ``status`` None for a transport error or timeout; for EOK, the
        verified ``entry`` and its packaged ``payload``. A digest failure is an error (None)."""
        if self.phase == Phase.FENCING and entry_id == LAC_ENTRY:
            return self._on_fence_answer(bookie_index, status, entry, problem)
        if self.phase == Phase.READING and entry_id != LAC_ENTRY:
            return self._on_entry_answer(bookie_index, entry_id, status, entry, payload, problem)
        return []

    def on_add(
        self,
        bookie_index: int,
        entry_id: int,
        status: StatusCode | None,
        problem: str = "",
        bookie: str | None = None,
    ) -> list[Instruction]:
        """A recovery add's answer (from ``bookie``, when the caller knows it: an answer of a
        bookie replaced since is ignored)."""
        if self.phase != Phase.READING or entry_id not in self._writes:
            return []
        ensemble = self._write_ensemble(entry_id)
        if bookie is not None and ensemble[bookie_index] != bookie:
            return []
        acks, problems, _ = self._writes[entry_id]
        if status == StatusCode.EOK:
            acks.ack(bookie_index)
        elif status == StatusCode.EUA:
            return self._refused("write")
        elif not acks.acked(bookie_index):
            acks.fail(bookie_index)
            problems.append(f"{ensemble[bookie_index]}: {problem or status}")
            self._failed[bookie_index] = ensemble[bookie_index]
            return self._replace()
        if acks.complete:
            _, _, payload = self._writes.pop(entry_id)
            self._written[entry_id] = payload
            lowest = min(self._writes) if self._writes else self.last_entry_id + 1
            for done in [e for e in self._written if e < lowest]:
                del self._written[done]
        return self._maybe_close()

    def on_replacement(self, ensemble: tuple[str, ...]) -> list[Instruction]:
        """Bookies for the failed ones: a new in-memory fragment from the lowest entry still
        being written back; its unacknowledged write-backs go to the new bookies."""
        if self.phase != Phase.READING or not self._replacing:
            return []
        self._replacing = False
        assert self.metadata is not None
        first = min(self._writes) if self._writes else self.last_entry_id + 1
        old = self._write_ensemble(first)
        replaced = [i for i in range(len(ensemble)) if ensemble[i] != old[i]]
        for index in replaced:
            self._failed.pop(index, None)
        if self._fragments and self._fragments[-1][0] == first:
            self._fragments[-1] = (first, ensemble)
        else:
            self._fragments.append((first, ensemble))
        instructions: list[Instruction] = []
        members_of = self._members
        reopened: set[int] = set()
        for entry_id, payload in sorted(self._written.items()):
            if entry_id >= first and set(members_of(entry_id)) & set(replaced):
                # Complete on bookies that are no longer its write set: write it again.
                del self._written[entry_id]
                self._writes[entry_id] = (
                    AckSet(self.metadata.write_quorum_size, self.metadata.ack_quorum_size),
                    [],
                    payload,
                )
                reopened.add(entry_id)
                instructions += [
                    RecoveryAdd(index, ensemble[index], entry_id, payload)
                    for index in members_of(entry_id)
                ]
        for entry_id, (acks, _, payload) in sorted(self._writes.items()):
            if entry_id in reopened:
                continue
            members = write_set(
                entry_id, self.metadata.ensemble_size, self.metadata.write_quorum_size
            )
            for index in replaced:
                if index in members:
                    acks.forget(index)
                    instructions.append(RecoveryAdd(index, ensemble[index], entry_id, payload))
        return instructions + self._replace() + self._maybe_close()

    def on_replacement_failed(self, error: errors.BKError) -> list[Instruction]:
        if self.phase != Phase.READING or not self._replacing:
            return []
        self._replacing = False
        for entry_id, (acks, problems, _) in self._writes.items():
            if not acks.still_possible:
                return self._stuck(
                    f"the recovery write of entry {entry_id} cannot reach its ack quorum "
                    f"({'; '.join(problems)}) and no bookie can replace the failed ones: {error}"
                )
        self._failed.clear()  # carry on with fewer copies
        return self._maybe_close()

    def _replace(self) -> list[Instruction]:
        if self._replacing or not self._failed:
            return []
        self._replacing = True
        first = min(self._writes) if self._writes else self.last_entry_id + 1
        return [ReplaceInRecovery(self._write_ensemble(first), dict(self._failed))]

    def _members(self, entry_id: int) -> list[int]:
        assert self.metadata is not None
        return write_set(entry_id, self.metadata.ensemble_size, self.metadata.write_quorum_size)

    def _write_ensemble(self, entry_id: int) -> tuple[str, ...]:
        """Where entry ``entry_id`` is written back: the in-memory fragments, else the stored."""
        for first, bookies in reversed(self._fragments):
            if entry_id >= first:
                return bookies
        assert self.metadata is not None
        return self.metadata.ensemble_at(entry_id)

    # -- fencing -------------------------------------------------------------------------------

    def _on_fence_answer(
        self, index: int, status: StatusCode | None, entry: Entry | None, problem: str
    ) -> list[Instruction]:
        assert self._fencing is not None
        try:
            outcome = self._fencing.on_answer(index, status, entry, problem)
        except errors.UnauthorizedAccessError:
            return self._refused("fence")
        except errors.LedgerRecoveryError:
            return self._stuck(
                "could not fence enough bookies of the last ensemble to stop the writer "
                f"({'; '.join(self._fencing.problems)})"
            )
        if outcome is None:
            return []
        return self._begin_reading(outcome)

    def _begin_reading(self, fenced: LastConfirmed) -> list[Instruction]:
        assert self.metadata is not None
        start = self._start_after(fenced.lac)
        self.last_entry_id = start
        self._next_to_read = start + 1
        if start < 0:
            self.length = 0
        elif start in fenced.lengths:  # some bookie's last entry was the one at ``start``
            self.length = fenced.lengths[start]
        else:
            self._length_known = False  # read below, with the entries after it
        self.phase = Phase.READING
        instructions = self._schedule_reads()
        if not self._length_known:
            # The length at ``start`` comes from that entry itself: read it (not written back).
            instructions += self._reads_for(start)
        return instructions

    def _start_after(self, lac: int) -> int:
        """The entry recovery starts after: the LAC, floored at the entry before the last
        fragment (earlier fragments are immutable; the #2615 fix)."""
        assert self.metadata is not None
        first_of_last, _ = self.metadata.last_ensemble
        return max(lac, first_of_last - 1)

    # -- reading forward -------------------------------------------------------------------------

    def _reads_for(self, entry_id: int) -> list[Instruction]:
        assert self.metadata is not None
        self._reads[entry_id] = _EntryRead()
        ensemble = self.metadata.ensemble_at(entry_id)
        members = write_set(entry_id, self.metadata.ensemble_size, self.metadata.write_quorum_size)
        return [ReadRequest(index, ensemble[index], entry_id, fence=True) for index in members]

    def _schedule_reads(self) -> list[Instruction]:
        instructions: list[Instruction] = []
        limit = self.last_entry_id + self.read_window
        if self._first_absent is not None:
            limit = min(limit, self._first_absent - 1)
        while self._next_to_read <= limit:
            instructions += self._reads_for(self._next_to_read)
            self._next_to_read += 1
        return instructions

    def _on_entry_answer(
        self,
        index: int,
        entry_id: int,
        status: StatusCode | None,
        entry: Entry | None,
        payload: bytes,
        problem: str,
    ) -> list[Instruction]:
        assert self.metadata is not None
        read = self._reads.get(entry_id)
        if read is None or index in read.answered:
            return []  # settled already, or a duplicate
        read.answered.add(index)
        if status == StatusCode.EOK and entry is not None:
            if entry.entry_id != entry_id:
                read.problems.append(f"bookie #{index}: answered entry {entry.entry_id}")
            else:
                del self._reads[entry_id]
                if entry_id == self.last_entry_id and not self._length_known:
                    self.length, self._length_known = entry.length, True
                    return self._advance()
                self._found[entry_id] = (entry, payload)
                return self._advance()
        elif status in NEGATIVE_ANSWERS:
            read.negatives += 1
            threshold = negative_threshold(
                self.metadata.write_quorum_size, self.metadata.ack_quorum_size
            )
            if entry_id <= self.last_entry_id:
                # A confirmed entry (read for its length) is not absent because some replicas
                # lost it: the others are still asked; if none has it, it is lost.
                if read.negatives == self.metadata.write_quorum_size:
                    del self._reads[entry_id]
                    return self._fail(
                        errors.LedgerRecoveryError(
                            f"ledger {self.ledger_id}: entry {entry_id} is confirmed but every "
                            "bookie of its write set says it does not have it: its data is lost"
                        )
                    )
                read.problems.append(f"bookie #{index}: {status.name}")
            elif read.negatives >= threshold:
                del self._reads[entry_id]
                if self._first_absent is None or entry_id < self._first_absent:
                    self._first_absent = entry_id
                return self._advance()
        elif status == StatusCode.EUA:
            return self._refused("read")
        else:
            read.problems.append(f"bookie #{index}: {problem or status}")
        if len(read.answered) == self.metadata.write_quorum_size:
            return self._stuck(
                f"cannot tell whether entry {entry_id} exists: {read.negatives} bookies said it "
                f"is absent, the others failed ({'; '.join(read.problems)}); an error is not an "
                "absence"
            )
        return []

    def _advance(self) -> list[Instruction]:
        """Consumes found entries in order, writing each back; schedules more reads."""
        assert self.metadata is not None
        instructions: list[Instruction] = []
        if not self._length_known:
            return instructions
        while self.last_entry_id + 1 in self._found:
            entry_id = self.last_entry_id + 1
            entry, payload = self._found.pop(entry_id)
            self.last_entry_id, self.length = entry_id, entry.length
            ensemble = self._write_ensemble(entry_id)
            members = write_set(
                entry_id, self.metadata.ensemble_size, self.metadata.write_quorum_size
            )
            self._writes[entry_id] = (
                AckSet(self.metadata.write_quorum_size, self.metadata.ack_quorum_size),
                [],
                payload,
            )
            instructions += [
                RecoveryAdd(index, ensemble[index], entry_id, payload) for index in members
            ]
        instructions += self._schedule_reads()
        return instructions + self._maybe_close()

    def _reading_done(self) -> bool:
        return self._length_known and self._first_absent == self.last_entry_id + 1

    def _maybe_close(self) -> list[Instruction]:
        if (
            self.phase != Phase.READING
            or not self._reading_done()
            or self._writes
            or self._replacing
        ):
            return []
        self.phase = Phase.CLOSING
        self._reads.clear()
        self._found.clear()
        fragments = tuple(f for f in self._fragments if f[0] <= self.last_entry_id)
        return [CloseInRecovery(self.last_entry_id, self.length, fragments)]

    # -- endings -------------------------------------------------------------------------------

    def _finish(self, metadata: LedgerMetadata) -> list[Instruction]:
        self.phase = Phase.DONE
        self.metadata = metadata
        return [RecoveryDone(metadata)]

    def _fail(self, error: errors.BKError) -> list[Instruction]:
        self.phase = Phase.FAILED
        return [RecoveryFailed(error)]

    def _stuck(self, what: str) -> list[Instruction]:
        """Fails so that a later attempt can finish: the ledger stays IN_RECOVERY."""
        return self._fail(
            errors.LedgerRecoveryError(
                f"ledger {self.ledger_id}: {what}; the ledger stays IN_RECOVERY, retry the "
                "recovery when the bookies are back"
            )
        )

    def _refused(self, what: str) -> list[Instruction]:
        return self._fail(
            errors.UnauthorizedAccessError(
                f"a bookie refused the recovery {what} of ledger {self.ledger_id} (EUA): "
                + errors.EUA_MEANING
            )
        )
