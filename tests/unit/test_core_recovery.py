"""The recovery state machine (``bookkeeper_py.core.recovery``) driven by scripted bookies: no I/O,
no clock, every answer chosen by the test. The scenarios are the protocol bugs of reference
section 3.5 and the rules of section 3.2."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest

from bookkeeper_py import errors
from bookkeeper_py.core.lac import LastConfirmedRead
from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.core.quorum import write_set
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
from bookkeeper_py.wire.digest import DigestType, Entry
from bookkeeper_py.wire.status import StatusCode

LEDGER = 7


@dataclass
class ScriptedBookie:
    """A bookie's entries of ``LEDGER``, and how it misbehaves."""

    entries: dict[int, Entry] = field(default_factory=dict)
    fenced: bool = False
    down: bool = False
    errors_on: set[int] = field(default_factory=set)  # entries whose reads fail with EIO
    fence_reads: int = 0
    unfenced_reads: int = 0
    writes: int = 0

    def read(self, entry_id: int, fence: bool) -> tuple[StatusCode | None, Entry | None]:
        if self.down:
            return None, None
        if fence:
            self.fenced = True
            self.fence_reads += 1
        else:
            self.unfenced_reads += 1
        if entry_id in self.errors_on:
            return StatusCode.EIO, None
        if entry_id == -1:
            if not self.entries:
                return StatusCode.ENOENTRY, None
            return StatusCode.EOK, self.entries[max(self.entries)]
        if entry_id not in self.entries:
            return StatusCode.ENOENTRY, None
        return StatusCode.EOK, self.entries[entry_id]


def entry(entry_id: int, lac: int) -> Entry:
    return Entry(LEDGER, entry_id, lac, 10 * (entry_id + 1), b"x" * 10)


def metadata(e: int, qw: int, qa: int, *fragments: int) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LEDGER,
        ensemble_size=e,
        write_quorum_size=qw,
        ack_quorum_size=qa,
        digest_type=DigestType.CRC32C,
        password=b"",
        ensembles=tuple(
            (first, tuple(f"b{first}-{i}:1" for i in range(e))) for first in fragments or (0,)
        ),
    )


def written(
    md: LedgerMetadata, upto: int, lac_lag: int = 1, only: set[int] | None = None
) -> list[ScriptedBookie]:
    """Bookies of the last ensemble holding entries 0..upto, each on its whole write set (or on
    the members in ``only``), with the LAC lagging ``lac_lag`` behind."""
    bookies = [ScriptedBookie() for _ in range(md.ensemble_size)]
    for entry_id in range(upto + 1):
        for index in write_set(entry_id, md.ensemble_size, md.write_quorum_size):
            if only is None or index in only:
                bookies[index].entries[entry_id] = entry(entry_id, entry_id - lac_lag)
    return bookies


def run(
    md: LedgerMetadata,
    last: list[ScriptedBookie],
    window: int = 4,
    others: dict[str, ScriptedBookie] | None = None,
) -> tuple[Instruction, LedgerMetadata]:
    """Executes the machine's instructions in order against the bookies (``last``: those of the
    last ensemble by index; ``others`` by bookie id) and a metadata store; returns the final
    instruction and metadata."""
    by_name = dict(zip(md.last_ensemble[1], last, strict=True)) | (others or {})
    machine = LedgerRecovery(LEDGER, read_window=window)
    stored = md
    queue: deque[Instruction] = deque(machine.start())
    for _ in range(100_000):
        instruction = queue.popleft()
        if isinstance(instruction, (RecoveryDone, RecoveryFailed)):
            assert not queue or all(
                not isinstance(i, (RecoveryDone, RecoveryFailed)) for i in queue
            )
            return instruction, stored
        if isinstance(instruction, MarkInRecovery):
            if stored.state == LedgerState.OPEN:
                stored = stored.with_state(LedgerState.IN_RECOVERY)
            queue.extend(machine.on_metadata(stored))
        elif isinstance(instruction, CloseInRecovery):
            if stored.state == LedgerState.IN_RECOVERY:
                stored = instruction.closed(stored)
            queue.extend(machine.on_metadata(stored))
        elif isinstance(instruction, ReplaceInRecovery):
            spares = [
                name
                for name, b in (others or {}).items()
                if not b.down and name not in instruction.ensemble
            ]
            if len(spares) < len(instruction.failed):
                queue.extend(machine.on_replacement_failed(errors.NotEnoughBookiesError("none")))
            else:
                members = list(instruction.ensemble)
                for index, spare in zip(sorted(instruction.failed), spares, strict=False):
                    members[index] = spare
                queue.extend(machine.on_replacement(tuple(members)))
        elif isinstance(instruction, ReadRequest):
            bookie = by_name[instruction.bookie]
            status, found = bookie.read(instruction.entry_id, instruction.fence)
            queue.extend(
                machine.on_read(
                    instruction.bookie_index, instruction.entry_id, status, found, b"raw"
                )
            )
        elif isinstance(instruction, RecoveryAdd):
            bookie = by_name[instruction.bookie]
            bookie.writes += 1
            if bookie.down:
                queue.extend(
                    machine.on_add(
                        instruction.bookie_index,
                        instruction.entry_id,
                        None,
                        "down",
                        instruction.bookie,
                    )
                )
            else:
                bookie.entries[instruction.entry_id] = entry(instruction.entry_id, -1)
                queue.extend(
                    machine.on_add(
                        instruction.bookie_index,
                        instruction.entry_id,
                        StatusCode.EOK,
                        "",
                        instruction.bookie,
                    )
                )
    raise AssertionError("recovery did not end within 100,000 instructions")


@pytest.mark.parametrize(("e", "qw", "qa"), [(3, 3, 2), (3, 2, 2), (5, 3, 2), (4, 4, 3)])
def test_recovery_closes_at_the_last_entry_written_and_writes_it_back(
    e: int, qw: int, qa: int
) -> None:
    md = metadata(e, qw, qa)
    bookies = written(md, 20, lac_lag=3)
    # Entry 21 reached only one bookie (fewer than Qa): it may or may not survive recovery,
    # but every entry up to 20 must.
    bookies[write_set(21, e, qw)[0]].entries[21] = entry(21, 18)
    final, stored = run(md, bookies)
    assert isinstance(final, RecoveryDone)
    assert stored.state == LedgerState.CLOSED and stored.last_entry_id >= 20
    last = stored.last_entry_id
    assert stored.length == 10 * (last + 1)
    for entry_id in range(last + 1):  # written back to the whole write set
        assert all(entry_id in bookies[i].entries for i in write_set(entry_id, e, qw))


def test_every_recovery_read_fences_issue_2614() -> None:
    md = metadata(3, 3, 2)
    bookies = written(md, 10)
    run(md, bookies)
    assert all(b.fenced and b.unfenced_reads == 0 and b.fence_reads > 1 for b in bookies)


def test_an_empty_last_fragment_is_not_read_issue_2615() -> None:
    # The writer changed ensemble at entry 11 (its LAC was 10) and wrote nothing more.
    md = metadata(3, 2, 2, 0, 11)
    first = written(metadata(3, 2, 2), 10)
    first_by_name = dict(zip(md.ensembles[0][1], first, strict=True))
    empty_last = [ScriptedBookie() for _ in range(3)]
    final, stored = run(md, empty_last, others=first_by_name)
    assert isinstance(final, RecoveryDone)
    assert (stored.last_entry_id, stored.length) == (10, 110)
    assert stored.ensembles == md.ensembles
    # The earlier fragment is immutable: only entry 10 is read from it (for the length), and
    # nothing is written back to it.
    assert sum(b.fence_reads for b in first) == 2 and sum(b.writes for b in first) == 0


def test_an_io_error_is_not_an_absence_issue_2908() -> None:
    md = metadata(3, 3, 2)
    bookies = written(md, 10, lac_lag=5)
    # Entry 8 was acked by bookies 0 and 1 (Qa=2) and never reached bookie 2. Now bookie 0's
    # read of it fails with an I/O error and bookie 1 is unreachable: one explicit "no" (from
    # bookie 2) of the two needed. Counting the I/O error as a "no" would close the ledger at
    # 7 and lose the acked entry 8: recovery must fail instead.
    bookies[0].errors_on.add(8)
    bookies[1].down = True
    bookies[2].entries.pop(8)
    final, stored = run(md, bookies)
    assert isinstance(final, RecoveryFailed)
    assert isinstance(final.error, errors.LedgerRecoveryError)
    assert "an error is not an absence" in str(final.error)
    assert stored.state == LedgerState.IN_RECOVERY  # retried later, never truncated


def test_absence_needs_qw_minus_qa_plus_one_explicit_answers() -> None:
    # E=5 Qw=3 Qa=2: two explicit "no" answers end the ledger, one does not.
    md = metadata(5, 3, 2)
    bookies = written(md, 12, lac_lag=2)
    members = write_set(13, 5, 3)
    bookies[members[0]].entries[13] = entry(13, 11)  # one copy of 13: maybe acked? no (< Qa)
    final, stored = run(md, bookies)
    assert isinstance(final, RecoveryDone)
    # 13 is found on one bookie, so it is recovered (written back), then 14 is absent.
    assert stored.last_entry_id == 13


def test_fencing_needs_coverage_of_every_write_set() -> None:
    # E=5 Qw=3 Qa=2: bookies 1 and 3 down leave the write set {1, 2, 3} with one known member,
    # so the writer could still get Qa acks from 1 and 3: recovery must not go on.
    md = metadata(5, 3, 2)
    bookies = written(md, 10)
    bookies[1].down = bookies[3].down = True
    final, stored = run(md, bookies)
    assert isinstance(final, RecoveryFailed) and "could not fence" in str(final.error)
    # With only bookie 1 down every write set keeps two known members: recovery succeeds.
    bookies = written(md, 10)
    bookies[1].down = True
    final, stored = run(md, bookies)
    assert isinstance(final, RecoveryDone) and stored.last_entry_id == 10


def test_wrong_password_ends_recovery_at_once() -> None:
    md = metadata(3, 2, 2)
    machine = LedgerRecovery(LEDGER)
    machine.start()
    reads = machine.on_metadata(md.with_state(LedgerState.IN_RECOVERY))
    assert [r.entry_id for r in reads if isinstance(r, ReadRequest)] == [-1, -1, -1]
    (failed,) = machine.on_read(0, -1, StatusCode.EUA)
    assert isinstance(failed, RecoveryFailed)
    assert isinstance(failed.error, errors.UnauthorizedAccessError)
    assert machine.on_read(1, -1, StatusCode.ENOENTRY) == []  # ignored after the end


def test_a_ledger_closed_meanwhile_keeps_its_close() -> None:
    md = metadata(3, 2, 2)
    closed = md.closed_at(4, 50)
    machine = LedgerRecovery(LEDGER)
    machine.start()
    assert machine.on_metadata(closed) == [RecoveryDone(closed)]
    # ... and when someone else closed it between our fencing and our close.
    machine = LedgerRecovery(LEDGER, read_window=1)
    machine.start()
    machine.on_metadata(md.with_state(LedgerState.IN_RECOVERY))
    for index in range(3):
        machine.on_read(index, -1, StatusCode.ENOENTRY)
    # Qw=2 Qa=2: one explicit "no" is enough.
    (close,) = machine.on_read(0, 0, StatusCode.ENOENTRY)
    assert close == CloseInRecovery(-1, 0)
    assert machine.on_metadata(closed) == [RecoveryDone(closed)]


def test_duplicate_answers_change_nothing() -> None:
    md = metadata(3, 3, 2)
    machine = LedgerRecovery(LEDGER, read_window=1)
    machine.start()
    machine.on_metadata(md.with_state(LedgerState.IN_RECOVERY))
    assert machine.on_read(0, -1, StatusCode.ENOENTRY) == []
    assert machine.on_read(0, -1, StatusCode.ENOENTRY) == []  # the same bookie twice: not covered
    reads = machine.on_read(1, -1, StatusCode.ENOENTRY)
    assert [(r.entry_id, r.fence) for r in reads if isinstance(r, ReadRequest)] == [(0, True)] * 3
    assert machine.on_read(0, 0, StatusCode.ENOENTRY) == []
    assert machine.on_read(0, 0, StatusCode.ENOENTRY) == []  # a duplicated "no" counts once
    (close,) = machine.on_read(2, 0, StatusCode.ENOENTRY)
    assert close == CloseInRecovery(-1, 0)


def last_bookie_leaves_after_its_first_read(md: LedgerMetadata) -> list[ScriptedBookie]:
    """Bookies holding entries 0..5 (LAC 3); bookie 2 answers reads, then goes away before the
    write-backs reach it."""
    bookies = written(md, 5, lac_lag=2)
    read = bookies[2].read

    def read_then_go_away(entry_id: int, fence: bool) -> tuple[StatusCode | None, Entry | None]:
        answer = read(entry_id, fence)
        if entry_id >= 0:
            bookies[2].down = True
        return answer

    bookies[2].read = read_then_go_away  # type: ignore[method-assign]
    return bookies


def test_a_failed_write_back_that_cannot_reach_qa_fails_recovery() -> None:
    md = metadata(3, 3, 3)
    # Without a spare bookie, Qa=3 is out of reach: the ledger stays IN_RECOVERY rather than
    # being closed on two copies.
    final, stored = run(md, last_bookie_leaves_after_its_first_read(md))
    assert isinstance(final, RecoveryFailed) and "cannot reach its ack quorum" in str(final.error)
    assert stored.state == LedgerState.IN_RECOVERY


def test_the_lac_read_takes_the_largest_lac_once_every_write_set_is_covered() -> None:
    md = metadata(5, 3, 2)
    read = LastConfirmedRead(md, fence=False)
    assert [(r.entry_id, r.fence) for r in read.start()] == [(-1, False)] * 5
    assert read.on_answer(0, StatusCode.EOK, entry(9, 7)) is None
    assert read.on_answer(0, StatusCode.EOK, entry(9, 8)) is None  # a duplicate: ignored
    assert read.on_answer(1, None, None, "timed out") is None  # an error is not known
    assert read.on_answer(2, StatusCode.ENOENTRY, None) is None
    assert read.on_answer(3, StatusCode.EOK, entry(8, 6)) is None
    outcome = read.on_answer(4, StatusCode.EOK, entry(7, 5))  # {0, 2, 3, 4} cover every set
    assert outcome is not None and outcome.lac == 7
    assert outcome.lengths == {9: 100, 8: 90, 7: 80}
    failing = LastConfirmedRead(md, fence=False)
    for index in range(4):
        assert failing.on_answer(index, None, None, f"down {index}") is None
    with pytest.raises(errors.LedgerRecoveryError, match=r"down 0; .*down 3"):
        failing.on_answer(4, StatusCode.EOK, entry(7, 5))


def test_a_dead_bookie_is_replaced_in_memory_and_the_close_stores_the_new_fragment() -> None:
    md = metadata(3, 3, 3)
    spare = ScriptedBookie()
    final, stored = run(md, last_bookie_leaves_after_its_first_read(md), others={"spare": spare})
    assert isinstance(final, RecoveryDone) and stored.state == LedgerState.CLOSED
    assert stored.last_entry_id == 5  # entries 0..5 were written
    first, last_ensemble = stored.last_ensemble
    assert last_ensemble == (md.last_ensemble[1][0], md.last_ensemble[1][1], "spare")
    assert first == 4  # recovery started after the LAC, 3: its first write-back opens it
    # Every entry of the new fragment is on all three of its bookies (Qa = 3).
    assert all(e in spare.entries for e in range(first, 6))
