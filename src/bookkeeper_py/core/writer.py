"""The single writer of a ledger as a sans-IO state machine (reference sections 1.6 and 3.1).

The rules:

1. **Pipelined adds.** ``add`` numbers the entry (last pushed + 1); at most ``max_in_flight``
   entries are sent and not yet acknowledged, the rest wait in order. Each goes to its write set,
   ensemble indices ``(e + i) mod E``, i < Qw, of the fragment holding it. The entry is packaged
   once with the LAC of the moment (piggybacked) and the same bytes go to every bookie.
2. **Ordered acks.** An entry completes once Qa bookies of its write set made it durable *and*
   every lower entry completed; completions come out in entry-id order (``Completed``).
3. **Bookie failure** (an error answer, a lost connection, or no answer within
   ``add_timeout_ms``): the bookie is replaced (``ChangeEnsemble``, answered by
   ``on_ensemble_changed`` or ``on_ensemble_change_failed``): the executor picks replacements
   with the placement policy and CASes a new fragment starting at LAC+1 (``change_ensemble``
   below decides each CAS attempt). While the change is in progress no entry completes and no
   new entry is sent. Afterwards each unacknowledged entry from LAC+1 is sent again to the new
   bookies of its write set, and acks the replaced bookies gave for them are forgotten (those
   entries now belong to the new fragment). Failures seen during a change start another one.
   With ``delay_ensemble_change`` a failed bookie is replaced only once an entry cannot reach
   Qa without it (the entries meanwhile have fewer copies; AutoRecovery restores them).
4. **Fenced or refused** (``EFENCED``, ``EUA``), a metadata change refused because the ledger
   is closed or in recovery, or no replacement bookie while an entry cannot reach Qa: every
   pending add fails (``Failed``) and the writer takes no more adds.
5. **Explicit LAC**: when the LAC advanced past what the last sent entry carried and nothing
   was sent for ``explicit_lac_interval_ms``, ``tick`` asks to write it (``WriteLac``) so that
   readers of an idle writer see every acknowledged entry.
6. **Caller-chosen entry ids** (``add(..., entry_id=N)``, BookKeeper's LedgerHandleAdv): entries
   may be added in any order, each id once and above the LAC; they still complete in id order,
   so a gap holds back every entry above it until it is filled. The length an entry carries is
   the total added so far, in the order of the calls (as BookKeeper does).
7. **DEFERRED_SYNC** (``deferred_sync``): bookies acknowledge before their journal sync. An add
   completes after Qa such acks, but the LAC (what readers can see and the close ends at) only
   moves with ``force``: FORCE_LEDGER to every bookie of the ensemble, and once all answered,
   the LAC becomes the last entry completed when the force began. No ensemble change for such
   a ledger: a failed bookie fails the adds (as in BookKeeper).
8. **Under-replicated adds** (BookKeeper's ``ADD_ENTRY_UR``, counted in
   ``under_replicated_adds``): a failed answer (an error status, a lost connection, a timeout)
   from a member of an entry's write set once the entry has its Qa acks, completed or not, as
   Java's ``PendingAddOp`` counts it: one per such answer. It changes nothing else.

Times are milliseconds given by the caller; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import collections
from array import array
from collections.abc import Iterator, Mapping, MutableSequence
from dataclasses import dataclass
from itertools import repeat, starmap

from bookkeeper_py import errors
from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.core.placement import ChangeRate
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.speedups import native
from bookkeeper_py.wire.status import StatusCode

# -- instructions ------------------------------------------------------------------------------


@dataclass(slots=True)
class SendAdds:
    """Send the packaged entries ``entry_ids``, in this order, each to the (index, bookie)
    pairs of its ``targets`` (the list beside it); answer each with ``on_add_answer`` or
    ``on_add_acks``. One instruction for the entries sent together, not one per entry."""

    entry_ids: list[int]
    targets: list[tuple[tuple[int, str], ...]]

    def __iter__(self) -> Iterator[tuple[int, tuple[tuple[int, str], ...]]]:
        """Each entry id with its targets."""
        return zip(self.entry_ids, self.targets, strict=True)


@dataclass(slots=True)  # not frozen: one per entry, and frozen __init__ costs 3.5x
class Completed:
    """Entries ``first``..``last`` are acknowledged, in this order; ``length`` is the ledger's
    length once ``last`` is."""

    first: int
    last: int
    length: int


@dataclass(frozen=True, slots=True)
class Failed:
    """These adds failed with ``error``; the writer takes no more adds."""

    entry_ids: tuple[int, ...]
    error: errors.BKError


@dataclass(frozen=True, slots=True)
class ChangeEnsemble:
    """Replace the ``failed`` indices (index -> bookie) of ``ensemble``, the fragment starting
    at ``based_on_start``, with a new fragment from ``first_entry``; answer with
    ``on_ensemble_changed`` or ``on_ensemble_change_failed``."""

    first_entry: int
    based_on_start: int
    ensemble: tuple[str, ...]
    failed: Mapping[int, str]


@dataclass(frozen=True, slots=True)
class WriteLac:
    """Write the explicit LAC ``lac`` to every bookie of the last ensemble (fire and forget)."""

    lac: int
    targets: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class Force:
    """Send FORCE_LEDGER to each (index, bookie) of ``targets``; answer each with
    ``on_force_answer(force_id, ...)``."""

    force_id: int
    targets: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class Forced:
    """Force ``force_id`` ended: the LAC is now ``lac``, or it failed with ``error``."""

    force_id: int
    lac: int
    error: errors.BKError | None = None


Instruction = SendAdds | Completed | Failed | ChangeEnsemble | WriteLac | Force | Forced


@dataclass(slots=True)  # not frozen: one per entry, and frozen __init__ costs 3.5x
class Accepted:
    """``add``'s answer: the entry's id and what to package it with."""

    entry_id: int
    last_add_confirmed: int  # piggybacked
    length: int  # the ledger's length including this entry
    instructions: list[Instruction]


# -- the metadata rule of an ensemble change ---------------------------------------------------


def change_ensemble(
    current: LedgerMetadata,
    first_entry: int,
    based_on: tuple[int, tuple[str, ...]],
    new_ensemble: tuple[str, ...],
) -> LedgerMetadata | None:
    """One CAS attempt of an ensemble change, on the metadata as stored now: the new metadata to
    write, or None when ``current`` already ends with exactly this fragment (an earlier attempt
    landed although its answer was lost). Raises ``LedgerClosedError`` / ``LedgerFencedError``
    when the ledger is closed or being recovered, ``MetadataVersionError`` when the last
    fragment is not the one the writer based its change on (only the writer changes ensembles)."""
    if current.state == LedgerState.CLOSED:
        raise errors.LedgerClosedError(
            f"ledger {current.ledger_id} was closed (at entry {current.last_entry_id}) while "
            "its writer was replacing a failed bookie"
        )
    if current.state == LedgerState.IN_RECOVERY:
        raise errors.LedgerFencedError(
            f"ledger {current.ledger_id} is being recovered by another client: this writer is "
            "fenced and cannot change its ensemble"
        )
    last = current.last_ensemble
    if last == (first_entry, new_ensemble):
        return None
    if last != based_on:
        raise errors.MetadataVersionError(
            f"ledger {current.ledger_id}: its last fragment is {last}, not the {based_on} this "
            "writer changed; someone else changed the ensemble"
        )
    try:
        return current.with_fragment(first_entry, new_ensemble)
    except ValueError as error:
        raise errors.MetadataVersionError(str(error)) from error


# -- the writer --------------------------------------------------------------------------------


WAITING = -1  # ``_Pending.sent``: taken, not sent yet (waiting for a permit)
HOLE = -2  # ``_Pending.sent``: an id not taken yet, below one that was (caller-chosen ids)


def _ack_py(
    acked: MutableSequence[int],
    failed: MutableSequence[int],
    sent: MutableSequence[int],
    base: int,
    entry_ids: list[int],
    index: int,
    ensemble_size: int,
    write_quorum: int,
    first: int,
) -> list[int]:
    """``speedups.native.pending_ack`` in Python (see ``_Pending.ack``)."""
    bit = 1 << index
    keep = ~bit
    count = len(sent)
    earlier: list[int] = []
    for entry_id in entry_ids:
        if entry_id < first:
            earlier.append(entry_id)
            continue
        at = entry_id - base
        if (
            at < 0
            or at >= count
            or sent[at] < 0
            or (index - entry_id) % ensemble_size >= write_quorum
        ):
            continue
        failed[at] &= keep
        acked[at] |= bit
    return earlier


def _done_py(acked: MutableSequence[int], sent: MutableSequence[int], ack_quorum: int) -> int:
    """``speedups.native.pending_done`` in Python (see ``_Pending.done``)."""
    done = 0
    for mask, sent_at in zip(acked, sent, strict=False):
        if sent_at < 0 or mask.bit_count() < ack_quorum:
            break
        done += 1
    return done


class _Pending:
    """The adds taken and not completed, by entry id from ``base`` (the first not completed):
    for each, the ensemble indices that acked it durably and that failed it (bits), the
    ledger's length with it, and when it was sent (ms; ``WAITING`` until then; ``HOLE`` for an
    id not taken yet when the caller chooses ids). Arrays rather than an object per entry: the
    acks of a batch of answers and the completions at the head are one pass each, in C where
    the speedups are built (``pending_ack``, ``pending_done``) and ensembles have at most 64
    bookies (bits of 64-bit words), in Python otherwise."""

    __slots__ = ("_ack", "_done", "acked", "base", "failed", "lengths", "sent", "taken")

    def __init__(self, ensemble_size: int) -> None:
        self.base = 0
        self.taken = 0  # ids taken (holes not counted)
        self.lengths = array("q")
        self.sent = array("q")
        self.acked: MutableSequence[int]
        self.failed: MutableSequence[int]
        if ensemble_size <= 64:
            self.acked, self.failed = array("Q"), array("Q")
        else:  # wider than a word: Python ints
            self.acked, self.failed = [], []
        self._ack, self._done = _ack_py, _done_py
        if native is not None and ensemble_size <= 64:
            self._ack, self._done = native.pending_ack, native.pending_done

    def take(self, entry_id: int, length: int) -> None:
        """Takes ``entry_id``, waiting to be sent: above every completed one, and not taken
        already (the caller checks, with ``in``)."""
        at = entry_id - self.base
        sent = self.sent
        count = len(sent)
        if at == count:  # the next id
            self.acked.append(0)
            self.failed.append(0)
            self.lengths.append(length)
            sent.append(WAITING)
        elif at > count:
            gap = at - count
            self.acked.extend([0] * (gap + 1))
            self.failed.extend([0] * (gap + 1))
            self.lengths.extend([0] * gap + [length])
            sent.extend([HOLE] * gap + [WAITING])
        else:  # a hole below the last id taken
            self.lengths[at] = length
            sent[at] = WAITING
        self.taken += 1

    def take_run(self, first: int, lengths: list[int]) -> None:
        """``take`` of ``first``, ``first + 1``, ... with ``lengths``: the next ids (above every
        id taken, holes included), in one extend per array."""
        count = len(lengths)
        assert first - self.base == len(self.sent), "a run starts right after the last id taken"
        zeros = array("Q", bytes(8 * count)) if isinstance(self.acked, array) else [0] * count
        self.acked.extend(zeros)
        self.failed.extend(zeros)
        self.lengths.extend(lengths)
        self.sent.extend(array("q", [WAITING]) * count)
        self.taken += count

    def __contains__(self, entry_id: int) -> bool:
        at = entry_id - self.base
        return 0 <= at < len(self.sent) and self.sent[at] != HOLE

    def ids(self) -> list[int]:
        """The ids taken, in order."""
        base = self.base
        return [base + at for at, sent_at in enumerate(self.sent) if sent_at != HOLE]

    def sent_at(self, entry_id: int) -> int:
        return self.sent[entry_id - self.base]

    def set_sent(self, entry_id: int, now: int) -> None:
        self.sent[entry_id - self.base] = now

    def ack(
        self,
        index: int,
        entry_ids: list[int],
        ensemble_size: int,
        write_quorum: int,
        first: int,
    ) -> list[int]:
        """Records durable acks of the bookie at ensemble ``index`` for the ``entry_ids`` from
        ``first`` on that are taken, sent and of its write sets; returns those below ``first``
        for the caller to look at one by one."""
        return self._ack(
            self.acked,
            self.failed,
            self.sent,
            self.base,
            entry_ids,
            index,
            ensemble_size,
            write_quorum,
            first,
        )

    def acked_by(self, entry_id: int, index: int) -> bool:
        return bool(self.acked[entry_id - self.base] >> index & 1)

    def reached(self, entry_id: int, ack_quorum: int) -> bool:
        """Whether the entry has durable acks from ``ack_quorum`` members (it may still wait for
        a lower entry, or an ensemble change, to complete)."""
        return self.acked[entry_id - self.base].bit_count() >= ack_quorum

    def fail(self, entry_id: int, index: int) -> None:
        """Records a failed write to one member of the entry's write set (not after its ack)."""
        at = entry_id - self.base
        if not self.acked[at] >> index & 1:
            self.failed[at] |= 1 << index

    def forget(self, entry_id: int, index: int) -> None:
        """Drops what one member answered (it was replaced: its copy is of an old fragment)."""
        at = entry_id - self.base
        keep = ~(1 << index)
        self.acked[at] &= keep
        self.failed[at] &= keep

    def still_possible(self, entry_id: int, write_quorum: int, ack_quorum: int) -> bool:
        """Whether the entry can still reach Qa acks without the members that failed."""
        return write_quorum - self.failed[entry_id - self.base].bit_count() >= ack_quorum

    def done(self, ack_quorum: int) -> int:
        """How many adds at the head were sent and acked by Qa bookies, in a row."""
        return self._done(self.acked, self.sent, ack_quorum)

    def pop(self, count: int) -> int:
        """Drops the first ``count`` adds (completed); returns the longest length among them."""
        longest = max(self.lengths[:count])
        del self.acked[:count], self.failed[:count], self.lengths[:count], self.sent[:count]
        self.base += count
        self.taken -= count
        return longest

    def clear(self) -> None:
        self.base += len(self.sent)
        self.taken = 0
        del self.acked[:], self.failed[:], self.lengths[:], self.sent[:]


class LedgerWriter:
    """Feed it ``add``, the answers and ``tick``; execute the instructions it returns."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        *,
        max_in_flight: int = 5000,
        add_timeout_ms: int | None = None,
        delay_ensemble_change: bool = False,
        explicit_lac_interval_ms: int = 0,
        deferred_sync: bool = False,
        change_rate: ChangeRate | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"at least one add must be allowed in flight: {max_in_flight}")
        self.metadata = metadata
        self.max_in_flight = max_in_flight
        self.add_timeout_ms = add_timeout_ms
        self.delay_ensemble_change = delay_ensemble_change
        self.explicit_lac_interval_ms = explicit_lac_interval_ms
        self.last_add_confirmed = -1
        self.last_add_pushed = -1
        self.length = 0  # of the confirmed entries
        self._pushed_length = 0
        self._pending = _Pending(metadata.ensemble_size)  # pushed, not completed
        self._waiting: collections.deque[int] = collections.deque()
        self._in_flight = 0
        self.changing = False
        self._failed: dict[int, str] = {}  # index -> bookie of the last fragment, to replace
        # Ensemble changes in quick succession back off (a storm of replacements that fail at
        # once); meanwhile entries complete with the copies they have, if Qa still can be met.
        self._change_rate = change_rate if change_rate is not None else ChangeRate()
        self._change_not_before = 0
        self._why: dict[str, str] = {}  # bookie -> how it last failed
        self.error: errors.BKError | None = None
        self._lac_carried = -1  # the LAC the last sent entry (or explicit write) carried
        self._last_send = 0
        self.ensemble_changes = 0
        self.under_replicated_adds = 0  # rule 8
        self.deferred_sync = deferred_sync
        self.last_add_completed = -1  # = the LAC unless deferred_sync
        self._confirmed_length = 0  # the length at the LAC
        # force id -> (LAC and length once done, bookies yet to answer)
        self._forces: dict[int, tuple[int, int, set[str]]] = {}
        self._force_ids = 0
        # _targets' table of the last fragment's write sets, and the metadata it was made from
        self._write_sets: list[tuple[tuple[int, str], ...]] = []
        self._write_sets_from = 0
        self._write_sets_of: LedgerMetadata | None = None

    # -- adds ----------------------------------------------------------------------------------

    def add(self, payload_length: int, now: int, entry_id: int | None = None) -> Accepted:
        """Takes the next entry, or entry ``entry_id`` when the caller chooses ids, and sends
        what may be sent; raises the writer's error if it failed, ``DuplicateEntryIdError`` for
        an id taken already. The one-step form of ``push`` and ``send_waiting`` (the client's
        handle pushes a loop pass's adds and sends once)."""
        entry_id = self.push(payload_length, entry_id)
        return Accepted(
            entry_id, self.last_add_confirmed, self._pushed_length, self.send_waiting(now)
        )

    def push(self, payload_length: int, entry_id: int | None = None) -> int:
        """``add`` without sending: takes the entry (it waits in order) and returns its id; the
        entry carries ``last_add_confirmed`` and ``pushed_length`` as they are now. A runtime
        that sends once per loop pass pushes the pass's adds and calls ``send_waiting`` once."""
        if self.error is not None:
            raise self.error
        if entry_id is None:
            entry_id = self.last_add_pushed + 1
        elif entry_id <= self.last_add_completed or entry_id in self._pending:
            raise errors.DuplicateEntryIdError(
                f"ledger {self.metadata.ledger_id}: entry {entry_id} was added already"
            )
        elif entry_id < 0:
            raise errors.IncorrectParameterError(f"entry ids start at 0, not {entry_id}")
        if entry_id > self.last_add_pushed:
            self.last_add_pushed = entry_id
        self._pushed_length += payload_length
        self._pending.take(entry_id, self._pushed_length)
        self._waiting.append(entry_id)
        if self.last_add_confirmed > self._lac_carried:
            self._lac_carried = self.last_add_confirmed
        return entry_id

    def push_run(self, lengths: list[int]) -> int:
        """``push`` of entries numbered on from the last one pushed, of these ledger
        ``lengths`` (the ledger's length with each entry: increasing, from ``pushed_length``
        on): a run of adds in one step. Returns the first one's id; raises the writer's error
        if it failed."""
        if self.error is not None:
            raise self.error
        first = self.last_add_pushed + 1
        if not lengths:
            return first
        self.last_add_pushed = first + len(lengths) - 1
        self._pushed_length = lengths[-1]
        self._pending.take_run(first, lengths)
        self._waiting.extend(range(first, self.last_add_pushed + 1))
        if self.last_add_confirmed > self._lac_carried:
            self._lac_carried = self.last_add_confirmed
        return first

    @property
    def pushed_length(self) -> int:
        """The ledger's length including every entry taken so far."""
        return self._pushed_length

    def _write_set_table(self) -> tuple[list[tuple[tuple[int, str], ...]], int]:
        """The last fragment's write sets, by entry id mod E, and the fragment's first entry."""
        metadata = self.metadata
        if self._write_sets_of is not metadata:
            start, bookies = metadata.last_ensemble
            size = metadata.ensemble_size
            self._write_sets = [
                tuple((i, bookies[i]) for i in write_set(k, size, metadata.write_quorum_size))
                for k in range(size)
            ]
            self._write_sets_from = start
            self._write_sets_of = metadata
        return self._write_sets, self._write_sets_from

    def _targets(
        self, entry_id: int, indices: list[int] | None = None
    ) -> tuple[tuple[int, str], ...]:
        if indices is None:  # the hot path: write sets of the last fragment, by entry id mod E
            table, start = self._write_set_table()
            if entry_id >= start:
                return table[entry_id % len(table)]
        ensemble = self.metadata.ensemble_at(entry_id)
        members = write_set(entry_id, self.metadata.ensemble_size, self.metadata.write_quorum_size)
        return tuple((i, ensemble[i]) for i in members if indices is None or i in indices)

    def send_waiting(self, now: int) -> list[Instruction]:
        """Sends the entries waiting, in order, as far as the in-flight bound allows: one
        ``SendAdds`` for them all."""
        if self.changing or self.error is not None:
            return []
        count = min(len(self._waiting), self.max_in_flight - self._in_flight)
        if count <= 0:
            return []
        waiting = self._waiting
        sent, base = self._pending.sent, self._pending.base
        table, start = self._write_set_table()
        size = len(table)
        entry_ids = list(starmap(waiting.popleft, repeat((), count)))
        first = entry_ids[0]
        if first >= start and entry_ids == [*range(first, first + count)]:
            # A run of the next ids, all of the last fragment (the usual case): marked sent
            # and given their write sets (the table from ``first`` on, round and round) without
            # a step per entry.
            sent[first - base : first - base + count] = array("q", [now]) * count
            turn = first % size
            if turn + count <= size:  # within one turn of the table (one add in flight: one)
                targets = table[turn : turn + count]
            else:
                targets = (table[turn:] + table[:turn]) * (count // size + 1)
                del targets[count:]
        else:  # caller-chosen ids out of order, or entries of an earlier fragment
            targets = []
            for entry_id in entry_ids:
                sent[entry_id - base] = now
                targets.append(self._targets(entry_id))
        self._in_flight += count
        self._last_send = now
        return [SendAdds(entry_ids, targets)]

    # -- answers -------------------------------------------------------------------------------

    def on_add_answer(
        self,
        entry_id: int,
        bookie_index: int,
        bookie: str,
        status: StatusCode | None,
        now: int,
        problem: str = "",
    ) -> list[Instruction]:
        """A bookie's answer to an add (``status`` None: connection lost or timed out;
        ``problem`` says what went wrong, for the error the adds fail with if it comes to that)."""
        if status == StatusCode.EOK:
            return self.on_add_acks(bookie_index, bookie, [entry_id], now)
        pending = self._pending
        if entry_id not in pending:
            if entry_id <= self.last_add_completed and self._of_write_set(
                entry_id, bookie_index, bookie
            ):
                self.under_replicated_adds += 1  # completed with fewer copies (rule 8)
            return []  # completed already, failed already, or never taken (a stray answer)
        if self.error is not None or pending.sent_at(entry_id) < 0:
            return []  # failed already, or not sent yet (a stray answer)
        if not self._of_write_set(entry_id, bookie_index, bookie):
            return []  # not of its write set, or replaced since: a copy of the old fragment
        if not pending.acked_by(entry_id, bookie_index) and pending.reached(
            entry_id, self.metadata.ack_quorum_size
        ):
            self.under_replicated_adds += 1  # has its Qa acks, not completed yet (rule 8)
        if status == StatusCode.EFENCED:
            return self._fail_all(
                errors.LedgerFencedError(
                    f"ledger {self.metadata.ledger_id} was fenced by a recovering reader "
                    f"(bookie {bookie} answered EFENCED): this writer can add no more entries"
                )
            )
        if status == StatusCode.EUA:
            return self._fail_all(
                errors.UnauthorizedAccessError(
                    f"bookie {bookie} refused ledger {self.metadata.ledger_id} (EUA): "
                    + errors.EUA_MEANING
                )
            )
        why = problem or (status.name if status is not None else "no answer")
        return self._bookie_failed(entry_id, bookie_index, bookie, why, now)

    def _of_write_set(self, entry_id: int, bookie_index: int, bookie: str) -> bool:
        """Whether ``bookie`` is at ``bookie_index`` of the entry's write set now (not replaced
        since the entry was sent to it)."""
        metadata = self.metadata
        in_write_set = (bookie_index - entry_id) % metadata.ensemble_size < (
            metadata.write_quorum_size
        )
        return in_write_set and metadata.ensemble_at(entry_id)[bookie_index] == bookie

    def on_add_acks(
        self, bookie_index: int, bookie: str, entry_ids: list[int], now: int
    ) -> list[Instruction]:
        """Durable acks (EOK) of one bookie, at ensemble index ``bookie_index``, for
        ``entry_ids``: a batch of answers completed in one pass. Answers for entries completed
        or failed already, not sent yet, outside the bookie's write sets, or sent to a bookie
        replaced since (a copy of the old fragment) change nothing."""
        if self.error is not None:
            return []
        metadata = self.metadata
        size, write_quorum = metadata.ensemble_size, metadata.write_quorum_size
        start, last = metadata.ensembles[-1]
        pending = self._pending
        if bookie_index < len(last) and last[bookie_index] == bookie:
            earlier = pending.ack(bookie_index, entry_ids, size, write_quorum, start)
        else:  # replaced: only its acks of earlier fragments count
            earlier = [entry_id for entry_id in entry_ids if entry_id < start]
        if earlier:  # entries of earlier fragments (rare): acked where it was of their ensemble
            ours = [e for e in earlier if metadata.ensemble_at(e)[bookie_index] == bookie]
            pending.ack(bookie_index, ours, size, write_quorum, 0)
        return self._complete(now)

    def _bookie_failed(
        self, entry_id: int, index: int, bookie: str, why: str, now: int
    ) -> list[Instruction]:
        pending = self._pending
        if pending.acked_by(entry_id, index):
            return []  # a failure after its durable ack changes nothing for this entry
        pending.fail(entry_id, index)
        self._why[bookie] = why
        if self.deferred_sync:
            return self._fail_all(
                errors.WriteError(
                    f"ledger {self.metadata.ledger_id} (DEFERRED_SYNC): bookie {bookie} failed "
                    f"({why}); such a ledger cannot change its ensemble, as in BookKeeper: "
                    "close it and write a new one"
                )
            )
        # Every pending entry is in the last fragment: a new fragment starts at LAC+1 and no
        # entry completes while it is being made.
        self._failed[index] = bookie
        if self.delay_ensemble_change and self._still_possible(entry_id):
            return []  # replaced with the next change, once some entry needs it
        return self._maybe_change(now)

    def _maybe_change(self, now: int) -> list[Instruction]:
        if self.changing or not self._failed or self.error is not None:
            return []
        if now < self._change_not_before:
            return []  # paced: ``tick`` makes the change once it is due
        self._change_not_before = self._change_rate.made(now)
        self.changing = True
        start, ensemble = self.metadata.last_ensemble
        return [ChangeEnsemble(self.last_add_confirmed + 1, start, ensemble, dict(self._failed))]

    def on_ensemble_changed(self, metadata: LedgerMetadata, now: int) -> list[Instruction]:
        """The new fragment is stored; ``metadata`` is the metadata as stored."""
        if self.error is not None:
            return []
        _, old = self.metadata.last_ensemble
        start, new = metadata.last_ensemble
        self.metadata = metadata
        self.changing = False
        self.ensemble_changes += 1
        replaced = {i for i in range(len(new)) if new[i] != old[i]}
        for index in replaced:
            self._failed.pop(index, None)
        instructions: list[Instruction] = []
        resent = SendAdds([], [])
        pending = self._pending
        for entry_id in pending.ids():
            if entry_id < start or pending.sent_at(entry_id) < 0:
                continue
            members = set(write_set(entry_id, metadata.ensemble_size, metadata.write_quorum_size))
            again = sorted(members & replaced)
            if not again:
                continue
            for index in again:
                pending.forget(entry_id, index)
            pending.set_sent(entry_id, now)
            resent.entry_ids.append(entry_id)
            resent.targets.append(self._targets(entry_id, again))
        if resent.entry_ids:
            instructions.append(resent)
        instructions += self._complete(now)
        instructions += self.send_waiting(now)
        return instructions + self._maybe_change(now)

    def on_ensemble_change_failed(self, error: errors.BKError, now: int) -> list[Instruction]:
        """The change could not be made: no replacement bookie, or the metadata refused it."""
        if self.error is not None:
            return []
        self.changing = False
        if isinstance(error, errors.NotEnoughBookiesError) and self._all_possible():
            # Carry on with fewer copies (BookKeeper does the same when no bookie is spare).
            self._failed.clear()
            return self._complete(now) + self.send_waiting(now)
        if isinstance(error, errors.NotEnoughBookiesError):
            causes = "; ".join(
                f"{bookie}: {self._why.get(bookie, '?')}"
                for bookie in sorted(self._failed.values())
            )
            error = errors.WriteError(
                f"ledger {self.metadata.ledger_id}: adds cannot reach their ack quorum "
                f"(Qa={self.metadata.ack_quorum_size}) because bookies failed ({causes}) and "
                f"none could replace them: {error}"
            )
        return self._fail_all(error)

    # -- time ----------------------------------------------------------------------------------

    def tick(self, now: int) -> list[Instruction]:
        """Add timeouts and the explicit LAC; call it every few milliseconds of idle or busy time."""
        instructions: list[Instruction] = []
        if self.error is not None:
            return instructions
        if self.add_timeout_ms is not None and not self.changing:
            pending = self._pending
            for entry_id in pending.ids():
                if self.error is not None or entry_id not in pending:
                    break  # every add failed (or completed, if that ever comes to pass here)
                sent_at = pending.sent_at(entry_id)
                if sent_at < 0 or now - sent_at < self.add_timeout_ms:
                    continue
                for index, bookie in self._targets(entry_id):
                    if self.error is None and not pending.acked_by(entry_id, index):
                        instructions += self._bookie_failed(
                            entry_id,
                            index,
                            bookie,
                            f"no answer within {self.add_timeout_ms} ms",
                            now,
                        )
                if self.error is None:
                    pending.set_sent(entry_id, now)  # one timeout per period, not per tick
        if (
            self._failed
            and not self.changing
            and now >= self._change_not_before
            and (not self.delay_ensemble_change or not self._all_possible())
        ):
            instructions += self._maybe_change(now)  # a paced change now due
        if (
            self.explicit_lac_interval_ms > 0
            and not self._pending.taken
            and self.last_add_confirmed > self._lac_carried
            and now - self._last_send >= self.explicit_lac_interval_ms
        ):
            self._lac_carried = self.last_add_confirmed
            self._last_send = now
            _, ensemble = self.metadata.last_ensemble
            instructions.append(WriteLac(self.last_add_confirmed, tuple(enumerate(ensemble))))
        return instructions

    # -- completion and failure ------------------------------------------------------------------

    def _complete(self, now: int) -> list[Instruction]:
        if self.changing:
            return []  # no success callback while the ensemble is being changed
        pending = self._pending
        done = pending.done(self.metadata.ack_quorum_size)
        if not done:
            return []
        first = self.last_add_completed + 1
        longest = pending.pop(done)
        self._in_flight -= done
        self.last_add_completed = first + done - 1
        if longest > self.length:
            self.length = longest
        if not self.deferred_sync:
            self.last_add_confirmed, self._confirmed_length = self.last_add_completed, self.length
        return [Completed(first, self.last_add_completed, self.length), *self.send_waiting(now)]

    # -- DEFERRED_SYNC ---------------------------------------------------------------------------

    def force(self) -> list[Instruction]:
        """Makes every completed entry durable and confirmed (``Forced`` once every bookie of the
        ensemble answered); at once when there is nothing to force."""
        self._force_ids += 1
        force_id = self._force_ids
        if self.error is not None:
            return [Forced(force_id, self.last_add_confirmed, self.error)]
        if self.last_add_completed <= self.last_add_confirmed:
            return [Forced(force_id, self.last_add_confirmed)]
        _, ensemble = self.metadata.last_ensemble
        self._forces[force_id] = (self.last_add_completed, self.length, set(ensemble))
        return [Force(force_id, tuple(enumerate(ensemble)))]

    def on_force_answer(
        self, force_id: int, bookie: str, status: StatusCode | None, problem: str = ""
    ) -> list[Instruction]:
        pending = self._forces.get(force_id)
        if pending is None:
            return []
        up_to, length, unanswered = pending
        if status != StatusCode.EOK:
            del self._forces[force_id]
            why = problem or (status.name if status is not None else "no answer")
            error = errors.WriteError(
                f"ledger {self.metadata.ledger_id}: bookie {bookie} could not force its entries "
                f"to disk ({why}); entries after {self.last_add_confirmed} are not durable"
            )
            return [Forced(force_id, self.last_add_confirmed, error)]
        unanswered.discard(bookie)
        if unanswered:
            return []
        del self._forces[force_id]
        if up_to > self.last_add_confirmed:
            self.last_add_confirmed, self._confirmed_length = up_to, length
        return [Forced(force_id, self.last_add_confirmed)]

    def _fail_all(self, error: errors.BKError) -> list[Instruction]:
        self.error = error
        failed = tuple(self._pending.ids())
        self._pending.clear()
        self._waiting.clear()
        self._in_flight = 0
        return [Failed(failed, error)] if failed else []

    def close(self) -> tuple[int, int, list[Instruction]]:
        """Stops the writer: (last entry, length) to close the ledger at, and the failures of the
        adds still pending (``LedgerClosedError``)."""
        instructions: list[Instruction] = []
        if self.error is None:
            instructions = self._fail_all(
                errors.LedgerClosedError(
                    f"ledger {self.metadata.ledger_id} was closed with this add pending"
                )
            )
        return self.last_add_confirmed, self._confirmed_length, instructions

    @property
    def deadlines_only_grow(self) -> bool:
        """Whether ``next_deadline`` can only move later (or vanish) as adds are sent and
        answered: no failed bookie waits for a (paced) ensemble change, and no explicit LAC is
        kept. The deadlines left are add timeouts, a fixed time after each send, so a later
        send's is later. A timer set for the next deadline then stays right (it fires early at
        worst, and ``tick`` finds nothing due), and the runtime need not look again after
        every step; once a bookie fails, it must."""
        return not self._failed and self.explicit_lac_interval_ms <= 0

    def next_deadline(self, now: int) -> int | None:
        """When ``tick`` may next do something (ms, on the caller's clock; at most ``now``
        when it is due already), or None: nothing will be due until an event (an add, an
        answer, a change) comes. The runtime sets one timer for it instead of polling."""
        if self.error is not None:
            return None
        deadlines: list[int] = []
        if self.add_timeout_ms is not None and not self.changing:
            sent = self._pending.sent
            earliest = min(sent, default=-1)
            if earliest < 0:  # some wait (or are holes): the earliest of those sent
                earliest = min((sent_at for sent_at in sent if sent_at >= 0), default=-1)
            if earliest >= 0:
                deadlines.append(earliest + self.add_timeout_ms)
        if self._failed and not self.changing:
            due = (not self.delay_ensemble_change) or not self._all_possible()
            if due:
                deadlines.append(self._change_not_before)  # a paced ensemble change to make
        if (
            self.explicit_lac_interval_ms > 0
            and not self._pending.taken
            and self.last_add_confirmed > self._lac_carried
        ):
            deadlines.append(self._last_send + self.explicit_lac_interval_ms)
        return min(deadlines) if deadlines else None

    @property
    def pending(self) -> int:
        """Adds taken and not yet completed or failed."""
        return self._pending.taken

    def _still_possible(self, entry_id: int) -> bool:
        metadata = self.metadata
        return self._pending.still_possible(
            entry_id, metadata.write_quorum_size, metadata.ack_quorum_size
        )

    def _all_possible(self) -> bool:
        """Whether every pending add can still reach Qa without the members that failed."""
        return all(self._still_possible(entry_id) for entry_id in self._pending.ids())


def close_needed(current: LedgerMetadata, last_entry: int, length: int) -> bool:
    """The writer's close rule, for the metadata update loop: whether ``current`` still needs
    the writer's close at ``last_entry`` / ``length``. Closed there already: no (a retried
    close). Closed elsewhere: ``MetadataVersionError`` (someone else decided the end). In
    recovery: ``LedgerFencedError`` (a recovering reader closes it, not this writer)."""
    if current.state == LedgerState.CLOSED:
        if current.last_entry_id == last_entry and current.length == length:
            return False
        raise errors.MetadataVersionError(
            f"ledger {current.ledger_id} was closed by someone else at entry "
            f"{current.last_entry_id} (length {current.length}) while this writer had "
            f"{last_entry} (length {length}) confirmed"
        )
    if current.state == LedgerState.IN_RECOVERY:
        raise errors.LedgerFencedError(
            f"ledger {current.ledger_id} is being recovered by another client"
        )
    return True
