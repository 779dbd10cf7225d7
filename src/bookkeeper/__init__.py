"""pybookkeeper: a Python implementation of Apache BookKeeper.

The blocking API lives here (:class:`BookKeeper`); :mod:`bookkeeper.aio` has the same names as
coroutines. See ``shared/DESIGN.md`` section 3 for the public contract.
"""

from bookkeeper.client.config import ClientConfig
from bookkeeper.client.facade import (
    BookKeeper,
    LedgerEntry,
    LedgerHandle,
    LedgerHandleAdv,
    ReadHandle,
)
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
