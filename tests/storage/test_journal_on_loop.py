"""A journal written by an event loop (the bookie's way, ``Journal.write_on``): each loop pass's
records are one group written on the loop and synced by a syncer thread (the C one, and the
pure-Python one), completions come back on the loop, in order; idle groups are synced on the
loop; rolls, failures, background records, zeros ahead and closing from another thread."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from bookkeeper_py.loop import call_on
from bookkeeper_py.prometheus import PrometheusMetrics
from bookkeeper_py.speedups import native
from bookkeeper_py.storage import journal as journal_module
from bookkeeper_py.storage.journal import (
    BACKGROUND_WITH_FOREGROUND,
    INLINE_MAX_RECORDS,
    ZERO_AHEAD_MAX_SYNC_BYTES,
    Journal,
    JournalError,
    JournalStats,
    RecordType,
    ThreadSyncer,
    journal_name,
    replay,
)

from .test_journal import Collector, entry, replayed

SYNCERS = ["python"] + (["c"] if native is not None else [])


class LoopThread:
    """An event loop running in a thread of its own, as a bookie's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop")
        self.thread.start()

    def call(self, call: Callable[[], Any]) -> Any:
        """Runs ``call`` on the loop and waits for its result."""
        return call_on(self.loop, call)

    def settle(self) -> None:
        """Until the loop has run what was due when this was called (twice: callbacks that
        the first pass scheduled run too)."""
        for _ in range(2):
            self.call(lambda: None)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


class LoopCollector(Collector):
    """Completions, and the thread each one ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def __call__(self, tokens: list[Any], error: Exception | None) -> None:
        self.threads.extend(threading.get_ident() for _ in tokens)
        super().__call__(tokens, error)


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    running = LoopThread()
    yield running
    running.stop()


@pytest.fixture(params=SYNCERS)
def syncer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which syncer thread the journal gets: the C one where built, the Python one always."""
    if request.param == "python":
        monkeypatch.setattr(journal_module, "make_syncer", ThreadSyncer)
    return str(request.param)


def loop_journal(
    directory: Path,
    collector: Collector,
    running: LoopThread,
    inline_ok: Callable[[], bool] = lambda: False,
    **options: Any,
) -> Journal:
    """A journal written by ``running``'s loop, open; idle groups go to the syncer unless
    ``inline_ok`` says otherwise."""
    journal = Journal(str(directory), collector, **options)
    journal.write_on(running.loop, inline_ok, partial(call_on, running.loop))
    journal.open(0)
    return journal


def groups_of(directory: Path) -> list[list[bytes]]:
    """The bodies of each group of the journal files, in order."""
    groups: dict[tuple[int, int], list[bytes]] = {}
    for _, body, file_id, group_end in replay(str(directory), None):
        groups.setdefault((file_id, group_end), []).append(body)
    return [groups[key] for key in sorted(groups)]


def held_python_fdatasync(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[threading.Event, threading.Event, list[int]]:
    """Holds every ``os.fdatasync`` (the Python syncer's) until the gate opens; returns the gate,
    an event set once a sync waits, and the threads that synced."""
    gate, waiting = threading.Event(), threading.Event()
    threads: list[int] = []
    real_fdatasync = os.fdatasync

    def held(fd: int) -> None:
        threads.append(threading.get_ident())
        waiting.set()
        assert gate.wait(30), "the test never released the sync"
        real_fdatasync(fd)

    monkeypatch.setattr(journal_module, "make_syncer", ThreadSyncer)
    monkeypatch.setattr(os, "fdatasync", held)
    return gate, waiting, threads


def test_a_loop_pass_is_one_group_synced_off_the_loop_and_answered_on_it(
    tmp_path: Path, loop_thread: LoopThread, syncer: str
) -> None:
    collector = LoopCollector()
    journal = loop_journal(tmp_path, collector, loop_thread)
    key = (1).to_bytes(8, "big") + b"k" * 20
    first = [entry(1, 0, b"a"), entry(1, 1, b"b")]
    second = [entry(1, 2, b"c")]
    fence = (1).to_bytes(8, "big")

    def one_pass() -> None:
        journal.append(RecordType.MASTER_KEY, key, None)
        journal.append_entries(first, "first")
        journal.append(RecordType.FENCE, fence, "fence")
        journal.append_entries(second, "second")

    loop_thread.call(one_pass)
    collector.wait_for(3)
    later = [entry(1, 3 + i, b"l") for i in range(3)]
    loop_thread.call(lambda: journal.append_entries(later, "later"))
    collector.wait_for(4)
    loop_thread.call(journal.close)
    assert [token for token, _ in collector.results] == ["first", "fence", "second", "later"]
    assert all(error is None for _, error in collector.results)
    assert set(collector.threads) == {loop_thread.thread.ident}
    assert groups_of(tmp_path) == [[key, *first, fence, *second], later]
    assert journal.queued == 0


def test_records_written_while_a_sync_runs_wait_for_the_next_sync(
    tmp_path: Path, loop_thread: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop writes a pass's group at once, even while the syncer syncs an earlier one; none
    is answered before a sync that began after it was written, and one sync covers every group
    written meanwhile."""
    gate, waiting, threads = held_python_fdatasync(monkeypatch)
    collector = LoopCollector()
    journal = loop_journal(tmp_path, collector, loop_thread)
    loop_thread.call(lambda: journal.append_entries([entry(1, 0, b"x")], "held"))
    assert waiting.wait(30)
    size_held = journal.position[1]
    for number in range(1, 4):  # three passes while the first group's sync is held
        loop_thread.call(partial(journal.append_entries, [entry(1, number, b"y")], number))
    loop_thread.settle()  # the passes' flushes have run
    assert journal.position[1] > size_held  # written already, on the loop
    assert journal.queued == 4 and collector.results == []
    waiting.clear()
    gate.set()
    collector.wait_for(4)
    loop_thread.call(journal.close)
    monkeypatch.undo()
    assert [token for token, _ in collector.results] == ["held", 1, 2, 3]
    assert loop_thread.thread.ident not in threads
    assert len(groups_of(tmp_path)) == 4
    assert len(threads) <= 3  # the first sync, one for the three groups, zeros at most


def test_an_idle_journal_syncs_a_few_records_on_the_loop_when_allowed(
    tmp_path: Path, loop_thread: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone small group of an idle journal is synced on the loop (two thread hops fewer),
    unless ``inline_ok`` says no or the group holds more than ``INLINE_MAX_RECORDS``."""
    allowed = [True]
    synced_on: list[int] = []
    real_fdatasync = os.fdatasync

    def recording(fd: int) -> None:
        synced_on.append(threading.get_ident())
        real_fdatasync(fd)

    monkeypatch.setattr(journal_module, "make_syncer", ThreadSyncer)
    monkeypatch.setattr(os, "fdatasync", recording)
    collector = LoopCollector()
    journal = loop_journal(tmp_path, collector, loop_thread, inline_ok=lambda: allowed[0])
    me = loop_thread.thread.ident

    def idle_then(add: Callable[[], None]) -> list[int]:
        for _ in range(1000):  # bounded: until idle longer than the last sync took
            if journal.idle_past_a_sync and journal.queued == 0:
                break
            time.sleep(0.001)
        loop_thread.settle()
        synced_on.clear()
        count = len(collector.results)
        loop_thread.call(add)
        collector.wait_for(count + 1)
        return list(synced_on)

    few = [entry(1, 0, b"f")]
    assert idle_then(lambda: journal.append_entries(few, "few"))[0] == me
    many = [entry(1, 1 + i, b"m") for i in range(INLINE_MAX_RECORDS + 1)]
    assert me not in idle_then(lambda: journal.append_entries(many, "many"))
    allowed[0] = False
    declined = [entry(1, 2 + INLINE_MAX_RECORDS, b"d")]
    assert me not in idle_then(lambda: journal.append_entries(declined, "declined"))
    loop_thread.call(journal.close)
    monkeypatch.undo()
    assert [token for token, _ in collector.results] == ["few", "many", "declined"]
    assert replayed(tmp_path) == [(RecordType.ENTRY, body) for body in few + many + declined]


def test_a_failed_sync_fails_its_records_and_every_later_one(
    tmp_path: Path, loop_thread: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "make_syncer", ThreadSyncer)

    def broken_fdatasync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken_fdatasync)
    collector = LoopCollector()
    journal = loop_journal(tmp_path, collector, loop_thread)
    loop_thread.call(lambda: journal.append_entries([entry(1, 0, b"lost?")], "first"))
    collector.wait_for(1)
    monkeypatch.undo()
    loop_thread.call(lambda: journal.append_entries([entry(1, 1, b"later")], "second"))
    collector.wait_for(2)
    loop_thread.call(journal.close)
    assert [token for token, _ in collector.results] == ["first", "second"]
    assert all(isinstance(error, JournalError) for _, error in collector.results)
    assert journal.failure is not None and "Input/output error" in str(journal.failure)


def test_background_records_give_way_to_foreground_ones_on_the_loop(
    tmp_path: Path, loop_thread: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copies queued while a copy's group is being synced wait for it; the next group holds the
    live writer's record and at most ``BACKGROUND_WITH_FOREGROUND`` bytes of copies; the rest
    follow, each batch once the one before is durable; every record is written."""
    gate, waiting, _ = held_python_fdatasync(monkeypatch)
    collector = LoopCollector()
    journal = loop_journal(tmp_path, collector, loop_thread)
    copies = [entry(7, e, b"c" * (64 * 1024)) for e in range(21)]
    loop_thread.call(lambda: journal.append(RecordType.ENTRY, copies[0], "copy-0", background=True))
    assert waiting.wait(30)

    def more() -> None:
        for number, body in enumerate(copies[1:], 1):
            journal.append(RecordType.ENTRY, body, f"copy-{number}", background=True)
        journal.append(RecordType.ENTRY, write, "write")

    write = entry(8, 0, b"live writer")
    loop_thread.call(more)
    gate.set()
    collector.wait_for(22)
    loop_thread.call(journal.close)
    monkeypatch.undo()
    assert sorted(str(token) for token, _ in collector.results) == sorted(
        ["write", *(f"copy-{number}" for number in range(21))]
    )
    assert all(error is None for _, error in collector.results)
    first, second, *rest = groups_of(tmp_path)
    assert first == [copies[0]]
    assert second[0] == write
    assert sum(map(len, second[1:])) <= BACKGROUND_WITH_FOREGROUND + len(copies[1])
    assert rest  # the other copies in later groups
    assert [body for group in (second, *rest) for body in group if body != write] == copies[1:]


def test_rolls_by_size_and_on_request_keep_every_record(
    tmp_path: Path, loop_thread: LoopThread, syncer: str
) -> None:
    """A group past the file's size limit starts a new file after the syncs asked for; a roll
    asked for from another thread (a filling disk) runs on the loop; every record is answered
    and replayed, across the files."""
    collector = LoopCollector()
    rolled = threading.Event()
    journal = Journal(str(tmp_path), collector, max_file_size=40 * 1024, on_rolled=rolled.set)
    journal.write_on(loop_thread.loop, lambda: False, partial(call_on, loop_thread.loop))
    journal.open(0)
    bodies = [entry(1, i, bytes([i]) * 5000) for i in range(24)]
    for number in range(0, 24, 2):  # 12 passes of two records, ~10 KiB each
        loop_thread.call(partial(journal.append_entries, bodies[number : number + 2], number))
    collector.wait_for(12)
    assert rolled.is_set()
    files_before = journal.position[0]
    journal.request_roll()  # from this thread, as the disk check does
    loop_thread.settle()
    assert journal.position[0] == files_before + 1
    extra = entry(1, 24, b"after the roll")
    loop_thread.call(lambda: journal.append_entries([extra], "extra"))
    collector.wait_for(13)
    journal.close()  # from this thread too
    assert all(error is None for _, error in collector.results)
    assert [token for token, _ in collector.results] == [*range(0, 24, 2), "extra"]
    assert replayed(tmp_path) == [(RecordType.ENTRY, body) for body in [*bodies, extra]]
    assert len(os.listdir(tmp_path)) == files_before + 2


@pytest.mark.parametrize("closer", ["loop", "other thread"])
def test_closing_writes_and_answers_what_was_gathered(
    tmp_path: Path, loop_thread: LoopThread, syncer: str, closer: str
) -> None:
    """A close on the loop in the same pass as the appends (their flush not run yet), or from
    another thread (the bookie closes its storage off the loop; that close runs on the loop):
    the records gathered are written, synced and answered before it returns, and the syncer's
    eventfd is no longer watched."""
    collector = LoopCollector()
    journal = loop_journal(tmp_path, collector, loop_thread)
    gathered = [entry(1, 0, b"g"), entry(1, 1, b"h")]
    closed = threading.Event()

    def append_then_close() -> None:
        journal.append_entries(gathered, "gathered")
        if closer == "loop":
            journal.close()
            closed.set()
            return

        def close_elsewhere() -> None:
            journal.close()
            closed.set()

        other = threading.Thread(target=close_elsewhere)
        other.start()  # its close waits for this callback to end, then runs on the loop

    loop_thread.call(append_then_close)
    assert closed.wait(30)
    loop_thread.settle()
    assert collector.results == [("gathered", None)]
    assert replayed(tmp_path) == [(RecordType.ENTRY, body) for body in gathered]
    assert journal.queued == 0 and journal._syncer is None


def test_zeros_ahead_on_the_loop_land_past_the_records_and_are_synced(
    tmp_path: Path, loop_thread: LoopThread, syncer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once no record waits, the loop writes zeros over the preallocated space just past the
    records (the syncer syncs them, with no record to answer): never at or before the end of
    the records, and every record replays as written."""
    collector = LoopCollector()
    zero_writes: list[tuple[int, int, int]] = []
    journal = Journal(str(tmp_path), collector, preallocate_bytes=4 * 1024 * 1024)
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        zero_writes.append((offset, len(data), journal._size))
        assert not any(bytes(data))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    journal.write_on(loop_thread.loop, lambda: False, partial(call_on, loop_thread.loop))
    journal.open(0)
    records = [(RecordType.ENTRY, entry(1, i, bytes([i + 1]) * 3000)) for i in range(6)]
    for index, (_, body) in enumerate(records):
        loop_thread.call(partial(journal.append_entries, [body], index))
        collector.wait_for(index + 1)
    for _ in range(1000):  # bounded: the zeros' sync is answered on the loop too
        loop_thread.settle()
        if zero_writes and journal.queued == 0 and journal._unsynced_records == 0:
            break
        time.sleep(0.001)
    records_end = journal._size
    loop_thread.call(journal.close)
    assert zero_writes
    assert all(offset >= end for offset, _, end in zero_writes)
    assert max(offset + length for offset, length, _ in zero_writes) > records_end
    assert (tmp_path / journal_name(0)).stat().st_size == records_end
    assert replayed(tmp_path) == records


def test_zeros_ahead_on_the_loop_stop_while_syncs_are_large(
    tmp_path: Path, loop_thread: LoopThread, syncer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Groups of 9 times ZERO_AHEAD_MAX_SYNC_BYTES synced one by one (by the syncer) outrun the
    zeros ahead, which are written again once small groups follow; every record replays as
    written."""
    collector = LoopCollector()
    zero_writes: list[tuple[int, int]] = []
    journal = Journal(str(tmp_path), collector, preallocate_bytes=16 * 1024 * 1024)
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        zero_writes.append((offset, journal._size))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    journal.write_on(loop_thread.loop, lambda: False, partial(call_on, loop_thread.loop))
    journal.open(0)
    large_size = 9 * ZERO_AHEAD_MAX_SYNC_BYTES  # past the average from the first sync
    large = [(RecordType.ENTRY, entry(1, i, bytes([i + 1]) * large_size)) for i in range(8)]
    small = [(RecordType.ENTRY, entry(1, 8 + i, b"s" * 100)) for i in range(40)]
    for index, (_, body) in enumerate(large):
        loop_thread.call(partial(journal.append_entries, [body], index))
        collector.wait_for(index + 1)
    loop_thread.settle()
    while_large = len(zero_writes)
    assert journal._sync_bytes > ZERO_AHEAD_MAX_SYNC_BYTES
    for index, (_, body) in enumerate(small, start=len(large)):
        loop_thread.call(partial(journal.append_entries, [body], index))
        collector.wait_for(index + 1)
    for _ in range(1000):  # bounded: the zeros' sync is answered on the loop too
        loop_thread.settle()
        if len(zero_writes) > while_large and journal._unsynced_records == 0:
            break
        time.sleep(0.001)
    loop_thread.call(journal.close)
    assert while_large <= 1  # without the rule: one after each large group
    assert len(zero_writes) > while_large
    assert all(offset >= end for offset, end in zero_writes)
    assert replayed(tmp_path) == large + small


def test_without_fsync_the_loop_answers_once_written(
    tmp_path: Path, loop_thread: LoopThread
) -> None:
    collector = LoopCollector()
    journal = loop_journal(tmp_path, collector, loop_thread, sync_data=False)
    assert journal._syncer is None  # no syncer thread, no eventfd
    bodies = [entry(1, i, b"n" * 100) for i in range(3)]
    loop_thread.call(lambda: journal.append_entries(bodies, "written"))
    collector.wait_for(1)
    loop_thread.call(journal.close)
    assert collector.results == [("written", None)]
    assert replayed(tmp_path) == [(RecordType.ENTRY, body) for body in bodies]


def test_max_group_wait_on_the_loop_gathers_passes_until_the_threshold(
    tmp_path: Path, loop_thread: LoopThread, syncer: str
) -> None:
    """With journalMaxGroupWaitMSec, records of several passes wait to be one group, which is
    written as soon as they reach the threshold (long before the wait is over)."""
    collector = LoopCollector()
    journal = loop_journal(
        tmp_path, collector, loop_thread, max_group_wait_s=30.0, buffered_writes_threshold=3 * 136
    )
    for index in range(3):
        loop_thread.call(
            partial(journal.append, RecordType.ENTRY, entry(1, index, b"w" * 100), index)
        )
        if index < 2:
            loop_thread.settle()
            assert collector.results == []  # waiting for more
    collector.wait_for(3)
    loop_thread.call(journal.close)
    assert len(groups_of(tmp_path)) == 1


@pytest.mark.skipif(native is None, reason="the C speedups are not built")
def test_the_c_syncer_reports_syncs_failures_and_misuse(tmp_path: Path) -> None:
    assert native is not None
    path = tmp_path / "file"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    read_end, write_end = os.pipe()
    syncer = native.JournalSyncer(fd)
    try:
        os.write(fd, b"data")
        syncer.request(1)
        syncer.drain()
        synced, error, times, ended = syncer.take()
        assert (synced, error, len(times)) == (1, 0, 1)
        assert times[0] >= 0 and 0 < ended <= time.monotonic()
        assert syncer.idle
        with pytest.raises(ValueError, match="increasing"):
            syncer.request(1)
        syncer.set_fd(write_end)  # fdatasync of a pipe fails: EINVAL
        syncer.request(2)
        syncer.drain()
        assert syncer.take()[:2] == (2, errno.EINVAL)
        syncer.set_fd(fd)
        syncer.request(3)  # a failed syncer stays failed: nothing is synced any more
        syncer.drain()
        assert syncer.take()[:2] == (3, errno.EINVAL)
    finally:
        syncer.close()
        syncer.close()  # twice is harmless
        os.close(fd)
        os.close(read_end)
        os.close(write_end)
    with pytest.raises(ValueError, match="closed"):
        syncer.request(4)


def test_copies_waiting_when_a_roll_takes_the_syncers_report_are_still_written(
    tmp_path: Path, loop_thread: LoopThread, syncer: str
) -> None:
    """A roll asked for (a filling disk) takes the syncer's report of the sync that covered a
    copy, while more copies wait for it: they are written and answered all the same."""
    collector = LoopCollector()
    journal = loop_journal(tmp_path, collector, loop_thread, buffered_writes_threshold=1)
    copies = [entry(5, number, b"c" * 100) for number in range(3)]

    def copies_then_a_roll() -> None:
        for number, body in enumerate(copies):
            journal.append(RecordType.ENTRY, body, f"copy-{number}", background=True)

        def roll_after_the_sync() -> None:
            for _ in range(3000):  # bounded: until the first copy's sync has run
                if journal._syncer.idle:
                    break
                time.sleep(0.001)
            journal._roll_on_loop()  # what request_roll schedules

        loop_thread.loop.call_soon(roll_after_the_sync)  # after the copies' first flush

    loop_thread.call(copies_then_a_roll)
    collector.wait_for(3)
    loop_thread.call(journal.close)
    assert sorted(token for token, _ in collector.results) == ["copy-0", "copy-1", "copy-2"]
    assert all(error is None for _, error in collector.results)
    assert sorted(body for _, body in replayed(tmp_path)) == sorted(copies)


def test_a_failed_sync_seen_during_a_roll_fails_the_group_that_rolled(
    tmp_path: Path, loop_thread: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The syncer's failed sync is taken by a roll in the middle of the next group's write: that
    group fails too, never written on and synced on the loop as if the journal were sound."""
    monkeypatch.setattr(journal_module, "make_syncer", ThreadSyncer)
    real_fdatasync = os.fdatasync

    def failing_on_the_syncer(fd: int) -> None:
        if threading.current_thread().name == "journal-sync":
            raise OSError(errno.EIO, "Input/output error")
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", failing_on_the_syncer)
    inline = [False]
    collector = LoopCollector()
    journal = loop_journal(
        tmp_path,
        collector,
        loop_thread,
        inline_ok=lambda: inline[0],
        max_file_size=100,
        preallocate_bytes=0,
    )
    loop_thread.call(lambda: journal.append(RecordType.ENTRY, entry(1, 0, b"x" * 200), "first"))

    def second_before_the_report() -> None:
        for _ in range(3000):  # bounded: until the failed sync has run
            if journal._syncer.idle:
                break
            time.sleep(0.001)
        inline[0] = True
        journal.append(RecordType.ENTRY, entry(1, 1, b"y" * 200), "second")
        journal._flush()  # now, before the loop takes the syncer's report (its roll does)

    loop_thread.call(second_before_the_report)
    collector.wait_for(2)
    loop_thread.call(journal.close)
    monkeypatch.undo()
    assert [token for token, _ in collector.results] == ["first", "second"]
    assert all(isinstance(error, JournalError) for _, error in collector.results)


def _histogram(metrics: PrometheusMetrics, name: str) -> tuple[float, float]:
    """The (count, sum) of histogram ``name``'s successes as the bookie exports them."""
    values: dict[str, float] = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        for suffix in ("_count", "_sum"):
            if line.startswith(f'{name}{suffix}{{success="true"}} '):
                values[suffix] = float(line.split()[1])
    return values["_count"], values["_sum"]


def test_how_late_the_loop_takes_a_finished_sync_is_recorded(
    tmp_path: Path, loop_thread: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JOURNAL_SYNC_TAKEN: from a sync's end on the syncer thread to the loop taking it. A sync
    that ends while the loop is busy is taken once the loop is free again, and counted that
    late; the answers wait for it."""
    gate, synced = threading.Event(), threading.Event()
    ended: list[float] = []
    real_fdatasync = os.fdatasync

    def held(fd: int) -> None:
        assert gate.wait(30), "the test never released the sync"
        real_fdatasync(fd)
        ended.append(time.monotonic())
        synced.set()

    monkeypatch.setattr(journal_module, "make_syncer", ThreadSyncer)
    monkeypatch.setattr(os, "fdatasync", held)
    metrics = PrometheusMetrics()
    collector = Collector()
    journal = loop_journal(tmp_path, collector, loop_thread, stats=JournalStats.of(metrics))
    taken = "bookie_journal_JOURNAL_SYNC_TAKEN"
    loop_thread.call(lambda: journal.append_entries([entry(1, 0, b"a")], "a"))
    busy, free = threading.Event(), threading.Event()

    def keep_busy() -> None:
        busy.set()
        assert free.wait(30)

    loop_thread.loop.call_soon_threadsafe(keep_busy)
    assert busy.wait(30)
    gate.set()  # the sync ends while the loop is busy
    assert synced.wait(30)
    time.sleep(0.1)
    freed_at = time.monotonic()
    sync_end = journal._syncer._last_end  # the syncer's own clock of the sync's end
    assert sync_end >= ended[0]
    free.set()
    collector.wait_for(1)
    assert collector.results == [("a", None)]
    count, seconds = _histogram(metrics, taken)
    assert count == 1
    assert seconds >= freed_at - sync_end  # at least as late as the loop was busy
    loop_thread.call(journal.close)
