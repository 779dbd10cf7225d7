"""What logs keep in the metadata store and in their ledgers' entries, byte by byte.

``docs/formats/logs.md`` documents every field; the values here are little-endian and start
with a magic and a format version, so that a newer reader can refuse what it does not know.

- A **log** is one node holding its configuration and its list of segments (one ledger each),
  changed only by compare-and-swap of the whole value (``LogMetadata``).
- A **subscription** is a node under its log holding a durable position (``Subscription``).
- A ledger **entry** of a log holds a batch of records in columns (``encode_entry`` /
  ``decode_entry``), or a control record that carries no user data.
"""

from __future__ import annotations

import re
import struct
import sys
from array import array
from dataclasses import dataclass, field, replace
from enum import IntEnum
from itertools import accumulate
from typing import NamedTuple

from bookkeeper_py.errors import BKError, IncorrectParameterError
from bookkeeper_py.wire.digest import DigestType

LOG_MAGIC = b"BKLG"
NAMESPACE_MAGIC = b"BKNS"
SUBSCRIPTION_MAGIC = b"BKSB"
FORMAT_VERSION = 1
ENTRY_VERSION = 1

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


class LogError(BKError):
    """A log operation failed."""


class LogFencedError(LogError):
    """Another writer took the log over: this writer can append no more."""


class LogNotFoundError(LogError):
    """No such log or namespace."""


class LogExistsError(LogError):
    """The log or namespace exists already."""


class EndOfStreamError(LogError):
    """The log was ended (``mark_end_of_stream``): nothing can be appended to it."""


class RecordTooLargeError(LogError, ValueError):
    """A record does not fit in one entry of the log."""


class LogFormatError(LogError):
    """Stored log metadata or a log entry is not in a format this version reads."""


def check_name(kind: str, name: str) -> str:
    """Names of namespaces, logs and subscriptions: 1-255 of ``A-Za-z0-9._-``, not starting
    with ``.``, ``_`` or ``-`` (they are path components in the metadata store)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise IncorrectParameterError(
            f"invalid {kind} name {name!r}: use 1-255 characters of A-Z a-z 0-9 . _ -, "
            "starting with a letter or a digit"
        )
    return name


class Position(NamedTuple):
    """Where a record is: its ledger, its entry in that ledger and its slot in the entry.
    Positions compare as tuples, which is log order (a log's ledger ids increase)."""

    ledger_id: int
    entry_id: int
    slot: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}:{self.slot}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """``ledger:entry:slot`` (as ``str`` writes it)."""
        parts = text.split(":")
        try:
            if len(parts) != 3:
                raise ValueError
            return cls(*(int(part) for part in parts))
        except ValueError:
            raise IncorrectParameterError(
                f"invalid position {text!r}: write it as ledger:entry:slot, e.g. 12:0:0"
            ) from None


# As Pulsar's broker deduplication answers (-1:-1): the record was appended before.
DUPLICATE = Position(-1, -1, -1)


class LogRecord(NamedTuple):
    """A record as read: where it is, its sequence number in the log (0, 1, 2... across
    segments), its transaction id, its timestamp (ms since the epoch) and its bytes."""

    ledger_id: int
    entry_id: int
    slot: int
    sequence: int
    txid: int
    timestamp: int
    data: bytes

    @property
    def position(self) -> Position:
        return Position(self.ledger_id, self.entry_id, self.slot)


# -- configuration and segments ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogConfig:
    """A log's ledger parameters, roll and retention policies (0 turns a limit off)."""

    ensemble_size: int = 3
    write_quorum_size: int = 2
    ack_quorum_size: int = 2
    digest_type: DigestType = DigestType.CRC32C
    roll_bytes: int = 256 * 1024 * 1024  # DistributedLog's default
    roll_age_ms: int = 2 * 60 * 60 * 1000
    roll_records: int = 0
    retention_age_ms: int = 0
    retention_bytes: int = 0
    max_entry_bytes: int = 1024 * 1024
    # the placement policy its ledgers need ("" = whatever the writer's client uses): a writer
    # whose client has another one is refused
    placement: str = ""

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise IncorrectParameterError(
                f"unknown placement policy {self.placement!r} for a log: use one of "
                f"{', '.join(repr(p) for p in PLACEMENTS)} ('' = the client's)"
            )
        if not 255 >= self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size >= 1:
            raise IncorrectParameterError(
                f"a log's ledgers need 255 >= ensemble >= write quorum >= ack quorum >= 1, got "
                f"{self.ensemble_size}/{self.write_quorum_size}/{self.ack_quorum_size}"
            )
        for name in ("roll_bytes", "roll_age_ms", "roll_records"):
            if getattr(self, name) < 0:
                raise IncorrectParameterError(f"{name} is >= 0 (0: never roll on it)")
        for name in ("retention_age_ms", "retention_bytes"):
            if getattr(self, name) < 0:
                raise IncorrectParameterError(f"{name} is >= 0 (0: keep everything)")
        if not 4096 <= self.max_entry_bytes <= 4 * 1024 * 1024:
            raise IncorrectParameterError(
                f"max_entry_bytes is between 4096 and 4194304 (a bookie's frame limit), got "
                f"{self.max_entry_bytes}"
            )


class SegmentState(IntEnum):
    OPEN = 0
    CLOSED = 1
    TRUNCATED = 2


@dataclass(frozen=True, slots=True)
class Segment:
    """One ledger of a log. For an open segment the counts, ends and ids are unknown (-1 and
    0) until it is closed (by its writer, or by the next writer's recovery)."""

    sequence: int  # 1, 2, 3... in log order
    ledger_id: int
    state: SegmentState = SegmentState.OPEN
    writer_id: str = ""
    min_entry: int = 0  # records before (min_entry, min_slot) were truncated
    min_slot: int = 0
    last_entry: int = -1  # the last data record's position (closed, not empty)
    last_slot: int = -1
    start_sequence: int = -1  # the log sequence number of its first record
    record_count: int = 0
    byte_count: int = 0  # bytes of its ledger (entries with their headers): what retention counts
    first_txid: int = -1
    last_txid: int = -1
    first_timestamp: int = -1
    last_timestamp: int = -1
    last_writer_sequence: int = -1
    created_ms: int = 0
    closed_ms: int = 0

    @property
    def is_open(self) -> bool:
        return self.state == SegmentState.OPEN

    @property
    def end_sequence(self) -> int:
        """The sequence number after its last record (closed segments)."""
        return self.start_sequence + self.record_count

    @property
    def first_position(self) -> Position:
        return Position(self.ledger_id, self.min_entry, self.min_slot)

    @property
    def last_position(self) -> Position | None:
        if self.last_entry < 0:
            return None
        return Position(self.ledger_id, self.last_entry, self.last_slot)


@dataclass(frozen=True, slots=True)
class WrittenLedger:
    """A closed ledger of RELATIVE entries written for a log before its place in it was known
    (a Spark task's), as ``commit_ledgers`` appends it. Transaction ids and timestamps are
    the ones its writer gave (-1: assigned by the commit: ids after the log's last, the
    commit's time)."""

    ledger_id: int
    record_count: int
    byte_count: int  # the closed ledger's length
    last_entry: int  # the entry of its last record
    last_slot: int
    first_txid: int = -1
    last_txid: int = -1
    first_timestamp: int = -1
    last_timestamp: int = -1


MAX_WRITERS_KEPT = 1000  # idempotent writers remembered per log (the least recent forgotten)


@dataclass(frozen=True, slots=True)
class LogMetadata:
    """A log's value in the metadata store."""

    config: LogConfig = field(default_factory=LogConfig)
    created_ms: int = 0
    end_of_stream: bool = False
    deleting: bool = False
    next_segment: int = 1
    # floors left by segments dropped from the list after truncation: the sequence number
    # after their last record, their last transaction id and timestamp
    base_sequence: int = 0
    base_txid: int = -1
    base_timestamp: int = -1
    segments: tuple[Segment, ...] = ()
    # idempotent writer id -> the last writer sequence number durable in the log
    writers: tuple[tuple[str, int], ...] = ()

    @property
    def last_segment(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    def without_segments(self, sequences: set[int]) -> LogMetadata:
        """The list without these (truncated, deleted) segments; the floors keep what they
        held."""
        dropped = [s for s in self.segments if s.sequence in sequences]
        return replace(
            self,
            segments=tuple(s for s in self.segments if s.sequence not in sequences),
            base_sequence=max(
                [self.base_sequence] + [s.end_sequence for s in dropped if s.start_sequence >= 0]
            ),
            base_txid=max([self.base_txid] + [s.last_txid for s in dropped]),
            base_timestamp=max([self.base_timestamp] + [s.last_timestamp for s in dropped]),
        )

    def replace_segment(self, segment: Segment) -> LogMetadata:
        return replace(
            self,
            segments=tuple(segment if s.sequence == segment.sequence else s for s in self.segments),
        )

    def segment(self, sequence: int) -> Segment | None:
        for segment in self.segments:
            if segment.sequence == sequence:
                return segment
        return None

    def writer_sequence(self, writer_id: str) -> int:
        """The last durable sequence number of an idempotent writer (-1: none)."""
        for name, sequence in self.writers:
            if name == writer_id:
                return sequence
        best = -1
        for segment in self.segments:
            if segment.writer_id == writer_id and not segment.is_open:
                best = max(best, segment.last_writer_sequence)
        return best

    def with_writer_sequence(self, writer_id: str, sequence: int) -> LogMetadata:
        if not writer_id or sequence < 0:
            return self
        kept = [(name, seq) for name, seq in self.writers if name != writer_id]
        old = self.writer_sequence(writer_id)
        kept.append((writer_id, max(old, sequence)))
        return replace(self, writers=tuple(kept[-MAX_WRITERS_KEPT:]))

    @property
    def live_segments(self) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.state != SegmentState.TRUNCATED)


_HEADER = struct.Struct("<4sHHq")
_CONFIG = struct.Struct("<BBBBQQQQQIB")
PLACEMENTS = ("", "random", "rackaware", "regionaware")  # stored as the index
_SEGMENT = struct.Struct("<QqBqiqiqqqqqqqqqq")
_COUNT = struct.Struct("<I")
_BASES = struct.Struct("<Qqqq")
_WRITER_SEQ = struct.Struct("<q")
_FLAG_END_OF_STREAM = 1
_FLAG_DELETING = 2


def _put_name(out: bytearray, name: str) -> None:
    raw = name.encode()
    out.append(len(raw))
    out += raw


def _get_name(data: bytes, offset: int) -> tuple[str, int]:
    length = data[offset]
    end = offset + 1 + length
    if end > len(data):
        raise LogFormatError("a name runs past the end of the value")
    return data[offset + 1 : end].decode(), end


def encode_log(metadata: LogMetadata) -> bytes:
    config = metadata.config
    flags = (_FLAG_END_OF_STREAM if metadata.end_of_stream else 0) | (
        _FLAG_DELETING if metadata.deleting else 0
    )
    out = bytearray(_HEADER.pack(LOG_MAGIC, FORMAT_VERSION, flags, metadata.created_ms))
    out += _CONFIG.pack(
        config.ensemble_size,
        config.write_quorum_size,
        config.ack_quorum_size,
        int(config.digest_type),
        config.roll_bytes,
        config.roll_age_ms,
        config.roll_records,
        config.retention_age_ms,
        config.retention_bytes,
        config.max_entry_bytes,
        PLACEMENTS.index(config.placement),
    )
    out += _BASES.pack(
        metadata.next_segment,
        metadata.base_sequence,
        metadata.base_txid,
        metadata.base_timestamp,
    )
    out += _COUNT.pack(len(metadata.writers))
    for name, sequence in metadata.writers:
        _put_name(out, name)
        out += _WRITER_SEQ.pack(sequence)
    out += _COUNT.pack(len(metadata.segments))
    for s in metadata.segments:
        out += _SEGMENT.pack(
            s.sequence,
            s.ledger_id,
            int(s.state),
            s.min_entry,
            s.min_slot,
            s.last_entry,
            s.last_slot,
            s.start_sequence,
            s.record_count,
            s.byte_count,
            s.first_txid,
            s.last_txid,
            s.first_timestamp,
            s.last_timestamp,
            s.last_writer_sequence,
            s.created_ms,
            s.closed_ms,
        )
        _put_name(out, s.writer_id)
    return bytes(out)


def decode_log(data: bytes, where: str = "log") -> LogMetadata:
    try:
        magic, version, flags, created = _HEADER.unpack_from(data, 0)
        if magic != LOG_MAGIC:
            raise LogFormatError(f"{where}: not a log (magic {magic!r})")
        if version != FORMAT_VERSION:
            raise LogFormatError(
                f"{where}: log format version {version}, this version reads {FORMAT_VERSION}: "
                "upgrade bookkeeper-py"
            )
        if flags & ~(_FLAG_END_OF_STREAM | _FLAG_DELETING):
            raise LogFormatError(
                f"{where}: unknown log flags {flags:#x} (written by a newer version): upgrade "
                "bookkeeper-py"
            )
        offset = _HEADER.size
        fields = _CONFIG.unpack_from(data, offset)
        offset += _CONFIG.size
        config = LogConfig(
            ensemble_size=fields[0],
            write_quorum_size=fields[1],
            ack_quorum_size=fields[2],
            digest_type=DigestType(fields[3]),
            roll_bytes=fields[4],
            roll_age_ms=fields[5],
            roll_records=fields[6],
            retention_age_ms=fields[7],
            retention_bytes=fields[8],
            max_entry_bytes=fields[9],
            placement=PLACEMENTS[fields[10]],
        )
        next_segment, base_sequence, base_txid, base_timestamp = _BASES.unpack_from(data, offset)
        offset += _BASES.size
        (count,) = _COUNT.unpack_from(data, offset)
        offset += _COUNT.size
        writers = []
        for _ in range(count):
            name, offset = _get_name(data, offset)
            (sequence,) = _WRITER_SEQ.unpack_from(data, offset)
            offset += _WRITER_SEQ.size
            writers.append((name, sequence))
        (count,) = _COUNT.unpack_from(data, offset)
        offset += _COUNT.size
        segments = []
        for _ in range(count):
            v = _SEGMENT.unpack_from(data, offset)
            offset += _SEGMENT.size
            writer_id, offset = _get_name(data, offset)
            segments.append(
                Segment(
                    sequence=v[0],
                    ledger_id=v[1],
                    state=SegmentState(v[2]),
                    writer_id=writer_id,
                    min_entry=v[3],
                    min_slot=v[4],
                    last_entry=v[5],
                    last_slot=v[6],
                    start_sequence=v[7],
                    record_count=v[8],
                    byte_count=v[9],
                    first_txid=v[10],
                    last_txid=v[11],
                    first_timestamp=v[12],
                    last_timestamp=v[13],
                    last_writer_sequence=v[14],
                    created_ms=v[15],
                    closed_ms=v[16],
                )
            )
        if offset != len(data):
            raise LogFormatError(f"{where}: {len(data) - offset} bytes after the last segment")
    except (struct.error, ValueError, UnicodeDecodeError, IndexError) as error:
        if isinstance(error, LogError):
            raise
        raise LogFormatError(f"{where}: corrupt log metadata ({error})") from None
    return LogMetadata(
        config=config,
        created_ms=created,
        end_of_stream=bool(flags & _FLAG_END_OF_STREAM),
        deleting=bool(flags & _FLAG_DELETING),
        next_segment=next_segment,
        base_sequence=base_sequence,
        base_txid=base_txid,
        base_timestamp=base_timestamp,
        segments=tuple(segments),
        writers=tuple(writers),
    )


_NAMESPACE = struct.Struct("<4sHq")


def encode_namespace(created_ms: int) -> bytes:
    return _NAMESPACE.pack(NAMESPACE_MAGIC, FORMAT_VERSION, created_ms)


def decode_namespace(data: bytes, where: str) -> int:
    """The namespace's creation time."""
    try:
        magic, version, created = _NAMESPACE.unpack(data)
        created = int(created)
    except struct.error:
        raise LogFormatError(f"{where}: not a namespace of logs") from None
    if magic != NAMESPACE_MAGIC or version != FORMAT_VERSION:
        raise LogFormatError(f"{where}: namespace format {magic!r} v{version} is not known")
    return created


@dataclass(frozen=True, slots=True)
class Subscription:
    """A named durable position: the last record its consumer is done with (``sequence`` is
    that record's log sequence number; -1 and (0, -1, -1) before any)."""

    name: str
    position: Position
    sequence: int
    updated_ms: int


_SUBSCRIPTION = struct.Struct("<4sHqqiqq")


def encode_subscription(subscription: Subscription) -> bytes:
    p = subscription.position
    return _SUBSCRIPTION.pack(
        SUBSCRIPTION_MAGIC,
        FORMAT_VERSION,
        p.ledger_id,
        p.entry_id,
        p.slot,
        subscription.sequence,
        subscription.updated_ms,
    )


def decode_subscription(name: str, data: bytes) -> Subscription:
    try:
        magic, version, ledger_id, entry_id, slot, sequence, updated = _SUBSCRIPTION.unpack(data)
    except struct.error:
        raise LogFormatError(f"subscription {name!r}: corrupt value") from None
    if magic != SUBSCRIPTION_MAGIC or version != FORMAT_VERSION:
        raise LogFormatError(f"subscription {name!r}: format {magic!r} v{version} is not known")
    return Subscription(name, Position(ledger_id, entry_id, slot), sequence, updated)


# -- entries: batches of records ---------------------------------------------------------------


class EntryFlags:
    CONTROL = 1  # no user records: a keep-alive, or one of the flags below
    END_OF_STREAM = 2  # the log was ended after the records before this entry
    WRITER = 4  # an idempotent writer's id and per-record sequence numbers follow the header
    END_OF_SEGMENT = 8  # the writer rolled: the next records are in the next segment
    # first_sequence, transaction ids and timestamps are offsets from the segment's
    # start_sequence, first_txid and first_timestamp (a ledger written before its place in the
    # log was known: a Spark task's, appended by the job's commit)
    RELATIVE = 16


_ENTRY_HEADER = struct.Struct("<BBHIq")
_KNOWN_ENTRY_FLAGS = (
    EntryFlags.CONTROL
    | EntryFlags.END_OF_STREAM
    | EntryFlags.WRITER
    | EntryFlags.END_OF_SEGMENT
    | EntryFlags.RELATIVE
)
_BIG_ENDIAN = sys.byteorder == "big"


def _column(typecode: str, values: array | list[int]) -> bytes:  # type: ignore[type-arg]
    column = values if isinstance(values, array) else array(typecode, values)
    if _BIG_ENDIAN:
        column = array(typecode, column)
        column.byteswap()
    return column.tobytes()


def encode_entry(
    first_sequence: int,
    txids: list[int],
    timestamps: list[int],
    payloads: list[bytes],
    writer_id: str = "",
    writer_sequences: list[int] | None = None,
    flags: int = 0,
) -> bytes:
    """One entry holding ``payloads`` (with their transaction ids and timestamps), the first
    being record ``first_sequence`` of the log."""
    return encode_columns(
        first_sequence,
        len(payloads),
        _column("q", txids),
        _column("q", timestamps),
        _column("I", [len(p) for p in payloads]),
        payloads,
        writer_id=writer_id,
        writer_sequences=_column("q", writer_sequences or []) if writer_id else b"",
        flags=flags,
    )


def encode_columns(
    first_sequence: int,
    count: int,
    txids: bytes | memoryview,
    timestamps: bytes | memoryview,
    lengths: bytes | memoryview,
    payloads: list[bytes] | list[memoryview] | list[bytes | memoryview],
    *,
    writer_id: str = "",
    writer_sequences: bytes | memoryview = b"",
    flags: int = 0,
) -> bytes:
    """An entry from columns already in their stored form (little-endian i64 transaction ids
    and timestamps, u32 lengths) and the records' bytes back to back (in any number of
    pieces): what a columnar writer (a Spark task) hands over without a step per record."""
    parts: list[bytes | memoryview] = [
        _ENTRY_HEADER.pack(
            ENTRY_VERSION, flags | (EntryFlags.WRITER if writer_id else 0), 0, count, first_sequence
        )
    ]
    if writer_id:
        raw = writer_id.encode()
        parts.append(bytes((len(raw),)) + raw)
        parts.append(writer_sequences)
    parts += [txids, timestamps, lengths, *payloads]
    return b"".join(parts)


def encode_control(flags: int, next_sequence: int) -> bytes:
    """A control entry (no records): ``next_sequence`` is the log sequence number of the next
    record."""
    return _ENTRY_HEADER.pack(ENTRY_VERSION, EntryFlags.CONTROL | flags, 0, 0, next_sequence)


ENTRY_OVERHEAD = _ENTRY_HEADER.size + 1 + 255
RECORD_OVERHEAD = 8 + 8 + 4 + 8  # txid, timestamp, length, writer sequence


@dataclass(slots=True)
class DecodedEntry:
    """An entry's records in columns."""

    flags: int
    first_sequence: int
    txids: array  # type: ignore[type-arg]
    timestamps: array  # type: ignore[type-arg]
    payloads: list[bytes]
    writer_id: str = ""
    writer_sequences: array | None = None  # type: ignore[type-arg]

    @property
    def is_control(self) -> bool:
        return bool(self.flags & EntryFlags.CONTROL)

    def records(self, ledger_id: int, entry_id: int, first_slot: int = 0) -> list[LogRecord]:
        """The records as ``LogRecord``s, from slot ``first_slot`` on."""
        new = tuple.__new__
        txids = self.txids
        timestamps = self.timestamps
        payloads = self.payloads
        first = self.first_sequence
        return [
            new(
                LogRecord, (ledger_id, entry_id, i, first + i, txids[i], timestamps[i], payloads[i])
            )
            for i in range(first_slot, len(payloads))
        ]


def _read_column(typecode: str, data: bytes, offset: int, count: int) -> tuple[array, int]:  # type: ignore[type-arg]
    column = array(typecode)
    end = offset + count * column.itemsize
    if end > len(data):
        raise LogFormatError("a column runs past the end of the entry")
    column.frombytes(data[offset:end])
    if _BIG_ENDIAN:
        column.byteswap()
    return column, end


@dataclass(slots=True, frozen=True)
class EntryLayout:
    """Where an entry's columns are (byte offsets into it): what a columnar consumer (the
    Spark reader) takes as it is, without splitting the records."""

    flags: int
    count: int
    first_sequence: int
    writer_id: str
    writer_sequences: int  # offset of the i64 column, -1 without a writer id
    txids: int  # offset of the i64 column
    timestamps: int  # offset of the i64 column
    lengths: int  # offset of the u32 column
    payloads: int  # offset of the first record's bytes (they run to the end of the entry)


def entry_layout(data: bytes | memoryview, where: str = "entry") -> EntryLayout:
    """The layout of a log entry, its header checked (version, flags, columns within the
    entry); the record lengths are not added up here (``decode_entry`` does)."""
    try:
        version, flags, _, count, first_sequence = _ENTRY_HEADER.unpack_from(data, 0)
    except struct.error:
        raise LogFormatError(f"{where}: too short for a log entry ({len(data)} bytes)") from None
    if version != ENTRY_VERSION:
        raise LogFormatError(
            f"{where}: log entry version {version}, this version reads {ENTRY_VERSION} (is this "
            "ledger part of a log?)"
        )
    if flags & ~_KNOWN_ENTRY_FLAGS:
        raise LogFormatError(
            f"{where}: unknown log entry flags {flags:#x} (written by a newer version): upgrade "
            "bookkeeper-py"
        )
    offset = _ENTRY_HEADER.size
    writer_id = ""
    writer_sequences = -1
    if flags & EntryFlags.WRITER:
        try:
            writer_id, used = _get_name(bytes(data[offset : offset + 256]), 0)
        except (IndexError, UnicodeDecodeError, LogFormatError):
            raise LogFormatError(f"{where}: corrupt log entry header") from None
        offset += used
        writer_sequences = offset
        offset += 8 * count
    txids = offset
    timestamps = txids + 8 * count
    lengths = timestamps + 8 * count
    payloads = lengths + 4 * count
    if payloads > len(data):
        raise LogFormatError(f"{where}: a column runs past the end of the entry")
    return EntryLayout(
        flags,
        count,
        first_sequence,
        writer_id,
        writer_sequences,
        txids,
        timestamps,
        lengths,
        payloads,
    )


def decode_entry(data: bytes, where: str = "entry", segment: Segment | None = None) -> DecodedEntry:
    """Splits an entry into its records; ``LogFormatError`` for anything that is not a log
    entry of a known version. A RELATIVE entry's numbers are made whole from ``segment``,
    which it needs."""
    layout = entry_layout(data, where)
    count = layout.count
    writer_sequences = None
    if layout.writer_sequences >= 0:
        writer_sequences, _ = _read_column("q", data, layout.writer_sequences, count)
    txids, _ = _read_column("q", data, layout.txids, count)
    timestamps, _ = _read_column("q", data, layout.timestamps, count)
    lengths, offset = _read_column("I", data, layout.lengths, count)
    ends = list(accumulate(lengths, initial=offset))
    if ends[-1] != len(data):
        raise LogFormatError(
            f"{where}: record lengths add up to {ends[-1]} bytes, the entry has {len(data)}"
        )
    payloads = [data[ends[i] : ends[i + 1]] for i in range(count)]
    first_sequence = layout.first_sequence
    if layout.flags & EntryFlags.RELATIVE:
        bases = relative_bases(segment, where)
        first_sequence += bases[0]
        txids = array("q", [txid + bases[1] for txid in txids])
        timestamps = array("q", [stamp + bases[2] for stamp in timestamps])
    return DecodedEntry(
        layout.flags,
        first_sequence,
        txids,
        timestamps,
        payloads,
        layout.writer_id,
        writer_sequences,
    )


def relative_bases(segment: Segment | None, where: str) -> tuple[int, int, int]:
    """What a RELATIVE entry's sequence numbers, transaction ids and timestamps are offsets
    from: its segment's start_sequence, first_txid and first_timestamp."""
    if segment is None or segment.start_sequence < 0:
        raise LogFormatError(
            f"{where}: a relative entry (written before its place in the log was known) read "
            "without its segment, or from a segment not committed yet"
        )
    return segment.start_sequence, segment.first_txid, segment.first_timestamp
