"""Ledger metadata for the metadata tests."""

from __future__ import annotations

from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.wire.digest import DigestType


def sample(ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum_size=2,
        ack_quorum_size=2,
        digest_type=DigestType.CRC32,
        password=b"secret",
        ensembles=((0, ("h:1", "h:2", "h:3")),),
    )
