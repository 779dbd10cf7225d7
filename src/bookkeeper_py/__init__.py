"""bookkeeper-py: a Python implementation of Apache BookKeeper.

The blocking API lives here (:class:`BookKeeper`); :mod:`bookkeeper_py.aio` has the same names as
coroutines. See ``shared/DESIGN.md`` section 3 for the public contract.
"""

from bookkeeper_py.client.config import ClientConfig
from bookkeeper_py.client.facade import (
    BookKeeper,
    LedgerEntry,
    LedgerHandle,
    LedgerHandleAdv,
    ReadHandle,
)
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
