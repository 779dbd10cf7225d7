"""Reading entries as sans-IO state machines (reference sections 1.1 and 1.5).

* ``ReplicaHealth`` remembers, per bookie, recent read failures (forgotten after
  ``failure_expiry_ms``, BookKeeper's bookieFailureHistoryExpirationMSec), whether it was given
  up on as slow by a speculative read and has not answered anything since, and the reads
  pending on it; ``order`` puts the replicas of a write set healthy first (BookKeeper's
  reorderReadSequence): no recent failure before some, fewer failures before more, a replica
  not marked slow before one that is (and of two marked slow, the one that answered more
  lately first), and with a ``pending_threshold`` above 0 a replica with that many more reads
  pending than the least busy one after the others (readReorderThresholdPendingRequests; 0
  leaves pending counts out). A slow mark is not a failure: any answer from the bookie takes it
  back, so a replica that is only slow (a busy machine) soon leads again, and only one that
  does not answer at all (frozen, partitioned) stays behind the others until the mark expires.
  Counting slowness as failures made busy healthy replicas look worse than a frozen one, whose
  single mark then put it first again: one speculative read per entry.
* ``EntryRead`` reads one entry from one replica at a time: the next replica on an error or
  timeout, and a *speculative* read to the next replica when the current one has not answered
  within ``speculative_ms`` (doubling up to ``max_speculative_ms``, as BookKeeper's
  speculativeReadTimeout with backoff). The first good answer wins. The entry is declared absent
  only when every replica answered and at least Qw-Qa+1 of them said "no such entry" or "no
  such ledger"; errors are never absence.
* ``LastConfirmedAndEntryRead`` is the long poll of ``readLastAddConfirmedAndEntry``: a v3 read
  parked on a bookie until its LAC passes the reader's, answered with the new LAC and the entry
  asked for. One replica at a time (the next on a failure), or all of the write set at once with
  ``parallel``; the first answer that moves the LAC wins, since any LAC a bookie saw is confirmed.

Times are integer milliseconds on the caller's clock; the caller sends the requests, verifies the
digests and feeds the answers back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bookkeeper_py import errors
from bookkeeper_py.core.lac import NEGATIVE_ANSWERS
from bookkeeper_py.wire.status import StatusCode


@dataclass(slots=True)  # not frozen: one per entry, and frozen __init__ costs 3.5x
class ReadAttempt:
    """Read ``entry_id`` from the bookie at ``bookie_index`` of the entry's fragment."""

    bookie_index: int
    bookie: str
    entry_id: int


def _name(replicas: Sequence[tuple[int, str]], bookie_index: int) -> str:
    """The bookie at ``bookie_index`` among ``replicas``, for messages."""
    return next((b for i, b in replicas if i == bookie_index), f"#{bookie_index}")


def answered_at_all(delivered: list[int], failed: list[tuple[int, StatusCode | None]]) -> bool:
    """Whether a bookie's answers to stripe reads hold one of its own (not only failures of the
    connection or of a digest, status None): whether it was heard from."""
    return bool(delivered) or any(status is not None for _, status in failed)


class ReplicaHealth:
    """Recent failures, slow marks and pending reads per bookie; orders the replicas of a write
    set."""

    def __init__(self, failure_expiry_ms: int = 60_000, pending_threshold: int = 0) -> None:
        self.failure_expiry_ms = failure_expiry_ms
        self.pending_threshold = pending_threshold
        # Failure times per bookie, oldest first (``now_ms`` never goes back): expired ones
        # leave from the left, so counting the recent ones costs nothing per read.
        self._failures: dict[str, deque[int]] = {}
        # Bookies given up on as slow, and since when they have not answered anything.
        self._slow_since: dict[str, int] = {}
        self._pending: dict[str, int] = {}
        self.reordered = 0  # reads whose replica order differed from the write set's

    def failed(self, bookie: str, now_ms: int) -> None:
        times = self._failures.get(bookie)
        if times is None:
            times = self._failures[bookie] = deque()
        times.append(now_ms)

    def recent_failures(self, bookie: str, now_ms: int) -> int:
        times = self._failures.get(bookie)
        if not times:
            return 0
        while times and now_ms - times[0] >= self.failure_expiry_ms:
            times.popleft()
        if not times:
            del self._failures[bookie]
        return len(times)

    def slow(self, bookie: str, now_ms: int) -> None:
        """A read to ``bookie`` was given up on as slow: it goes after the others until it
        answers anything (``heard``) or the mark expires. Marked again, it keeps the time of
        its first mark: that is how long it has not answered."""
        self._slow_since.setdefault(bookie, now_ms)

    def slow_since(self, bookie: str, now_ms: int) -> int | None:
        """Since when ``bookie``, given up on as slow, has not answered; None if it is not."""
        since = self._slow_since.get(bookie)
        if since is not None and now_ms - since >= self.failure_expiry_ms:
            del self._slow_since[bookie]
            return None
        return since

    def heard(self, bookie: str) -> None:
        """``bookie`` answered (whatever the answer): it is not frozen, whatever its speed."""
        if self._slow_since:
            self._slow_since.pop(bookie, None)

    def healthy(self, bookie: str, now_ms: int) -> bool:
        """No recent failure and no slow mark."""
        return self.recent_failures(bookie, now_ms) == 0 and self.slow_since(bookie, now_ms) is None

    def sent(self, bookie: str, count: int = 1) -> None:
        self._pending[bookie] = self._pending.get(bookie, 0) + count

    def answered(self, bookie: str, count: int = 1, heard: bool = True) -> None:
        """``count`` reads pending on ``bookie`` ended; ``heard`` unless none of them was an
        answer of the bookie's (a connection's failure, a timeout)."""
        left = self._pending.get(bookie, 0) - count
        if left > 0:
            self._pending[bookie] = left
        else:
            self._pending.pop(bookie, None)
        if heard:
            self.heard(bookie)

    def pending(self, bookie: str) -> int:
        return self._pending.get(bookie, 0)

    def order(self, replicas: Sequence[tuple[int, str]], now_ms: int) -> list[tuple[int, str]]:
        """``replicas`` (index, bookie) in the order to try them; stable for equally healthy ones."""
        if (
            not self._failures
            and not self._slow_since
            and (self.pending_threshold <= 0 or not self._pending)
        ):
            return list(replicas)  # the common case: nothing known against any of them
        least = min(self.pending(bookie) for _, bookie in replicas)

        def key(position: int) -> tuple[int, int, int, int, int]:
            bookie = replicas[position][1]
            busy = (
                self.pending_threshold > 0
                and self.pending(bookie) - least >= self.pending_threshold
            )
            since = self.slow_since(bookie, now_ms)
            return (
                self.recent_failures(bookie, now_ms),
                since is not None,
                0 if since is None else -since,  # silent for longer: later
                int(busy),
                position,
            )

        positions = sorted(range(len(replicas)), key=key)
        if positions != list(range(len(replicas))):
            self.reordered += 1
        return [replicas[position] for position in positions]


class EntryRead:
    """One entry read from the replicas of its write set (already in the order to try them).

    ``start`` gives the first attempt; feed every answer to ``on_answer`` and call ``tick``
    when ``deadline`` passes; both give the attempts to send next. Once ``done``, ``winner`` is
    the index of the bookie whose answer was good, or ``error`` says why there is none."""

    __slots__ = (
        "_answered",
        "_negatives",
        "_next",
        "_problems",
        "_speculative_ms",
        "deadline",
        "done",
        "entry_id",
        "error",
        "ledger_id",
        "max_speculative_ms",
        "negatives_needed",
        "replicas",
        "speculative_reads",
        "winner",
    )

    def __init__(
        self,
        ledger_id: int,
        entry_id: int,
        replicas: Sequence[tuple[int, str]],
        *,
        negatives_needed: int,
        speculative_ms: int = 0,
        max_speculative_ms: int = 0,
    ) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.replicas = replicas
        self.negatives_needed = negatives_needed
        self._speculative_ms = speculative_ms
        self.max_speculative_ms = max(max_speculative_ms, speculative_ms)
        self._next = 0  # replicas[_next:] were not asked yet
        self._answered = 0
        self._negatives = 0
        self._problems: list[str] = []
        self.deadline: int | None = None  # when ``tick`` sends a speculative read
        self.done = False
        self.winner: int | None = None
        self.error: errors.BKError | None = None
        self.speculative_reads = 0

    def _send_next(self, now_ms: int) -> list[ReadAttempt]:
        if self._next >= len(self.replicas):
            self.deadline = None
            return []
        index, bookie = self.replicas[self._next]
        self._next += 1
        if self._speculative_ms > 0 and self._next < len(self.replicas):
            self.deadline = now_ms + self._speculative_ms
        else:
            self.deadline = None
        return [ReadAttempt(index, bookie, self.entry_id)]

    def start(self, now_ms: int) -> list[ReadAttempt]:
        return self._send_next(now_ms)

    def on_answer(
        self, bookie_index: int, status: StatusCode | None, problem: str, now_ms: int
    ) -> list[ReadAttempt]:
        """An answer from ``bookie_index``: ``EOK`` once the caller verified the entry's digest,
        a status, or None (transport error, timeout, bad digest: ``problem`` says which)."""
        if self.done:
            return []
        self._answered += 1
        if status == StatusCode.EOK:
            self.done, self.winner, self.deadline = True, bookie_index, None
            return []
        if status in NEGATIVE_ANSWERS:
            self._negatives += 1
        bookie = _name(self.replicas, bookie_index)
        self._problems.append(f"{bookie}: {problem or (status.name if status else 'failed')}")
        if self._answered >= len(self.replicas):
            self.done, self.deadline = True, None
            what = f"ledger {self.ledger_id} entry {self.entry_id}"
            if self._negatives >= self.negatives_needed:
                self.error = errors.NoSuchEntryError(
                    f"{what}: not stored ({self._negatives} of {len(self.replicas)} replicas say "
                    f"so: {'; '.join(self._problems)})"
                )
            else:
                self.error = errors.ReadError(
                    f"{what}: no replica could serve it ({'; '.join(self._problems)}); "
                    "retry once the bookies are back"
                )
            return []
        # The replica failed: go on to the next one now, unless every one was asked already.
        return self._send_next(now_ms)

    @property
    def asking(self) -> str | None:
        """The bookie of the latest attempt (the one a speculative read gives up waiting on)."""
        return self.replicas[self._next - 1][1] if self._next > 0 else None

    def tick(self, now_ms: int) -> list[ReadAttempt]:
        """A speculative read to the next replica once the current one is slow (the caller
        should count the slow one as failed in ``ReplicaHealth``, so that later reads start
        elsewhere instead of each waiting out the timeout on it)."""
        if self.done or self.deadline is None or now_ms < self.deadline:
            return []
        self.speculative_reads += 1
        self._speculative_ms = min(self._speculative_ms * 2, self.max_speculative_ms)
        return self._send_next(now_ms)


@dataclass(frozen=True, slots=True)
class LongPoll:
    """Park a read of ``entry_id`` on the bookie at ``bookie_index`` until its LAC passes
    ``previous_lac``, for at most ``timeout_ms``."""

    bookie_index: int
    bookie: str
    entry_id: int
    previous_lac: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class LastConfirmedAndEntry:
    """What a long poll learnt: the LAC (the reader's own if nothing moved) and whether the
    bookie at ``entry_from`` returned the entry asked for (None: no entry came with it).
    ``unknown`` is set when no bookie waited because none holds the ledger yet (Java bookies
    answer a long poll on a ledger they have no entry of with ENOLEDGER at once): the caller
    waits a while before polling again."""

    last_add_confirmed: int
    entry_from: int | None
    unknown: bool = False


class LastConfirmedAndEntryRead:
    """One ``readLastAddConfirmedAndEntry``: a long poll on one replica at a time, or on the
    whole write set at once (``parallel``)."""

    def __init__(
        self,
        ledger_id: int,
        entry_id: int,
        previous_lac: int,
        replicas: Sequence[tuple[int, str]],
        timeout_ms: int,
        *,
        parallel: bool = False,
    ) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.previous_lac = previous_lac
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.parallel = parallel
        self._next = 0
        self._answered = 0
        self._quiet = 0  # answers that timed out on the bookie with the LAC unchanged
        self._absent = 0  # answers that the bookie holds no such ledger or entry
        self._problems: list[str] = []
        self.result: LastConfirmedAndEntry | None = None

    def _poll(self, count: int) -> list[LongPoll]:
        chosen = self.replicas[self._next : self._next + count]
        self._next += len(chosen)
        return [
            LongPoll(index, bookie, self.entry_id, self.previous_lac, self.timeout_ms)
            for index, bookie in chosen
        ]

    def start(self) -> list[LongPoll]:
        return self._poll(len(self.replicas) if self.parallel else 1)

    def speculate(self, timeout_ms: int) -> list[LongPoll]:
        """A poll to the next replica while the others still wait (Java's speculative LAC read,
        ``firstSpeculativeReadLACTimeout``): a bookie may miss the LAC moving and answer only
        when its wait ends. ``timeout_ms`` is what is left of the caller's. Nothing once
        settled, in parallel mode, or when every replica was asked."""
        if self.result is not None or self.parallel:
            return []
        chosen = self._poll(1)
        return [
            LongPoll(p.bookie_index, p.bookie, p.entry_id, p.previous_lac, timeout_ms)
            for p in chosen
        ]

    def on_answer(
        self,
        bookie_index: int,
        status: StatusCode | None,
        max_lac: int,
        has_entry: bool,
        problem: str = "",
    ) -> list[LongPoll]:
        """An answer: ``status`` EOK with the bookie's ``max_lac`` and whether it carried the
        (digest-verified) entry; any other status or None is a failed replica. Sets ``result``
        once settled; raises ``ReadError`` when every replica failed."""
        if self.result is not None:
            return []
        self._answered += 1
        if status == StatusCode.EOK:
            if max_lac > self.previous_lac:
                entry_from = bookie_index if has_entry and self.entry_id <= max_lac else None
                self.result = LastConfirmedAndEntry(max_lac, entry_from)
                return []
            self._quiet += 1
            if not self.parallel or self._answered >= len(self.replicas):
                # The poll timed out with nothing new: not an error, the LAC stays.
                self.result = LastConfirmedAndEntry(self.previous_lac, None)
            return []
        bookie = _name(self.replicas, bookie_index)
        self._problems.append(f"{bookie}: {problem or (status.name if status else 'failed')}")
        if status in (StatusCode.ENOLEDGER, StatusCode.ENOENTRY):
            self._absent += 1
        if self._answered >= len(self.replicas) and self._quiet:
            self.result = LastConfirmedAndEntry(self.previous_lac, None)
            return []
        if self._answered >= len(self.replicas) and self._absent:
            # Bookies that know nothing of the ledger yet (none of its entries reached them):
            # nothing new, as a quiet answer, but they did not wait.
            self.result = LastConfirmedAndEntry(self.previous_lac, None, unknown=True)
            return []
        if self._answered >= len(self.replicas):
            raise errors.ReadError(
                f"ledger {self.ledger_id}: no bookie answered the long poll for entry "
                f"{self.entry_id} ({'; '.join(self._problems)})"
            )
        return [] if self.parallel else self._poll(1)


# -- tailing -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadConfirmed:
    """Read entries ``first``..``last`` (all confirmed) and deliver them in order."""

    first: int
    last: int


@dataclass(frozen=True, slots=True)
class PollNext:
    """Long-poll for entry ``entry_id`` (``LastConfirmedAndEntryRead``)."""

    entry_id: int


@dataclass(frozen=True, slots=True)
class RefreshMetadata:
    """Read the ledger's metadata again: it may be closed, or have a fragment not known yet."""


@dataclass(frozen=True, slots=True)
class TailEnded:
    """Every entry of the closed ledger was delivered."""


TailStep = ReadConfirmed | PollNext | TailEnded


class Tail:
    """A tailing reader (BookKeeper's ``readLastAddConfirmedAndEntry`` loop): delivers every
    entry from ``start`` on once it is confirmed, reading what is confirmed ``batch`` at a time
    and long-polling for the next entry otherwise, until the ledger is closed and its last entry
    delivered. Never fences. The runtime asks ``next_step`` with what it knows (the LAC, whether
    the ledger is closed) and reports what happened."""

    def __init__(self, start: int, batch: int) -> None:
        if start < 0 or batch < 1:
            raise errors.IncorrectParameterError(
                f"a tail starts at an entry id (>= 0) and reads batches of 1 or more, got "
                f"start {start}, batch {batch}"
            )
        self.next_entry = start
        self.batch = batch

    def next_step(self, lac: int, closed: bool) -> TailStep:
        if self.next_entry <= lac:
            return ReadConfirmed(self.next_entry, min(lac, self.next_entry + self.batch - 1))
        if closed:
            return TailEnded()
        return PollNext(self.next_entry)

    def delivered(self, last: int) -> None:
        """Entries up to ``last`` were delivered."""
        self.next_entry = last + 1

    def polled(self, lac: int, entry_came: bool) -> RefreshMetadata | None:
        """A long poll ended: with the next entry (delivered), or without. Nothing new for a
        whole poll: the writer may have closed the ledger or moved to a new ensemble."""
        if entry_came:
            self.next_entry += 1
            return None
        return RefreshMetadata() if lac < self.next_entry else None

    @staticmethod
    def read_failed(closed: bool) -> RefreshMetadata | None:
        """Confirmed entries could not be read where the reader looked: for an open ledger the
        writer may have moved them to a new ensemble (a LAC learned from a bookie that stayed
        runs ahead of the metadata), so read the metadata again and retry if it changed; for a
        closed one the failure stands (None)."""
        return None if closed else RefreshMetadata()


# -- range reads ---------------------------------------------------------------------------------

READ_WINDOW = 128  # entries read concurrently by a range read, one entry at a time
BATCH_ENTRIES = 512  # entries asked for per batch
BATCHES_IN_FLIGHT = 4
# Batches take the replicas by regions of a ledger this long, each region from one replica
# (shifted by the ledger id, so that readers of several ledgers start on different ones): a
# bookie then reads long stretches of its entry logs one after the other, which the kernel's
# read-ahead serves; batches dealt out in turn had each bookie read every third batch's worth,
# and the read-ahead read the two between for nothing.
BATCH_REGION_ENTRIES = 8 * BATCH_ENTRIES
# Entries a striped range read starts together (split by replica), and in flight at most:
# larger stripes mean fewer, fuller sends and answer chunks per entry (128/640 -> 512/2048:
# 3/2/2 catch-up reads ~160 -> ~175 MB/s, the client 3.6 -> 3.2 us per entry).
STRIPE_ENTRIES = 512
STRIPE_WINDOW = 2048
_NEVER = 2**62  # the deadline of a read without speculative reads


@dataclass(frozen=True, slots=True)
class SendBatch:
    """BATCH_READ_ENTRY of ``start``..``end`` to ``bookie``."""

    start: int
    end: int
    bookie: str


@dataclass(frozen=True, slots=True)
class SendStripe:
    """Plain reads of ``entry_ids`` from ``bookie``, pipelined (one request per entry, sent
    together): the entries whose write set puts ``bookie`` first in the order to try it."""

    bookie: str
    entry_ids: list[int]


class _Stripe:
    """The entries of one ``SendStripe`` not answered yet, and when it turns slow."""

    __slots__ = ("bookie", "due", "entry_ids", "pending")

    def __init__(self, bookie: str, due: int, entry_ids: list[int]) -> None:
        self.bookie = bookie
        self.due = due
        self.entry_ids = entry_ids
        self.pending = len(entry_ids)


# What a range read asks the runtime to send.
ReadSend = SendBatch | ReadAttempt | SendStripe


class RangeRead:
    """Entries ``first``..``last`` of a ledger: the order and the failover of their reads.

    With ``batched`` (E = Qw, so every bookie of a fragment holds all of its entries, and a
    protocol that has BATCH_READ_ENTRY), ``BATCHES_IN_FLIGHT`` batches of up to
    ``BATCH_ENTRIES`` entries, one fragment each, to one replica per ``BATCH_REGION_ENTRIES`` of
    the ledger, in turn (those that failed lately left out while others remain); a batch cut by
    its size is asked for the rest; a batch that failed or is slow (past ``speculative_ms``) is
    read entry by entry, and the next batch takes its place. Otherwise, with ``striped`` (a
    protocol whose reads can be pipelined), up to ``STRIPE_WINDOW`` entries at a time, started
    ``STRIPE_ENTRIES`` together: each from the first replica of its write set in the order to
    try it, the entries of one replica sent as one ``SendStripe`` with one deadline, no state
    kept per entry but which stripe it is in; an entry whose replica failed it, and the rest of
    a stripe that turned slow, go the careful way below. Otherwise ``READ_WINDOW``
    ``EntryRead``s at a time (one replica per entry, the next on a failure, a speculative read
    when one is slow).

    ``replicas(entry_id)`` gives the write set in the order to try it; ``health`` is told of
    failures and slow replicas. The runtime sends the instructions (``SendBatch``,
    ``SendStripe``, ``ReadAttempt``), verifies what comes back, reports it
    (``on_batch_answer``, ``on_stripe_answers``, ``on_entry_answer``) and calls ``tick`` at
    ``next_deadline``. ``done`` once every entry came; an entry that cannot be read raises its
    ``EntryRead``'s error."""

    def __init__(
        self,
        ledger_id: int,
        first: int,
        last: int,
        *,
        fragment_starts: Sequence[int],
        replicas: Callable[[int], list[tuple[int, str]]],
        health: ReplicaHealth,
        negatives_needed: int,
        batched: bool,
        striped: bool = False,
        ensemble_size: int = 0,
        speculative_ms: int = 0,
        max_speculative_ms: int = 0,
        read_order: Callable[[Sequence[tuple[int, str]]], Sequence[tuple[int, str]]] = list,
    ) -> None:
        """``ensemble_size`` is needed ``striped``: the write sets repeat with that period.
        ``read_order`` is the placement policy's (replicas it prefers first)."""
        self.ledger_id = ledger_id
        self.first, self.last = first, last
        self._fragment_starts = fragment_starts
        self._replicas = replicas
        self._health = health
        self._negatives_needed = negatives_needed
        self.batched = batched and last > first
        self.striped = striped and not self.batched and ensemble_size > 0
        self._ensemble_size = ensemble_size
        self._speculative_ms = speculative_ms
        self._max_speculative_ms = max_speculative_ms
        self._read_order = read_order
        self.next = first
        self.left = last - first + 1
        self.reads: dict[int, EntryRead] = {}
        self._open_batches: dict[int, tuple[int, int, str]] = {}  # start -> (end, due, bookie)
        self._slow_batches: dict[int, str] = {}  # given up as slow: start -> bookie
        self._stripe_of: dict[int, _Stripe] = {}  # entry -> its stripe, until it is answered
        self._stripes: deque[_Stripe] = deque()  # in the order sent (so, of their deadlines)
        self._striped_in_flight = 0
        self.speculative_reads = 0

    @property
    def done(self) -> bool:
        return self.left == 0

    def start(self, now: int) -> list[ReadSend]:
        sends: list[ReadSend] = []
        if self.batched:
            for _ in range(BATCHES_IN_FLIGHT):
                sends += self._next_batch(now)
        elif self.striped:
            sends += self._more_stripes(now)
        else:
            for _ in range(min(READ_WINDOW, self.left)):
                sends += self._start_next(now)
        return sends

    # -- batches ---------------------------------------------------------------------------------

    def _next_batch(self, now: int) -> list[ReadSend]:
        """A batch for the next entries, within one fragment."""
        start = self.next
        if start > self.last:
            return []
        end = self._last_of_chunk(start, BATCH_ENTRIES)
        self.next = end + 1
        return [self._batch(start, end, now)]

    def _batch(self, start: int, end: int, now: int) -> SendBatch:
        # Every bookie of the fragment holds all of it: one per region of the ledger, in turn by
        # ensemble index, those that failed or were slow lately left out while others remain.
        replicas = sorted(self._replicas(start))
        healthy = [r for r in replicas if self._health.healthy(r[1], now)]
        candidates = healthy or self._health.order(replicas, now)[:1]
        region = start // BATCH_REGION_ENTRIES + self.ledger_id
        _, bookie = candidates[region % len(candidates)]
        self._open_batches[start] = (end, self._due(now), bookie)
        return SendBatch(start, end, bookie)

    def on_batch_answer(
        self, start: int, status: StatusCode | None, served: int, now: int
    ) -> list[ReadSend]:
        """The answer to the batch from ``start``: its ``status`` (None: a transport error or a
        bad entry) and how many entries from ``start`` on were good (verified, delivered)."""
        opened = self._open_batches.pop(start, None)
        if opened is None:
            # Given up as slow: its entries are being read one by one. A late answer still
            # shows that its bookie is not frozen.
            bookie = self._slow_batches.pop(start, None)
            if bookie is not None and status is not None:
                self._health.heard(bookie)
            return []
        end, _, bookie = opened
        if status is not None:
            self._health.heard(bookie)
        if self.done:
            return []
        self.left -= served
        if status is None or (status not in NEGATIVE_ANSWERS and status != StatusCode.EOK):
            self._health.failed(bookie, now)
        if self.done:
            return []
        sends: list[ReadSend] = []
        following = start + served
        if following <= end:
            if status == StatusCode.EOK and served > 0:
                return [self._batch(following, end, now)]  # cut by its size: ask for the rest
            # An error, or nothing served: each entry goes the careful way (one replica at a
            # time, failover, speculative reads), and the next batch takes this one's place.
            for missing in range(following, end + 1):
                sends += self._start_entry(missing, now)
        return sends + self._next_batch(now)

    def _due(self, now: int) -> int:
        return now + self._speculative_ms if self._speculative_ms > 0 else _NEVER

    def _last_of_chunk(self, start: int, size: int) -> int:
        """The last entry of a chunk of up to ``size`` from ``start``, within one fragment."""
        end = min(self.last, start + size - 1)
        for first in self._fragment_starts:
            if start < first <= end:
                end = first - 1
        return end

    # -- stripes ---------------------------------------------------------------------------------

    def _more_stripes(self, now: int) -> list[ReadSend]:
        """Stripes for the next entries while the window has room."""
        sends: list[ReadSend] = []
        while self.next <= self.last and self._striped_in_flight <= STRIPE_WINDOW - STRIPE_ENTRIES:
            start = self.next
            end = self._last_of_chunk(start, STRIPE_ENTRIES)
            self.next = end + 1
            self._striped_in_flight += end - start + 1
            # The chunk in E parts, each led by one ensemble index in turn: an entry of a part
            # whose write set holds its lead (Qw of every E) is read from the lead, the others
            # from the first replica in the order to try them. Within the part it leads, a
            # bookie's walk over its entry log then takes every record it holds of the ledger,
            # not one of every Qw (a 3/2/2 bookie read two records for each it served, and the
            # copy out of the page cache was a third of its CPU).
            by_bookie: dict[str, list[int]] = {}
            size = self._ensemble_size
            part = -(-(end - start + 1) // size)
            for lead in range(size):
                part_start = start + lead * part
                part_end = min(end, part_start + part - 1)
                # Within a fragment the write sets repeat every E entries: one per position.
                for entry_id in range(part_start, min(part_start + size, part_end + 1)):
                    order = self._replicas(entry_id)
                    bookie = order[0][1]
                    for index, replica in order:
                        if index == lead:
                            if self._may_lead(order[0], (index, replica), now):
                                bookie = replica
                            break
                    position = range(entry_id, part_end + 1, size)
                    if (taken := by_bookie.get(bookie)) is None:
                        by_bookie[bookie] = list(position)
                    else:
                        taken += position
            due = self._due(now)
            for bookie, entry_ids in by_bookie.items():
                entry_ids.sort()
                stripe = _Stripe(bookie, due, entry_ids)
                self._stripe_of.update(dict.fromkeys(entry_ids, stripe))
                self._stripes.append(stripe)
                self._health.sent(bookie, len(entry_ids))
                sends.append(SendStripe(bookie, entry_ids))
        return sends

    def _may_lead(self, first: tuple[int, str], lead: tuple[int, str], now: int) -> bool:
        """Whether ``lead`` may serve an entry whose first replica to try is ``first``: it is
        healthy and the placement policy does not put ``first`` before it."""
        if lead == first:
            return True
        return self._health.healthy(lead[1], now) and self._read_order([lead, first])[0] == lead

    def on_stripe_answers(
        self,
        bookie: str,
        delivered: list[int],
        failed: list[tuple[int, StatusCode | None]],
        now: int,
    ) -> list[ReadSend]:
        """Answers of ``bookie`` to stripe reads: the entries ``delivered`` (verified and kept
        by the runtime) and those ``failed`` with a status (None: a transport error or a bad
        digest), which go the careful way. Answers to a stripe given up as slow change nothing
        (its entries are being read one by one)."""
        heard = answered_at_all(delivered, failed)
        self._health.answered(bookie, len(delivered) + len(failed), heard)
        stripe_of = self._stripe_of
        taken = 0
        for entry_id in delivered:
            stripe = stripe_of.get(entry_id)
            if stripe is not None and stripe.bookie == bookie:
                del stripe_of[entry_id]
                stripe.pending -= 1
                taken += 1
        self.left -= taken
        self._striped_in_flight -= taken
        sends: list[ReadSend] = []
        for entry_id, status in failed:
            stripe = stripe_of.get(entry_id)
            if stripe is None or stripe.bookie != bookie:
                continue
            del stripe_of[entry_id]
            stripe.pending -= 1
            self._striped_in_flight -= 1
            if status is None or (status not in NEGATIVE_ANSWERS and status != StatusCode.EOK):
                self._health.failed(bookie, now)
            sends += self._start_entry(entry_id, now)
        if self.done:
            return sends
        return sends + self._more_stripes(now)

    def _give_up_stripe(self, stripe: _Stripe, now: int) -> list[ReadSend]:
        """A slow stripe: its unanswered entries go the careful way; its bookie is avoided
        until it answers."""
        self._health.slow(stripe.bookie, now)
        self.speculative_reads += 1
        sends: list[ReadSend] = []
        stripe_of = self._stripe_of
        for entry_id in stripe.entry_ids:
            if stripe_of.get(entry_id) is stripe:
                del stripe_of[entry_id]
                self._striped_in_flight -= 1
                sends += self._start_entry(entry_id, now)
        stripe.pending = 0
        return sends

    def _first_open_stripe(self) -> _Stripe | None:
        stripes = self._stripes
        while stripes and stripes[0].pending == 0:
            stripes.popleft()
        return stripes[0] if stripes else None

    # -- one entry at a time ---------------------------------------------------------------------

    def _start_next(self, now: int) -> list[ReadSend]:
        entry_id = self.next
        self.next += 1
        return self._start_entry(entry_id, now)

    def _start_entry(self, entry_id: int, now: int) -> list[ReadSend]:
        read = EntryRead(
            self.ledger_id,
            entry_id,
            self._replicas(entry_id),
            negatives_needed=self._negatives_needed,
            speculative_ms=self._speculative_ms,
            max_speculative_ms=self._max_speculative_ms,
        )
        self.reads[entry_id] = read
        return self._sent(read.start(now))

    def _sent(self, attempts: list[ReadAttempt]) -> list[ReadSend]:
        for attempt in attempts:
            self._health.sent(attempt.bookie)  # pending reads order the replicas too
        return list(attempts)

    def on_entry_answer(
        self,
        attempt: ReadAttempt,
        status: StatusCode | None,
        problem: str,
        now: int,
    ) -> list[ReadSend]:
        """An answer to ``attempt``: ``EOK`` once the runtime verified (and kept) the entry, a
        status, or None with ``problem``. Raises the entry's error when no replica has it."""
        self._health.answered(attempt.bookie, heard=status is not None)
        read = self.reads.get(attempt.entry_id)
        if read is None or self.done:
            return []  # settled already (a slower replica's answer)
        if status is None or (status not in NEGATIVE_ANSWERS and status != StatusCode.EOK):
            self._health.failed(attempt.bookie, now)
        sends = self._sent(read.on_answer(attempt.bookie_index, status, problem, now))
        if not read.done:
            return sends
        del self.reads[attempt.entry_id]
        if read.winner is None:
            raise read.error or errors.ReadError(
                f"ledger {self.ledger_id} entry {attempt.entry_id}: read failed"
            )
        self.left -= 1
        if not self.done and self.next <= self.last and not (self.batched or self.striped):
            sends += self._start_next(now)
        return sends

    # -- time ------------------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """When ``tick`` has something to do: a batch, a stripe or an entry read that turns slow."""
        due = [d for _, d, _ in self._open_batches.values() if d < _NEVER]
        due += [read.deadline for read in self.reads.values() if read.deadline is not None]
        stripe = self._first_open_stripe()
        if stripe is not None and stripe.due < _NEVER:
            due.append(stripe.due)
        return min(due) if due else None

    def tick(self, now: int) -> list[ReadSend]:
        """Speculative reads for whatever is slow: a slow batch's entries go the careful way
        (its late answer delivers nothing) and the next batch takes its place; so do a slow
        stripe's unanswered entries, and more stripes fill the window; a slow entry read asks
        the next replica. Each slow replica is marked slow (``ReplicaHealth.slow``): later reads
        start elsewhere until it answers again."""
        sends: list[ReadSend] = []
        for start, (end, due, bookie) in list(self._open_batches.items()):
            if due <= now:
                del self._open_batches[start]
                self._slow_batches[start] = bookie
                self._health.slow(bookie, now)
                self.speculative_reads += 1
                for entry_id in range(start, end + 1):
                    sends += self._start_entry(entry_id, now)
                sends += self._next_batch(now)
        given_up = False
        while (stripe := self._first_open_stripe()) is not None and stripe.due <= now:
            sends += self._give_up_stripe(stripe, now)
            given_up = True
        if given_up:
            sends += self._more_stripes(now)
        for read in list(self.reads.values()):
            slow = read.asking
            attempts = read.tick(now)
            if attempts:
                if slow is not None:
                    self._health.slow(slow, now)  # later entries start on another replica
                self.speculative_reads += len(attempts)
                sends += self._sent(attempts)
        return sends
