"""Writes to a log, exactly once: each Spark task writes its rows to a ledger of its own, in
RELATIVE entries (sequence numbers, transaction ids and timestamps counted from the segment's
bases, which only the commit knows); the job's commit appends every task's ledger to the log
in one compare-and-swap (``LogNamespace.commit_ledgers``), idempotent by a writer id and
sequence (a batch job's id; a streaming query's id and batch id). A task stages its ledger
in the metadata store before writing to it (``<log>/staged/<job>/<ledger>``), so the ledgers
of failed or retried attempts, which appear in no commit message, are swept by the commit or
the abort. Nothing here imports PySpark.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from bookkeeper_py import errors
from bookkeeper_py.client.ledger import LedgerHandle
from bookkeeper_py.log.format import (
    RECORD_OVERHEAD,
    EntryFlags,
    LogConfig,
    LogExistsError,
    LogNotFoundError,
    RecordTooLargeError,
    WrittenLedger,
    check_name,
    encode_columns,
)
from bookkeeper_py.log.namespace import LOG_LEDGER_PROPERTY, JobEndedError, LogNamespace
from bookkeeper_py.spark.options import OptionError, SinkOptions
from bookkeeper_py.spark.planning import split_key
from bookkeeper_py.spark.tasks import runtime

JOB_LEDGER_PROPERTY = "bookkeeper-py.spark-job"  # in the ledger's custom metadata
ENTRY_HEADER_BYTES = 16
IN_FLIGHT_GROUPS = 8  # groups of entries sent and not yet acknowledged, per task
WRITE_TIMEOUT_S = 300.0
ENDED_JOBS_KEPT_MS = 3_600_000  # a job's ended mark outlives its late task attempts
_I64 = np.dtype("<i8")
_U32 = np.dtype("<u4")


@dataclass(frozen=True)
class SinkSpec:
    """What every task and the commit need, made once on the driver (``prepare_sink``)."""

    options: SinkOptions
    config: LogConfig

    @property
    def namespace(self) -> str:
        return split_key(self.options.log)[0]

    @property
    def log_name(self) -> str:
        return split_key(self.options.log)[1]


@dataclass(frozen=True)
class Written:
    """A task's commit message: the ledger it wrote (None: it had no rows) and its job."""

    job: str
    ledger: WrittenLedger | None


def streaming_writer_id(options: dict[str, str]) -> str:
    """The exactly-once key of a streaming query's writes: ``writerId``, else one made from
    the checkpoint location (the same query after a restart has the same one)."""
    lowered = {k.lower(): v for k, v in options.items()}
    if lowered.get("writerid"):
        try:
            return check_name("writer id", lowered["writerid"])
        except errors.BKError as error:
            raise OptionError(f"option writerId: {error}") from None
    checkpoint = lowered.get("checkpointlocation", "")
    if not checkpoint:
        raise OptionError(
            "a streaming write to a log needs option checkpointLocation (or writerId): its "
            "batches are committed exactly once per query, which these name"
        )
    return "spark-" + hashlib.sha256(checkpoint.encode()).hexdigest()[:20]


async def sink_namespace(options: SinkOptions) -> LogNamespace:
    """The sink log's namespace, on this worker's client (``tasks.Runtime.client``)."""
    client = await runtime().client(options.uri, options.client)
    return LogNamespace(client, split_key(options.log)[0], password=options.password)


async def prepare_sink(options: SinkOptions) -> SinkSpec:
    """The log's configuration (the log made first when missing and ``createLog``)."""
    logs = await sink_namespace(options)
    name = split_key(options.log)[1]
    try:
        metadata, _ = await logs.read_log(name)
    except LogNotFoundError:
        if not options.create:
            raise
        await logs.create()
        e, qw, qa = options.ensemble
        try:
            metadata = await logs.create_log(
                name, LogConfig(ensemble_size=e, write_quorum_size=qw, ack_quorum_size=qa)
            )
        except LogExistsError:
            metadata, _ = await logs.read_log(name)
    return SinkSpec(options, metadata.config)


# -- tasks -------------------------------------------------------------------------------------


class _Columns:
    """The columns of an Arrow batch the log takes: payload, and optionally transaction ids
    and timestamps (ms)."""

    def __init__(self, batch: pa.RecordBatch, options: SinkOptions) -> None:
        names = batch.schema.names
        wanted = options.payload_column or next((n for n in ("payload", "value") if n in names), "")
        if wanted not in names:
            raise OptionError(
                f"no payload column: write a binary or string column named payload or value, "
                f"or name it with option payloadColumn (the columns are {names})"
            )
        payload = batch.column(wanted)
        if payload.null_count:
            raise ValueError(f"column {wanted} holds nulls: a record's payload cannot be null")
        if pa.types.is_large_binary(payload.type) or pa.types.is_large_string(payload.type):
            payload = payload.cast(
                pa.binary() if pa.types.is_large_binary(payload.type) else pa.string()
            )
        if not (pa.types.is_binary(payload.type) or pa.types.is_string(payload.type)):
            raise OptionError(f"column {wanted} is {payload.type}: the payload is binary or string")
        count = len(payload)
        self.count = count
        self.offsets = np.frombuffer(
            payload.buffers()[1], dtype=np.int32, count=count + 1, offset=payload.offset * 4
        ).astype(np.int64)
        data = payload.buffers()[2]
        self.data = memoryview(data) if data is not None else memoryview(b"")
        self.txids = self._int_column(batch, options.txid_column, "txidColumn")
        self.timestamps = self._int_column(batch, options.timestamp_column, "timestampColumn")

    @staticmethod
    def _int_column(batch: pa.RecordBatch, name: str, option: str) -> np.ndarray | None:
        if not name:
            return None
        if name not in batch.schema.names:
            raise OptionError(f"option {option}={name}: no such column ({batch.schema.names})")
        column = batch.column(name)
        if column.null_count:
            raise ValueError(f"column {name} holds nulls")
        if pa.types.is_timestamp(column.type):  # to ms since the epoch
            raw = np.asarray(column.cast(pa.int64()).to_numpy(zero_copy_only=False), np.int64)
            unit = column.type.unit
            if unit == "s":
                return raw * 1000
            return raw // {"ms": 1, "us": 1000, "ns": 1_000_000}[unit]
        if pa.types.is_integer(column.type):
            return np.asarray(column.cast(pa.int64()).to_numpy(zero_copy_only=False), np.int64)
        raise OptionError(f"option {option}={name}: the column is {column.type}, not a number")


class TaskWriter:
    """One task's ledger: rows in, RELATIVE entries out, pipelined (a few groups of entries
    in flight on the worker's loop while the task's thread encodes the next)."""

    def __init__(self, spec: SinkSpec, job: str, *, skip_if_ended: bool = False) -> None:
        self.spec = spec
        self.job = job
        self.skip_if_ended = skip_if_ended
        self.skipped = False
        self.run = runtime()
        self.entry_bytes = min(
            spec.options.entry_bytes, spec.config.max_entry_bytes - ENTRY_HEADER_BYTES
        )
        self.handle: LedgerHandle | None = None
        self.count = 0
        self.entries = 0
        self.last_entry_count = 0
        self.first_txid = self.last_txid = -1
        self.first_stamp = self.last_stamp = -1
        self._groups: deque[concurrent.futures.Future[Any]] = deque()

    async def _open(self) -> LedgerHandle:
        spec = self.spec
        config = spec.config
        namespace = await sink_namespace(spec.options)
        client = namespace.client
        handle = await client.create_ledger(
            config.ensemble_size,
            config.write_quorum_size,
            config.ack_quorum_size,
            config.digest_type,
            spec.options.password,
            {
                LOG_LEDGER_PROPERTY: spec.options.log.encode(),
                JOB_LEDGER_PROPERTY: self.job.encode(),
            },
        )
        try:
            await namespace.stage_ledger(spec.log_name, self.job, handle.ledger_id)
        except BaseException:
            await handle.close()
            await client.delete_ledger(handle.ledger_id)
            raise
        return handle

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0 or self.skipped:
            return
        columns = _Columns(batch, self.spec.options)
        if self.handle is None:
            try:
                self.handle = self.run.loop.run(self._open(), WRITE_TIMEOUT_S)
            except JobEndedError:
                if not self.skip_if_ended:
                    raise
                self.skipped = True  # a replayed streaming batch, committed already
                return
        txids = self._relative_txids(columns)
        stamps = self._relative_stamps(columns)
        offsets = columns.offsets
        sizes = np.diff(offsets) + RECORD_OVERHEAD - 8  # txid, timestamp, length
        if int(sizes.max()) > self.entry_bytes:
            raise RecordTooLargeError(
                f"a record of {int(sizes.max()) - RECORD_OVERHEAD + 8} bytes does not fit in an "
                f"entry of log {self.spec.options.log} (raise option entryBytes, at most the "
                "log's max_entry_bytes)"
            )
        ends = np.cumsum(sizes)
        entries = []
        start = 0
        total = columns.count
        while start < total:
            base = ends[start - 1] if start else 0
            stop = int(np.searchsorted(ends, base + self.entry_bytes, side="right"))
            stop = max(stop, start + 1)
            first, last = int(offsets[start]), int(offsets[stop])
            entries.append(
                encode_columns(
                    self.count + start,
                    stop - start,
                    txids[start:stop].astype(_I64).tobytes(),
                    stamps[start:stop].astype(_I64).tobytes(),
                    np.diff(offsets[start : stop + 1]).astype(_U32).tobytes(),
                    [columns.data[first:last]],
                    flags=EntryFlags.RELATIVE,
                )
            )
            self.last_entry_count = stop - start
            start = stop
        self.count += total
        self.entries += len(entries)
        self._send(entries)

    def _relative_txids(self, columns: _Columns) -> np.ndarray:
        if columns.txids is None:
            return np.arange(self.count, self.count + columns.count, dtype=np.int64)
        relative, self.first_txid, self.last_txid = _relative(
            columns.txids,
            self.first_txid,
            self.last_txid,
            strictly=True,
            what=f"column {self.spec.options.txid_column}: transaction ids must increase",
        )
        return relative

    def _relative_stamps(self, columns: _Columns) -> np.ndarray:
        if columns.timestamps is None:
            return np.zeros(columns.count, dtype=np.int64)
        relative, self.first_stamp, self.last_stamp = _relative(
            columns.timestamps,
            self.first_stamp,
            self.last_stamp,
            strictly=False,
            what=f"column {self.spec.options.timestamp_column}: timestamps must not go back",
        )
        return relative

    def _send(self, entries: list[bytes]) -> None:
        handle = self.handle
        assert handle is not None

        async def add_all() -> None:
            import asyncio

            await asyncio.gather(*(handle.add_entry_async(entry) for entry in entries))

        self._groups.append(self.run.loop.submit(add_all()))
        while len(self._groups) > IN_FLIGHT_GROUPS:
            self._groups.popleft().result(WRITE_TIMEOUT_S)

    def finish(self) -> Written:
        """Waits for every entry, closes the ledger: the task's commit message."""
        if self.handle is None:
            return Written(self.job, None)
        while self._groups:
            self._groups.popleft().result(WRITE_TIMEOUT_S)
        handle = self.handle
        self.run.loop.run(handle.close(), WRITE_TIMEOUT_S)
        return Written(
            self.job,
            WrittenLedger(
                ledger_id=handle.ledger_id,
                record_count=self.count,
                byte_count=handle.length,
                last_entry=self.entries - 1,
                last_slot=self.last_entry_count - 1,
                first_txid=self.first_txid,
                last_txid=self.last_txid,
                first_timestamp=self.first_stamp,
                last_timestamp=self.last_stamp,
            ),
        )


def _relative(
    given: np.ndarray, first: int, last: int, *, strictly: bool, what: str
) -> tuple[np.ndarray, int, int]:
    """``given`` (a task's next values of a column) checked to increase (``strictly``) or not
    to go back from ``last``, as offsets from the task's first value; (offsets, first, last).
    ``first`` -1: none yet."""
    steps = np.diff(given)
    going_back = np.any(steps <= 0) if strictly else np.any(steps < 0)
    if first >= 0:
        going_back = going_back or (given[0] <= last if strictly else given[0] < last)
    if going_back:
        raise ValueError(f"{what} within a task (sort the rows by it)")
    if first < 0:
        first = int(given[0])
    return given - first, first, int(given[-1])


def write_task(
    spec: SinkSpec, job: str, batches: Iterator[pa.RecordBatch], *, streaming: bool = False
) -> Written:
    """A task's rows into a ledger of its own. A streaming batch's job is the query's writer
    id and the batch id: when Spark replays a batch that was committed, its tasks find the job
    ended and write nothing."""
    writer = TaskWriter(spec, job, skip_if_ended=streaming)
    for batch in batches:
        writer.write(batch)
    return writer.finish()


# -- the driver's commit and abort ---------------------------------------------------------------


async def commit_job(
    spec: SinkSpec,
    job: str,
    messages: list[Written | None],
    *,
    writer_id: str,
    writer_sequence: int,
    overwrite: bool,
) -> bool:
    """Appends the tasks' ledgers to the log (once: False when this writer id and sequence
    were committed before), then sweeps the job's staged ledgers that are not in the log (a
    failed attempt's)."""
    ledgers = [m.ledger for m in messages if m is not None and m.ledger is not None]
    logs = await sink_namespace(spec.options)
    committed = await logs.commit_ledgers(
        spec.log_name,
        ledgers,
        writer_id=writer_id,
        writer_sequence=writer_sequence,
        overwrite=overwrite,
    )
    await _sweep(logs, spec.log_name, job)
    return committed


async def abort_job(spec: SinkSpec, job: str, *, retried: bool = False) -> list[int]:
    """Deletes the job's staged ledgers (those a commit already put in the log stay). A job
    that will be ``retried`` under the same name (a streaming batch) is not ended: its retry
    stages anew, and its commit sweeps what late attempts left."""
    logs = await sink_namespace(spec.options)
    return await _sweep(logs, spec.log_name, job, end=not retried)


async def _sweep(logs: LogNamespace, log_name: str, job: str, *, end: bool = True) -> list[int]:
    """Ends the job (a late task attempt can stage no more), then deletes its staged ledgers
    that are not in the log, and forgets the marks of jobs that ended long ago."""
    if end:
        await logs.end_job(log_name, job)
    metadata, _ = await logs.read_log(log_name)
    in_log = frozenset(s.ledger_id for s in metadata.segments)
    deleted = await logs.unstage(log_name, job, delete_ledgers=True, keep=in_log)
    await logs.forget_ended_jobs(log_name, ENDED_JOBS_KEPT_MS)
    return deleted
