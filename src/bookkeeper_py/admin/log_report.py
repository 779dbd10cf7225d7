"""What ``bookkeeper log`` prints about logs: ``describe`` as a table or as JSON values, the
subscriptions with their lag, counts in words. Text from data, no I/O."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from bookkeeper_py.log.format import LogConfig, Position, Segment, SegmentState

if TYPE_CHECKING:
    from bookkeeper_py.log.namespace import LogDescription, SubscriptionInfo

NOTHING = "-"


def counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def listed(items: list[Any], noun: str) -> str:
    if not items:
        return f"no {noun}s"
    return f"{counted(len(items), noun)} ({', '.join(map(str, items))})"


def describe_config(config: LogConfig) -> str:
    def limit(value: int, unit: str) -> str:
        return f"{value} {unit}" if value else "off"

    return (
        f"E={config.ensemble_size} Qw={config.write_quorum_size} Qa={config.ack_quorum_size} "
        f"digest {config.digest_type.name}; roll at {limit(config.roll_bytes, 'bytes')}, "
        f"{limit(config.roll_age_ms, 'ms')}, {limit(config.roll_records, 'records')}; "
        f"retention {limit(config.retention_age_ms, 'ms')}, "
        f"{limit(config.retention_bytes, 'bytes')}; entries of at most "
        f"{config.max_entry_bytes} bytes"
    )


def time_text(ms: int) -> str:
    if ms < 0:
        return NOTHING
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def consumed(where: Position) -> str:
    return "nothing yet" if where.entry_id < 0 else str(where)


def _span(first: int, last: int, form: Callable[[int], str] = str) -> str:
    if first < 0:
        return NOTHING
    return form(first) if first == last else f"{form(first)}..{form(last)}"


def _open_records(segment: Segment, description: LogDescription) -> int | None:
    """The confirmed records of the log's last segment while it is open (the list holds its
    counts only once it is closed)."""
    last = description.metadata.last_segment
    if segment is last and segment.start_sequence >= 0:
        return description.next_sequence - segment.start_sequence
    return None


def segment_row(segment: Segment, description: LogDescription) -> list[str]:
    last = segment.last_position
    if segment.is_open:
        records = _open_records(segment, description)
        counts = [NOTHING if records is None else str(records), NOTHING, NOTHING, NOTHING]
    else:
        counts = [
            str(segment.record_count),
            str(segment.byte_count),
            _span(segment.first_txid, segment.last_txid),
            _span(segment.first_timestamp, segment.last_timestamp, time_text),
        ]
    return [
        str(segment.sequence),
        str(segment.ledger_id),
        segment.state.name,
        str(segment.first_position),
        NOTHING if last is None else str(last),
        *counts,
    ]


def description_lines(description: LogDescription) -> list[str]:
    metadata = description.metadata
    ended = ", ended (end of stream)" if metadata.end_of_stream else ""
    lines = [
        f"log {description.namespace}/{description.name} (metadata version "
        f"{description.version}, created {time_text(metadata.created_ms)}{ended})",
        f"config: {describe_config(metadata.config)}",
        "",
    ]
    header = ["SEQ", "LEDGER", "STATE", "FIRST", "LAST", "RECORDS", "BYTES", "TXIDS", "TIMESTAMPS"]
    rows = [segment_row(segment, description) for segment in metadata.segments]
    lines += table(header, rows) if rows else ["no segments (nothing was ever written)"]
    first = description.next_sequence - description.record_count
    lines += [
        "",
        f"records: {description.record_count} (sequence numbers "
        f"{_span(first, description.next_sequence - 1) if description.record_count else NOTHING}"
        f"); next sequence number {description.next_sequence}",
        f"ledger bytes: {description.byte_count} (of the closed segments; an open segment's "
        "are counted once it is closed)",
    ]
    if metadata.writers:
        lines.append(
            "idempotent writers: "
            + ", ".join(f"{name} (up to {sequence})" for name, sequence in metadata.writers)
        )
    lines.append("")
    if description.subscriptions:
        rows = [
            [info.subscription.name, consumed(info.subscription.position), str(info.lag)]
            for info in description.subscriptions
        ]
        lines += table(["SUBSCRIPTION", "CONSUMED UP TO", "LAG"], rows)
    else:
        lines.append("no subscriptions")
    return lines


def description_dict(description: LogDescription) -> dict[str, Any]:
    """``describe --json``: the description as plain JSON values (positions as text)."""
    metadata = description.metadata
    config = {field.name: getattr(metadata.config, field.name) for field in fields(LogConfig)}
    config["digest_type"] = metadata.config.digest_type.name.lower()
    segments = []
    for segment in metadata.segments:
        last = segment.last_position
        segments.append(
            {
                "sequence": segment.sequence,
                "ledger_id": segment.ledger_id,
                "state": segment.state.name.lower(),
                "first_position": str(segment.first_position),
                "last_position": None if last is None else str(last),
                "start_sequence": segment.start_sequence,
                "record_count": (
                    _open_records(segment, description)
                    if segment.state == SegmentState.OPEN
                    else segment.record_count
                ),
                "byte_count": None if segment.is_open else segment.byte_count,
                "first_txid": segment.first_txid,
                "last_txid": segment.last_txid,
                "first_timestamp_ms": segment.first_timestamp,
                "last_timestamp_ms": segment.last_timestamp,
                "writer_id": segment.writer_id,
                "created_ms": segment.created_ms,
                "closed_ms": segment.closed_ms,
            }
        )
    return {
        "namespace": description.namespace,
        "name": description.name,
        "version": description.version,
        "created_ms": metadata.created_ms,
        "end_of_stream": metadata.end_of_stream,
        "config": config,
        "next_sequence": description.next_sequence,
        "record_count": description.record_count,
        "byte_count": description.byte_count,
        "segments": segments,
        "writers": {name: sequence for name, sequence in metadata.writers},
        "subscriptions": [
            {
                "name": info.subscription.name,
                "position": str(info.subscription.position),
                "sequence": info.subscription.sequence,
                "lag": info.lag,
                "updated_ms": info.subscription.updated_ms,
            }
            for info in description.subscriptions
        ],
    }


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def subscription_lines(infos: list[SubscriptionInfo]) -> list[str]:
    """``subscriptions``: each with the last record it consumed, its lag and its last commit."""
    rows = [
        [
            info.subscription.name,
            consumed(info.subscription.position),
            str(info.lag),
            time_text(info.subscription.updated_ms),
        ]
        for info in infos
    ]
    return table(["NAME", "CONSUMED UP TO", "LAG", "UPDATED"], rows)
