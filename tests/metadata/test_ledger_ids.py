"""Ledger ids: the 31-bit sequence, its overflow, and the 63-bit ids of ``idgen-long`` that follow
(reference section 1.8), on every driver."""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor

import pytest

from bookkeeper_py.errors import LedgerIdOverflowError
from bookkeeper_py.metadata import memory
from bookkeeper_py.metadata.driver import parse_uri, sequence_suffix
from bookkeeper_py.metadata.layout import ledger_path
from bookkeeper_py.metadata.manager import MetadataClient

from .samples import sample

HOB_1 = 1 << 32


def set_sequence(uri: str, path: str, counter: int) -> None:
    """Moves the sequence of ``path``'s children to ``counter``: the state a store reaches after
    ``counter`` sequential creates, which no test could make one by one."""
    address = parse_uri(uri)
    if address.scheme == "memory":
        memory._tree(address.location).nodes[path].child_counter = counter
        return
    with sqlite3.connect(address.location) as db:
        changed = db.execute(
            "UPDATE nodes SET child_counter = ? WHERE path = ?", (counter, path)
        ).rowcount
    assert changed == 1


def test_sequence_names_wrap_as_zookeepers_signed_counter() -> None:
    assert sequence_suffix(0) == "0000000000"
    assert sequence_suffix(2**31 - 1) == "2147483647"
    assert sequence_suffix(2**31) == "-2147483648"
    assert sequence_suffix(2**32 + 5) == "0000000005"


@pytest.fixture(params=["memory", "sqlite"])
def settable_uri(request: pytest.FixtureRequest, tmp_path: object) -> str:
    """Stores whose sequence counters a test can move (ZooKeeper's is the parent's cversion)."""
    if request.param == "memory":
        return f"memory://ids-{id(request)}"
    return f"sqlite:///{tmp_path}/metadata.db"


def test_hierarchical_ids_go_on_in_63_bits_when_the_31_bit_sequence_is_used_up(
    settable_uri: str,
) -> None:
    with MetadataClient.connect(settable_uri, create=True) as client:
        client.init_cluster()
        assert client.generate_ledger_id() == 0
        set_sequence(settable_uri, "/ledgers/idgen", 2**31 - 3)
        ids = [client.generate_ledger_id() for _ in range(4)]
        # 2^31-1 is Integer.MAX_VALUE, not a short id: BookKeeper switches there.
        assert ids == [2**31 - 3, 2**31 - 2, HOB_1 | 0, HOB_1 | 1]
        assert client.store.children("/ledgers/idgen-long") == ["HOB-0000000001"]
        # From now on every client uses long ids, even where the short sequence would not
        # overflow.
        set_sequence(settable_uri, "/ledgers/idgen", 10)
        with MetadataClient.connect(settable_uri) as other:
            assert other.generate_ledger_id() == HOB_1 | 2
        # A full low sequence moves on to the next high bits.
        set_sequence(settable_uri, "/ledgers/idgen-long/HOB-0000000001", 2**31 - 1)
        assert client.generate_ledger_id() == 2 << 32
        assert client.store.children("/ledgers/idgen-long") == ["HOB-0000000001", "HOB-0000000002"]
        for ledger_id in (*ids, 2 << 32):
            client.create_ledger_metadata(sample(ledger_id))
        assert list(client.list_ledgers()) == [*ids, 2 << 32]
        assert client.store.exists("/ledgers/000/0000/0085/8993/L4592") is not None
        assert (
            ledger_path("/ledgers", "hierarchical", 2 << 32) == "/ledgers/000/0000/0085/8993/L4592"
        )


def test_a_flat_layout_refuses_to_overflow(settable_uri: str) -> None:
    uri = settable_uri.replace("memory://", "memory+flat://").replace("sqlite://", "sqlite+flat://")
    with MetadataClient.connect(uri, create=True) as client:
        client.init_cluster()
        client.generate_ledger_id()
        set_sequence(uri, "/ledgers", 2**31 - 2)  # flat: the counter of the root, as Java's
        assert client.generate_ledger_id() == 2**31 - 2
        with pytest.raises(LedgerIdOverflowError, match="hierarchical layout"):
            client.generate_ledger_id()
        assert client.store.exists("/ledgers/idgen-long") is None


def test_long_ids_are_unique_across_clients(uri: str) -> None:
    """Once ``idgen-long`` exists (as left by an overflow), concurrent clients share it."""
    with MetadataClient.connect(uri, create=True) as setup:
        setup.init_cluster()
        setup.store.create(f"{setup.root}/idgen-long")
        clients = [MetadataClient.connect(uri) for _ in range(4)]
        try:
            with ThreadPoolExecutor(len(clients)) as pool:
                chunks = list(
                    pool.map(lambda c: [c.generate_ledger_id() for _ in range(25)], clients)
                )
        finally:
            for client in clients:
                client.close()
        ids = sorted(i for chunk in chunks for i in chunk)
        assert ids == [HOB_1 | low for low in range(100)]
        assert setup.store.children(f"{setup.root}/idgen-long") == ["HOB-0000000001"]
        assert setup.store.children(f"{setup.root}/idgen-long/HOB-0000000001") == []
