"""Listing 100,000 ledgers on every driver, with memory bounded by a page, not by the count."""

from __future__ import annotations

import tracemalloc

import pytest

from bookkeeper_py.metadata import format as metadata_format
from bookkeeper_py.metadata.driver import CreateOp
from bookkeeper_py.metadata.layout import ledger_path
from bookkeeper_py.metadata.manager import MetadataClient

from .samples import sample

COUNT = 100_000
BATCH = 1_000


@pytest.mark.slow
def test_listing_a_hundred_thousand_ledgers(uri: str) -> None:
    client = MetadataClient.connect(uri, create=True)
    try:
        client.init_cluster()
        body = metadata_format.serialize(sample(0))
        for start in range(0, COUNT, BATCH):
            paths = [
                ledger_path(client.root, client.layout, i) for i in range(start, start + BATCH)
            ]
            directory = paths[0].rsplit("/", 1)[0]  # a batch stays in one directory
            if client.store.exists(directory) is None:
                client.store.create(directory)  # with its parents
            client.store.multi([CreateOp(path, body) for path in paths])
        tracemalloc.start()
        try:
            count, previous = 0, -1
            for ledger_id in client.list_ledgers():
                assert ledger_id == previous + 1
                previous = ledger_id
                count += 1
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert count == COUNT
        # At most a directory of names (ZooKeeper: 10,000, about 0.8 MB; SQLite and memory: a
        # page), never the 100,000 ids (3.6 MB as a list of ints).
        assert peak < 2 * 1024 * 1024, f"listing peaked at {peak / 1e6:.1f} MB"
    finally:
        client.close()


def test_listing_after_an_id_reads_only_the_directories_above_it(
    uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``list_ledgers(after)``: the ids above ``after`` in order, on every layout (ZooKeeper
    takes the three, each under a root of its own; the embedded stores the hierarchical one),
    both id widths of the hierarchical one; the directories whose ids are all below it not
    listed."""
    scheme, _, rest = uri.partition("://")
    if not scheme.startswith("zk"):
        _check_listing_after(uri, "hierarchical", monkeypatch)
        return
    parent, _, root = rest.rpartition("/")
    for layout in ("hierarchical", "longhierarchical", "flat"):
        _check_listing_after(f"zk+{layout}://{parent}/{layout}-{root}", layout, monkeypatch)


def _check_listing_after(uri: str, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = MetadataClient.connect(uri, create=True)
    try:
        client.init_cluster()
        ids = [1, 2, 10_000, 10_001, 123_456_789, 9_999_999_999, 10**10, 10**10 + 7, 2**62]
        if layout == "flat":
            ids = [i for i in ids if i < 10**10]
        for ledger_id in ids:
            client.create_ledger_metadata(sample(ledger_id))
        listed: list[str] = []
        listing = client.store.iter_children

        def counted(path: str, page_size: int = 1000):  # type: ignore[no-untyped-def]
            listed.append(path)
            return listing(path, page_size)

        monkeypatch.setattr(client.store, "iter_children", counted)
        assert list(client.list_ledgers()) == ids
        everything = len(listed)
        for after in (-1, 0, 1, 2, 9_999, 10_000, 123_456_788, 9_999_999_999, 10**10, 2**62):
            assert list(client.list_ledgers(after)) == [i for i in ids if i > after], after
        listed.clear()
        assert list(client.list_ledgers(10_001)) == [i for i in ids if i > 10_001]
        if layout != "flat":
            assert len(listed) < everything  # the directories of 1 to 10,001 were not read
    finally:
        client.close()
