"""The asyncio client: ``bookkeeper.aio.BookKeeper``."""

from __future__ import annotations

import asyncio
import hmac
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import replace

from bookkeeper import errors
from bookkeeper.auth import ClientAuthProvider
from bookkeeper.client.bookies import BookieWatcher
from bookkeeper.client.connection import BookiePool
from bookkeeper.client.ledger import LedgerHandle, ReadHandle
from bookkeeper.client.recovery import recover
from bookkeeper.core.metadata import LedgerMetadata
from bookkeeper.core.placement import Quarantine, RandomPlacement
from bookkeeper.core.quorum import check_quorum_sizes
from bookkeeper.metadata.manager import MetadataClient
from bookkeeper.tls import TlsConfig
from bookkeeper.wire.digest import DigestType

log = logging.getLogger(__name__)


class BookKeeper:
    """A client of one BookKeeper cluster, named by its metadata service URI."""

    def __init__(
        self,
        metadata: MetadataClient,
        *,
        use_v3: bool = False,
        request_timeout_s: float = 5.0,
        connect_timeout_s: float = 5.0,
        throttle: int = 5000,
        tls: TlsConfig | None = None,
        auth: ClientAuthProvider | None = None,
        delay_ensemble_change: bool = False,
        explicit_lac_interval_s: float = 0.0,
    ) -> None:
        self.metadata = metadata
        self.throttle = throttle  # adds in flight per ledger handle (BookKeeper's "throttle")
        # BookKeeper's delayEnsembleChange: replace a failed bookie only once an entry cannot
        # reach Qa without it; explicitLacInterval: an idle writer writes its LAC (0: never).
        self.delay_ensemble_change = delay_ensemble_change
        self.explicit_lac_interval_s = explicit_lac_interval_s
        self.pool = BookiePool(
            self._resolve,
            use_v3=use_v3,
            connect_timeout_s=connect_timeout_s,
            request_timeout_s=request_timeout_s,
            tls=tls,
            auth=auth,
        )
        self.bookies = BookieWatcher(metadata)
        self._random = random.Random()
        self.placement = RandomPlacement(self._random)
        self.quarantine = Quarantine()
        self._closed = False

    @classmethod
    async def connect(
        cls,
        metadata_uri: str,
        *,
        use_v3: bool = False,
        metadata_timeout_s: float = 10.0,
        request_timeout_s: float = 5.0,
        throttle: int = 5000,
        tls: TlsConfig | None = None,
        auth: ClientAuthProvider | None = None,
        delay_ensemble_change: bool = False,
        explicit_lac_interval_s: float = 0.0,
    ) -> BookKeeper:
        """Connects to the metadata store; raises ``MetadataUnavailableError`` within
        ``metadata_timeout_s``. With ``tls``, every bookie connection is upgraded to TLS (and
        the bookie's certificate checked); with ``auth``, authenticated with that plugin."""
        metadata = await asyncio.to_thread(
            MetadataClient.connect, metadata_uri, connect_timeout_s=metadata_timeout_s
        )
        return cls(
            metadata,
            use_v3=use_v3,
            request_timeout_s=request_timeout_s,
            throttle=throttle,
            tls=tls,
            auth=auth,
            delay_ensemble_change=delay_ensemble_change,
            explicit_lac_interval_s=explicit_lac_interval_s,
        )

    def _resolve(self, bookie_id: str) -> tuple[str, int]:
        endpoint = self.metadata.bookie_endpoint(bookie_id)
        return endpoint.host, endpoint.port

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ClientClosedError("this BookKeeper client is closed")

    async def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum_size: int = 2,
        ack_quorum_size: int = 2,
        digest_type: DigestType = DigestType.CRC32C,
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
    ) -> LedgerHandle:
        """Creates a ledger on a random ensemble of writable bookies and returns its writer."""
        self._check_open()
        check_quorum_sizes(ensemble_size, write_quorum_size, ack_quorum_size)
        bookies = await asyncio.to_thread(self.bookies.writable)
        if len(bookies) < ensemble_size:
            raise errors.NotEnoughBookiesError(
                f"need {ensemble_size} writable bookies for the ensemble, {len(bookies)} registered: {bookies}"
            )
        ensemble = self.placement.new_ensemble(
            ensemble_size, bookies, self.quarantine.quarantined(int(time.monotonic() * 1000))
        )
        ledger_id = await asyncio.to_thread(self.metadata.generate_ledger_id)
        metadata = LedgerMetadata(
            ledger_id=ledger_id,
            ensemble_size=ensemble_size,
            write_quorum_size=write_quorum_size,
            ack_quorum_size=ack_quorum_size,
            digest_type=DigestType(digest_type),
            password=bytes(password),
            ensembles=((0, ensemble),),
            ctime_ms=int(time.time() * 1000),
            custom_metadata=dict(custom_metadata or {}),
            c_token=self._random.getrandbits(63),
        )
        await asyncio.to_thread(self.metadata.create_ledger_metadata, metadata)
        log.debug("created ledger %d on %s", ledger_id, ensemble)
        return LedgerHandle(self, metadata, bytes(password))

    async def _open(
        self, ledger_id: int, password: bytes, digest_type: DigestType | None
    ) -> LedgerMetadata:
        self._check_open()
        metadata, _ = await asyncio.to_thread(self.metadata.read_ledger_metadata, ledger_id)
        if not metadata.stores_password:
            # Legacy metadata (format v1) keeps neither: the opener's are used, and the bookies
            # check the password when fencing.
            return replace(
                metadata,
                password=bytes(password),
                digest_type=DigestType(digest_type or DigestType.CRC32),
            )
        if not hmac.compare_digest(metadata.password, bytes(password)):
            raise errors.UnauthorizedAccessError(
                f"wrong password for ledger {ledger_id}: open it with the password it was "
                "created with"
            )
        return metadata

    async def open_ledger(
        self, ledger_id: int, password: bytes = b"", digest_type: DigestType | None = None
    ) -> ReadHandle:
        """Opens a ledger for reading; if it is not closed, fences it and recovers it first.

        The digest type stored in the metadata is used (BookKeeper's digest autodetection);
        ``digest_type`` (default CRC32) only for legacy ledgers whose metadata stores none.
        """
        metadata = await self._open(ledger_id, password, digest_type)
        handle = ReadHandle(self, metadata, bytes(password))
        if not metadata.is_closed:
            await recover(handle)
        return handle

    async def open_ledger_no_recovery(
        self, ledger_id: int, password: bytes = b"", digest_type: DigestType | None = None
    ) -> ReadHandle:
        """Opens a ledger for reading without fencing it: a live writer keeps writing."""
        metadata = await self._open(ledger_id, password, digest_type)
        return ReadHandle(self, metadata, bytes(password))

    async def delete_ledger(self, ledger_id: int) -> None:
        """Deletes the ledger's metadata; bookies reclaim the data in their garbage collection."""
        self._check_open()
        await asyncio.to_thread(self.metadata.delete_ledger_metadata, ledger_id)

    async def list_ledgers(self) -> list[int]:
        self._check_open()
        return await asyncio.to_thread(lambda: list(self.metadata.list_ledgers()))

    async def get_ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        self._check_open()
        metadata, _ = await asyncio.to_thread(self.metadata.read_ledger_metadata, ledger_id)
        return metadata

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.bookies.close()
        self.pool.close()
        await asyncio.to_thread(self.metadata.close)
