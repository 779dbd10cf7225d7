"""One conformance suite for every ``storage.engine.LedgerEngine``: the real engine (journal,
entry logs, index) and the simulator's in-memory engine over a simulated disk. What the bookie's
request handling relies on holds for both, so the simulator tests the bookie over an engine
that behaves as the real one does."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from bookkeeper_py.storage.engine import LedgerEngine, StorageConfig, StorageEngine
from bookkeeper_py.storage.ledger_storage import NoEntryError, NoLedgerError
from bookkeeper_py.testing.sim import VirtualTimeLoop
from bookkeeper_py.testing.sim.disk import Disk
from bookkeeper_py.testing.sim.engine import SimEngine
from bookkeeper_py.wire.digest import DigestManager, DigestType
from bookkeeper_py.wire.status import StatusCode

KEY = b"k" * 20


def packaged(ledger_id: int, entry_id: int) -> bytes:
    return DigestManager(ledger_id, DigestType.CRC32C, b"p").package(
        entry_id, entry_id - 1, entry_id + 1, b"entry %d" % entry_id
    )


class Durable:
    """The engine's durability callback: the tokens it gave back, in order."""

    def __init__(self) -> None:
        self.tokens: list[Any] = []
        self.errors: list[Exception] = []
        self.lock = threading.Lock()

    def __call__(self, tokens: list[Any], error: Exception | None) -> None:
        with self.lock:
            self.tokens.extend(tokens)
            if error is not None:
                self.errors.append(error)


class Harness(Protocol):
    engine: LedgerEngine
    durable: Durable

    def settle(self, tokens: int) -> None:
        """Until ``tokens`` tokens came back (bounded)."""

    def restart(self) -> None:
        """A clean stop and a start: the engine brings back what was durable."""


class RealHarness:
    def __init__(self, directory: Path) -> None:
        self.config = StorageConfig(
            journal_directory=str(directory / "journal"),
            ledger_directory=str(directory / "ledgers"),
        )
        self.durable = Durable()
        self.engine: LedgerEngine = StorageEngine(self.config, self.durable)
        self.engine.start()

    def settle(self, tokens: int) -> None:
        done = threading.Event()
        for _ in range(3000):  # 30 s at most
            with self.durable.lock:
                if len(self.durable.tokens) >= tokens:
                    return
            done.wait(0.01)
        raise AssertionError(f"{tokens} tokens did not come back in 30 s")

    def restart(self) -> None:
        self.engine.close()
        self.durable = Durable()
        self.engine = StorageEngine(self.config, self.durable)
        self.engine.start()


class SimHarness:
    def __init__(self, _directory: Path) -> None:
        self.loop = VirtualTimeLoop()
        self.disk = Disk(random.Random(0))
        self.durable = Durable()
        self.engine: LedgerEngine = self._make()

    def _make(self) -> SimEngine:
        engine = SimEngine(
            self.loop,
            random.Random(1),
            self.disk,
            self.durable,
            sync_delay_ms=1.0,
            read_error_probability=lambda: 0.0,
            read_error=lambda: StatusCode.EIO,
        )
        engine.start()
        return engine

    def settle(self, tokens: int) -> None:
        for _ in range(100):
            if len(self.durable.tokens) >= tokens:
                return
            self.loop.run_until_complete(asyncio.sleep(0.001))
        raise AssertionError(f"{tokens} tokens did not come back in 100 virtual ms")

    def restart(self) -> None:
        self.engine.close()
        self.durable = Durable()
        self.engine = self._make()


@pytest.fixture(params=["real", "sim"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    made: Harness = RealHarness(tmp_path) if request.param == "real" else SimHarness(tmp_path)
    yield made
    made.engine.close()
    if isinstance(made, SimHarness):
        made.loop.close()


def test_writes_are_readable_at_once_and_their_tokens_come_back_once_durable(
    harness: Harness,
) -> None:
    engine = harness.engine
    engine.create_ledger(7, KEY)
    for entry_id in range(5):
        engine.add_entry(7, entry_id, packaged(7, entry_id), ("add", entry_id))
    assert engine.read(7, 3) == packaged(7, 3)  # taken: readable before it is durable
    harness.settle(5)
    assert harness.durable.tokens == [("add", entry_id) for entry_id in range(5)]
    assert harness.durable.errors == []
    assert engine.read(7, -1) == packaged(7, 4)  # -1: the last entry held
    assert list(dict.fromkeys(engine.entry_ids(7))) == [0, 1, 2, 3, 4]


def test_entries_taken_together_are_readable_at_once_and_come_back_with_one_token(
    harness: Harness,
) -> None:
    engine = harness.engine
    engine.create_ledger(6, KEY)
    engine.add_entry(6, 0, packaged(6, 0), "alone")
    engine.add_entries(6, [1, 2, 3], [packaged(6, i) for i in (1, 2, 3)], "together")
    assert engine.read(6, 2) == packaged(6, 2)
    assert engine.read(6, -1) == packaged(6, 3)
    harness.settle(2)
    assert harness.durable.tokens == ["alone", "together"]
    harness.restart()
    engine = harness.engine
    assert [engine.read(6, i) for i in range(4)] == [packaged(6, i) for i in range(4)]


def test_absence_is_told_apart_no_ledger_from_no_entry(harness: Harness) -> None:
    engine = harness.engine
    with pytest.raises(NoLedgerError):
        engine.read(8, 0)
    assert engine.ledger(8) is None
    engine.create_ledger(8, KEY)
    engine.add_entry(8, 0, packaged(8, 0), "t")
    with pytest.raises(NoEntryError):
        engine.read(8, 1)
    with pytest.raises(NoLedgerError):
        list(engine.entry_ids(9))


def test_ledger_state_and_entries_come_back_after_a_restart(harness: Harness) -> None:
    engine = harness.engine
    info = engine.create_ledger(3, KEY)
    assert engine.key_matches(info, KEY) and not engine.key_matches(info, b"x" * 20)
    engine.add_entry(3, 0, packaged(3, 0), "e0")
    engine.add_entry(3, 1, packaged(3, 1), "e1")
    engine.set_explicit_lac(3, b"lac-body", "lac")
    engine.fence(3, "fence")
    harness.settle(4)
    harness.restart()
    engine = harness.engine
    info = engine.ledger(3)
    assert info is not None and info.fenced and info.explicit_lac == b"lac-body"
    assert engine.key_matches(info, KEY)
    assert [engine.read(3, i) for i in (0, 1)] == [packaged(3, 0), packaged(3, 1)]


def test_a_force_comes_back_after_the_writes_taken_before_it(harness: Harness) -> None:
    engine = harness.engine
    engine.create_ledger(4, KEY)
    engine.add_entry(4, 0, packaged(4, 0), "e0")
    engine.force(4, "force")
    harness.settle(2)
    tokens = harness.durable.tokens
    assert tokens.index("e0") < tokens.index("force")
    assert engine.failure is None and not engine.write_cache_full
