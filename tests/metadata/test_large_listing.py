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
