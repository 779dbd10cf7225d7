"""The bookie-level client on its own: requests by bookie id over a fixed endpoint map (no
metadata session, as a Spark executor has), against real bookies."""

from __future__ import annotations

import asyncio

import pytest

from bookkeeper_py import BookKeeper, DigestType, errors
from bookkeeper_py.client.bookie_client import BookieClient
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.wire.digest import DigestManager, master_key
from bookkeeper_py.wire.status import StatusCode

PASSWORD = b"bookie-client"


def test_reads_fences_recovery_adds_and_lac_reads_by_bookie_id() -> None:
    with LocalCluster(1) as cluster, BookKeeper(cluster.metadata_uri) as client:
        handle = client.create_ledger(1, 1, 1, DigestType.CRC32C, PASSWORD)
        for data in (b"zero", b"one"):
            handle.add_entry(data)
        bookie = cluster.bookie_ids[0]
        host, port = bookie.rsplit(":", 1)
        ledger_id, key = handle.ledger_id, master_key(PASSWORD)
        digest = DigestManager(ledger_id, DigestType.CRC32C, PASSWORD)

        async def scenario() -> None:
            bookies = BookieClient.for_endpoints({bookie: (host, int(port))}, use_v3=True)
            try:
                status, body = await bookies.read_entry(bookie, ledger_id, 1)
                assert status == StatusCode.EOK and digest.verify(body, 1).payload == b"one"
                status, _ = await bookies.read_entry(bookie, ledger_id, 7)
                assert status == StatusCode.ENOENTRY
                status, _explicit_lac, last = await bookies.read_lac(bookie, ledger_id)
                assert status == StatusCode.EOK and digest.verify(last, 1).entry_id == 1
                status, body = await bookies.fence(bookie, ledger_id, key)
                assert status == StatusCode.EOK and digest.verify(body, 1).entry_id == 1
                entry = digest.package(2, 1, 11, b"two")
                assert await bookies.recovery_add(bookie, ledger_id, 2, key, entry) == (
                    StatusCode.EOK
                )
                status, body = await bookies.read_entry(bookie, ledger_id, 2)
                assert digest.verify(body, 2).payload == b"two"
                with pytest.raises(errors.IncorrectParameterError):
                    await bookies.read_entry(bookie, ledger_id, 0, fence=True)
                with pytest.raises(errors.BookieHandleNotAvailableError, match="no endpoint"):
                    await bookies.read_entry("unknown:1", ledger_id, 0)
            finally:
                bookies.pool.close()

        asyncio.run(scenario())
        # The fence holds: the writer can add nothing more.
        with pytest.raises(errors.BKError):
            handle.add_entry(b"after the fence")
