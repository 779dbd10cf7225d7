"""The writer state machine (``bookkeeper_py.core.writer``): ordered acks, the in-flight bound,
ensemble change (no completion during it, unacknowledged entries re-sent to the replacement,
stale answers of replaced bookies ignored), timeouts, fencing and the explicit LAC. No I/O: the
test plays the bookies and the metadata store."""

from __future__ import annotations

import itertools
import random
from array import array
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper_py import errors
from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.core.writer import (
    ChangeEnsemble,
    Completed,
    Failed,
    Force,
    Forced,
    Instruction,
    LedgerWriter,
    SendAdds,
    WriteLac,
    _ack_py,
    _done_py,
    change_ensemble,
    close_needed,
)
from bookkeeper_py.speedups import native
from bookkeeper_py.wire.digest import DigestType
from bookkeeper_py.wire.status import StatusCode

OK = StatusCode.EOK


def metadata(e: int, qw: int, qa: int) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=1,
        ensemble_size=e,
        write_quorum_size=qw,
        ack_quorum_size=qa,
        digest_type=DigestType.CRC32C,
        password=b"",
        ensembles=((0, tuple(f"b{i}" for i in range(e))),),
    )


def of(instructions: list[Instruction], kind: type) -> list:  # type: ignore[type-arg]
    return [i for i in instructions if isinstance(i, kind)]


class Sent(NamedTuple):
    entry_id: int
    targets: tuple[tuple[int, str], ...]


def sent(instructions: list[Instruction]) -> list[Sent]:
    """The entries the ``SendAdds`` among ``instructions`` send, one by one, in order."""
    return [Sent(e, t) for send in of(instructions, SendAdds) for e, t in send]


def completed(instructions: list[Instruction]) -> list[int]:
    return [e for c in of(instructions, Completed) for e in range(c.first, c.last + 1)]


def test_adds_complete_in_order_after_qa_acks() -> None:
    writer = LedgerWriter(metadata(3, 2, 2))
    sends = [sent(writer.add(10, 0).instructions)[0] for _ in range(3)]
    assert [s.targets for s in sends] == [
        ((0, "b0"), (1, "b1")),
        ((1, "b1"), (2, "b2")),
        ((2, "b2"), (0, "b0")),
    ]
    # entry 1 reaches Qa first: nothing completes until entry 0 does
    assert completed(writer.on_add_answer(1, 1, "b1", OK, 1)) == []
    assert completed(writer.on_add_answer(1, 2, "b2", OK, 1)) == []
    assert completed(writer.on_add_answer(0, 0, "b0", OK, 1)) == []
    out = writer.on_add_answer(0, 1, "b1", OK, 1)
    assert completed(out) == [0, 1] and of(out, Completed)[0].length == 20
    assert writer.on_add_answer(2, 2, "b2", OK, 1) == []
    assert writer.on_add_answer(2, 2, "b2", OK, 1) == []  # a duplicate ack counts once
    assert completed(writer.on_add_answer(2, 0, "b0", OK, 1)) == [2]
    assert writer.on_add_answer(2, 1, "b1", OK, 1) == []  # late, and not of its write set
    assert writer.pending == 0 and writer.last_add_confirmed == 2 and writer.length == 30


@given(st.permutations(list(itertools.product(range(6), range(2)))))
def test_any_ack_order_yields_sequential_completions(order: list[tuple[int, int]]) -> None:
    writer = LedgerWriter(metadata(2, 2, 2))
    for _ in range(6):
        writer.add(1, 0)
    done: list[int] = []
    for entry_id, member in order:
        index = write_set(entry_id, 2, 2)[member]
        done += completed(writer.on_add_answer(entry_id, index, f"b{index}", OK, 0))
        assert done == list(range(len(done)))
    assert done == list(range(6))


def test_at_most_max_in_flight_are_sent_and_the_rest_follow_acks() -> None:
    writer = LedgerWriter(metadata(1, 1, 1), max_in_flight=2)
    accepted = [writer.add(1, 0) for _ in range(5)]
    assert [len(sent(a.instructions)) for a in accepted] == [1, 1, 0, 0, 0]
    assert [a.last_add_confirmed for a in accepted] == [-1] * 5
    out = writer.on_add_answer(0, 0, "b0", OK, 1)
    assert completed(out) == [0] and [s.entry_id for s in sent(out)] == [2]
    assert writer.add(1, 2).last_add_confirmed == 0  # the LAC rides on the next entry


def test_pushed_adds_are_sent_together_in_order_within_the_in_flight_bound() -> None:
    """``push`` takes entries without sending (a runtime sending once per loop pass);
    ``send_waiting`` then sends them in order, as many as the in-flight bound allows, and
    each carries the LAC and length of its push."""
    writer = LedgerWriter(metadata(3, 2, 2), max_in_flight=3)
    assert [writer.push(10) for _ in range(4)] == [0, 1, 2, 3]
    assert writer.pushed_length == 40 and writer.last_add_confirmed == -1
    sends = sent(writer.send_waiting(5))
    assert [s.entry_id for s in sends] == [0, 1, 2]  # the fourth waits for a permit
    assert writer.send_waiting(5) == []
    out = ack_all(writer, 0, 6)
    assert completed(out) == [0] and [s.entry_id for s in sent(out)] == [3]
    assert writer.push(7) == 4 and writer.pushed_length == 47
    assert writer.last_add_confirmed == 0  # what entry 4 carries
    writer.on_add_answer(1, 1, "b1", StatusCode.EFENCED, 7)
    with pytest.raises(errors.LedgerFencedError):
        writer.push(1)


@given(runs=st.lists(st.lists(st.integers(0, 100), max_size=6), max_size=6), acked=st.data())
def test_a_run_of_pushes_is_the_same_pushes_one_by_one(
    runs: list[list[int]], acked: st.DataObject
) -> None:
    """``push_run`` (a runtime's slice of next entries, taken in one step) leaves the writer as
    the same ``push`` calls do: the ids, the lengths, the sends, the LAC carried, the acks."""
    one, run = (LedgerWriter(metadata(3, 2, 2), max_in_flight=8) for _ in range(2))
    for sizes in runs:
        ids = [one.push(size) for size in sizes]
        lengths = list(itertools.accumulate(sizes, initial=run.pushed_length))[1:]
        first = run.push_run(lengths)
        assert ids == list(range(first, first + len(sizes)))
        assert (run.pushed_length, run.last_add_pushed) == (one.pushed_length, one.last_add_pushed)
        sends = [sent(writer.send_waiting(1)) for writer in (one, run)]
        assert sends[0] == sends[1]
        for send in sends[0][: acked.draw(st.integers(0, len(sends[0])))]:
            outs = [ack_all(writer, send.entry_id, 2) for writer in (one, run)]
            assert outs[0] == outs[1]
    assert list(one._pending.lengths) == list(run._pending.lengths)
    assert list(one._pending.sent) == list(run._pending.sent)
    assert one.last_add_confirmed == run.last_add_confirmed
    if run.last_add_pushed == run.last_add_confirmed:  # nothing pending: one to fence
        run.push_run([run.pushed_length + 1])
        run.send_waiting(3)
    lowest = run.last_add_confirmed + 1  # pending and sent
    index, bookie = run._targets(lowest)[0]
    run.on_add_answer(lowest, index, bookie, StatusCode.EFENCED, 3)
    with pytest.raises(errors.LedgerFencedError):
        run.push_run([run.pushed_length + 1])


def ack_all(writer: LedgerWriter, entry_id: int, now: int = 0) -> list[Instruction]:
    out: list[Instruction] = []
    for index, bookie in writer._targets(entry_id):
        out += writer.on_add_answer(entry_id, index, bookie, OK, now)
    return out


def test_a_failed_bookie_is_replaced_from_lac_plus_one_and_unacked_entries_resent() -> None:
    writer = LedgerWriter(metadata(3, 3, 2))
    for _ in range(4):
        writer.add(1, 0)
    ack_all(writer, 0)  # LAC 0
    # entry 1: b0 and b2 ack... but b1 fails: entry 1 could still complete, yet b1 is replaced
    assert completed(writer.on_add_answer(1, 0, "b0", OK, 1)) == []
    out = writer.on_add_answer(1, 1, "b1", StatusCode.EIO, 1)
    (change,) = of(out, ChangeEnsemble)
    assert change.first_entry == 1 and dict(change.failed) == {1: "b1"}
    assert writer.changing
    # no completion while the ensemble changes, even though entry 1 reaches Qa now
    assert writer.on_add_answer(1, 2, "b2", OK, 2) == []
    assert writer.add(1, 2).instructions == []  # new adds wait for the change
    stored = change_ensemble(writer.metadata, 1, (0, ("b0", "b1", "b2")), ("b0", "b9", "b2"))
    assert stored is not None and stored.ensembles == (
        (0, ("b0", "b1", "b2")),
        (1, ("b0", "b9", "b2")),
    )
    out = writer.on_ensemble_changed(stored, 3)
    resent = {s.entry_id: s.targets for s in sent(out)}
    # entries 1-3 re-sent to b9 only; entry 4 (never sent) goes to its whole write set
    assert resent == {
        1: ((1, "b9"),),
        2: ((1, "b9"),),
        3: ((1, "b9"),),
        4: ((1, "b9"), (2, "b2"), (0, "b0")),
    }
    assert completed(out) == [1]  # b0 + b2 acked it: released once the change is done
    # a late ack of the replaced bookie counts for nothing
    assert writer.on_add_answer(2, 1, "b1", OK, 4) == []
    assert completed(writer.on_add_answer(2, 1, "b9", OK, 4)) == []
    assert completed(writer.on_add_answer(2, 2, "b2", OK, 4)) == [2]


@given(
    st.permutations([(e, i) for e in range(6) for i in range(3)]),
    st.lists(st.integers(1, 4), min_size=18, max_size=18),
)
def test_acks_in_batches_complete_as_the_same_acks_one_by_one(
    order: list[tuple[int, int]], cuts: list[int]
) -> None:
    """A batch of one bookie's acks (``on_add_acks``) completes exactly what the same acks,
    answered one at a time, complete; acks outside a bookie's write sets count for nothing."""
    one, batched = LedgerWriter(metadata(3, 2, 2)), LedgerWriter(metadata(3, 2, 2))
    for _ in range(6):
        one.add(1, 0)
        batched.add(1, 0)
    singly: list[int] = []
    for entry_id, index in order:
        singly += completed(one.on_add_answer(entry_id, index, f"b{index}", OK, 1))
    in_batches: list[int] = []
    position = 0
    for cut in cuts:  # consecutive runs of the same order, grouped by bookie
        run, position = order[position : position + cut], position + cut
        for index in range(3):
            entry_ids = [e for e, i in run if i == index]
            in_batches += completed(batched.on_add_acks(index, f"b{index}", entry_ids, 1))
    assert singly == in_batches == list(range(6))
    assert one.last_add_confirmed == batched.last_add_confirmed == 5


def test_a_batch_of_acks_from_a_replaced_bookie_counts_for_nothing() -> None:
    writer = LedgerWriter(metadata(3, 3, 2))
    for _ in range(3):
        writer.add(1, 0)
    (change,) = of(writer.on_add_answer(0, 1, "b1", StatusCode.EIO, 1), ChangeEnsemble)
    assert dict(change.failed) == {1: "b1"}
    stored = change_ensemble(writer.metadata, 0, (0, ("b0", "b1", "b2")), ("b0", "b9", "b2"))
    assert stored is not None
    writer.on_ensemble_changed(stored, 2)
    assert writer.on_add_acks(1, "b1", [0, 1, 2], 3) == []  # the replaced bookie, late
    assert completed(writer.on_add_acks(0, "b0", [0, 1, 2], 3)) == []
    assert completed(writer.on_add_acks(1, "b9", [1, 0, 7], 3)) == [0, 1]  # 7: never added
    assert completed(writer.on_add_acks(2, "b2", [2], 3)) == [2]


def test_failures_during_a_change_start_another_change_afterwards() -> None:
    writer = LedgerWriter(metadata(3, 3, 3))
    writer.add(1, 0)
    (first,) = of(writer.on_add_answer(0, 0, "b0", None, 1), ChangeEnsemble)
    assert dict(first.failed) == {0: "b0"}
    assert of(writer.on_add_answer(0, 1, "b1", StatusCode.EIO, 1), ChangeEnsemble) == []
    stored = change_ensemble(writer.metadata, 0, (0, ("b0", "b1", "b2")), ("b5", "b1", "b2"))
    assert stored is not None and stored.ensembles == ((0, ("b5", "b1", "b2")),)  # same start
    out = writer.on_ensemble_changed(stored, 2)
    (second,) = of(out, ChangeEnsemble)
    assert dict(second.failed) == {1: "b1"} and second.ensemble == ("b5", "b1", "b2")


def test_an_ensemble_change_refused_by_the_metadata_fails_every_add() -> None:
    writer = LedgerWriter(metadata(3, 2, 2))
    for _ in range(3):
        writer.add(1, 0)
    writer.on_add_answer(0, 0, "b0", StatusCode.EIO, 1)
    fenced = writer.metadata.with_state(LedgerState.IN_RECOVERY)
    with pytest.raises(errors.LedgerFencedError):
        change_ensemble(fenced, 0, (0, ("b0", "b1", "b2")), ("b7", "b1", "b2"))
    with pytest.raises(errors.LedgerClosedError):
        change_ensemble(fenced.closed_at(5, 5), 0, (0, ("b0", "b1", "b2")), ("b7", "b1", "b2"))
    out = writer.on_ensemble_change_failed(errors.LedgerFencedError("fenced"), 2)
    (failed,) = of(out, Failed)
    assert failed.entry_ids == (0, 1, 2)
    with pytest.raises(errors.LedgerFencedError):
        writer.add(1, 3)


def test_a_change_that_landed_but_whose_answer_was_lost_is_not_made_twice() -> None:
    before = metadata(3, 2, 2)
    based_on = before.last_ensemble
    landed = change_ensemble(before, 4, based_on, ("b0", "b8", "b2"))
    assert landed is not None
    assert change_ensemble(landed, 4, based_on, ("b0", "b8", "b2")) is None
    with pytest.raises(errors.MetadataVersionError):
        change_ensemble(landed, 4, based_on, ("b0", "b9", "b2"))


def test_no_spare_bookie_carries_on_while_qa_is_reachable_and_fails_when_not() -> None:
    writer = LedgerWriter(metadata(3, 3, 2))
    writer.add(1, 0)
    writer.on_add_answer(0, 0, "b0", StatusCode.EIO, 1)
    out = writer.on_ensemble_change_failed(errors.NotEnoughBookiesError("none"), 2)
    assert of(out, Failed) == [] and not writer.changing
    assert completed(writer.on_add_answer(0, 1, "b1", OK, 3)) == []
    assert completed(writer.on_add_answer(0, 2, "b2", OK, 3)) == [0]
    writer.add(1, 4)
    writer.on_add_answer(1, 1, "b1", StatusCode.EIO, 5)
    writer.on_add_answer(1, 2, "b2", StatusCode.EIO, 5)
    (failed,) = of(writer.on_ensemble_change_failed(errors.NotEnoughBookiesError("x"), 6), Failed)
    assert failed.entry_ids == (1,)


def test_fenced_answer_fails_the_writer() -> None:
    writer = LedgerWriter(metadata(3, 2, 2))
    writer.add(1, 0)
    writer.add(1, 0)
    (failed,) = of(writer.on_add_answer(1, 1, "b1", StatusCode.EFENCED, 1), Failed)
    assert failed.entry_ids == (0, 1) and isinstance(failed.error, errors.LedgerFencedError)
    assert writer.on_add_answer(0, 0, "b0", OK, 2) == []  # nothing completes after that


def test_a_bookie_that_does_not_answer_in_time_is_replaced() -> None:
    writer = LedgerWriter(metadata(3, 2, 2), add_timeout_ms=100)
    writer.add(1, 0)
    writer.on_add_answer(0, 0, "b0", OK, 10)
    assert writer.tick(99) == []
    (change,) = of(writer.tick(100), ChangeEnsemble)
    assert dict(change.failed) == {1: "b1"}


def test_delayed_ensemble_change_waits_until_an_entry_needs_it() -> None:
    writer = LedgerWriter(metadata(3, 3, 2), delay_ensemble_change=True)
    writer.add(1, 0)
    assert writer.on_add_answer(0, 0, "b0", StatusCode.EIO, 1) == []
    assert completed(writer.on_add_answer(0, 1, "b1", OK, 1)) == []
    assert completed(writer.on_add_answer(0, 2, "b2", OK, 1)) == [0]
    writer.add(1, 2)
    writer.on_add_answer(1, 1, "b1", OK, 3)
    assert writer.on_add_answer(1, 2, "b2", StatusCode.EIO, 3) == []  # b0 may still ack
    (change,) = of(writer.on_add_answer(1, 0, "b0", StatusCode.EIO, 3), ChangeEnsemble)
    assert dict(change.failed) == {0: "b0", 2: "b2"}  # both suspects go at once


def test_a_failure_after_the_ack_quorum_counts_an_under_replicated_add() -> None:
    """Rule 8: one count per failed answer of a write-set member once the entry has its Qa
    acks, completed or held back by a lower entry; a failure before Qa, one of a bookie not of
    the write set, or one for an entry never added counts nothing."""
    writer = LedgerWriter(metadata(3, 3, 2), delay_ensemble_change=True)
    for _ in range(3):
        writer.add(1, 0)
    assert completed(writer.on_add_acks(0, "b0", [0, 2], 1)) == []
    assert completed(writer.on_add_acks(1, "b1", [0, 2], 1)) == [0]
    assert writer.under_replicated_adds == 0
    assert writer.on_add_answer(0, 2, "b2", None, 2) == []  # completed with two copies
    assert writer.under_replicated_adds == 1
    assert writer.on_add_answer(2, 2, "b2", StatusCode.EIO, 2) == []  # Qa acks, behind entry 1
    assert writer.under_replicated_adds == 2
    assert writer.on_add_answer(1, 2, "b2", StatusCode.EIO, 3) == []  # before its Qa acks
    assert writer.on_add_answer(0, 2, "b9", None, 3) == []  # not of entry 0's write set
    assert writer.on_add_answer(7, 2, "b2", None, 3) == []  # never added
    assert writer.under_replicated_adds == 2
    assert completed(writer.on_add_acks(0, "b0", [1], 4)) == []
    assert completed(writer.on_add_acks(1, "b1", [1], 4)) == [1, 2]


def test_an_idle_writer_writes_its_lac_explicitly() -> None:
    writer = LedgerWriter(metadata(3, 2, 2), explicit_lac_interval_ms=50)
    writer.add(1, 0)
    ack_all(writer, 0, 5)
    assert writer.next_deadline(5) == 50  # one timer, for when the LAC is due
    assert writer.tick(20) == []  # not idle long enough
    (lac,) = of(writer.tick(50), WriteLac)
    assert lac.lac == 0 and len(lac.targets) == 3
    assert writer.tick(200) == []  # written once, until the LAC moves again


def test_caller_chosen_entry_ids_complete_in_id_order() -> None:
    writer = LedgerWriter(metadata(3, 2, 2))
    sends = {}
    for entry_id in (2, 0, 3):
        accepted = writer.add(10 + entry_id, 0, entry_id)
        assert accepted.entry_id == entry_id
        sends[entry_id] = sent(accepted.instructions)[0]
    assert sends[2].targets == ((2, "b2"), (0, "b0"))  # the write set of the id, not the call
    assert completed(ack_all(writer, sends[2].entry_id) + ack_all(writer, sends[3].entry_id)) == []
    assert completed(ack_all(writer, sends[0].entry_id)) == [0]  # 1 is missing: 2 and 3 wait for it
    with pytest.raises(errors.DuplicateEntryIdError):
        writer.add(1, 0, 2)
    with pytest.raises(errors.DuplicateEntryIdError):
        writer.add(1, 0, 0)
    assert writer.last_add_pushed == 3
    out = ack_all(writer, writer.add(11, 0, 1).entry_id)
    assert completed(out) == [1, 2, 3]
    assert writer.last_add_confirmed == 3 and writer.length == 12 + 10 + 13 + 11


def test_deferred_sync_confirms_only_what_was_forced() -> None:
    writer = LedgerWriter(metadata(3, 2, 2), deferred_sync=True)
    for _ in range(3):
        accepted = writer.add(5, 0)
        assert accepted.last_add_confirmed == -1  # nothing forced yet: readers see nothing
        assert completed(ack_all(writer, accepted.entry_id)) == [accepted.entry_id]
    assert (writer.last_add_completed, writer.last_add_confirmed) == (2, -1)
    (force,) = writer.force()
    assert isinstance(force, Force) and [b for _, b in force.targets] == ["b0", "b1", "b2"]
    assert writer.on_force_answer(force.force_id, "b0", OK) == []
    assert writer.on_force_answer(force.force_id, "b1", OK) == []
    (forced,) = writer.on_force_answer(force.force_id, "b2", OK)
    assert forced == Forced(force.force_id, 2) and writer.last_add_confirmed == 2
    assert writer.add(5, 0).last_add_confirmed == 2  # now piggybacked
    (again,) = writer.force()  # entry 3 is not acknowledged yet: nothing new to force
    assert again == Forced(again.force_id, 2)
    assert writer.close()[:2] == (2, 15)


def test_a_failed_force_leaves_the_lac_and_says_why() -> None:
    writer = LedgerWriter(metadata(2, 2, 2), deferred_sync=True)
    ack_all(writer, writer.add(5, 0).entry_id)
    (force,) = writer.force()
    assert isinstance(force, Force)
    (forced,) = writer.on_force_answer(force.force_id, "b1", StatusCode.EIO)
    assert isinstance(forced, Forced) and forced.lac == -1
    assert isinstance(forced.error, errors.WriteError) and "b1" in str(forced.error)
    assert writer.on_force_answer(force.force_id, "b0", OK) == []  # settled already


def test_a_deferred_sync_ledger_fails_instead_of_changing_its_ensemble() -> None:
    writer = LedgerWriter(metadata(3, 2, 2), deferred_sync=True)
    send = sent(writer.add(5, 0).instructions)[0]
    out = writer.on_add_answer(0, 0, "b0", None, 1, "connection reset")
    assert of(out, ChangeEnsemble) == []
    (failed,) = of(out, Failed)
    assert failed.entry_ids == (0,) and "cannot change its ensemble" in str(failed.error)
    assert send.entry_id == 0


def test_the_writer_names_its_next_deadline_instead_of_being_polled() -> None:
    writer = LedgerWriter(metadata(3, 2, 2), add_timeout_ms=100, explicit_lac_interval_ms=50)
    assert writer.next_deadline(0) is None  # nothing pending: no timer at all
    writer.add(1, 10)
    assert writer.next_deadline(10) == 110  # the add's timeout
    ack_all(writer, 0, 20)
    assert writer.next_deadline(20) == 60  # idle with an unsent LAC: 50 ms after the last send
    (lac,) = of(writer.tick(60), WriteLac)
    assert lac.lac == 0 and writer.next_deadline(60) is None  # written: nothing left to time
    writer.add(1, 70)
    # A timeout fails a bookie; the change is made at once, and nothing is timed while it lasts.
    assert of(writer.tick(170), ChangeEnsemble) and writer.next_deadline(170) is None


def test_deadlines_only_grow_until_a_bookie_fails_or_an_explicit_lac_is_kept() -> None:
    """While ``deadlines_only_grow`` holds, the next deadline never comes earlier as adds are
    sent and answered (the runtime keeps its timer); a failed bookie's paced change, or an
    explicit LAC, can bring one earlier, and then it does not hold."""
    writer = LedgerWriter(metadata(3, 2, 2), add_timeout_ms=100, delay_ensemble_change=True)
    deadlines = []
    for now in range(0, 50, 10):
        writer.add(1, now)
        assert writer.deadlines_only_grow
        deadlines.append(writer.next_deadline(now))
        if now >= 20:
            ack_all(writer, now // 10 - 2, now)
            deadlines.append(writer.next_deadline(now))
    assert deadlines == sorted(deadlines) and deadlines[0] == 100 and deadlines[-1] == 130
    # a bookie fails: a change may now come due (paced), before the timeouts timed so far
    writer.on_add_answer(4, 2, "b2", StatusCode.EIO, 50)
    assert not writer.deadlines_only_grow
    lac_writer = LedgerWriter(metadata(3, 2, 2), explicit_lac_interval_ms=50)
    assert not lac_writer.deadlines_only_grow


def test_the_close_rule_keeps_a_retried_close_and_refuses_anyone_elses_end() -> None:
    open_ledger = metadata(3, 2, 2)
    assert close_needed(open_ledger, 9, 100)
    assert not close_needed(open_ledger.closed_at(9, 100), 9, 100)  # our close, retried
    with pytest.raises(errors.MetadataVersionError, match="closed by someone else at entry 7"):
        close_needed(open_ledger.closed_at(7, 80), 9, 100)
    with pytest.raises(errors.LedgerFencedError, match="being recovered"):
        close_needed(open_ledger.with_state(LedgerState.IN_RECOVERY), 9, 100)


def test_a_writer_of_an_ensemble_wider_than_64_bookies_acks_and_completes_alike() -> None:
    # beyond 64 bookies the acks are Python ints, not 64-bit words, and no C pass is used
    writer = LedgerWriter(metadata(66, 3, 2))
    sends = [sent(writer.add(10, 0).instructions)[0] for _ in range(66)]
    assert sends[65].targets == ((65, "b65"), (0, "b0"), (1, "b1"))
    assert completed(writer.on_add_acks(65, "b65", [64, 65], 1)) == []
    assert completed(writer.on_add_acks(0, "b0", [0, 65], 1)) == []
    assert completed(writer.on_add_acks(1, "b1", [0], 1)) == [0]
    for entry_id in range(1, 65):
        writer.on_add_answer(entry_id, entry_id, f"b{entry_id}", OK, 1)
        writer.on_add_answer(entry_id, entry_id + 1, f"b{entry_id + 1}", OK, 1)
    assert writer.last_add_confirmed == 65 and writer.length == 660 and writer.pending == 0


pending_ids = st.lists(st.integers(min_value=-3, max_value=40), max_size=60)


@pytest.mark.skipif(native is None, reason="C speedups not built here")
@given(
    sent_at=st.lists(st.sampled_from([-2, -1, 0, 5]), max_size=30),
    entry_ids=pending_ids,
    index=st.integers(min_value=0, max_value=5),
    shape=st.sampled_from([(6, 3, 2), (3, 2, 2), (5, 5, 3), (1, 1, 1)]),
    base=st.integers(min_value=0, max_value=4),
    first=st.integers(min_value=0, max_value=12),
    masks=st.lists(st.integers(min_value=0, max_value=63), min_size=30, max_size=30),
)
def test_c_and_python_passes_over_pending_adds_agree(
    sent_at: list[int],
    entry_ids: list[int],
    index: int,
    shape: tuple[int, int, int],
    base: int,
    first: int,
    masks: list[int],
) -> None:
    assert native is not None
    size, write_quorum, ack_quorum = shape
    index %= size
    count = len(sent_at)
    arrays = []
    for ack in (native.pending_ack, _ack_py):
        acked, failed = array("Q", masks[:count]), array("Q", masks[::-1][:count])
        sent = array("q", sent_at)
        earlier = ack(acked, failed, sent, base, entry_ids, index, size, write_quorum, first)
        arrays.append((acked.tolist(), failed.tolist(), earlier))
        assert native.pending_done(acked, sent, ack_quorum) == _done_py(acked, sent, ack_quorum)
    assert arrays[0] == arrays[1]


@pytest.mark.skipif(native is None, reason="C speedups not built here")
def test_the_c_passes_over_pending_adds_refuse_other_arrays() -> None:
    assert native is not None
    words, times = array("Q", [0]), array("q", [0])
    with pytest.raises(TypeError, match=r"array\('Q'\)"):
        native.pending_ack(array("q", [0]), words, times, 0, [0], 0, 1, 1, 0)
    with pytest.raises(TypeError, match=r"array\('q'\)"):
        native.pending_done(words, array("Q", [0]), 1)
    with pytest.raises(ValueError, match="64 bookies"):
        native.pending_ack(words, words, times, 0, [0], 0, 65, 1, 0)
    with pytest.raises(TypeError):
        native.pending_ack(words, words, times, 0, (0,), 0, 1, 1, 0)


@given(
    shape=st.sampled_from([(3, 2, 2), (3, 3, 2), (5, 3, 2), (1, 1, 1)]),
    steps=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 12)), max_size=8),
    chosen=st.booleans(),
    order=st.randoms(use_true_random=False),
)
def test_every_add_sent_is_marked_sent_and_goes_to_its_write_set(
    shape: tuple[int, int, int],
    steps: list[tuple[int, int]],
    chosen: bool,
    order: random.Random,
) -> None:
    """``send_waiting`` sends each waiting add, in the order they waited, to the members of its
    write set (entry id mod E) and marks it sent, whether the adds are a run of next ids (sent
    without a step per entry) or caller-chosen ids in any order; acks free permits for more."""
    writer = LedgerWriter(metadata(*shape), max_in_flight=16)
    e, qw, _ = shape
    bookies = [f"b{i}" for i in range(e)]
    taken = 0
    for pushes, acks in steps:
        if chosen:  # a shuffled block of the next ids (LedgerHandleAdv's caller-chosen ids)
            ids = list(range(taken, taken + pushes))
            order.shuffle(ids)
            for entry_id in ids:
                writer.push(1, entry_id)
        else:
            for _ in range(pushes):
                writer.push(1)
        taken += pushes
        before = list(writer._waiting)
        sends = sent(writer.send_waiting(7))
        assert [s.entry_id for s in sends] == before[: len(sends)]
        for s in sends:
            assert s.targets == tuple((i, bookies[i]) for i in write_set(s.entry_id, e, qw))
            assert writer._pending.sent_at(s.entry_id) == 7
        assert all(writer._pending.sent_at(entry_id) < 0 for entry_id in writer._waiting)
        for s in sends[:acks]:
            for index, bookie in s.targets:
                writer.on_add_acks(index, bookie, [s.entry_id], 8)
