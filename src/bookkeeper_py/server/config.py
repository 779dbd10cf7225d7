r"""Bookie configuration: ``bk_server.conf`` keys, command-line options, defaults.

One table (``SETTINGS``) maps each supported BookKeeper key to its command-line option. A value
comes from, in increasing precedence: the default (BookKeeper's, reference sections 1.11-1.13,
except where noted), the ``--conf`` file, the command line. File values are in BookKeeper's units
(``logSizeLimit`` in bytes, ``flushInterval`` in ms...). Every key of BookKeeper's stock
``bk_server.conf`` that this bookie does not take is known, with why (``config_keys.NOT_USED``):
setting one is warned about with that reason (one line per reason; a value that asks for nothing,
such as BookKeeper's default, only at DEBUG). Any other unknown key is warned about with the
nearest known key ("did you mean"). A value that does not parse, or a combination that makes no
sense, stops the bookie with ``ConfigError`` naming the key. Where ``metadataServiceUri`` and the
legacy ``zkServers`` / ``zkLedgersRootPath`` are both given, ``metadataServiceUri`` wins, as in
BookKeeper (a warning says so when they disagree).

The file format is Java's ``.properties`` (read by ``javaproperties``): ``key=value``,
``key: value`` or ``key value``, ``#`` and ``!`` comments, a trailing backslash continues the line,
and the escapes ``\=``, ``\:``, ``\uXXXX``, ``\\``.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import javaproperties

from bookkeeper_py.errors import BKError
from bookkeeper_py.server.bookie import BookieConfig
from bookkeeper_py.server.config_keys import NOT_USED, asks_nothing
from bookkeeper_py.storage.disk import DiskThresholds
from bookkeeper_py.storage.engine import StorageConfig
from bookkeeper_py.storage.gc import GcConfig
from bookkeeper_py.tls import TlsConfig

if TYPE_CHECKING:
    from bookkeeper_py.autorecovery.service import AutoRecoveryOptions

log = logging.getLogger(__name__)
MiB = 1024 * 1024


class ConfigError(BKError):
    """A configuration value is invalid; the message names the key and the value."""


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "1"):
        return True
    if lowered in ("false", "no", "0"):
        return False
    raise ValueError("not a boolean (true or false)")


def _dirs(text: str) -> list[str]:
    directories = [part.strip() for part in text.split(",") if part.strip()]
    if not directories:
        raise ValueError("no directory given")
    return directories


@dataclass(frozen=True, slots=True)
class Setting:
    key: str  # bk_server.conf key
    option: str  # command-line option
    parse: Callable[[str], Any]  # file text -> value in the option's unit
    default: Any
    help: str
    cli_type: Callable[[str], Any] | None = None  # None: same as parse


def _scaled(kind: Callable[[str], Any], factor: float) -> Callable[[str], Any]:
    return lambda text: kind(text) * factor


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "metadataServiceUri",
        "--metadata-uri",
        str,
        None,
        "metadataServiceUri, e.g. sqlite:///tmp/bk/metadata.db",
    ),
    Setting("advertisedAddress", "--host", str, "127.0.0.1", "address to listen on and advertise"),
    Setting("bookiePort", "--port", int, 3181, "bookiePort"),
    Setting("bookieId", "--bookie-id", str, None, "bookieId (default host:port)"),
    Setting(
        "zkTimeout",
        "--zk-timeout-ms",
        int,
        None,
        "zkTimeout: ms the metadata session outlives a dead bookie (its registration, its "
        "AutoRecovery vote and locks); the ZooKeeper session timeout, or the SQLite lease "
        "(default 10000 on ZooKeeper, 5000 on SQLite)",
    ),
    Setting(
        "journalDirectories",
        "--journal-dir",
        _dirs,
        None,
        "journalDirectories (repeat the option for several)",
        str,
    ),
    Setting(
        "ledgerDirectories",
        "--ledger-dir",
        _dirs,
        None,
        "ledgerDirectories (repeat the option for several; a ledger lives in directory "
        "ledgerId mod n; default 'ledgers' beside the first journal)",
        str,
    ),
    Setting(
        "journalSyncData",
        "--journal-sync-data",
        _bool,
        True,
        "journalSyncData: fsync before acknowledging",
    ),
    Setting(
        "journalRemoveFromPageCache",
        "--journal-remove-from-page-cache",
        _bool,
        True,
        "journalRemoveFromPageCache: drop synced journal pages from the page cache",
    ),
    Setting("journalMaxSizeMB", "--journal-max-size-mb", int, 2048, "journalMaxSizeMB"),
    Setting("journalPreAllocSizeMB", "--journal-prealloc-mb", int, 16, "journalPreAllocSizeMB"),
    Setting(
        "journalMaxGroupWaitMSec",
        "--journal-max-group-wait-ms",
        float,
        0.0,
        "journalMaxGroupWaitMSec (0: write when idle)",
    ),
    Setting(
        "journalBufferedWritesThreshold",
        "--journal-buffered-writes-threshold",
        int,
        512 * 1024,
        "journalBufferedWritesThreshold (bytes)",
    ),
    Setting(
        "flushInterval", "--flush-interval-ms", int, 10_000, "flushInterval: checkpoint period (ms)"
    ),
    Setting(
        "logSizeLimit",
        "--log-size-limit-mb",
        _scaled(int, 1 / MiB),
        1024,
        "logSizeLimit (file: bytes; option: MiB)",
        float,
    ),
    Setting(
        "flushEntrylogBytes",
        "--flush-entrylog-bytes",
        int,
        MiB,
        "flushEntrylogBytes: fdatasync entry logs every so many bytes (0: at checkpoints only)",
    ),
    Setting(
        "entryLogRemoveFromPageCache",
        "--entry-log-remove-from-page-cache",
        _bool,
        True,
        "drop synced pages of the active entry log from the page cache (not a BookKeeper key)",
    ),
    Setting(
        "dbStorage_directIOEntryLogger",
        "--direct-io-entry-logger",
        _bool,
        True,
        "write entry logs with O_DIRECT, not through the page cache (the same file format; "
        "where the file system refuses direct I/O, through the page cache)",
    ),
    Setting(
        "checkpointPace",
        "--checkpoint-pace",
        float,
        0.5,
        "spread a periodic checkpoint's writes over this fraction of flushInterval (0: full speed)",
    ),
    Setting(
        "dbStorage_writeCacheMaxSizeMb",
        "--write-cache-mb",
        int,
        256,
        "dbStorage_writeCacheMaxSizeMb",
    ),
    Setting(
        "dbStorage_maxThrottleTimeMs",
        "--max-throttle-time-ms",
        int,
        10_000,
        "how long an add waits for a full write cache to drain before ETOOMANYREQUESTS",
    ),
    Setting("gcWaitTime", "--gc-wait-time-ms", int, 600_000, "gcWaitTime (ms)"),
    Setting(
        "minorCompactionThreshold",
        "--minor-compaction-threshold",
        float,
        0.2,
        "minorCompactionThreshold",
    ),
    Setting(
        "minorCompactionInterval",
        "--minor-compaction-interval-s",
        float,
        3600,
        "minorCompactionInterval (s)",
    ),
    Setting(
        "majorCompactionThreshold",
        "--major-compaction-threshold",
        float,
        0.8,
        "majorCompactionThreshold",
    ),
    Setting(
        "majorCompactionInterval",
        "--major-compaction-interval-s",
        float,
        86400,
        "majorCompactionInterval (s)",
    ),
    Setting(
        "compactionRateByBytes",
        "--compaction-rate-bytes",
        int,
        100 * MiB,
        "compactionRateByBytes (per second)",
    ),
    Setting("diskUsageThreshold", "--disk-usage-threshold", float, 0.95, "diskUsageThreshold"),
    Setting(
        "diskUsageWarnThreshold",
        "--disk-usage-warn-threshold",
        float,
        0.90,
        "diskUsageWarnThreshold",
    ),
    Setting(
        "diskUsageLwmThreshold",
        "--disk-usage-lwm-threshold",
        float,
        None,
        "diskUsageLwmThreshold (default: the threshold)",
    ),
    Setting("diskCheckInterval", "--disk-check-interval-ms", int, 10_000, "diskCheckInterval (ms)"),
    Setting("nettyMaxFrameSizeBytes", "--max-frame-size", int, 5 * MiB, "nettyMaxFrameSizeBytes"),
    Setting(
        "httpServerEnabled",
        "--http-enabled",
        _bool,
        False,
        "httpServerEnabled: /metrics, /heartbeat, /api/v1/bookie/*",
    ),
    Setting(
        "httpServerPort",
        "--http-port",
        int,
        8080,
        "httpServerPort (giving it on the command line enables HTTP)",
    ),
    Setting(
        "httpServerHost",
        "--http-host",
        str,
        None,
        "httpServerHost: the address the HTTP endpoint listens on (default: advertisedAddress)",
    ),
    Setting(
        "httpServerTlsEnable",
        "--http-tls",
        _bool,
        False,
        "httpServerTlsEnable: HTTPS, clients required to show a certificate of the truststore",
    ),
    Setting(
        "httpServerKeyStorePath",
        "--http-keystore",
        str,
        None,
        "httpServerKeyStorePath: the HTTP endpoint's certificate and key (PKCS#12 or PEM)",
    ),
    Setting(
        "httpServerKeyStorePassword",
        "--http-keystore-password",
        str,
        None,
        "httpServerKeyStorePassword",
    ),
    Setting(
        "httpServerTrustStorePath",
        "--http-truststore",
        str,
        None,
        "httpServerTrustStorePath: the CAs whose client certificates the HTTP endpoint takes",
    ),
    Setting(
        "httpServerTrustStorePassword",
        "--http-truststore-password",
        str,
        None,
        "httpServerTrustStorePassword",
    ),
    Setting(
        "prometheusStatsLatencyRolloverSeconds",
        "--metrics-rollover-s",
        int,
        60,
        "prometheusStatsLatencyRolloverSeconds: the window of the summaries' quantiles "
        "(metricsStyle=bookkeeper)",
    ),
    Setting(
        "metricsStyle",
        "--metrics-style",
        str,
        "histograms",
        "metricsStyle (ours): histograms (in seconds, counters as _total) or bookkeeper (as "
        "BookKeeper's Prometheus provider: summaries in ms with quantile labels, which its "
        "Grafana dashboards read)",
    ),
    Setting(
        "prometheusStatsHttpPort",
        "--metrics-port",
        int,
        None,
        "prometheusStatsHttpPort: /metrics on a port of its own (default: none, /metrics is on "
        "the HTTP endpoint)",
    ),
    Setting(
        "prometheusStatsHttpAddress",
        "--metrics-host",
        str,
        None,
        "prometheusStatsHttpAddress: the address of that port (default: advertisedAddress)",
    ),
    Setting(
        "readOnlyModeEnabled",
        "--read-only-mode-enabled",
        _bool,
        True,
        "readOnlyModeEnabled: turn read-only when the disks are full (false: stop the bookie)",
    ),
    Setting(
        "forceReadOnlyBookie",
        "--force-read-only",
        _bool,
        False,
        "forceReadOnlyBookie: start read-only and stay so (reads only; not writable over HTTP)",
    ),
    Setting(
        "serverTcpNoDelay",
        "--tcp-no-delay",
        _bool,
        True,
        "serverTcpNoDelay: TCP_NODELAY on accepted connections (off: Nagle's algorithm)",
    ),
    Setting(
        "serverSockKeepalive",
        "--tcp-keepalive",
        _bool,
        True,
        "serverSockKeepalive: TCP keep-alive probes on accepted connections",
    ),
    Setting(
        "serverTcpLinger",
        "--tcp-linger-s",
        int,
        -1,
        "serverTcpLinger: seconds a close may wait for unsent answers (SO_LINGER; -1: the "
        "system's default, 0: reset at once)",
    ),
    Setting(
        "maxPendingAddRequestsPerThread",
        "--max-pending-adds",
        int,
        50_000,
        "adds not yet durable, per bookie (BookKeeper: 10,000 per add thread; one loop serves all here)",
    ),
    Setting(
        "maxPendingReadRequestsPerThread",
        "--max-parked-long-polls",
        int,
        10_000,
        "long-poll reads parked at once",
    ),
    Setting(
        "maxPendingRequestsPerConnection",
        "--max-pending-per-connection",
        int,
        10_000,
        "unanswered requests per connection; at this many the connection is not read until "
        "half are answered (not a BookKeeper key)",
    ),
    Setting(
        "tlsCertificatePath",
        "--tls-certificate",
        str,
        None,
        "tlsCertificatePath: PEM certificate chain; setting it turns TLS on",
    ),
    Setting("tlsKeyStore", "--tls-key", str, None, "tlsKeyStore: the PEM private key"),
    Setting("tlsKeyStoreType", "--tls-key-type", str, "PEM", "tlsKeyStoreType (PEM only)"),
    Setting(
        "tlsTrustStore",
        "--tls-trust",
        str,
        None,
        "tlsTrustStore: PEM CA certificates that sign client certificates",
    ),
    Setting("tlsTrustStoreType", "--tls-trust-type", str, "PEM", "tlsTrustStoreType (PEM only)"),
    Setting(
        "tlsClientAuthentication",
        "--tls-client-auth",
        _bool,
        False,
        "tlsClientAuthentication: mutual TLS, refuse clients without a trusted certificate",
    ),
    Setting(
        "bookieAuthProviderFactoryClass",
        "--auth-provider",
        str,
        None,
        "bookieAuthProviderFactoryClass: 'shared-secret' or package.module:factory",
    ),
    Setting(
        "authSharedSecretFile",
        "--auth-secret-file",
        str,
        None,
        "file holding the shared-secret plugin's secret (not a BookKeeper key)",
    ),
    Setting(
        "idleConnectionTimeoutSec",
        "--idle-timeout-s",
        float,
        600.0,
        "close connections idle this long, 0 never (not a BookKeeper key)",
    ),
    Setting(
        "cpuSchedulingPolicy",
        "--cpu-scheduling-policy",
        str,
        "normal",
        "normal, or batch: every thread of the bookie under Linux's SCHED_BATCH, so that a "
        "bookie woken by a request does not take the CPU from the process that sent it, where "
        "bookies share CPUs with their clients (a local cluster's default; not a BookKeeper key)",
    ),
)
AUTORECOVERY_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "autoRecoveryDaemonEnabled",
        "--autorecovery",
        _bool,
        False,
        "autoRecoveryDaemonEnabled: stand for auditor and run a replication worker here",
    ),
    Setting(
        "lostBookieRecoveryDelay",
        "--lost-bookie-recovery-delay",
        int,
        0,
        "lostBookieRecoveryDelay: seconds a lost bookie may stay away before its ledgers are "
        "marked (used until the shell sets one in the metadata store)",
    ),
    Setting(
        "auditorPeriodicCheckInterval",
        "--auditor-check-interval-s",
        int,
        604800,
        "auditorPeriodicCheckInterval: seconds between checks of every ledger against the "
        "bookies' contents, 0 never",
    ),
    Setting(
        "auditorPeriodicBookieCheckInterval",
        "--auditor-bookie-check-interval-s",
        int,
        86400,
        "auditorPeriodicBookieCheckInterval: seconds between audits of every lost bookie",
    ),
    Setting(
        "auditorPeriodicPlacementPolicyCheckInterval",
        "--auditor-placement-check-interval-s",
        int,
        0,
        "auditorPeriodicPlacementPolicyCheckInterval: seconds between placement checks, 0 never",
    ),
    Setting(
        "rereplicationEntryBatchSize",
        "--rereplication-entries-in-flight",
        int,
        10,
        "rereplicationEntryBatchSize: entries a replication worker copies at once",
    ),
    Setting(
        "replicationRateByBytes",
        "--replication-rate-bytes",
        int,
        -1,
        "replicationRateByBytes: bytes per second a replication worker copies, -1 no limit",
    ),
    Setting(
        "openLedgerRereplicationGracePeriod",
        "--open-ledger-grace-ms",
        int,
        30000,
        "openLedgerRereplicationGracePeriod: ms an open ledger's writer has to replace a lost "
        "bookie before the worker fences the ledger",
    ),
)
SETTINGS += AUTORECOVERY_SETTINGS
_BY_KEY = {setting.key: setting for setting in SETTINGS}
_ALIASES = {"journalDirectory": "journalDirectories"}  # the single-directory form


def read_properties(path: str) -> dict[str, str]:
    """Key -> value of a Java ``.properties`` file (values stripped of surrounding blanks: a
    trailing blank after a path or a number is a slip); ``ConfigError`` naming the line for a
    key-less line or a broken ``\\u`` escape."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read configuration file {path}: {error}") from error
    values: dict[str, str] = {}
    line = 1
    try:
        for element in javaproperties.parse(text):
            if isinstance(element, javaproperties.KeyValue):
                if not element.key:
                    raise ConfigError(
                        f"{path}:{line}: a line without a key: {element.source.strip()!r}"
                    )
                values[element.key] = element.value.strip()
            line += element.source.count("\n")
    except javaproperties.InvalidUEscapeError as error:
        raise ConfigError(
            f"{path}:{line}: {error}; write \\u and four hex digits, or \\\\u for a backslash "
            "followed by u"
        ) from error
    return values


def add_arguments(
    parser: argparse.ArgumentParser,
    settings: tuple[Setting, ...] | None = None,
    metadata: bool = False,
) -> None:
    """The options of ``settings`` (default: every setting, and the bookie's own options); with
    ``metadata``, the metadata service URI's and zkTimeout too."""
    parser.add_argument("--conf", help="a bk_server.conf-style file (BookKeeper's keys)")
    chosen = SETTINGS if settings is None else settings
    if metadata and settings is not None:
        chosen = (_BY_KEY["metadataServiceUri"], _BY_KEY["zkTimeout"], *chosen)
    for setting in chosen:
        kind = setting.cli_type or setting.parse
        if setting.parse is _bool:
            parser.add_argument(
                setting.option,
                type=_bool,
                default=None,
                metavar="true|false",
                help=f"{setting.help} [{setting.default}]",
            )
        elif setting.key in ("journalDirectories", "ledgerDirectories"):
            parser.add_argument(setting.option, action="append", default=None, help=setting.help)
        else:
            parser.add_argument(
                setting.option, type=kind, default=None, help=f"{setting.help} [{setting.default}]"
            )
    if settings is not None:
        parser.set_defaults(no_journal_sync=False)
        return
    parser.add_argument(
        "--no-journal-sync", action="store_true", help="same as --journal-sync-data false (unsafe)"
    )
    parser.add_argument("--ready-file", help="file to write the bookie id to once serving")
    parser.add_argument(
        "--stop-with-pid",
        type=int,
        metavar="PID",
        help="stop cleanly once process PID exits (a tool that starts bookies passes its own: "
        "they do not outlive it when it is killed)",
    )
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="serve without a metadata store: no registration, no cookie in the store, no "
        "garbage collection (for tools and tests that address the bookie directly)",
    )


def _dest(setting: Setting) -> str:
    return setting.option.lstrip("-").replace("-", "_")


def _zookeeper_keys(path: str, file_values: dict[str, str]) -> None:
    """The legacy ``zkServers`` and ``zkLedgersRootPath`` (taken out of ``file_values``): the
    metadata URI they make where ``metadataServiceUri`` is not given; where it is, it wins (as in
    BookKeeper), and a warning says so when they name other servers or another root."""
    servers = file_values.pop("zkServers", None)
    root = file_values.pop("zkLedgersRootPath", None)
    uri = file_values.get("metadataServiceUri")
    if uri is None:
        if servers is not None:
            file_values["metadataServiceUri"] = (
                f"zk+hierarchical://{servers.replace(',', ';')}{root or '/ledgers'}"
            )
        return
    scheme, _, rest = uri.partition("://")
    uri_servers, _, uri_root = rest.partition("/")
    given = [
        f"{key}={value}"
        for key, value, same in (
            ("zkServers", servers, uri_servers.replace(";", ",") == (servers or "")),
            ("zkLedgersRootPath", root, "/" + uri_root == (root or "")),
        )
        if value is not None and not (same and scheme.startswith("zk"))
    ]
    if given:
        log.warning(
            "%s: %s ignored: metadataServiceUri=%s is given and wins, as in BookKeeper; "
            "remove the legacy key",
            path,
            " and ".join(given),
            uri,
        )


def _known_keys() -> list[str]:
    return [*_BY_KEY, *_ALIASES, *NOT_USED, "zkServers", "zkLedgersRootPath"]


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """Key -> value after defaults, the --conf file and the command line."""
    values: dict[str, Any] = {setting.key: setting.default for setting in SETTINGS}
    if args.conf:
        file_values = read_properties(args.conf)
        _zookeeper_keys(args.conf, file_values)
        not_used: dict[str, list[str]] = {}  # reason -> the keys set that it applies to
        for raw_key, text in file_values.items():
            key = _ALIASES.get(raw_key, raw_key)
            setting = _BY_KEY.get(key)
            if setting is None:
                reason = NOT_USED.get(key)
                if reason is None:
                    nearest = difflib.get_close_matches(key, _known_keys(), n=1, cutoff=0.75)
                    log.warning(
                        "%s: unknown key %s; ignored: %s",
                        args.conf,
                        key,
                        f"did you mean {nearest[0]}?"
                        if nearest
                        else "it is no key of BookKeeper's bk_server.conf nor of this bookie",
                    )
                elif asks_nothing(key, text):
                    log.debug("%s: %s=%s is not used here (%s)", args.conf, key, text, reason)
                else:
                    not_used.setdefault(reason, []).append(key)
                continue
            try:
                values[key] = setting.parse(text)
            except ValueError as error:
                raise ConfigError(f"{args.conf}: {key}={text!r} is invalid: {error}") from error
        for reason, keys in not_used.items():
            log.warning("%s: %s ignored: %s", args.conf, ", ".join(keys), reason)
    for setting in SETTINGS:
        given = getattr(args, _dest(setting), None)
        if given is not None:
            values[setting.key] = given
    if args.no_journal_sync:
        values["journalSyncData"] = False
    if getattr(args, "http_port", None) is not None and getattr(args, "http_enabled", None) is None:
        values["httpServerEnabled"] = True
    return values


def read_conf(path: str) -> dict[str, Any]:
    """Key -> value after the defaults and the file at ``path`` alone (what the shell takes
    from ``--conf``: the metadata service URI, the directories)."""
    return resolve(argparse.Namespace(conf=path, no_journal_sync=False))


def session_timeout_s(values: dict[str, Any]) -> float | None:
    """zkTimeout in seconds (None: the metadata store's default); ``ConfigError`` below 1 s."""
    timeout_ms = values["zkTimeout"]
    if timeout_ms is None:
        return None
    if timeout_ms < 1000:
        raise ConfigError(f"zkTimeout must be at least 1000 ms, got {timeout_ms}")
    return float(timeout_ms) / 1000.0


def _http_tls(values: dict[str, Any]) -> tuple[str, str | None, str, str | None] | None:
    """The HTTP endpoint's TLS files (httpServerTlsEnable), checked to be named."""
    if not values["httpServerTlsEnable"]:
        return None
    keystore, truststore = values["httpServerKeyStorePath"], values["httpServerTrustStorePath"]
    if not keystore or not truststore:
        raise ConfigError(
            "httpServerTlsEnable needs httpServerKeyStorePath (the endpoint's certificate and "
            "key) and httpServerTrustStorePath (the CAs of the client certificates it requires)"
        )
    return (
        os.path.abspath(keystore),
        values["httpServerKeyStorePassword"],
        os.path.abspath(truststore),
        values["httpServerTrustStorePassword"],
    )


def _metrics_style(style: str) -> str:
    from bookkeeper_py.prometheus import STYLES

    if style not in STYLES:
        raise ConfigError(f"metricsStyle must be {' or '.join(STYLES)}, not {style!r}")
    return style


SCHEDULING_POLICIES = ("normal", "batch")


def scheduling_policy(values: dict[str, Any]) -> str:
    """cpuSchedulingPolicy, checked; ``ConfigError`` naming the key otherwise."""
    policy = values["cpuSchedulingPolicy"]
    if policy not in SCHEDULING_POLICIES:
        raise ConfigError(
            f"cpuSchedulingPolicy must be {' or '.join(SCHEDULING_POLICIES)}, not {policy!r}"
        )
    return str(policy)


def build(values: dict[str, Any]) -> BookieConfig:
    """The bookie configuration for resolved ``values``; raises ``ConfigError`` naming the key."""

    def positive(key: str) -> Any:
        value = values[key]
        if value is None or value <= 0:
            raise ConfigError(f"{key} must be positive, got {value!r}")
        return value

    journals = values["journalDirectories"]
    if not journals:
        raise ConfigError(
            "journalDirectories is required (--journal-dir or the configuration file)"
        )
    journals = [os.path.abspath(directory) for directory in journals]
    ledgers = values["ledgerDirectories"] or [os.path.join(os.path.dirname(journals[0]), "ledgers")]
    ledgers = [os.path.abspath(directory) for directory in ledgers]
    if len({os.path.realpath(directory) for directory in ledgers}) != len(ledgers):
        raise ConfigError(
            f"ledgerDirectories names a directory twice (links resolved): {', '.join(ledgers)}"
        )
    log_size_limit = int(positive("logSizeLimit") * MiB)
    if log_size_limit >= 2**32:
        raise ConfigError(
            f"logSizeLimit must stay below 4 GiB (entry offsets are 32 bits), got {log_size_limit}"
        )
    pace = values["checkpointPace"]
    if not 0 <= pace < 1:
        raise ConfigError(
            f"checkpointPace is a fraction of flushInterval from 0 (full speed) to below 1, "
            f"got {pace}"
        )
    port = values["bookiePort"]
    if not 0 < port < 65536:
        raise ConfigError(f"bookiePort must be 1-65535, got {port}")
    storage = StorageConfig(
        journal_directory=journals[0],
        extra_journal_directories=tuple(journals[1:]),
        ledger_directory=ledgers[0],
        extra_ledger_directories=tuple(ledgers[1:]),
        journal_sync_data=values["journalSyncData"],
        journal_remove_from_page_cache=values["journalRemoveFromPageCache"],
        journal_max_size_bytes=positive("journalMaxSizeMB") * MiB,
        journal_preallocate_bytes=values["journalPreAllocSizeMB"] * MiB,
        journal_max_group_wait_s=values["journalMaxGroupWaitMSec"] / 1000.0,
        journal_buffered_writes_threshold=positive("journalBufferedWritesThreshold"),
        log_size_limit=log_size_limit,
        flush_entrylog_bytes=max(0, values["flushEntrylogBytes"]),
        entry_log_remove_from_page_cache=values["entryLogRemoveFromPageCache"],
        entry_log_direct_writes=values["dbStorage_directIOEntryLogger"],
        checkpoint_pace=pace,
        write_cache_max_bytes=positive("dbStorage_writeCacheMaxSizeMb") * MiB,
        flush_interval_s=positive("flushInterval") / 1000.0,
    )
    gc = GcConfig(
        gc_wait_time_s=positive("gcWaitTime") / 1000.0,
        minor_compaction_threshold=values["minorCompactionThreshold"],
        minor_compaction_interval_s=values["minorCompactionInterval"],
        major_compaction_threshold=values["majorCompactionThreshold"],
        major_compaction_interval_s=values["majorCompactionInterval"],
        compaction_rate_bytes=values["compactionRateByBytes"],
    )
    try:
        disk = DiskThresholds(
            usage_threshold=values["diskUsageThreshold"],
            warn_threshold=values["diskUsageWarnThreshold"],
            lwm_threshold=values["diskUsageLwmThreshold"],
        )
    except ValueError as error:
        raise ConfigError(str(error)) from error
    for key in ("tlsKeyStoreType", "tlsTrustStoreType"):
        if str(values[key]).upper() != "PEM":
            raise ConfigError(f"{key}={values[key]!r}: this bookie reads PEM files only")
    tls = None
    if values["tlsCertificatePath"]:
        if not values["tlsKeyStore"]:
            raise ConfigError("tlsCertificatePath is set but tlsKeyStore (its PEM key) is not")
        if values["tlsClientAuthentication"] and not values["tlsTrustStore"]:
            raise ConfigError(
                "tlsClientAuthentication needs tlsTrustStore, the CAs of client certificates"
            )
        tls = TlsConfig(
            certificate_path=os.path.abspath(values["tlsCertificatePath"]),
            key_path=os.path.abspath(values["tlsKeyStore"]),
            trust_path=values["tlsTrustStore"] and os.path.abspath(values["tlsTrustStore"]),
            client_authentication=values["tlsClientAuthentication"],
        )
    elif values["tlsClientAuthentication"]:
        raise ConfigError(
            "tlsClientAuthentication needs TLS: set tlsCertificatePath and tlsKeyStore"
        )
    return BookieConfig(
        storage=storage,
        gc=gc,
        disk=disk,
        disk_check_interval_s=positive("diskCheckInterval") / 1000.0,
        host=values["advertisedAddress"],
        port=port,
        bookie_id=values["bookieId"],
        metadata_session_timeout_s=session_timeout_s(values),
        max_frame_size=positive("nettyMaxFrameSizeBytes"),
        http_port=values["httpServerPort"] if values["httpServerEnabled"] else None,
        http_host=values["httpServerHost"],
        http_tls=_http_tls(values),
        tcp_no_delay=values["serverTcpNoDelay"],
        tcp_keepalive=values["serverSockKeepalive"],
        tcp_linger_s=values["serverTcpLinger"],
        force_read_only=values["forceReadOnlyBookie"],
        read_only_mode_enabled=values["readOnlyModeEnabled"],
        metrics_port=values["prometheusStatsHttpPort"],
        metrics_host=values["prometheusStatsHttpAddress"],
        metrics_style=_metrics_style(values["metricsStyle"]),
        metrics_rollover_s=positive("prometheusStatsLatencyRolloverSeconds"),
        max_pending_adds=positive("maxPendingAddRequestsPerThread"),
        max_throttle_time_s=values["dbStorage_maxThrottleTimeMs"] / 1000.0,
        max_parked_long_polls=positive("maxPendingReadRequestsPerThread"),
        max_pending_per_connection=positive("maxPendingRequestsPerConnection"),
        idle_connection_timeout_s=values["idleConnectionTimeoutSec"],
        tls=tls,
        auth_provider=values["bookieAuthProviderFactoryClass"],
        settings={key: value for key, value in values.items() if value is not None},
    )


def autorecovery_options(values: dict[str, Any]) -> AutoRecoveryOptions:
    """AutoRecovery's options from resolved ``values``; ``ConfigError`` naming a bad key."""
    # Imported here: a bookie without AutoRecovery loads no client code.
    from bookkeeper_py.autorecovery.auditor import AuditorOptions
    from bookkeeper_py.autorecovery.replication import ReplicationOptions
    from bookkeeper_py.autorecovery.service import AutoRecoveryOptions
    from bookkeeper_py.autorecovery.worker import WorkerOptions

    for key in (
        "lostBookieRecoveryDelay",
        "auditorPeriodicCheckInterval",
        "auditorPeriodicBookieCheckInterval",
        "auditorPeriodicPlacementPolicyCheckInterval",
        "openLedgerRereplicationGracePeriod",
    ):
        if values[key] < 0:
            raise ConfigError(f"{key} must be 0 or more, got {values[key]}")
    if values["rereplicationEntryBatchSize"] < 1:
        raise ConfigError(
            f"rereplicationEntryBatchSize must be 1 or more, got "
            f"{values['rereplicationEntryBatchSize']}"
        )
    bookie_check = values["auditorPeriodicBookieCheckInterval"]
    return AutoRecoveryOptions(
        auditor=AuditorOptions(
            bookie_check_interval_s=float(bookie_check) if bookie_check else float("inf"),
            ledger_check_interval_s=float(values["auditorPeriodicCheckInterval"]),
            placement_check_interval_s=float(values["auditorPeriodicPlacementPolicyCheckInterval"]),
            initial_delay_s=values["lostBookieRecoveryDelay"],
        ),
        worker=WorkerOptions(
            replication=ReplicationOptions(
                entries_in_flight=values["rereplicationEntryBatchSize"],
                bytes_per_second=float(values["replicationRateByBytes"]),
            ),
            open_ledger_grace_s=values["openLedgerRereplicationGracePeriod"] / 1000,
        ),
    )
