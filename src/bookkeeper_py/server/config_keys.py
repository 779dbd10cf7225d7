"""The keys of Apache BookKeeper's stock ``bk_server.conf`` (release 4.18.0, 216 keys with the
commented ones) that this bookie does not take, each with why (issue 22). A configuration file
that sets one gets a warning naming the reason, one line per reason, never "unknown"; a value
that asks for nothing this bookie lacks (empty, ``false``, or BookKeeper's own default) is only
logged at DEBUG. The keys this bookie does take are ``config.SETTINGS``; ``docs/operations.md``
lists both, and a test keeps the three in step with the stock file.
"""

from __future__ import annotations

from collections.abc import Mapping

# -- reasons, each shared by the keys it applies to ----------------------------------------------

_NETTY_BUFFERS = (
    "Netty's buffer allocator: this bookie reads into its event loop's buffers (asyncio, uvloop "
    "where installed); there is no pooled allocator to tune"
)
_THREAD_POOLS = (
    "thread pools of the Java bookie: this bookie serves every connection on one event loop "
    "(reads that must wait for a disk go to its reader threads), so there is no pool to size; "
    "back-pressure is maxPendingAddRequestsPerThread / maxPendingReadRequestsPerThread"
)
_IN_JVM = "clients inside the bookie's own JVM: there is no such thing for a Python bookie"
_PLUGINS = (
    "Java classes loaded into the bookie process: not applicable; run other services as "
    "processes of their own"
)
_STREAM_STORAGE = (
    "BookKeeper's stream storage (the table service and its DistributedLog settings), which "
    "this project does not include"
)
_ROCKSDB = (
    "RocksDB tuning of DbLedgerStorage's indexes: this bookie's index is an LMDB store "
    "(docs/formats/index.md), which needs no such tuning"
)
_DIRECT_IO = (
    "buffers of DbLedgerStorage's direct-I/O entry logger: this bookie writes its entry logs "
    "with O_DIRECT (dbStorage_directIOEntryLogger) from one buffer of ~2 MiB per ledger "
    "directory, and reads them through the page cache"
)
_READ_AHEAD_CACHE = (
    "DbLedgerStorage's read-ahead cache: this bookie reads a ledger's following entries in "
    "spans of up to 1 MiB of its entry logs, cached by the kernel (docs/formats/entry-log.md)"
)
_OTHER_STORAGE = (
    "settings of SortedLedgerStorage / InterleavedLedgerStorage: this bookie has one ledger "
    "storage (a write cache, interleaved entry logs and an LMDB index, as DbLedgerStorage has), "
    "sized by dbStorage_writeCacheMaxSizeMb"
)
_INDEX_PLACE = (
    "the index lives in the ledger directory (an LMDB environment beside the entry logs), "
    "so there is no separate index directory to check"
)
_LOG_PER_LEDGER = (
    "entry log per ledger: this bookie writes every ledger into one entry log at a time and "
    "writes each checkpoint's entries sorted by ledger"
)
_ENTRY_LOG_BUFFERS = (
    "buffers of Java's entry-log channels: a checkpoint is written with writev straight from "
    "the write cache, and reads take spans of the log (flushEntrylogBytes bounds the dirty bytes)"
)
_JOURNAL_FORMAT = (
    "this bookie writes its own journal format (docs/formats/journal.md); journals are not "
    "shared with Java bookies, and a group is padded to no sector size"
)
_JOURNAL_GROUPING = (
    "a journal group here takes everything queued while the previous sync ran, written as soon "
    "as that sync ends (adaptive, as BookKeeper's default); journalMaxGroupWaitMSec and "
    "journalBufferedWritesThreshold shape it"
)
_JOURNAL_BUFFERS = (
    "a journal group is written with one writev from its records: there is no write buffer or "
    "queue of its own to size; back-pressure comes from the write cache (dbStorage_maxThrottleTimeMs) "
    "and maxPendingAddRequestsPerThread"
)
_JOURNAL_BACKUPS = (
    "a journal file is deleted once a checkpoint covers it; keep copies with the file system "
    "if you need them"
)
_JOURNAL_WRITE = (
    "journal records are always written here: without them an acknowledged entry could be lost "
    "(journalSyncData=false skips only the sync)"
)
_JOURNAL_CHANNEL = "a Java file-channel class: not applicable"
_STATS_PROVIDER = (
    "metrics are Prometheus text at /metrics, on the bookie's HTTP port (httpServerEnabled) or a "
    "port of their own (prometheusStatsHttpPort); no other stats provider is built in"
)
_STATS_OTHER = "a Java stats provider's setting: metrics here are Prometheus text at /metrics"
_JVM_METRICS = "JVM metrics: the bookie is a Python process (process_* metrics are exported)"
_HTTP_CLASS = "the HTTP server is built in (aiohttp); there is no server class to choose"
_LONG_POLL_TIMER = (
    "the timer wheel of Java's long polls: a long poll here is a timer on the event loop"
)
_ZK_RATE = (
    "ZooKeeper request throttles: this bookie sends few metadata requests (no per-ledger "
    "requests on the add path)"
)
_ZK_RETRY = (
    "the ZooKeeper client's retry backoff: the metadata driver (kazoo) reconnects on its own "
    "schedule within zkTimeout"
)
_ZK_SECURITY = (
    "ZooKeeper ACLs with SASL (JAAS/Kerberos) authentication: not supported; protect the "
    "ensemble by network access"
)
_LEDGER_MANAGER = (
    "the ledger-manager class: the layout comes from metadataServiceUri "
    "(zk+hierarchical://, zk+flat://, zk+longhierarchical://, sqlite://)"
)
_CLIENT_PLACEMENT = (
    "a Java placement-policy or resolver class: placement here is built in (random, rack-aware "
    "or region-aware, from the racks known to the metadata store)"
)
_CLIENT_READS = (
    "a setting of the BookKeeper client: the AutoRecovery client a bookie starts here uses the "
    "client's defaults (see the client's configuration)"
)
_CLIENT_DIGEST = (
    "the default digest and password of the bookie's own client: AutoRecovery reads each "
    "ledger with the digest and password its metadata records"
)
_GC_CACHE = (
    "GC's entry-log metadata cache (in RocksDB): GC here reads each entry log's ledgers map "
    "(written when the log is rolled), or scans a log without one"
)
_GC_OTHER = (
    "a fine-tuning of BookKeeper's GC and compaction that this bookie's GC (gcWaitTime, "
    "minor/majorCompaction*, compactionRateByBytes) does not have"
)
_OVERREPLICATED = (
    "GC of over-replicated ledgers: not implemented here; a bookie keeps a ledger's entries "
    "until the ledger is deleted"
)
_STARTUP_USERS = "not implemented: start the bookie under the user that should run it"
_ROLES = "role-based authorization of clients: not implemented (authentication only)"
_LOOPBACK = (
    "this bookie listens on advertisedAddress (loopback by default, for one-machine clusters) "
    "and always registers its address (or bookieId), never its host name"
)
_EPHEMERAL = (
    "a bookie here listens on the bookiePort given (1-65535): there is no ephemeral port to allow"
)
_DEATH_WATCH = (
    "a watchdog of the Java bookie's threads: not applicable to this bookie's event loop and "
    "its few threads, whose failures are logged and fail the requests they serve"
)
_PERSIST_STATUS = (
    "the read-only state is not persisted: a bookie started again is writable unless its disks "
    "are full"
)
_STORAGE_EXPANSION = (
    "a ledger lives in ledger directory ledgerId mod n, as in BookKeeper's DbLedgerStorage (whose "
    "expansion BookKeeper does not support either): a directory added would move every ledger; "
    "the directories of a bookie stay those its cookie records"
)
_MULTI_DIRS = (
    "this bookie does not check whether its directories share a disk partition: any layout is "
    "accepted"
)
_MIN_USABLE = (
    "this bookie turns read-only at diskUsageThreshold and keeps writing what replay and "
    "compaction need; there are no separate minimum sizes"
)
_TLS_PROVIDER = "TLS is Python's ssl module (OpenSSL); there is no provider to choose"
_TLS_PASSWORD = (
    "key stores here are PEM files (tlsKeyStoreType=PEM) without a password: keep the key "
    "readable by the bookie's user only"
)
_TLS_REFRESH = "certificates are read at start; restart the bookie to take new ones"
_ANY_DISK_FULL = (
    "this bookie counts its fullest directory: it turns read-only as soon as one directory "
    "passes diskUsageThreshold (as with readOnlyModeOnAnyDiskFullEnabled=true)"
)
_IO_THREADS = (
    "Netty's I/O threads: this bookie's connections share one event loop; run more bookies "
    "for more cores"
)
_AUDITOR_TUNING = (
    "a fine-tuning of the Java auditor's checks that this project's auditor does not have "
    "(it checks each ledger's fragments by asking their bookies)"
)
_UNDERREPLICATED_TIME = "this project's under-replicated marks always record when they were made"
_REPLICATION_BACKOFF = (
    "the replication worker's backoff after a failure: this project's worker retries on its "
    "own schedule"
)

NOT_USED: Mapping[str, str] = {
    **dict.fromkeys(
        (
            "allocatorLeakDetectionPolicy",
            "allocatorOutOfMemoryPolicy",
            "allocatorPoolingConcurrency",
            "allocatorPoolingPolicy",
            "byteBufAllocatorSizeInitial",
            "byteBufAllocatorSizeMax",
            "byteBufAllocatorSizeMin",
        ),
        _NETTY_BUFFERS,
    ),
    **dict.fromkeys(
        (
            "numAddWorkerThreads",
            "numReadWorkerThreads",
            "numHighPriorityWorkerThreads",
            "numLongPollWorkerThreads",
            "numJournalCallbackThreads",
            "readWorkerThreadsThrottlingEnabled",
            "enableBusyWait",
            "numOfMemtableFlushThreads",
            "enableTaskExecutionStats",
        ),
        _THREAD_POOLS,
    ),
    "serverNumIOThreads": _IO_THREADS,
    **dict.fromkeys(("enableLocalTransport", "disableServerSocketBind"), _IN_JVM),
    **dict.fromkeys(
        ("extraServerComponents", "ignoreExtraServerComponentsStartupFailures"), _PLUGINS
    ),
    **dict.fromkeys(
        (
            "storageserver.grpc.port",
            "storage.range.store.dirs",
            "storage.serve.readonly.tables",
            "storage.cluster.controller.schedule.interval.ms",
            "dlog.bkcEnsembleSize",
            "dlog.bkcWriteQuorumSize",
            "dlog.bkcAckQuorumSize",
        ),
        _STREAM_STORAGE,
    ),
    **dict.fromkeys(
        (
            "dbStorage_rocksDB_blockCacheSize",
            "dbStorage_rocksDB_blockSize",
            "dbStorage_rocksDB_bloomFilterBitsPerKey",
            "dbStorage_rocksDB_checksum_type",
            "dbStorage_rocksDB_format_version",
            "dbStorage_rocksDB_logPath",
            "dbStorage_rocksDB_maxSizeInLevel1MB",
            "dbStorage_rocksDB_numFilesInLevel0",
            "dbStorage_rocksDB_numLevels",
            "dbStorage_rocksDB_sstSizeInMB",
            "dbStorage_rocksDB_writeBufferSizeMB",
            "defaultRocksdbConf",
            "entryLocationRocksdbConf",
            "ledgerMetadataRocksdbConf",
            "entryLocationCompactionInterval",
        ),
        _ROCKSDB,
    ),
    **dict.fromkeys(
        (
            "dbStorage_directIOEntryLoggerMaxFdCacheTimeSeconds",
            "dbStorage_directIOEntryLoggerReadBufferSizeMB",
            "dbStorage_directIOEntryLoggerTotalReadBufferSizeMB",
            "dbStorage_directIOEntryLoggerTotalWriteBufferSizeMB",
        ),
        _DIRECT_IO,
    ),
    **dict.fromkeys(
        (
            "dbStorage_readAheadCacheMaxSizeMb",
            "dbStorage_readAheadCacheBatchSize",
            "dbStorage_readAheadCacheBatchBytesSize",
        ),
        _READ_AHEAD_CACHE,
    ),
    **dict.fromkeys(
        (
            "ledgerStorageClass",
            "sortedLedgerStorageEnabled",
            "skipListSizeLimit",
            "skipListArenaChunkSize",
            "skipListArenaMaxAllocSize",
            "openFileLimit",
            "fileInfoCacheInitialCapacity",
            "fileInfoMaxIdleTime",
            "pageSize",
            "pageLimit",
        ),
        _OTHER_STORAGE,
    ),
    **dict.fromkeys(("indexDirectories", "minUsableSizeForIndexFileCreation"), _INDEX_PLACE),
    **dict.fromkeys(
        (
            "entryLogPerLedgerEnabled",
            "entryLogPerLedgerCounterLimitsMultFactor",
            "entrylogMapAccessExpiryTimeInSeconds",
            "maximumNumberOfActiveEntryLogs",
        ),
        _LOG_PER_LEDGER,
    ),
    **dict.fromkeys(
        ("entryLogFilePreallocationEnabled", "readBufferSizeBytes", "writeBufferSizeBytes"),
        _ENTRY_LOG_BUFFERS,
    ),
    **dict.fromkeys(("journalFormatVersionToWrite", "journalAlignmentSize"), _JOURNAL_FORMAT),
    **dict.fromkeys(
        (
            "journalAdaptiveGroupWrites",
            "journalFlushWhenQueueEmpty",
            "journalBufferedEntriesThreshold",
        ),
        _JOURNAL_GROUPING,
    ),
    **dict.fromkeys(
        ("journalWriteBufferSizeKB", "journalQueueSize", "journalMaxMemorySizeMb"),
        _JOURNAL_BUFFERS,
    ),
    "journalMaxBackups": _JOURNAL_BACKUPS,
    "journalWriteData": _JOURNAL_WRITE,
    "journalChannelProvider": _JOURNAL_CHANNEL,
    **dict.fromkeys(("statsProviderClass", "enableStatistics"), _STATS_PROVIDER),
    **dict.fromkeys(
        (
            "codahaleStatsPrefix",
            "codahaleStatsOutputFrequencySeconds",
            "codahaleStatsGraphiteEndpoint",
            "codahaleStatsCSVEndpoint",
            "codahaleStatsSlf4jEndpoint",
            "codahaleStatsJmxEndpoint",
            "sanityCheckMetricsEnabled",
        ),
        _STATS_OTHER,
    ),
    "exposeDefaultJVMMetrics": _JVM_METRICS,
    "httpServerClass": _HTTP_CLASS,
    **dict.fromkeys(("requestTimerTickDurationMs", "requestTimerNumTicks"), _LONG_POLL_TIMER),
    **dict.fromkeys(("zkRequestRateLimit", "zkReplicationTaskRateLimit"), _ZK_RATE),
    **dict.fromkeys(("zkRetryBackoffStartMs", "zkRetryBackoffMaxMs"), _ZK_RETRY),
    "zkEnableSecurity": _ZK_SECURITY,
    **dict.fromkeys(
        (
            "ledgerManagerFactoryClass",
            "ledgerManagerType",
            "allowShadedLedgerManagerFactoryClass",
            "shadedLedgerManagerFactoryClassPrefix",
        ),
        _LEDGER_MANAGER,
    ),
    **dict.fromkeys(
        (
            "ensemblePlacementPolicy",
            "reppDnsResolverClass",
            "networkTopologyScriptFileName",
            "networkTopologyScriptNumberArgs",
            "minNumRacksPerWriteQuorum",
            "enforceMinNumRacksPerWriteQuorum",
            "enforceMinNumFaultDomainsForWrite",
            "bookieAddressResolverEnabled",
        ),
        _CLIENT_PLACEMENT,
    ),
    **dict.fromkeys(("stickyReadSEnabled", "reorderReadSequenceEnabled"), _CLIENT_READS),
    **dict.fromkeys(("digestType", "passwd", "enableDigestTypeAutodetection"), _CLIENT_DIGEST),
    **dict.fromkeys(("gcEntryLogMetadataCacheEnabled", "gcEntryLogMetadataCachePath"), _GC_CACHE),
    **dict.fromkeys(
        (
            "gcMetadataOpRateLimit",
            "verifyMetadataOnGC",
            "useTargetEntryLogSizeForGc",
            "isForceGCAllowWhenNoSpace",
            "forceAllowCompaction",
            "useTransactionalCompaction",
            "isThrottleByBytes",
            "compactionRate",
            "compactionRateByEntries",
            "compactionMaxOutstandingRequests",
            "minorCompactionMaxTimeMillis",
            "majorCompactionMaxTimeMillis",
        ),
        _GC_OTHER,
    ),
    **dict.fromkeys(
        ("gcOverreplicatedLedgerWaitTime", "gcOverreplicatedLedgerMaxConcurrentRequests"),
        _OVERREPLICATED,
    ),
    "permittedStartupUsers": _STARTUP_USERS,
    "authorizedRoles": _ROLES,
    **dict.fromkeys(
        ("allowLoopback", "useHostNameAsBookieID", "useShortHostName", "listeningInterface"),
        _LOOPBACK,
    ),
    "allowEphemeralPorts": _EPHEMERAL,
    "bookieDeathWatchInterval": _DEATH_WATCH,
    "persistBookieStatusEnabled": _PERSIST_STATUS,
    "allowStorageExpansion": _STORAGE_EXPANSION,
    "allowMultipleDirsUnderSameDiskPartition": _MULTI_DIRS,
    **dict.fromkeys(
        ("minUsableSizeForEntryLogCreation", "minUsableSizeForHighPriorityWrites"), _MIN_USABLE
    ),
    **dict.fromkeys(("tlsProvider", "tlsProviderFactoryClass"), _TLS_PROVIDER),
    **dict.fromkeys(("tlsKeyStorePasswordPath", "tlsTrustStorePasswordPath"), _TLS_PASSWORD),
    "tlsCertFilesRefreshDurationSeconds": _TLS_REFRESH,
    "readOnlyModeOnAnyDiskFullEnabled": _ANY_DISK_FULL,
    **dict.fromkeys(
        (
            "auditorLedgerVerificationPercentage",
            "auditorMaxNumberOfConcurrentOpenLedgerOperations",
            "auditorAcquireConcurrentOpenLedgerOperationsTimeOutMSec",
        ),
        _AUDITOR_TUNING,
    ),
    "storeSystemTimeAsLedgerUnderreplicatedMarkTime": _UNDERREPLICATED_TIME,
    "rwRereplicateBackoffMs": _REPLICATION_BACKOFF,
}

# BookKeeper's defaults of keys above whose stock file sets them, or whose default asks for
# nothing this bookie lacks: a file value equal to one of these is logged at DEBUG, not warned.
BOOKKEEPER_DEFAULTS: Mapping[str, str] = {
    "httpServerClass": "org.apache.bookkeeper.http.vertx.VertxHttpServer",
    "statsProviderClass": "org.apache.bookkeeper.stats.prometheus.PrometheusMetricsProvider",
    "enableStatistics": "true",
    "stickyReadSEnabled": "true",
    "reorderReadSequenceEnabled": "true",
    "journalAdaptiveGroupWrites": "true",
    "journalWriteData": "true",
    "journalFormatVersionToWrite": "6",
    "readOnlyModeOnAnyDiskFullEnabled": "true",
    "entryLogFilePreallocationEnabled": "true",
}


def asks_nothing(key: str, value: str) -> bool:
    """Whether ``value`` for the not-used ``key`` asks for nothing this bookie lacks: empty, or
    BookKeeper's default where it is recorded above, else false (a feature left off)."""
    text = value.strip()
    default = BOOKKEEPER_DEFAULTS.get(key)
    if not text:
        return True
    if default is not None:
        return text == default or text.lower() == default  # true / True alike
    return text.lower() == "false"
