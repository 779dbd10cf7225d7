"""bookkeeper-py: a Python implementation of Apache BookKeeper.

The blocking API lives here (:class:`BookKeeper`); :mod:`bookkeeper_py.aio` has the same names as
coroutines. See ``shared/DESIGN.md`` section 3 for the public contract.

The names below are loaded on first use (PEP 562), so that importing a low layer
(``bookkeeper_py.wire.v2``, ``bookkeeper_py.core.writer``) does not import the client, asyncio,
ssl or the metadata drivers along with this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# public name -> the module that defines it
_EXPORTS = {
    "BookKeeper": "bookkeeper_py.client.facade",
    "ClientConfig": "bookkeeper_py.client.config",
    "DigestType": "bookkeeper_py.wire.digest",
    "LedgerEntry": "bookkeeper_py.client.facade",
    "LedgerHandle": "bookkeeper_py.client.facade",
    "LedgerHandleAdv": "bookkeeper_py.client.facade",
    "LedgerMetadata": "bookkeeper_py.core.metadata",
    "LedgerState": "bookkeeper_py.core.metadata",
    "ReadHandle": "bookkeeper_py.client.facade",
}

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bookkeeper_py' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
