"""The asyncio client: ``bookkeeper_py.aio.BookKeeper``."""

from __future__ import annotations

import asyncio
import hmac
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bookkeeper_py import errors
from bookkeeper_py.client.bookies import BookieWatcher
from bookkeeper_py.client.config import ClientConfig
from bookkeeper_py.client.connection import BookiePool
from bookkeeper_py.client.ledger import LedgerHandle, LedgerHandleAdv, ReadHandle
from bookkeeper_py.client.recovery import recover
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.core.placement import (
    NetworkTopology,
    PlacementPolicy,
    Quarantine,
    RandomPlacement,
    TopologyAwarePlacement,
)
from bookkeeper_py.core.quorum import check_quorum_sizes
from bookkeeper_py.core.reader import ReplicaHealth
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.wire.digest import DigestType

log = logging.getLogger(__name__)


def placement_policy(config: ClientConfig, rng: random.Random) -> PlacementPolicy:
    """The placement policy ``config.placement`` names."""
    if config.placement == "random":
        return RandomPlacement(rng)
    return TopologyAwarePlacement(
        NetworkTopology(config.network_topology),
        rng,
        min_racks=config.min_racks_per_write_quorum,
        enforce=config.enforce_min_racks_per_write_quorum,
        regions=config.placement == "regionaware",
        local_region=config.local_region,
    )


class BookKeeper:
    """A client of one BookKeeper cluster, named by its metadata service URI."""

    def __init__(self, metadata: MetadataClient, config: ClientConfig | None = None) -> None:
        self.metadata = metadata
        self.config = config = config or ClientConfig()
        self.pool = BookiePool(
            self._resolve,
            use_v3=config.use_v3,
            connect_timeout_s=config.connect_timeout_s,
            request_timeout_s=config.request_timeout_s,
            tls=config.tls,
            auth=config.auth,
        )
        self.bookies = BookieWatcher(metadata)
        self._random = random.Random()
        self.placement = placement_policy(config, self._random)
        self.quarantine = Quarantine()
        self.replica_health = ReplicaHealth(
            config.bookie_failure_history_ms, config.read_reorder_threshold_pending
        )
        self.speculative_reads = 0  # reads sent to a second replica because one was slow
        self._closed = False

    @classmethod
    async def connect(
        cls, metadata_uri: str, config: ClientConfig | None = None, **options: Any
    ) -> BookKeeper:
        """Connects to the metadata store; raises ``MetadataUnavailableError`` within
        ``metadata_timeout_s``. ``options`` are ``ClientConfig`` fields (over ``config``): with
        ``tls``, every bookie connection is upgraded to TLS (and the bookie's certificate
        checked); with ``auth``, authenticated with that plugin; see ``ClientConfig``."""
        config = replace(config, **options) if config and options else config
        config = config or ClientConfig.of(options)
        metadata = await asyncio.to_thread(
            MetadataClient.connect, metadata_uri, connect_timeout_s=config.metadata_timeout_s
        )
        return cls(metadata, config)

    @staticmethod
    def now_ms() -> int:
        """The clock of every timing decision (quarantine, replica health, speculative reads):
        CLOCK_MONOTONIC in ms. (Not uvloop's ``loop.time()``: called per add and per answer,
        it cost a third of the client's time in ``bookkeeper bench writes``.)"""
        return int(time.monotonic() * 1000)

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
        deferred_sync: bool = False,
    ) -> LedgerHandle:
        """Creates a ledger on an ensemble chosen by the placement policy and returns its
        writer. ``deferred_sync`` (BookKeeper's WriteFlag.DEFERRED_SYNC): adds are acknowledged
        before the bookies' journal sync, and ``force()`` makes them durable and confirmed."""
        metadata = await self._create(
            ensemble_size,
            write_quorum_size,
            ack_quorum_size,
            digest_type,
            password,
            custom_metadata,
            None,
        )
        return LedgerHandle(self, metadata, bytes(password), deferred_sync)

    async def create_ledger_adv(
        self,
        ensemble_size: int = 3,
        write_quorum_size: int = 2,
        ack_quorum_size: int = 2,
        digest_type: DigestType = DigestType.CRC32C,
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        deferred_sync: bool = False,
        ledger_id: int | None = None,
    ) -> LedgerHandleAdv:
        """As ``create_ledger``, for a writer that chooses its entry ids (``add_entry(entry_id,
        data)``); ``ledger_id`` picks the ledger's id too (``LedgerExistsError`` if taken)."""
        if ledger_id is not None and ledger_id < 0:
            raise errors.IncorrectParameterError(f"ledger ids are not negative: {ledger_id}")
        metadata = await self._create(
            ensemble_size,
            write_quorum_size,
            ack_quorum_size,
            digest_type,
            password,
            custom_metadata,
            ledger_id,
        )
        return LedgerHandleAdv(self, metadata, bytes(password), deferred_sync)

    async def _create(
        self,
        ensemble_size: int,
        write_quorum_size: int,
        ack_quorum_size: int,
        digest_type: DigestType,
        password: bytes,
        custom_metadata: Mapping[str, bytes] | None,
        ledger_id: int | None,
    ) -> LedgerMetadata:
        self._check_open()
        check_quorum_sizes(ensemble_size, write_quorum_size, ack_quorum_size)
        bookies = await asyncio.to_thread(self.bookies.writable)
        if len(bookies) < ensemble_size:
            raise errors.NotEnoughBookiesError(
                f"need {ensemble_size} writable bookies for the ensemble, {len(bookies)} registered: {bookies}"
            )
        ensemble = self.placement.new_ensemble(
            ensemble_size, bookies, self.quarantine.quarantined(self.now_ms()), write_quorum_size
        )
        if ledger_id is None:
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
        return metadata

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
