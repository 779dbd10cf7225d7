"""Logs built from ledgers (the seeds' "Ledgers to logs"): namespaces of named logs, each an
ordered list of ledgers kept by compare-and-swap; a single writer that fences its predecessor,
batches records into entries and rolls segments; readers that catch up and tail; subscriptions,
truncation and retention. ``bookkeeper_py.log.LogNamespace`` is the asyncio API."""

from bookkeeper_py.log.format import (
    DUPLICATE,
    EndOfStreamError,
    LogConfig,
    LogError,
    LogExistsError,
    LogFencedError,
    LogMetadata,
    LogNotFoundError,
    LogRecord,
    Position,
    RecordTooLargeError,
    Segment,
    SegmentState,
    Subscription,
)
from bookkeeper_py.log.namespace import (
    LogDescription,
    LogNamespace,
    SubscriptionInfo,
    list_namespaces,
)
from bookkeeper_py.log.reader import LogReader
from bookkeeper_py.log.writer import LogWriter, PendingAppend

__all__ = [
    "DUPLICATE",
    "EndOfStreamError",
    "LogConfig",
    "LogDescription",
    "LogError",
    "LogExistsError",
    "LogFencedError",
    "LogMetadata",
    "LogNamespace",
    "LogNotFoundError",
    "LogReader",
    "LogRecord",
    "LogWriter",
    "PendingAppend",
    "Position",
    "RecordTooLargeError",
    "Segment",
    "SegmentState",
    "Subscription",
    "SubscriptionInfo",
    "list_namespaces",
]
