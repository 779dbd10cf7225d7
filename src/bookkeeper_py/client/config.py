"""The client's settings, one object for the asyncio client and the blocking facade.

Named after BookKeeper's client configuration keys where there is one (in brackets below); both
``bookkeeper_py.BookKeeper(uri, **options)`` and ``bookkeeper_py.aio.BookKeeper.connect(uri,
**options)`` take these fields as keyword arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from bookkeeper_py import errors
from bookkeeper_py.auth import ClientAuthProvider
from bookkeeper_py.metrics import Metrics
from bookkeeper_py.tls import TlsConfig

PLACEMENT_POLICIES = ("random", "rackaware", "regionaware")


@dataclass(frozen=True)
class ClientConfig:
    # Connections
    use_v3: bool = False  # protocol v3 for adds and reads (long polls always use v3)
    metadata_timeout_s: float = 10.0  # connecting, and each request (ZooKeeper may be away)
    # the metadata session's timeout (the SQLite lease); None: the store's default [zkTimeout]
    metadata_session_timeout_s: float | None = None
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 5.0  # [readTimeout / addEntryTimeout]
    tls: TlsConfig | None = None
    auth: ClientAuthProvider | None = None
    # Writes
    throttle: int = 5000  # adds in flight per ledger handle [throttle]
    delay_ensemble_change: bool = False  # [delayEnsembleChange]
    explicit_lac_interval_s: float = (
        0.0  # an idle writer writes its LAC (0: never) [explicitLacInterval]
    )
    # Reads
    speculative_read_timeout_ms: int = 2000  # 0: off [speculativeReadTimeout]
    max_speculative_read_timeout_ms: int = 2000  # [maxSpeculativeReadTimeout]
    # a long poll unanswered this long is also sent to the next replica, doubling to the max
    speculative_read_lac_timeout_ms: int = 1500  # 0: off [firstSpeculativeReadLACTimeout]
    max_speculative_read_lac_timeout_ms: int = 5000  # [maxSpeculativeReadLACTimeout]
    reorder_read_sequence: bool = True  # [reorderReadSequenceEnabled]
    bookie_failure_history_ms: int = 60_000  # [bookieFailureHistoryExpirationMSec]
    read_reorder_threshold_pending: int = 0  # [readReorderThresholdPendingRequests]
    # Placement [ensemblePlacementPolicy]
    placement: str = "random"  # random | rackaware | regionaware
    # bookie id -> "/rack" or "/region/rack"; unknown bookies are in /default-region/default-rack
    network_topology: Mapping[str, str] = field(default_factory=dict)
    min_racks_per_write_quorum: int = 2  # [minNumRacksPerWriteQuorum]
    enforce_min_racks_per_write_quorum: bool = False  # [enforceMinNumRacksPerWriteQuorum]
    local_region: str = ""  # regionaware: reads prefer this region's replicas
    # Where the client records its metrics (bookkeeper_client_*, see client/client_metrics.py),
    # e.g. a prometheus.PrometheusMetrics the application serves; None: none are recorded
    metrics: Metrics | None = None
    # with metrics, also BookKeeper's per-bookie channel stats (per_channel_bookie_client_*,
    # labelled bookie="<id>"): off by default, as BookKeeper's [limitStatsLogging=true]
    per_bookie_metrics: bool = False

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENT_POLICIES:
            raise errors.IncorrectParameterError(
                f"unknown placement policy {self.placement!r}: use one of {PLACEMENT_POLICIES}"
            )
        if self.throttle < 1:
            raise errors.IncorrectParameterError(
                f"throttle must be at least 1, not {self.throttle}"
            )
        for name in (
            "speculative_read_timeout_ms",
            "max_speculative_read_timeout_ms",
            "speculative_read_lac_timeout_ms",
            "max_speculative_read_lac_timeout_ms",
        ):
            if getattr(self, name) < 0:
                raise errors.IncorrectParameterError(f"{name} must not be negative")
        if self.metadata_session_timeout_s is not None and self.metadata_session_timeout_s < 1:
            raise errors.IncorrectParameterError(
                f"metadata_session_timeout_s must be at least 1 s, not "
                f"{self.metadata_session_timeout_s}"
            )

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> ClientConfig:
        """A configuration from keyword options; an unknown name is an error that lists the
        known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise errors.IncorrectParameterError(
                f"unknown client option(s) {unknown}; the options are {sorted(known)}"
            )
        return cls(**options)
