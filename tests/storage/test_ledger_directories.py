"""Several ledger directories (``ledgerDirectories``): a ledger lives in directory ledgerId mod
n (its entry logs and index there, as in BookKeeper's DbLedgerStorage), every directory keeps a
copy of the LastLogMark, replay after a crash refills each one, a garbage collector runs per
directory, and a bookie started on two directories serves and restarts."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bookkeeper_py import BookKeeper
from bookkeeper_py.storage.gc import GcConfig
from bookkeeper_py.storage.index import LedgerIndex
from bookkeeper_py.storage.last_log_mark import FILE_NAME, read_mark
from bookkeeper_py.testing import LocalCluster

from .test_engine import KEY, crash, entry, open_engine

LEDGERS = range(1, 7)


def indexed_ledgers(directory: str) -> list[int]:
    index = LedgerIndex(directory, readonly=True)
    try:
        return list(index.ledger_ids())
    finally:
        index.close()


def test_ledgers_are_spread_by_id_and_replayed_into_their_directory(tmp_path: Path) -> None:
    dirs = (str(tmp_path / "l0"), str(tmp_path / "l1"))
    options = {"ledger_directory": dirs[0], "extra_ledger_directories": dirs[1:]}
    engine, durable = open_engine(tmp_path, **options)
    for ledger_id in LEDGERS:
        engine.create_ledger(ledger_id, KEY)
        for entry_id in range(5):
            engine.add_entry(ledger_id, entry_id, entry(ledger_id, entry_id), True)
    durable.wait_for(30)
    engine.checkpoint()
    for number, directory in enumerate(dirs):
        held = list(engine.storages[number].index.ledger_ids())
        assert held == [lid for lid in LEDGERS if lid % 2 == number]
        assert engine.storages[number].directory == directory
        assert read_mark(directory, FILE_NAME) is not None  # each keeps the mark
    assert read_mark(dirs[0], FILE_NAME) == read_mark(dirs[1], FILE_NAME)
    for ledger_id in LEDGERS:  # more, then a crash before any checkpoint: replay refills both
        engine.add_entry(ledger_id, 5, entry(ledger_id, 5), True)
    durable.wait_for(36)
    crash(engine)

    engine, _ = open_engine(tmp_path, **options)
    try:
        assert engine.replayed_records >= 6
        for ledger_id in LEDGERS:
            for entry_id in range(6):
                assert engine.read(ledger_id, entry_id) == entry(ledger_id, entry_id)
        assert len(engine.start_gc(lambda: list(LEDGERS), lambda _: True, engine_gc_config())) == 2
    finally:
        engine.close()
    for number, directory in enumerate(dirs):  # the close's checkpoint wrote each directory's
        assert indexed_ledgers(directory) == [lid for lid in LEDGERS if lid % 2 == number]


def engine_gc_config() -> GcConfig:
    return GcConfig(gc_wait_time_s=3600)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The bookie's /metrics: (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_bookie_on_two_ledger_directories(tmp_path: Path) -> None:
    """... and two journals: its metrics are labelled per journal (``journalIndex``) and per
    ledger directory (``ledgerDir``, ``indexDir``), as BookKeeper's."""
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    args = ["--ledger-dir", dirs[0], "--ledger-dir", dirs[1]]
    args += ["--journal-dir", str(tmp_path / "journal2"), "--metrics-style", "bookkeeper"]
    with LocalCluster(1, bookie_args=args) as local:
        with BookKeeper(local.metadata_uri) as client:
            ledgers = []
            for _ in range(4):
                handle = client.create_ledger(1, 1, 1)
                for number in range(10):
                    handle.add_entry(b"entry %d" % number)
                handle.close()
                ledgers.append(handle.ledger_id)
        samples = scrape(local.bookies[0].http_port)
        for journal in (0, 1):  # each ledger's records go to journal ledgerId mod 2
            records = 4 + 10 * sum(1 for lid in ledgers if lid % 2 == journal)  # keys, fences
            labels = (("journalIndex", str(journal)), ("success", "true"))
            for name in ("JOURNAL_ADD_ENTRY", "JOURNAL_QUEUE_LATENCY"):
                assert samples[(f"bookie_journal_{name}_count", labels)] >= records - 4
            assert samples[("bookie_journal_JOURNAL_SYNC_count", labels)] >= 1
            queued = ("bookie_journal_JOURNAL_QUEUE_SIZE", (("journalIndex", str(journal)),))
            assert samples[queued] == 0
        local.restart_bookie(0)
        samples = scrape(local.bookies[0].http_port)
        for number, directory in enumerate(dirs):  # indexed by the stop's checkpoint
            labels = (("indexDir", directory), ("ledgerDir", directory))
            assert samples[("bookie_ledgers_count", labels)] == sum(
                1 for lid in ledgers if lid % 2 == number
            )
            assert samples[("bookie_entries_count", labels)] == 10 * sum(
                1 for lid in ledgers if lid % 2 == number
            )
            # (Prometheus's parser names a counter's sample <name>_total)
            assert samples[("bookie_MAJOR_COMPACTION_TOTAL_total", labels)] == 0
            assert samples[("bookie_write_cache_size", labels)] == 0
        with BookKeeper(local.metadata_uri) as client:
            for ledger_id in ledgers:
                reader = client.open_ledger(ledger_id)
                assert [e.data for e in reader.read_entries(0, 9)] == [
                    b"entry %d" % n for n in range(10)
                ]
        for number, directory in enumerate(dirs):
            assert os.path.exists(os.path.join(directory, "current", "VERSION"))  # its cookie
            assert sorted(indexed_ledgers(directory)) == sorted(
                lid for lid in ledgers if lid % 2 == number
            )
