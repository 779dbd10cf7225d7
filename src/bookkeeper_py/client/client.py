"""The asyncio client: ``bookkeeper_py.aio.BookKeeper``."""

from __future__ import annotations

import asyncio
import hmac
import logging
import random
import time
from collections.abc import Generator, Mapping
from dataclasses import replace
from typing import Any

from bookkeeper_py import errors
from bookkeeper_py.client.bookie_client import BookieClient
from bookkeeper_py.client.client_metrics import ClientMetrics, timed
from bookkeeper_py.client.clock import Clock, MonotonicClock
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
from bookkeeper_py.metadata.bookie_watcher import BookieWatcher
from bookkeeper_py.metadata.driver import parse_uri
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.metadata.port import MetadataPort, ThreadedMetadata
from bookkeeper_py.wire.digest import DigestType

log = logging.getLogger(__name__)

MAX_ID_COLLISIONS = 100  # generated ledger ids found taken before giving up


def password_bytes(password: str | bytes | bytearray | memoryview) -> bytes:
    """A ledger password as the bookies see it: ``bytes`` as given, ``str`` encoded UTF-8 (as
    Java's client takes ``"pw".getBytes(UTF_8)``)."""
    if isinstance(password, str):
        return password.encode()
    if isinstance(password, bytes | bytearray | memoryview):
        return bytes(password)
    raise errors.IncorrectParameterError(
        f"a ledger password is str or bytes, got {type(password).__name__}"
    )


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
    """A client of one BookKeeper cluster, named by its metadata service URI.

    Opens the way asyncio clients do (redis-py's ``redis.asyncio``, aiokafka, asyncpg)::

        async with BookKeeper("zk+hierarchical://127.0.0.1:2181/ledgers") as bk:
            ...
        bk = await BookKeeper.connect(uri)  # or: bk = await BookKeeper(uri)
        ...
        await bk.close()

    A client made with ``BookKeeper(uri)`` and not awaited connects on its first operation.
    ``options`` are ``ClientConfig`` fields (over ``config``): with ``tls``, every bookie
    connection is upgraded to TLS (and the bookie's certificate checked); with ``auth``,
    authenticated with that plugin. A malformed URI raises ``ValueError`` at once, naming the
    accepted schemes; an unreachable store raises ``MetadataUnavailableError`` within
    ``metadata_timeout_s`` of connecting.
    """

    def __init__(
        self,
        metadata: str | MetadataClient | MetadataPort,
        config: ClientConfig | None = None,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        **options: Any,
    ) -> None:
        config = replace(config, **options) if config and options else config
        self.config = config = config or ClientConfig.of(options)
        self.clock = clock or MonotonicClock()
        self._port: MetadataPort | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._uri = ""
        if isinstance(metadata, str):
            parse_uri(metadata)  # a malformed URI fails here, not at the first operation
            self._uri = metadata
        elif isinstance(metadata, MetadataClient):
            self._port = ThreadedMetadata(metadata)
        elif isinstance(metadata, MetadataPort):
            self._port = metadata
        else:
            raise errors.IncorrectParameterError(
                "a metadata service URI (str), a MetadataClient or a MetadataPort is needed, got "
                f"{type(metadata).__name__}"
            )
        self.stats = ClientMetrics(self, config.metrics) if config.metrics is not None else None
        self.pool = BookiePool(
            self._resolve,
            use_v3=config.use_v3,
            connect_timeout_s=config.connect_timeout_s,
            request_timeout_s=config.request_timeout_s,
            tls=config.tls,
            auth=config.auth,
            clock=self.clock,
            channel_stats=(
                self.stats.channel if self.stats is not None and config.per_bookie_metrics else None
            ),
        )
        self.bookie_client = BookieClient(self.pool)
        self._random = rng or random.Random()
        self.placement = placement_policy(config, self._random)
        # Rack- and region-aware placement without a mapping of its own reads the racks the
        # metadata store keeps (``metadata.racks``), once connected.
        # (RandomPlacement is the topology-aware policy without a topology: it reads nothing.)
        self._racks_to_load = config.placement != "random" and not config.network_topology
        self._racks_loading: asyncio.Future[None] | None = None
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
        """A connected client: ``BookKeeper(metadata_uri, config, **options)``, awaited."""
        return await cls(metadata_uri, config, **options)

    async def _ready(self) -> None:
        """Connects to the metadata store once (concurrent callers wait for the same attempt;
        after a failed attempt the next call tries again); raises if the client is closed."""
        self._check_open()
        if self._port is not None:
            if self._racks_to_load:
                await self._racks_loaded()
            return
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._port is None:
                self._connecting = None
        self._check_open()
        if self._racks_to_load:
            await self._racks_loaded()

    async def _racks_loaded(self) -> None:
        """Waits for the one reading of the racks node (concurrent callers share it)."""
        if self._racks_loading is None:
            self._racks_loading = asyncio.ensure_future(self._load_racks())
        await asyncio.shield(self._racks_loading)

    async def _load_racks(self) -> None:
        """The racks node's placements into the placement policy's topology (once; a node that
        cannot be read or is malformed is logged and the bookies stay in the default rack)."""
        from bookkeeper_py.metadata import racks

        assert self._port is not None and isinstance(self.placement, TopologyAwarePlacement)
        try:
            found = await racks.read_placements(self._port)
        except Exception as error:  # a malformed node, or the store failing: placement goes on
            log.warning(
                "the bookies' racks could not be read (%s); placing as if in one rack", error
            )
            self._racks_to_load = False
            return
        locations: dict[str, str] = {}
        for bookie_id, place in found.items():
            try:
                racks.check_rack(place.rack)
            except ValueError as error:
                log.warning("the racks node places bookie %s badly: %s; ignored", bookie_id, error)
                continue
            locations[bookie_id] = place.rack
        self.placement.topology = NetworkTopology(locations)
        self._racks_to_load = False

    async def _connect(self) -> None:
        port = await ThreadedMetadata.connect(
            self._uri,
            connect_timeout_s=self.config.metadata_timeout_s,
            operation_timeout_s=self.config.metadata_timeout_s,
            session_timeout_s=self.config.metadata_session_timeout_s,
        )
        if self._closed:  # closed while connecting
            await port.close()
            return
        self._port = port

    def __await__(self) -> Generator[Any, None, BookKeeper]:
        yield from self._ready().__await__()
        return self

    async def __aenter__(self) -> BookKeeper:
        return await self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def metadata_uri(self) -> str:
        """The metadata service URI this client was made with ("" when made from a port)."""
        return self._uri

    @property
    def metadata_port(self) -> MetadataPort:
        """The metadata store as coroutines (``metadata.port.MetadataPort``): what the handles,
        recovery and writers use (every operation of this client connects first)."""
        self._check_open()
        if self._port is None:
            raise errors.ClientClosedError(
                "this BookKeeper client is not connected yet: use `async with BookKeeper(uri) "
                "as bk`, `bk = await BookKeeper.connect(uri)`, or any of its operations"
            )
        return self._port

    @property
    def metadata(self) -> MetadataClient:
        """The blocking metadata client under the port, for a client made from a URI or a
        ``MetadataClient`` (read it off the loop)."""
        port = self.metadata_port
        if not isinstance(port, ThreadedMetadata):
            raise errors.IncorrectParameterError(
                f"this client's metadata port is a {type(port).__name__}, not a MetadataClient"
            )
        return port.client

    @property
    def bookies(self) -> BookieWatcher:
        """The registered bookies, kept current by watches (blocking; read it off the loop, or
        use ``metadata_port.writable_bookies()``)."""
        port = self.metadata_port
        if not isinstance(port, ThreadedMetadata):
            raise errors.IncorrectParameterError("no bookie watcher on a simulated metadata port")
        return port.bookies

    def now_ms(self) -> int:
        """The clock of every timing decision (quarantine, replica health, speculative reads),
        in ms: the client's ``Clock`` (``client.clock``)."""
        return int(self.clock.now() * 1000)

    async def _resolve(self, bookie_id: str) -> tuple[str, int]:
        endpoint = await self.metadata_port.bookie_endpoint(bookie_id)
        return endpoint.host, endpoint.port

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ClientClosedError(
                "this BookKeeper client is closed: make a new one to go on"
            )

    async def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum_size: int = 2,
        ack_quorum_size: int = 2,
        digest_type: DigestType = DigestType.CRC32C,
        password: str | bytes = b"",
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
        return LedgerHandle(self, metadata, metadata.password, deferred_sync)

    async def create_ledger_adv(
        self,
        ensemble_size: int = 3,
        write_quorum_size: int = 2,
        ack_quorum_size: int = 2,
        digest_type: DigestType = DigestType.CRC32C,
        password: str | bytes = b"",
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
        return LedgerHandleAdv(self, metadata, metadata.password, deferred_sync)

    async def _create(
        self,
        ensemble_size: int,
        write_quorum_size: int,
        ack_quorum_size: int,
        digest_type: DigestType,
        password: str | bytes,
        custom_metadata: Mapping[str, bytes] | None,
        ledger_id: int | None,
    ) -> LedgerMetadata:
        async with timed(self.stats.create if self.stats else None):
            password = password_bytes(password)
            await self._ready()
            check_quorum_sizes(ensemble_size, write_quorum_size, ack_quorum_size)
            bookies = await self.metadata_port.writable_bookies()
            if len(bookies) < ensemble_size:
                raise errors.NotEnoughBookiesError(
                    f"need {ensemble_size} writable bookies for the ensemble, {len(bookies)} registered: {bookies}"
                )
            ensemble = self.placement.new_ensemble(
                ensemble_size,
                bookies,
                self.quarantine.quarantined(self.now_ms()),
                write_quorum_size,
            )
            chosen = ledger_id is not None
            for _ in range(MAX_ID_COLLISIONS):
                if not chosen:
                    ledger_id = await self.metadata_port.generate_ledger_id()
                assert ledger_id is not None
                metadata = self._new_metadata(
                    ledger_id,
                    ensemble,
                    (ensemble_size, write_quorum_size, ack_quorum_size),
                    digest_type,
                    password,
                    custom_metadata,
                )
                try:
                    await self.metadata_port.create_ledger_metadata(metadata)
                except errors.LedgerExistsError:
                    # Another kind of client allocates ids from another counter (Java's flat layout
                    # counts under <root>/ID-, ours did under <root>/idgen/ID-): take the next id, as
                    # BookKeeper's LedgerCreateOp does. An id the caller chose is the caller's error.
                    if chosen:
                        raise
                    log.info("ledger id %d is taken already; generating another", ledger_id)
                    continue
                log.debug("created ledger %d on %s", ledger_id, ensemble)
                return metadata
            raise errors.LedgerExistsError(
                f"{MAX_ID_COLLISIONS} generated ledger ids in a row were taken already; the id "
                "generator of this metadata store is not the one its ledgers were made with"
            )

    def _new_metadata(
        self,
        ledger_id: int,
        ensemble: tuple[str, ...],
        quorums: tuple[int, int, int],
        digest_type: DigestType,
        password: bytes,
        custom_metadata: Mapping[str, bytes] | None,
    ) -> LedgerMetadata:
        ensemble_size, write_quorum_size, ack_quorum_size = quorums
        return LedgerMetadata(
            ledger_id=ledger_id,
            ensemble_size=ensemble_size,
            write_quorum_size=write_quorum_size,
            ack_quorum_size=ack_quorum_size,
            digest_type=DigestType(digest_type),
            password=password,
            ensembles=((0, ensemble),),
            ctime_ms=int(time.time() * 1000),
            custom_metadata=dict(custom_metadata or {}),
            c_token=self._random.getrandbits(63),
        )

    async def _open(
        self, ledger_id: int, password: str | bytes, digest_type: DigestType | None
    ) -> LedgerMetadata:
        password = password_bytes(password)
        await self._ready()
        metadata, _ = await self.metadata_port.read_ledger_metadata(ledger_id)
        if not metadata.stores_password:
            # Legacy metadata (format v1) keeps neither: the opener's are used, and the bookies
            # check the password when fencing.
            return replace(
                metadata,
                password=password,
                digest_type=DigestType(digest_type or DigestType.CRC32),
            )
        if not hmac.compare_digest(metadata.password, password):
            raise errors.UnauthorizedAccessError(
                f"wrong password for ledger {ledger_id}: open it with the password it was "
                "created with"
            )
        return metadata

    async def open_ledger(
        self, ledger_id: int, password: str | bytes = b"", digest_type: DigestType | None = None
    ) -> ReadHandle:
        """Opens a ledger for reading; if it is not closed, fences it and recovers it first.

        The digest type stored in the metadata is used (BookKeeper's digest autodetection);
        ``digest_type`` (default CRC32) only for legacy ledgers whose metadata stores none.
        """
        async with timed(self.stats.open if self.stats else None):
            metadata = await self._open(ledger_id, password, digest_type)
            handle = ReadHandle(self, metadata, metadata.password)
            if not metadata.is_closed:
                async with timed(self.stats.recover if self.stats else None):
                    await recover(handle)
        return handle

    async def open_ledger_no_recovery(
        self, ledger_id: int, password: str | bytes = b"", digest_type: DigestType | None = None
    ) -> ReadHandle:
        """Opens a ledger for reading without fencing it: a live writer keeps writing. An open
        ledger's LAC is read from the bookies of its last ensemble first, as BookKeeper's
        ``openLedgerNoRecovery`` does (it used to start at -1 until ``read_last_add_confirmed``);
        ``ReadError`` when they cannot tell it."""
        async with timed(self.stats.open if self.stats else None):
            metadata = await self._open(ledger_id, password, digest_type)
            handle = ReadHandle(self, metadata, metadata.password)
            if not metadata.is_closed:
                await handle.read_last_add_confirmed()
        return handle

    async def delete_ledger(self, ledger_id: int) -> None:
        """Deletes the ledger's metadata; bookies reclaim the data in their garbage collection."""
        await self._ready()
        async with timed(self.stats.delete if self.stats else None):
            await self.metadata_port.delete_ledger_metadata(ledger_id)

    async def list_ledgers(self) -> list[int]:
        await self._ready()
        return await self.metadata_port.list_ledgers()

    async def get_ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        await self._ready()
        metadata, _ = await self.metadata_port.read_ledger_metadata(ledger_id)
        return metadata

    async def close(self) -> None:
        """Closes the bookie connections and the metadata session. Handles of this client fail
        their next operation; close writers first (see ``LedgerHandle.close``)."""
        if self._closed:
            return
        self._closed = True
        self.pool.close()
        if self._port is not None:
            await self._port.close()
