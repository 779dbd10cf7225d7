"""Issue 18: logs built from ledgers in the simulator (``testing/sim/logs.py``): a sweep of
seeded runs with two writers that both think they lead, a writer crash, bookie crashes,
partitions, failing metadata calls and two tailing readers finds no violation; and each
invariant is caught when the rule behind it is broken on purpose."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

import pytest

from bookkeeper_py.log import namespace, reader, writer
from bookkeeper_py.log.format import LogMetadata, SegmentState
from bookkeeper_py.server.bookie import Bookie
from bookkeeper_py.testing.sim.__main__ import main, sweep
from bookkeeper_py.testing.sim.logs import LogRun, random_log_scenario, run_log_seed


def test_log_runs_violate_no_invariant() -> None:
    results = sweep(0, 300, jobs=2, kind="logs")
    assert [f"seed {r.seed}: {r.violation}" for r in results if not r.ok] == []
    # what the runs went through: takeovers, crashes in the middle, rolls, reads
    assert sum(1 for r in results if r.opens >= 3) > 50
    assert sum(1 for r in results if r.scenario.writer_a_crash_at is not None) > 60
    assert sum(r.segments for r in results) > 300 * 4
    assert all(r.records >= r.acked for r in results)
    assert sum(1 for r in results if r.acked) > 290  # (one run's writers may get no answer)


def test_a_log_seed_replays_the_same_run_and_the_command_line_sweeps() -> None:
    first, again = run_log_seed(42), run_log_seed(42)
    assert (first.steps, first.acked, first.records) == (again.steps, again.acked, again.records)
    assert main(["--logs", "--seeds", "5", "--jobs", "1"]) == 0


def violations(seeds: range) -> Iterator[str]:
    for seed in seeds:
        result = LogRun(seed, random_log_scenario(random.Random(seed))).run()
        if result.violation:
            yield result.violation


def first_violation(seeds: int = 60) -> str:
    return next(violations(range(seeds)), "")


def test_a_writer_that_opens_without_fencing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: the new writer marks the open segments closed in the list without fencing and
    recovering their ledgers; the old writer's appends go on being acknowledged."""

    async def no_fencing(_namespace: object, metadata: LogMetadata) -> object:
        closed = [
            dataclasses.replace(s, state=SegmentState.CLOSED, start_sequence=metadata.base_sequence)
            for s in metadata.segments
            if s.is_open
        ]
        tail = writer._Tail(metadata.base_sequence, metadata.base_txid, metadata.base_timestamp)
        return closed, tail

    monkeypatch.setattr(writer, "_recover_open_segments", no_fencing)
    assert first_violation(20)  # two writers on the log: numbering or the readers break


def test_a_fenced_writer_that_still_gets_acknowledgements_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutation: the bookies take adds on fenced ledgers (``Bookie._fenced_for`` treats every
    add as a recovery add), so the writer that lost the log is still acknowledged after the new
    one opened it: its records are acknowledged but not in the log."""
    monkeypatch.setattr(Bookie, "_fenced_for", staticmethod(lambda info, recovery: False))
    assert any("acknowledge" in found for found in violations(range(100)))


def test_a_list_that_loses_a_ledger_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: a write of the log's value drops its oldest segment."""
    write_log = namespace.LogNamespace.write_log

    async def lossy(self, name, metadata, version):  # type: ignore[no-untyped-def]
        if len(metadata.segments) >= 3:
            metadata = dataclasses.replace(metadata, segments=metadata.segments[1:])
        return await write_log(self, name, metadata, version)

    monkeypatch.setattr(namespace.LogNamespace, "write_log", lossy)
    assert "dropped ledger" in first_violation()


def test_a_reader_that_repeats_records_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: a reader reopened after a position starts at the beginning of that entry."""
    cursor_at = reader._cursor_at

    def whole_entry(metadata, position):  # type: ignore[no-untyped-def]
        cursor = cursor_at(metadata, position)
        cursor.slot = 0
        return cursor

    monkeypatch.setattr(reader, "_cursor_at", whole_entry)
    assert "not exactly the log's" in first_violation(200)


def test_numbers_that_start_again_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: a new writer forgets where the log's numbering ended."""
    recover = writer._recover_open_segments

    async def forgetful(ns, metadata):  # type: ignore[no-untyped-def]
        recovered, _ = await recover(ns, metadata)
        return recovered, writer._Tail(0, -1, -1)

    monkeypatch.setattr(writer, "_recover_open_segments", forgetful)
    found = first_violation()
    assert "sequence numbers" in found or "transaction ids" in found, found
