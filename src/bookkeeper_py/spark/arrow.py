"""Log entries and raw ledger entries as Arrow record batches, built by columns: a batch of
entries costs a few numpy and Arrow calls per entry, never a Python step per record (an entry
holds hundreds to thousands of records). The schemas here are the data source's; an Arrow
batch must match Spark's conversion of them exactly (``pa.binary()``, nullable fields,
timestamps in µs UTC), or Spark refuses it (``DATA_SOURCE_RETURN_SCHEMA_MISMATCH``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from bookkeeper_py.log.format import EntryFlags, LogFormatError, entry_layout, relative_bases

LOG_SCHEMA_DDL = (
    "log string, ledger_id long, entry_id long, slot int, sequence long, txid long, "
    "timestamp timestamp, payload binary"
)
METADATA_DDL = ", segment long, writer_id string, writer_sequence long"
LEDGER_SCHEMA_DDL = "ledger_id long, entry_id long, payload binary"

_LOG_FIELDS = [
    pa.field("log", pa.string()),
    pa.field("ledger_id", pa.int64()),
    pa.field("entry_id", pa.int64()),
    pa.field("slot", pa.int32()),
    pa.field("sequence", pa.int64()),
    pa.field("txid", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("payload", pa.binary()),
]
_METADATA_FIELDS = [
    pa.field("segment", pa.int64()),
    pa.field("writer_id", pa.string()),
    pa.field("writer_sequence", pa.int64()),
]
LOG_SCHEMA = pa.schema(_LOG_FIELDS)
LOG_SCHEMA_WITH_METADATA = pa.schema(_LOG_FIELDS + _METADATA_FIELDS)
LEDGER_SCHEMA = pa.schema(
    [
        pa.field("ledger_id", pa.int64()),
        pa.field("entry_id", pa.int64()),
        pa.field("payload", pa.binary()),
    ]
)
_LITTLE = sys.byteorder == "little"
_I64 = np.dtype("<i8")
_U32 = np.dtype("<u4")


def log_schema_ddl(include_metadata: bool) -> str:
    return LOG_SCHEMA_DDL + (METADATA_DDL if include_metadata else "")


def _constant_strings(text: str, count: int) -> pa.Array:
    """``count`` copies of ``text`` as a string array, from buffers."""
    raw = text.encode()
    offsets = np.arange(count + 1, dtype=np.int64) * len(raw)
    return pa.Array.from_buffers(
        pa.string(),
        count,
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(raw * count)],
    )


def _binary(lengths: np.ndarray, data: bytes) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] != len(data):
        raise LogFormatError(f"record lengths add up to {offsets[-1]} bytes, not {len(data)}")
    if offsets[-1] >= 2**31:
        raise ValueError("a batch of over 2 GiB of records: read smaller ranges")
    return pa.Array.from_buffers(
        pa.binary(),
        len(lengths),
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
    )


def log_batch(
    log: str,
    ledger_id: int,
    entries: Sequence[tuple[int, bytes]],
    start_sequence: int,
    end_sequence: int,
    *,
    segment: int = -1,
    bases: tuple[int, int, int] | None = None,
    include_metadata: bool = False,
) -> pa.RecordBatch | None:
    """The records of ``entries`` ((entry id, log entry) in entry order, one ledger) whose log
    sequence number is in [``start_sequence``, ``end_sequence``) (``end_sequence`` -1: no
    end), as one batch; None when there is none. ``bases``: the segment's start sequence,
    first transaction id and first timestamp, which RELATIVE entries count from."""
    entry_ids: list[int] = []
    counts: list[int] = []
    firsts: list[int] = []
    txids: list[bytes | memoryview] = []
    timestamps: list[bytes | memoryview] = []
    lengths: list[bytes | memoryview] = []
    payloads: list[bytes | memoryview] = []
    writers: list[str] = []
    writer_sequences: list[bytes | memoryview] = []
    shifts: list[tuple[int, int, int]] = []
    for entry_id, data in entries:
        where = f"log {log} ledger {ledger_id} entry {entry_id}"
        layout = entry_layout(data, where)
        count = layout.count
        if count == 0:
            continue
        entry_ids.append(entry_id)
        counts.append(count)
        if layout.flags & EntryFlags.RELATIVE:
            if bases is None:
                relative_bases(None, where)
            shifts.append(bases)  # type: ignore[arg-type]
        else:
            shifts.append((0, 0, 0))
        firsts.append(layout.first_sequence)
        view = memoryview(data)
        txids.append(view[layout.txids : layout.timestamps])
        timestamps.append(view[layout.timestamps : layout.lengths])
        lengths.append(view[layout.lengths : layout.payloads])
        payloads.append(view[layout.payloads :])
        if include_metadata:
            writers.append(layout.writer_id)
            if layout.writer_sequences >= 0:
                writer_sequences.append(view[layout.writer_sequences : layout.txids])
            else:
                writer_sequences.append(np.full(count, -1, dtype=_I64).tobytes())
    if not counts:
        return None
    count_array = np.array(counts, dtype=np.int64)
    total = int(count_array.sum())
    starts = np.cumsum(count_array) - count_array
    slot = np.arange(total, dtype=np.int64) - np.repeat(starts, count_array)
    shift = np.array(shifts, dtype=np.int64).reshape(-1, 3)
    shifted = bool(shift.any())
    sequence = np.repeat(np.array(firsts, dtype=np.int64) + shift[:, 0], count_array) + slot
    low = int(np.searchsorted(sequence, start_sequence, side="left"))
    high = total if end_sequence < 0 else int(np.searchsorted(sequence, end_sequence, "left"))
    if low >= high:
        return None
    length_array = np.frombuffer(b"".join(lengths), dtype=_U32)
    txid_array = np.frombuffer(b"".join(txids), dtype=_I64).astype(np.int64)
    stamp_array = np.frombuffer(b"".join(timestamps), dtype=_I64).astype(np.int64)
    if shifted:
        txid_array += np.repeat(shift[:, 1], count_array)
        stamp_array += np.repeat(shift[:, 2], count_array)
    columns = [
        _constant_strings(log, total),
        pa.array(np.full(total, ledger_id, dtype=np.int64)),
        pa.array(np.repeat(np.array(entry_ids, dtype=np.int64), count_array)),
        pa.array(slot.astype(np.int32)),
        pa.array(sequence),
        pa.array(txid_array),
        pa.array(stamp_array * 1000, pa.timestamp("us", tz="UTC")),
        _binary(length_array, b"".join(payloads)),
    ]
    schema = LOG_SCHEMA
    if include_metadata:
        writer_ids = pa.array(np.repeat(np.array(writers, dtype=object), count_array), pa.string())
        columns += [
            pa.array(np.full(total, segment, dtype=np.int64)),
            writer_ids,
            pa.array(np.frombuffer(b"".join(writer_sequences), dtype=_I64).astype(np.int64)),
        ]
        schema = LOG_SCHEMA_WITH_METADATA
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    return batch if (low, high) == (0, total) else batch.slice(low, high - low)


def ledger_batch(ledger_id: int, entries: Sequence[tuple[int, bytes]]) -> pa.RecordBatch:
    """Raw entries of a ledger (their data, without BookKeeper's header and digest)."""
    lengths = np.array([len(data) for _, data in entries], dtype=np.int64)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(len(entries), ledger_id, dtype=np.int64)),
            pa.array(np.array([entry_id for entry_id, _ in entries], dtype=np.int64)),
            _binary(lengths, b"".join(data for _, data in entries)),
        ],
        schema=LEDGER_SCHEMA,
    )
