"""The asyncio API: the same names as the blocking API in :mod:`bookkeeper_py`, as coroutines."""

from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.client.config import ClientConfig
from bookkeeper_py.client.ledger import LedgerEntry, LedgerHandle, LedgerHandleAdv, ReadHandle
from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.wire.digest import DigestType

__all__ = [
    "BookKeeper",
    "ClientConfig",
    "DigestType",
    "LedgerEntry",
    "LedgerHandle",
    "LedgerHandleAdv",
    "LedgerMetadata",
    "LedgerState",
    "ReadHandle",
]
