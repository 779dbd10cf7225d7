"""Checking and rebuilding a stopped bookie's index (``check-db-ledgers-index``,
``rebuild-db-ledger-locations-index``, ``rebuild-db-ledgers-index``): the rebuilt index locates
every entry as the old one did (the newest copy after a compaction's move), ledger states come
back existing and fenced with the journal's master keys, the old index is kept aside, and the
bookie starts on the new one and reads everything. A lost index needs both parts; a running
bookie is refused."""

from __future__ import annotations

import os
from pathlib import Path

import lmdb
import pytest

from bookkeeper_py.admin.cli import main
from bookkeeper_py.storage.disk import DirectoryLocks
from bookkeeper_py.storage.index import LedgerIndex

from .test_engine import KEY, entry, open_engine


def filled(tmp_path: Path) -> tuple[str, str]:
    engine, durable = open_engine(tmp_path)
    for ledger_id in (1, 2, 3):
        engine.create_ledger(ledger_id, KEY)
        for entry_id in range(20):
            engine.add_entry(ledger_id, entry_id, entry(ledger_id, entry_id), True)
    durable.wait_for(60)
    engine.checkpoint()
    engine.fence(2, True)
    durable.wait_for(61)
    engine.storage.entry_logger.roll()
    for entry_id in range(20, 25):  # a second entry log
        engine.add_entry(1, entry_id, entry(1, entry_id), True)
    durable.wait_for(66)
    engine.close()
    return str(tmp_path / "journal"), str(tmp_path / "ledgers")


def snapshot(ledgers: str) -> dict[int, list[tuple[int, int]]]:
    index = LedgerIndex(ledgers, readonly=True)
    try:
        return {ledger_id: list(index.entries(ledger_id)) for ledger_id in index.ledger_ids()}
    finally:
        index.close()


def test_rebuilt_locations_and_states_match_and_the_bookie_reads_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal, ledgers = filled(tmp_path)
    before = snapshot(ledgers)
    assert sorted(before) == [1, 2, 3] and len(before[1]) == 25
    main(["shell", "check-db-ledgers-index", "--ledger-dir", ledgers])
    assert "3 ledger states, all readable" in capsys.readouterr().out

    main(
        [
            "shell",
            "rebuild-db-ledger-locations-index",
            "--ledger-dir",
            ledgers,
            "--journal-dir",
            journal,
        ]
    )
    out = capsys.readouterr().out
    assert "3 ledgers, 65 entry locations from 2 entry logs" in out and "the old index is in" in out
    assert snapshot(ledgers) == before
    previous = [name for name in os.listdir(ledgers) if name.startswith("index-prev-")]
    assert len(previous) == 1 and "data.mdb" in os.listdir(os.path.join(ledgers, previous[0]))

    main(["shell", "rebuild-db-ledgers-index", "--ledger-dir", ledgers, "--journal-dir", journal])
    capsys.readouterr()
    index = LedgerIndex(ledgers, readonly=True)
    try:
        states = {ledger_id: index.ledger(ledger_id) for ledger_id in index.ledger_ids()}
    finally:
        index.close()
    assert sorted(states) == [1, 2, 3]
    assert all(state is not None and state.exists and state.fenced for state in states.values())
    assert snapshot(ledgers) == before  # the locations were kept

    engine, _ = open_engine(tmp_path)  # the bookie starts on the rebuilt index
    try:
        for ledger_id, entries in before.items():
            for entry_id, _ in entries:
                assert engine.read(ledger_id, entry_id) == entry(ledger_id, entry_id)
    finally:
        engine.close()


def test_a_lost_index_is_rebuilt_whole_and_a_running_bookie_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal, ledgers = filled(tmp_path)
    before = snapshot(ledgers)
    for name in ("data.mdb", "lock.mdb"):
        os.unlink(os.path.join(ledgers, name))
    with pytest.raises(SystemExit) as exited:
        main(
            ["shell", "rebuild-db-ledgers-index", "--ledger-dir", ledgers, "--journal-dir", journal]
        )
    assert exited.value.code == 1 and "rebuild both" in capsys.readouterr().err
    assert not any(name.startswith("index-") for name in os.listdir(ledgers))  # nothing left

    locks = DirectoryLocks({"bookie": "test"})
    locks.acquire_all([(ledgers, "ledger directory")])
    try:
        with pytest.raises(SystemExit):
            main(
                [
                    "shell",
                    "rebuild-db-ledgers-index",
                    "--all",
                    "--ledger-dir",
                    ledgers,
                    "--journal-dir",
                    journal,
                ]
            )
        assert "in use by" in capsys.readouterr().err
    finally:
        locks.release()
    main(
        [
            "shell",
            "rebuild-db-ledgers-index",
            "--all",
            "--ledger-dir",
            ledgers,
            "--journal-dir",
            journal,
        ]
    )
    assert "65 entry locations" in capsys.readouterr().out
    assert snapshot(ledgers) == before


def test_check_reports_a_damaged_ledger_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, ledgers = filled(tmp_path)
    env = lmdb.open(ledgers, max_dbs=4)
    with env.begin(write=True, db=env.open_db(b"ledgers")) as txn:
        txn.put((2).to_bytes(8, "big"), b"\xff\xfe not a LedgerData")
    env.close()
    with pytest.raises(SystemExit) as exited:
        main(["shell", "check-db-ledgers-index", "--ledger-dir", ledgers])
    assert exited.value.code == 1
    captured = capsys.readouterr()
    assert "ledger 2: unreadable state" in captured.out
    assert "1 of 3 ledger states are damaged" in captured.err
