"""``format("bookkeeper")``: the PySpark data source of logs and ledgers (docs/spark.md).

Spark runs each piece in a Python process of its own and pickles the objects between them
(``../shared/reference/pyspark-datasource.md``): the data source and its readers hold parsed
options only; clients are made where they are used (``tasks.runtime()``) and never pickled.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from bookkeeper_py.log.format import LogNotFoundError
from bookkeeper_py.spark.arrow import LEDGER_SCHEMA_DDL, log_schema_ddl
from bookkeeper_py.spark.options import (
    EARLIEST,
    LATEST,
    Offsets,
    OptionError,
    SourceOptions,
    sink_options,
    source_options,
)
from bookkeeper_py.spark.planning import (
    DataLossError,
    LogSnapshot,
    Planner,
    ReadRange,
    at_least,
    split_key,
)
from bookkeeper_py.spark.tasks import read_range, runtime
from bookkeeper_py.spark.writing import (
    SinkSpec,
    Written,
    abort_job,
    commit_job,
    prepare_sink,
    streaming_writer_id,
    write_task,
)

log = logging.getLogger(__name__)

PLAN_TIMEOUT_S = 300.0


class BookKeeperDataSource(DataSource):
    """``spark.read / readStream / write / writeStream .format("bookkeeper")``."""

    @classmethod
    def name(cls) -> str:
        return "bookkeeper"

    def schema(self) -> str:
        lowered = {k.lower(): v for k, v in self.options.items()}
        if lowered.get("ledgers"):
            return LEDGER_SCHEMA_DDL
        metadata = lowered.get("includemetadata", "false").strip().lower() == "true"
        return log_schema_ddl(metadata)

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        spec = runtime().loop.run(prepare_sink(sink_options(self.options)), PLAN_TIMEOUT_S)
        return BatchWriter(spec, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        writer_id = streaming_writer_id(dict(self.options))
        spec = runtime().loop.run(prepare_sink(sink_options(self.options)), PLAN_TIMEOUT_S)
        return StreamWriter(spec, overwrite, writer_id)


# -- planning, shared by batch and stream --------------------------------------------------------


async def resolve_logs(planner: Planner, options: SourceOptions) -> list[str]:
    """The ``namespace/log`` keys a read covers, sorted."""
    subject = options.subject
    if subject.pattern is None:
        return sorted(subject.logs)
    names = await planner.log_names(subject.namespace)
    pattern: re.Pattern[str] = subject.pattern
    return sorted(
        f"{subject.namespace}/{name}"
        for name in names
        if pattern.fullmatch(name) or pattern.fullmatch(f"{subject.namespace}/{name}")
    )


async def resolve_offset(
    planner: Planner, snapshot: LogSnapshot, offsets: Offsets, default: str
) -> int:
    """A log's offset (sequence number) from ``offsets`` (``default`` for a log it does not
    name)."""
    kind = offsets.kind
    if kind == "sequences":
        value = offsets.sequences.get(snapshot.key)
        if value is None:
            kind = default
        elif value == EARLIEST:
            return snapshot.first
        elif value == LATEST:
            return snapshot.next
        else:
            return value
    if kind == "timestamps":
        stamp = offsets.timestamp
        if stamp is None:
            stamp = offsets.timestamps.get(snapshot.key)
        if stamp is None:
            kind = default
        else:
            return await planner.sequence_at_timestamp(snapshot, stamp)
    return snapshot.first if kind == "earliest" else snapshot.next


def checked_start(snapshot: LogSnapshot, start: int, fail_on_data_loss: bool) -> int:
    """``start``, or the log's first record when records from ``start`` were truncated
    (``DataLossError`` with ``failOnDataLoss``)."""
    first = snapshot.first
    if start >= first:
        return start
    message = (
        f"log {snapshot.key}: records from sequence number {start} were asked for, but the log "
        f"now starts at {first} (truncated or deleted by retention)"
    )
    if fail_on_data_loss:
        raise DataLossError(message + "; set failOnDataLoss=false to read on from there")
    log.warning("%s: reading on from %d (failOnDataLoss=false)", message, first)
    return first


async def plan_batch(options: SourceOptions) -> list[ReadRange]:
    planner = Planner(await runtime().client(options.uri, options.client), options.password)
    if options.subject.is_ledgers:
        found = await planner.ledger_ranges(
            options.subject.ledgers,
            partition_bytes=options.partition_bytes,
            fail_on_data_loss=options.fail_on_data_loss,
        )
        return at_least(found, options.min_partitions)
    ranges: list[ReadRange] = []
    for key in await resolve_logs(planner, options):
        snapshot = await snapshot_of(planner, key)
        start = await resolve_offset(planner, snapshot, options.starting, "earliest")
        start = checked_start(snapshot, start, options.fail_on_data_loss)
        end = min(snapshot.next, await resolve_offset(planner, snapshot, options.ending, "latest"))
        ranges += await planner.ranges(
            snapshot,
            start,
            end,
            partition_bytes=options.partition_bytes,
            fail_on_data_loss=options.fail_on_data_loss,
        )
    return at_least(ranges, options.min_partitions)


async def snapshot_of(planner: Planner, key: str) -> LogSnapshot:
    try:
        return await planner.snapshot(key)
    except LogNotFoundError:
        raise OptionError(
            f"log {key} does not exist: create it first (bookkeeper log create {key})"
        ) from None


def _partitions(ranges: list[ReadRange]) -> list[InputPartition]:
    return [InputPartition(part) for part in ranges]


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    part = partition.value
    if part is None:  # Spark's stand-in for "no partition"
        return iter(())
    return read_range(part, options.client, options.password, options.include_metadata)


class BatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return _partitions(runtime().loop.run(plan_batch(self.options), PLAN_TIMEOUT_S))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


# -- streaming ----------------------------------------------------------------------------------


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"namespace/log": next sequence number}``, keys sorted (Spark compares
    offsets as JSON text). The instance Spark's stream runner keeps for a query holds a
    planner (a client) between triggers; the copies pickled to tasks hold options only."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._planner: Planner | None = None
        self._snapshots: dict[str, LogSnapshot] = {}
        self._latest: dict[str, int] | None = None
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow
        self._last_batch_at = time.monotonic()

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    def _run(self, coroutine: Any) -> Any:
        return runtime().loop.run(coroutine, PLAN_TIMEOUT_S)

    async def _planner_ready(self) -> Planner:
        if self._planner is None:
            client = await runtime().client(self.options.uri, self.options.client)
            self._planner = Planner(client, self.options.password)
        return self._planner

    async def _snapshots_now(self) -> dict[str, LogSnapshot]:
        planner = await self._planner_ready()
        keys = await resolve_logs(planner, self.options)
        self._snapshots = {key: await snapshot_of(planner, key) for key in keys}
        return self._snapshots

    # -- offsets --------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        async def initial() -> dict[str, int]:
            planner = await self._planner_ready()
            snapshots = await self._snapshots_now()
            offsets = {}
            for key, snapshot in snapshots.items():
                start = await resolve_offset(planner, snapshot, self.options.starting, "latest")
                offsets[key] = max(snapshot.first, min(start, snapshot.next))
                if self.options.subscription:
                    namespace, name = split_key(key)
                    await planner.namespace(namespace).subscribe(name, self.options.subscription)
            return dict(sorted(offsets.items()))

        return self._run(initial())  # type: ignore[no-any-return]

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger:
            return ReadMaxRows(self.options.max_records_per_trigger)
        if self.options.max_bytes_per_trigger:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        if self.options.min_records_per_trigger:
            return ReadMinRows(self.options.min_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        snapshots = self._run(self._snapshots_now())
        self._target = {key: snapshot.next for key, snapshot in snapshots.items()}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        snapshots: dict[str, LogSnapshot] = self._run(self._snapshots_now())
        latest = {key: snapshot.next for key, snapshot in snapshots.items()}
        if self._target is not None:
            latest = {
                key: min(value, self._target.get(key, value)) for key, value in latest.items()
            }
        self._latest = dict(sorted(latest.items()))
        begin = {
            key: start.get(key, snapshots[key].first) if start else snapshots[key].first
            for key in latest
        }
        backlog = {key: max(0, latest[key] - begin[key]) for key in latest}
        total = sum(backlog.values())
        now = time.monotonic()
        wanted_min = self.options.min_records_per_trigger
        if isinstance(limit, ReadMinRows):
            wanted_min = max(wanted_min, limit.min_rows)
        if (
            wanted_min
            and total < wanted_min
            and now - self._last_batch_at < self.options.max_trigger_delay_s
            and self._target is None
        ):
            return dict(sorted(begin.items()))  # wait for more
        cap = self._cap(limit, snapshots, backlog)
        end = dict(latest)
        if cap is not None and total > cap:
            for key in latest:
                share = backlog[key] * cap // total if total else 0
                end[key] = begin[key] + share
        if end != begin:
            self._last_batch_at = now
        for key, value in start.items() if start else ():
            end.setdefault(key, value)  # a log gone from the pattern keeps its offset
        return dict(sorted(end.items()))

    def _cap(
        self, limit: ReadLimit, snapshots: dict[str, LogSnapshot], backlog: dict[str, int]
    ) -> int | None:
        """The most records this trigger takes."""
        caps = []
        if self.options.max_records_per_trigger:
            caps.append(self.options.max_records_per_trigger)
        if isinstance(limit, ReadMaxRows):
            caps.append(limit.max_rows)
        max_bytes = self.options.max_bytes_per_trigger
        if isinstance(limit, ReadMaxBytes):
            max_bytes = min(max_bytes or limit.max_bytes, limit.max_bytes)
        if max_bytes:
            records = sum(
                span.end - span.start for snapshot in snapshots.values() for span in snapshot.spans
            )
            size = sum(span.length for snapshot in snapshots.values() for span in snapshot.spans)
            per_record = max(1, size // max(1, records))
            caps.append(max(1, max_bytes // per_record))
        return min(caps) if caps else None

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self._latest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        async def plan() -> list[ReadRange]:
            planner = await self._planner_ready()
            ranges: list[ReadRange] = []
            for key in sorted(end):
                low = start.get(key, 0) if start else 0
                high = end[key]
                if high <= low:
                    continue
                snapshot = self._snapshots.get(key)
                if snapshot is None or snapshot.next < high:
                    snapshot = self._snapshots[key] = await snapshot_of(planner, key)
                low = checked_start(snapshot, low, self.options.fail_on_data_loss)
                ranges += await planner.ranges(
                    snapshot,
                    low,
                    high,
                    partition_bytes=self.options.partition_bytes,
                    fail_on_data_loss=self.options.fail_on_data_loss,
                )
            return at_least(ranges, self.options.min_partitions)

        return _partitions(self._run(plan()))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Spark is done with everything before ``end``: the subscription (if any) moves to
        the last record of each log before it, so retention keeps what is not read yet."""
        if not self.options.subscription:
            return

        async def advance() -> None:
            planner = await self._planner_ready()
            for key, sequence in sorted(end.items()):
                snapshot = self._snapshots.get(key) or await snapshot_of(planner, key)
                position = await planner.position_of(snapshot, sequence - 1)
                if position is None:
                    continue
                namespace, name = split_key(key)
                await planner.namespace(namespace).commit(
                    name, self.options.subscription, position, sequence - 1
                )

        self._run(advance())

    def stop(self) -> None:
        self._planner = None  # its client is the worker's (tasks.Runtime), kept for others


# -- writing ------------------------------------------------------------------------------------


class Message(WriterCommitMessage):
    """A task's ``Written`` as Spark's commit message type."""

    def __init__(self, written: Written) -> None:
        self.written = written


def _written(messages: list[Any]) -> list[Written | None]:
    return [m.written if isinstance(m, Message) else None for m in messages]


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("bookkeeper").mode("append"|"overwrite")``: all of the DataFrame
    becomes part of the log at once, or none of it. The job id is made here, on the driver,
    and travels pickled to every task and to the commit."""

    def __init__(self, spec: SinkSpec, overwrite: bool) -> None:
        self.spec = spec
        self.overwrite = overwrite
        self.job = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Message:
        return Message(write_task(self.spec, self.job, iterator))

    def commit(self, messages: list[Any]) -> None:
        runtime().loop.run(
            commit_job(
                self.spec,
                self.job,
                _written(messages),
                writer_id=f"spark-job-{self.job}",
                writer_sequence=0,
                overwrite=self.overwrite,
            ),
            PLAN_TIMEOUT_S,
        )

    def abort(self, messages: list[Any]) -> None:
        runtime().loop.run(abort_job(self.spec, self.job), PLAN_TIMEOUT_S)


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("bookkeeper")``: each micro-batch is appended once, whatever
    Spark replays after a restart (the query's writer id and the batch id are recorded in the
    log with the batch's segments)."""

    def __init__(self, spec: SinkSpec, overwrite: bool, writer_id: str) -> None:
        self.spec = spec
        self.overwrite = overwrite
        self.writer_id = writer_id

    def _job(self, batch_id: int) -> str:
        return f"{self.writer_id}-{batch_id}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Message:
        context = TaskContext.get()
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        if batch is None:
            raise RuntimeError("a streaming write outside a micro-batch (no batch id)")
        return Message(write_task(self.spec, self._job(int(batch)), iterator, streaming=True))

    def commit(self, messages: list[Any], batchId: int) -> None:
        runtime().loop.run(
            commit_job(
                self.spec,
                self._job(batchId),
                _written(messages),
                writer_id=self.writer_id,
                writer_sequence=batchId,
                overwrite=self.overwrite,
            ),
            PLAN_TIMEOUT_S,
        )

    def abort(self, messages: list[Any], batchId: int) -> None:
        runtime().loop.run(abort_job(self.spec, self._job(batchId), retried=True), PLAN_TIMEOUT_S)
