"""The asyncio API: the same names as the blocking API in :mod:`bookkeeper`, as coroutines."""

from bookkeeper.client.client import BookKeeper
from bookkeeper.client.config import ClientConfig
from bookkeeper.client.ledger import LedgerEntry, LedgerHandle, LedgerHandleAdv, ReadHandle
from bookkeeper.core.metadata import LedgerMetadata, LedgerState
from bookkeeper.wire.digest import DigestType

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
