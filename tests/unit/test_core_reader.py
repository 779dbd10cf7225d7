"""The read machines of ``bookkeeper_py.core.reader``: replica order by health, one replica at a
time with failover and speculative reads, the negative rule, and the long poll."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from bookkeeper_py import errors
from bookkeeper_py.core.reader import (
    BATCH_ENTRIES,
    BATCH_REGION_ENTRIES,
    BATCHES_IN_FLIGHT,
    STRIPE_ENTRIES,
    STRIPE_WINDOW,
    EntryRead,
    LastConfirmedAndEntryRead,
    PollNext,
    RangeRead,
    ReadAttempt,
    ReadConfirmed,
    ReadSend,
    RefreshMetadata,
    ReplicaHealth,
    SendBatch,
    SendStripe,
    Tail,
    TailEnded,
)
from bookkeeper_py.wire.status import StatusCode

REPLICAS = [(1, "b1"), (2, "b2"), (0, "b0")]  # the write set of entry 1 (E=3, Qw=3)


def test_healthy_replicas_keep_the_write_set_order() -> None:
    health = ReplicaHealth()
    assert health.order(REPLICAS, now_ms=0) == REPLICAS
    assert health.reordered == 0


def test_a_replica_that_failed_recently_goes_last_until_the_failure_expires() -> None:
    health = ReplicaHealth(failure_expiry_ms=1000)
    health.failed("b1", now_ms=100)
    health.failed("b2", now_ms=100)
    health.failed("b2", now_ms=200)
    assert health.order(REPLICAS, now_ms=500) == [(0, "b0"), (1, "b1"), (2, "b2")]
    assert health.reordered == 1
    assert health.order(REPLICAS, now_ms=1150) == [(1, "b1"), (0, "b0"), (2, "b2")]
    assert health.order(REPLICAS, now_ms=1250) == REPLICAS  # every failure expired


def test_pending_reads_count_only_with_a_threshold() -> None:
    plain, busy = ReplicaHealth(), ReplicaHealth(pending_threshold=2)
    for health in (plain, busy):
        for _ in range(3):
            health.sent("b1")
    assert plain.order(REPLICAS, 0) == REPLICAS
    assert busy.order(REPLICAS, 0) == [(2, "b2"), (0, "b0"), (1, "b1")]
    busy.answered("b1")
    busy.answered("b1")
    assert busy.pending("b1") == 1
    assert busy.order(REPLICAS, 0) == REPLICAS


def test_a_slow_mark_lasts_until_the_bookie_answers_and_the_longest_silent_goes_last() -> None:
    """A replica given up on as slow goes after the unmarked ones; of two marked, the one
    silent for longer goes last (a frozen bookie, against one only busy). Any answer takes
    the mark back, an error of the connection does not, and marks expire like failures."""
    health = ReplicaHealth(failure_expiry_ms=1000)
    health.slow("b0", now_ms=100)  # frozen: never answers again
    assert health.order(REPLICAS, 150) == [(1, "b1"), (2, "b2"), (0, "b0")]
    for now in (200, 210, 220):  # a busy healthy one, given up on three times meanwhile
        health.slow("b1", now_ms=now)
    assert health.slow_since("b1", 220) == 200  # marked again, it keeps its first time
    assert health.order(REPLICAS, 230) == [(2, "b2"), (1, "b1"), (0, "b0")]
    health.slow("b2", now_ms=240)
    assert health.order(REPLICAS, 250) == [(2, "b2"), (1, "b1"), (0, "b0")]
    health.answered("b1", heard=False)  # its connection failed: still not heard from
    assert health.slow_since("b1", 260) == 200
    health.answered("b1")  # its late answer came
    health.heard("b2")
    assert health.order(REPLICAS, 270) == [(1, "b1"), (2, "b2"), (0, "b0")]
    health.failed("b1", now_ms=280)  # a failure still weighs more than a slow mark
    assert health.order(REPLICAS, 290) == [(2, "b2"), (0, "b0"), (1, "b1")]
    assert health.slow_since("b0", 1100) is None  # expired
    assert health.healthy("b0", 1100) and not health.healthy("b1", 1100)


def read(speculative_ms: int = 0, max_ms: int = 0, negatives_needed: int = 2) -> EntryRead:
    return EntryRead(
        7,
        1,
        REPLICAS,
        negatives_needed=negatives_needed,
        speculative_ms=speculative_ms,
        max_speculative_ms=max_ms,
    )


def test_one_replica_at_a_time_and_the_next_on_a_failure() -> None:
    entry = read()
    assert entry.start(0) == [ReadAttempt(1, "b1", 1)]
    assert entry.deadline is None  # no speculative reads
    assert entry.on_answer(1, None, "timed out", 10) == [ReadAttempt(2, "b2", 1)]
    assert entry.on_answer(2, StatusCode.EIO, "", 20) == [ReadAttempt(0, "b0", 1)]
    assert entry.on_answer(0, StatusCode.EOK, "", 30) == []
    assert (entry.done, entry.winner, entry.error) == (True, 0, None)
    assert entry.on_answer(1, StatusCode.EOK, "", 40) == []  # late answers change nothing
    assert entry.winner == 0


def test_a_slow_replica_gets_a_speculative_read_with_backoff() -> None:
    entry = read(speculative_ms=100, max_ms=150)
    assert entry.start(0) == [ReadAttempt(1, "b1", 1)]
    assert entry.deadline == 100
    assert entry.tick(99) == []
    assert entry.tick(100) == [ReadAttempt(2, "b2", 1)]
    assert entry.deadline == 250  # doubled, capped at 150
    assert entry.tick(250) == [ReadAttempt(0, "b0", 1)]
    assert entry.deadline is None  # every replica asked
    assert entry.speculative_reads == 2
    assert entry.on_answer(1, StatusCode.EOK, "", 260) == []  # the first, slow one wins
    assert entry.winner == 1


def test_absence_needs_every_replica_answered_and_qw_minus_qa_plus_1_saying_so() -> None:
    entry = read(negatives_needed=2)
    entry.start(0)
    entry.on_answer(1, StatusCode.ENOENTRY, "", 1)
    entry.on_answer(2, StatusCode.ENOLEDGER, "", 2)
    assert not entry.done  # the last replica may still have it
    entry.on_answer(0, StatusCode.ENOENTRY, "", 3)
    assert isinstance(entry.error, errors.NoSuchEntryError)


def test_errors_are_never_absence() -> None:
    entry = read(negatives_needed=2)
    entry.start(0)
    entry.on_answer(1, StatusCode.ENOENTRY, "", 1)
    entry.on_answer(2, StatusCode.EIO, "", 2)
    entry.on_answer(0, None, "bad digest", 3)
    assert isinstance(entry.error, errors.ReadError)
    assert "bad digest" in str(entry.error) and "b2: EIO" in str(entry.error)


def poll(parallel: bool) -> LastConfirmedAndEntryRead:
    return LastConfirmedAndEntryRead(7, 11, 10, REPLICAS, 5000, parallel=parallel)


def test_a_long_poll_asks_one_replica_and_takes_the_new_lac_with_the_entry() -> None:
    lp = poll(parallel=False)
    (first,) = lp.start()
    assert (first.bookie, first.entry_id, first.previous_lac, first.timeout_ms) == (
        "b1",
        11,
        10,
        5000,
    )
    assert lp.on_answer(1, None, -1, False, "connection refused")[0].bookie == "b2"
    assert lp.on_answer(2, StatusCode.EOK, 12, True) == []
    assert lp.result is not None
    assert (lp.result.last_add_confirmed, lp.result.entry_from) == (12, 2)


def test_a_long_poll_that_times_out_keeps_the_lac() -> None:
    lp = poll(parallel=False)
    lp.start()
    lp.on_answer(1, StatusCode.EOK, 10, False)
    assert lp.result is not None
    assert (lp.result.last_add_confirmed, lp.result.entry_from) == (10, None)


def test_a_parallel_long_poll_takes_the_first_progress() -> None:
    lp = poll(parallel=True)
    assert [p.bookie for p in lp.start()] == ["b1", "b2", "b0"]
    lp.on_answer(1, StatusCode.EOK, 10, False)  # this one timed out
    assert lp.result is None  # the others may still move
    lp.on_answer(0, StatusCode.EOK, 11, False)  # LAC moved, entry 11 not carried
    assert lp.result is not None
    assert (lp.result.last_add_confirmed, lp.result.entry_from) == (11, None)


def test_a_parallel_long_poll_with_timeouts_and_failures_keeps_the_lac() -> None:
    lp = poll(parallel=True)
    lp.start()
    lp.on_answer(1, StatusCode.EOK, 10, False)
    lp.on_answer(2, StatusCode.EIO, -1, False)
    lp.on_answer(0, None, -1, False, "reset")
    assert lp.result is not None and lp.result.last_add_confirmed == 10


def test_a_long_poll_that_no_replica_answers_fails() -> None:
    lp = poll(parallel=False)
    lp.start()
    lp.on_answer(1, None, -1, False, "refused")
    lp.on_answer(2, StatusCode.EIO, -1, False)
    with pytest.raises(errors.ReadError, match="b0: timed out"):
        lp.on_answer(0, None, -1, False, "timed out")


def test_a_long_poll_on_bookies_that_hold_nothing_of_the_ledger_yet_is_nothing_new() -> None:
    # Java bookies answer ENOLEDGER at once for a ledger none of whose entries reached them.
    lp = poll(parallel=False)
    lp.start()
    lp.on_answer(1, StatusCode.ENOLEDGER, -1, False)
    lp.on_answer(2, None, -1, False, "refused")
    assert lp.result is None
    lp.on_answer(0, StatusCode.ENOENTRY, -1, False)
    assert lp.result is not None
    assert (lp.result.last_add_confirmed, lp.result.entry_from, lp.result.unknown) == (
        10,
        None,
        True,
    )


def test_a_long_poll_answered_quietly_by_one_replica_is_not_unknown() -> None:
    lp = poll(parallel=True)
    lp.start()
    lp.on_answer(1, StatusCode.ENOLEDGER, -1, False)
    lp.on_answer(2, StatusCode.EOK, 10, False)
    lp.on_answer(0, StatusCode.ENOLEDGER, -1, False)
    assert lp.result is not None and not lp.result.unknown


def test_a_long_poll_unanswered_for_a_while_is_also_sent_to_the_next_replica() -> None:
    lp = poll(parallel=False)
    lp.start()
    (second,) = lp.speculate(3000)  # b1 has not answered: a bookie can miss the LAC moving
    assert (second.bookie, second.previous_lac, second.timeout_ms) == ("b2", 10, 3000)
    (third,) = lp.speculate(1000)
    assert third.bookie == "b0"
    assert lp.speculate(500) == []  # every replica asked
    lp.on_answer(0, StatusCode.EOK, 11, True)
    assert lp.result is not None and lp.result.entry_from == 0
    lp.on_answer(1, StatusCode.EOK, 11, True)  # a late answer changes nothing
    assert lp.result.entry_from == 0


def test_a_settled_or_parallel_long_poll_does_not_speculate() -> None:
    lp = poll(parallel=True)
    lp.start()
    assert lp.speculate(1000) == []
    lp = poll(parallel=False)
    lp.start()
    lp.on_answer(1, StatusCode.EOK, 12, True)
    assert lp.speculate(1000) == []


def test_a_tail_reads_what_is_confirmed_polls_for_the_next_and_ends_after_the_close() -> None:
    tail = Tail(start=0, batch=3)
    assert tail.next_step(lac=-1, closed=False) == PollNext(0)
    assert tail.polled(lac=0, entry_came=True) is None and tail.next_entry == 1
    assert tail.next_step(lac=7, closed=False) == ReadConfirmed(1, 3)  # a batch at a time
    tail.delivered(3)
    assert tail.next_step(lac=7, closed=False) == ReadConfirmed(4, 6)
    tail.delivered(7)
    assert tail.next_step(lac=7, closed=False) == PollNext(8)
    # Nothing new for a whole poll: the metadata may say closed, or name a new fragment.
    assert tail.polled(lac=7, entry_came=False) == RefreshMetadata()
    assert tail.next_step(lac=7, closed=True) == TailEnded()
    assert Tail.read_failed(closed=False) == RefreshMetadata()
    assert Tail.read_failed(closed=True) is None
    with pytest.raises(errors.IncorrectParameterError):
        Tail(start=-1, batch=1)


def plan(
    first: int,
    last: int,
    *,
    batched: bool,
    striped: bool = False,
    fragments: tuple[int, ...] = (0,),
    speculative_ms: int = 0,
    health: ReplicaHealth | None = None,
    write_quorum: int = 3,
    read_order: Callable[[Sequence[tuple[int, str]]], Sequence[tuple[int, str]]] = list,
) -> RangeRead:
    """A range read of a ledger on b0, b1, b2 (E = 3, Qw = 3 unless told) whose replicas are
    put in the order to try them by the placement policy's ``read_order``, then by ``health``
    (the runtime's rule)."""
    ensemble = ["b0", "b1", "b2"]
    replica_health = health or ReplicaHealth()
    return RangeRead(
        1,
        first,
        last,
        fragment_starts=list(fragments),
        replicas=lambda entry_id: replica_health.order(
            list(
                read_order(
                    [(i, ensemble[i]) for i in ((entry_id + k) % 3 for k in range(write_quorum))]
                )
            ),
            0,
        ),
        read_order=read_order,
        health=replica_health,
        negatives_needed=1,
        batched=batched,
        striped=striped,
        ensemble_size=3,
        speculative_ms=speculative_ms,
        max_speculative_ms=4 * speculative_ms,
    )


def batches(sends: list[ReadSend]) -> list[SendBatch]:
    assert all(isinstance(send, SendBatch) for send in sends)
    return [send for send in sends if isinstance(send, SendBatch)]


def attempts(sends: list[ReadSend]) -> list[ReadAttempt]:
    assert all(isinstance(send, ReadAttempt) for send in sends)
    return [send for send in sends if isinstance(send, ReadAttempt)]


def stripes(sends: list[ReadSend]) -> list[SendStripe]:
    assert all(isinstance(send, SendStripe) for send in sends)
    return [send for send in sends if isinstance(send, SendStripe)]


def test_a_batched_range_reads_fragments_in_batches_and_asks_for_what_a_cut_answer_left() -> None:
    read = plan(0, 1199, batched=True, fragments=(0, 600))
    sent = batches(read.start(0))
    assert [(b.start, b.end) for b in sent] == [(0, 511), (512, 599), (600, 1111), (1112, 1199)]
    assert len({b.bookie for b in sent}) == 1  # one region of the ledger: one replica
    (rest,) = batches(read.on_batch_answer(0, StatusCode.EOK, served=100, now=1))  # cut short
    assert (rest.start, rest.end) == (100, 511)
    assert read.on_batch_answer(100, StatusCode.EOK, served=412, now=2) == []
    for start, end in ((512, 599), (600, 1111), (1112, 1199)):
        read.on_batch_answer(start, StatusCode.EOK, served=end - start + 1, now=3)
    assert read.done


def test_batches_take_the_replicas_by_regions_of_the_ledger_in_turn() -> None:
    """Each region of BATCH_REGION_ENTRIES entries comes from one replica, the next region from
    the next one (by ensemble index, shifted by the ledger id: ledger 1 starts on b1), so that
    a bookie reads long stretches of its logs; a replica that failed lately is left out."""
    health = ReplicaHealth()
    read = plan(0, 3 * BATCH_REGION_ENTRIES - 1, batched=True, health=health)
    bookie_of: dict[int, set[str]] = {}
    sends = batches(read.start(0))
    while sends:
        more = []
        for batch in sends:
            bookie_of.setdefault(batch.start // BATCH_REGION_ENTRIES, set()).add(batch.bookie)
            more += batches(
                read.on_batch_answer(batch.start, StatusCode.EOK, batch.end - batch.start + 1, 1)
            )
        sends = more
    assert read.done
    assert bookie_of == {0: {"b1"}, 1: {"b2"}, 2: {"b0"}}
    health.failed("b1", 2)
    again = plan(0, BATCH_REGION_ENTRIES - 1, batched=True, health=health)
    assert {batch.bookie for batch in batches(again.start(2))} == {"b2"}


def test_a_failed_batch_is_read_entry_by_entry_and_its_bookie_avoided() -> None:
    health = ReplicaHealth()
    read = plan(0, 9, batched=True, health=health)
    (batch,) = batches(read.start(0))
    sends = attempts(read.on_batch_answer(0, StatusCode.EIO, served=3, now=1))
    assert health.recent_failures(batch.bookie, 1) == 1
    assert [s.entry_id for s in sends] == list(range(3, 10))  # the rest, one entry at a time
    for attempt in sends:
        read.on_entry_answer(attempt, StatusCode.EOK, "", now=2)
    assert read.done


def test_entry_reads_keep_a_window_fail_over_and_raise_when_no_replica_has_the_entry() -> None:
    read = plan(0, 199, batched=False)
    first = attempts(read.start(0))
    assert [a.entry_id for a in first] == list(range(128))  # READ_WINDOW at a time
    more = attempts(read.on_entry_answer(first[0], StatusCode.EOK, "", now=1))
    assert [a.entry_id for a in more] == [128]  # one done, the next starts
    (failover,) = attempts(read.on_entry_answer(first[1], StatusCode.EIO, "", now=1))
    assert failover.entry_id == 1 and failover.bookie != first[1].bookie
    (last_try,) = attempts(read.on_entry_answer(failover, StatusCode.EIO, "", now=1))
    with pytest.raises(errors.NoSuchEntryError):
        read.on_entry_answer(last_try, StatusCode.ENOENTRY, "", now=1)


def test_a_slow_batch_is_given_up_at_its_deadline() -> None:
    health = ReplicaHealth()
    read = plan(0, 9, batched=True, speculative_ms=20, health=health)
    (batch,) = batches(read.start(0))
    assert read.next_deadline() == 20
    sends = attempts(read.tick(20))
    assert [s.entry_id for s in sends] == list(range(10)) and read.speculative_reads == 1
    assert health.slow_since(batch.bookie, 20) == 20  # the slow one is avoided next
    assert health.recent_failures(batch.bookie, 20) == 0  # slow is no failure
    assert read.on_batch_answer(0, StatusCode.EOK, served=10, now=25) == []  # too late: ignored
    assert not read.done
    assert health.slow_since(batch.bookie, 25) is None  # but it answered: not frozen


def test_a_frozen_replica_stays_behind_busy_ones_that_answer_late() -> None:
    """The flaky frozen-replica test's sequence, in steps of 10 ms: b0 freezes, its batches
    are given up and their entries read one by one from b1 and b2, which are busy: their
    batches come back in time but their entry reads 30 ms after they went, past the
    speculative timeout. Slowness used to count as failures: b1 and b2 gathered more than
    frozen b0, which then took batches again (12 instead of its first 4) and led entry reads,
    one speculative read per entry. Now their late answers take their marks back; b0 never
    answers and stays behind."""
    health = ReplicaHealth()
    read = plan(0, 6 * BATCH_REGION_ENTRIES - 1, batched=True, speculative_ms=20, health=health)
    now = 0
    sends = read.start(now)
    batches_out: list[SendBatch] = []
    entries_out: list[tuple[int, ReadAttempt]] = []  # (when answered, the read)
    frozen_batches = 0
    for _step in range(1000):
        for send in sends:
            if isinstance(send, SendBatch):
                if send.bookie == "b0":
                    frozen_batches += 1
                else:
                    batches_out.append(send)
            elif isinstance(send, ReadAttempt) and send.bookie != "b0":
                entries_out.append((now + 30, send))
        now += 10
        sends = []
        answering, batches_out = batches_out, []
        for batch in answering:
            served = batch.end - batch.start + 1
            sends += read.on_batch_answer(batch.start, StatusCode.EOK, served, now)
        for attempt in [a for w, a in entries_out if w <= now]:
            sends += read.on_entry_answer(attempt, StatusCode.EOK, "", now)
        entries_out = [(w, a) for w, a in entries_out if w > now]
        if read.done:
            break
        sends += read.tick(now)
    assert read.done
    assert frozen_batches == BATCHES_IN_FLIGHT  # its first ones only
    # the give-ups of those, and one speculative read per entry of theirs
    assert read.speculative_reads == BATCHES_IN_FLIGHT * (1 + BATCH_ENTRIES)
    assert health.slow_since("b0", now) is not None
    assert health.healthy("b1", now) and health.healthy("b2", now)


def test_a_striped_range_reads_each_part_of_a_chunk_from_its_lead_in_a_bounded_window() -> None:
    """3/2/2: each chunk of a striped read is cut in three parts, led by b0, b1, b2 in turn; an
    entry whose write set holds its part's lead is read from the lead (so the lead's walk takes
    every record it holds there), the others from their first replica; each bookie gets a third
    of every chunk, and the window is kept full as stripes are answered."""
    last = 3 * STRIPE_WINDOW - 1
    read = plan(0, last, batched=False, striped=True, fragments=(0, 100), write_quorum=2)

    def chunk_of(entry_id: int) -> tuple[int, int]:
        if entry_id < 100:  # the first fragment is one chunk
            return 0, 99
        start = 100 + (entry_id - 100) // STRIPE_ENTRIES * STRIPE_ENTRIES
        return start, min(last, start + STRIPE_ENTRIES - 1)

    def check(sent: list[SendStripe]) -> None:
        shares: dict[tuple[int, int], dict[str, int]] = {}
        for stripe in sent:
            for entry_id in stripe.entry_ids:
                start, end = chunk_of(entry_id)
                lead = (entry_id - start) // -(-(end - start + 1) // 3)
                write_set = {entry_id % 3, (entry_id + 1) % 3}
                expected = lead if lead in write_set else entry_id % 3
                assert stripe.bookie == f"b{expected}"
                share = shares.setdefault((start, end), {})
                share[stripe.bookie] = share.get(stripe.bookie, 0) + 1
            # a stripe stays within a fragment
            assert max(stripe.entry_ids) < 100 or min(stripe.entry_ids) >= 100
        for (start, end), share in shares.items():
            assert max(share.values()) - min(share.values()) <= 3, (start, end, share)

    first = stripes(read.start(0))
    asked = sorted(e for s in first for e in s.entry_ids)
    # the window (filled a chunk at a time), nothing asked twice
    assert asked == list(range(len(asked)))
    assert STRIPE_WINDOW - STRIPE_ENTRIES < len(asked) <= STRIPE_WINDOW
    check(first)
    more: list[SendStripe] = []
    for stripe in first:
        more += stripes(read.on_stripe_answers(stripe.bookie, stripe.entry_ids, [], now=1))
    # the rest as the window empties, right after what was asked, each entry asked once
    everything = list(asked)
    while more:
        check(more)
        everything += sorted(e for s in more for e in s.entry_ids)
        assert not read.done
        answered, more = more, []
        for stripe in answered:
            more += stripes(read.on_stripe_answers(stripe.bookie, stripe.entry_ids, [], now=2))
    assert everything == list(range(last + 1))
    assert read.done


def test_a_bookie_that_failed_lately_leads_no_part_of_a_striped_read() -> None:
    health = ReplicaHealth()
    health.failed("b1", 0)
    read = plan(0, 5, batched=False, striped=True, health=health, write_quorum=2)
    by_bookie = {s.bookie: s.entry_ids for s in stripes(read.start(0))}
    # b1's part (2, 3) from the first healthy replicas; b1 asked for nothing
    assert by_bookie == {"b0": [0, 3], "b2": [1, 2, 4, 5]}


def test_a_bookie_the_placement_policy_reads_last_leads_no_part_of_a_striped_read() -> None:
    """A part's lead serves the entries of its part only where the placement policy does not put
    their first replica before it (a remote region's bookie is not read in place of a local
    one); the other parts keep their leads."""

    def b1_last(replicas: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
        return sorted(replicas, key=lambda replica: replica[1] == "b1")

    read = plan(0, 5, batched=False, striped=True, write_quorum=2, read_order=b1_last)
    by_bookie = {s.bookie: s.entry_ids for s in stripes(read.start(0))}
    # parts (0, 1), (2, 3), (4, 5) led by b0, b1, b2; b1 is first for none of its entries
    # (0 and 2 ask it, with b0 and b2 first), so its part goes to the others as if it were
    # not there: 2 from b2 and 3 from b0; and 1 (write set b1, b2) from b2
    assert by_bookie == {"b0": [0, 3], "b2": [1, 2, 4, 5]}
    # without the policy b1 leads its part
    read = plan(0, 5, batched=False, striped=True, write_quorum=2)
    assert {s.bookie: s.entry_ids for s in stripes(read.start(0))} == {
        "b0": [0],
        "b1": [1, 3],
        "b2": [2, 4, 5],
    }


def test_a_striped_entry_that_failed_goes_to_the_next_replica_and_its_bookie_is_avoided() -> None:
    health = ReplicaHealth()
    read = plan(0, 5, batched=False, striped=True, health=health, write_quorum=2)
    by_bookie = {s.bookie: s.entry_ids for s in stripes(read.start(0))}
    # parts (0, 1), (2, 3), (4, 5) led by b0, b1, b2: 1 and 2 are not of their lead's
    assert by_bookie == {"b0": [0], "b1": [1, 3], "b2": [2, 4, 5]}
    read.on_stripe_answers("b0", [0], [], now=1)
    (retry,) = attempts(read.on_stripe_answers("b1", [1], [(3, StatusCode.EIO)], now=1))
    assert (retry.entry_id, retry.bookie) == (3, "b0")
    assert health.recent_failures("b1", 1) == 1
    # an entry the bookie does not hold is no failure of it, and goes the careful way too
    (other,) = attempts(read.on_stripe_answers("b2", [2], [(4, StatusCode.ENOENTRY)], now=1))
    assert other.entry_id == 4 and health.recent_failures("b2", 1) == 0
    # answers from a bookie the entry was not sent to change nothing
    assert read.on_stripe_answers("b0", [2, 5], [], now=1) == []
    read.on_stripe_answers("b2", [5], [], now=1)
    read.on_entry_answer(retry, StatusCode.EOK, "", now=2)
    assert not read.done
    read.on_entry_answer(other, StatusCode.EOK, "", now=2)
    assert read.done


def test_a_slow_stripe_is_given_up_at_its_deadline_and_its_late_answers_ignored() -> None:
    health = ReplicaHealth()
    read = plan(0, 5, batched=False, striped=True, speculative_ms=20, health=health)
    by_bookie = {s.bookie: s for s in stripes(read.start(0))}
    assert {b: s.entry_ids for b, s in by_bookie.items()} == {
        "b0": [0, 1],
        "b1": [2, 3],
        "b2": [4, 5],
    }
    read.on_stripe_answers("b1", [2, 3], [], now=5)
    read.on_stripe_answers("b2", [4], [], now=5)  # 5 still out on b2
    assert read.next_deadline() == 20
    sends = attempts(read.tick(20))
    # the slow ones' entries from the replica that is neither
    assert sorted((s.entry_id, s.bookie) for s in sends) == [(0, "b1"), (1, "b1"), (5, "b1")]
    assert read.speculative_reads == 2
    assert health.slow_since("b0", 20) == 20 and health.slow_since("b2", 20) == 20
    assert read.on_stripe_answers("b0", by_bookie["b0"].entry_ids, [], now=25) == []
    assert health.slow_since("b0", 25) is None and health.slow_since("b2", 25) == 20
    assert not read.done
    for attempt in sends:
        read.on_entry_answer(attempt, StatusCode.EOK, "", now=26)
    assert read.done and read.next_deadline() is None
