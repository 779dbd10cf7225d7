"""The pure parts of re-replication: which fragments are short and which of their entries a
missing bookie held, the metadata swap, the auditor's first and last held entry, the pacing and
the progress arithmetic."""

from __future__ import annotations

import asyncio

import pytest

from bookkeeper_py.autorecovery import replication
from bookkeeper_py.autorecovery.replication import (
    Fragment,
    Progress,
    Throttle,
    _held,
    short_fragments,
)
from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.wire.digest import DigestType


def ledger(state: LedgerState = LedgerState.CLOSED, last: int = 19) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=5,
        ensemble_size=3,
        write_quorum_size=2,
        ack_quorum_size=2,
        digest_type=DigestType.CRC32C,
        password=b"p",
        ensembles=((0, ("a", "b", "c")), (10, ("a", "d", "c"))),
        state=state,
        last_entry_id=last if state == LedgerState.CLOSED else -1,
    )


def test_fragments_end_where_the_next_begins_and_the_open_one_is_unknown() -> None:
    assert replication.fragments(ledger()) == [(0, 9, ("a", "b", "c")), (10, 19, ("a", "d", "c"))]
    assert replication.fragments(ledger(LedgerState.OPEN))[-1] == (10, None, ("a", "d", "c"))


def test_short_fragments_name_the_gone_bookies_and_flag_the_writer_s() -> None:
    short, open_short = short_fragments(ledger(), lambda bookie: bookie in {"a", "b"})
    assert [(f.first_entry, f.last_entry, dict(f.missing)) for f in short] == [
        (0, 9, {0: "a", 1: "b"}),
        (10, 19, {0: "a"}),
    ]
    assert not open_short
    short, open_short = short_fragments(ledger(LedgerState.OPEN), lambda bookie: bookie == "a")
    assert [f.first_entry for f in short] == [0] and open_short
    assert short_fragments(ledger(), lambda bookie: bookie == "z") == ([], False)


def test_a_bookie_that_lost_data_is_replaced_only_where_it_lost_it() -> None:
    """A live bookie that lacks the entries of one fragment (its writer never got them to it,
    a replaced disk) is replaced in that fragment only: taken for gone in every fragment that
    names it, two members of one fragment could need replacing where one spare bookie is left,
    and the ledger stayed marked for good (simulator seed 739)."""
    short, _ = short_fragments(ledger(), lambda bookie: False, {10: {"c"}})
    assert [(f.first_entry, dict(f.missing)) for f in short] == [(10, {2: "c"})]
    short, _ = short_fragments(ledger(), lambda bookie: bookie == "b", {10: {"c"}, 0: {"z"}})
    assert [(f.first_entry, dict(f.missing)) for f in short] == [(0, {1: "b"}), (10, {2: "c"})]


def test_a_missing_index_held_the_entries_of_its_write_sets() -> None:
    fragment = Fragment(5, 0, 9, ("a", "b", "c"), {1: "b"})
    # (1 - e) mod 3 < 2: entries 0, 1, 3, 4, 6, 7, 9
    assert fragment.entries(2) == [0, 1, 3, 4, 6, 7, 9]
    assert Fragment(5, 0, 9, ("a", "b", "c"), {1: "b", 2: "c"}).entries(2) == list(range(10))
    assert Fragment(5, 4, 3, ("a", "b", "c"), {1: "b"}).entries(2) == []  # an empty fragment
    assert _held(2, 0, 9, ledger()) == [1, 8]
    assert _held(0, 4, 4, ledger()) == [] and _held(1, 4, 4, ledger()) == [4, 4]


def test_members_are_swapped_in_one_fragment_only_and_never_twice() -> None:
    swapped = ledger().with_members(0, {1: "e"})
    assert swapped.ensembles == ((0, ("a", "e", "c")), (10, ("a", "d", "c")))
    with pytest.raises(ValueError, match="twice"):
        ledger().with_members(0, {1: "c"})
    with pytest.raises(ValueError, match="no fragment starting at 3"):
        ledger().with_members(3, {1: "e"})


def test_the_throttle_paces_copies_to_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    clock = [100.0]

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(replication.asyncio, "sleep", sleep)
    monkeypatch.setattr(replication.time, "monotonic", lambda: clock[0])
    throttle = Throttle(1000)

    async def take() -> None:
        for _ in range(4):
            await throttle.take(500)

    asyncio.run(take())
    assert slept == [0.5, 1.0, 1.5]  # 2,000 bytes at 1,000 bytes/s: the last starts at 1.5 s
    slept.clear()
    asyncio.run(Throttle(0).take(10**9))
    assert slept == []


def test_progress_rate_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [10.0]
    monkeypatch.setattr(replication.time, "monotonic", lambda: clock[0])
    progress = Progress(ledgers_total=4, entries_total=100, started=10.0)
    assert progress.eta_s() is None and "ETA -" in progress.line()
    clock[0] = 12.0
    progress.entries_done, progress.bytes_done, progress.ledgers_done = 25, 2_000_000, 1
    assert progress.rate() == 1_000_000 and progress.eta_s() == 6.0
    assert progress.line() == ("1/4 ledgers, 25/100 entries, 2.0 MB copied, 1.0 MB/s, ETA 6 s")


def test_the_placement_check_counts_ledgers_whose_quorums_share_a_rack() -> None:
    """Over a memory store: a ledger whose write quorums all span two racks adheres, one with a
    quorum in one rack does not; the gauge reads the count."""
    from types import SimpleNamespace

    from bookkeeper_py.autorecovery.auditor import Auditor
    from bookkeeper_py.core.placement import NetworkTopology, TopologyAwarePlacement
    from bookkeeper_py.metadata.manager import MetadataClient
    from bookkeeper_py.metadata.port import run_blocking
    from bookkeeper_py.metadata.underreplication import UnderReplication

    racks = {"a": "/r1", "b": "/r2", "c": "/r3", "d": "/r1"}
    placement = TopologyAwarePlacement(NetworkTopology(racks))
    gauges: dict[str, object] = {}
    metrics = SimpleNamespace(gauge_function=lambda name, _help, read: gauges.update({name: read}))
    with MetadataClient.connect("memory://placement-check", create=True) as client:
        client.init_cluster()
        broken = ledger()  # (a, b, c) then (a, d, c), whose quorum (a, d) is in /r1 only
        client.create_ledger_metadata(broken)
        good = LedgerMetadata(
            **{**_fields(broken), "ledger_id": 6, "ensembles": ((0, ("a", "b", "c")),)}
        )
        client.create_ledger_metadata(good)

        async def check(port) -> int:  # type: ignore[no-untyped-def]
            bk = SimpleNamespace(metadata_port=port, placement=placement)
            auditor = Auditor(bk, UnderReplication(port), metrics=metrics)  # type: ignore[arg-type]
            return await auditor.check_placement()

        assert run_blocking(client, check) == 1
        assert gauges["auditor_NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY"]() == 1.0  # type: ignore[operator]


def _fields(metadata: LedgerMetadata) -> dict[str, object]:
    return {name: getattr(metadata, name) for name in LedgerMetadata.__dataclass_fields__}


def test_a_new_auditor_runs_a_periodic_check_one_interval_after_its_last_run() -> None:
    """Never run: one interval after this auditor's start; run an hour ago with a day's
    interval: 23 hours on; forced (0) or long overdue: at once."""
    import time
    from types import SimpleNamespace

    from bookkeeper_py.autorecovery.auditor import Auditor
    from bookkeeper_py.metadata.underreplication import CHECK_ALL_LEDGERS

    last: dict[str, int | None] = {CHECK_ALL_LEDGERS: None}

    async def check_ctime(check: str) -> int | None:
        return last[check]

    markers = SimpleNamespace(check_ctime=check_ctime)
    auditor = Auditor(SimpleNamespace(), markers)  # type: ignore[arg-type]
    day = 86_400.0

    def first(interval: float) -> float | None:
        return asyncio.run(auditor._first_check(CHECK_ALL_LEDGERS, interval, 1000.0))

    assert first(0) is None  # the check is off
    assert first(day) == 1000.0 + day
    last[CHECK_ALL_LEDGERS] = int((time.time() - 3600) * 1000)
    assert first(day) == pytest.approx(1000.0 + day - 3600, abs=5)
    for forced in (0, int((time.time() - 2 * day) * 1000)):
        last[CHECK_ALL_LEDGERS] = forced
        assert first(day) == 1000.0
