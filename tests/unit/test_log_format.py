"""The stored formats of logs (docs/formats/logs.md): round trips, and clear errors for what
is not a log value or entry."""

from __future__ import annotations

import struct

import pytest

from bookkeeper_py.errors import IncorrectParameterError
from bookkeeper_py.log.format import (
    EntryFlags,
    LogConfig,
    LogFormatError,
    LogMetadata,
    Position,
    Segment,
    SegmentState,
    Subscription,
    check_name,
    decode_entry,
    decode_log,
    decode_subscription,
    encode_control,
    encode_entry,
    encode_log,
    encode_subscription,
)
from bookkeeper_py.wire.digest import DigestType


def sample() -> LogMetadata:
    return LogMetadata(
        config=LogConfig(
            5,
            3,
            2,
            DigestType.MAC,
            1 << 20,
            60_000,
            1000,
            3_600_000,
            1 << 30,
            placement="rackaware",
        ),
        created_ms=1_700_000_000_000,
        end_of_stream=True,
        next_segment=4,
        base_sequence=77,
        base_txid=99,
        base_timestamp=1_700_000_000_500,
        segments=(
            Segment(
                2,
                12,
                SegmentState.CLOSED,
                "app-1",
                min_entry=3,
                min_slot=1,
                last_entry=40,
                last_slot=9,
                start_sequence=77,
                record_count=400,
                byte_count=123_456,
                first_txid=100,
                last_txid=499,
                first_timestamp=1_700_000_001_000,
                last_timestamp=1_700_000_002_000,
                last_writer_sequence=398,
                created_ms=1_700_000_000_900,
                closed_ms=1_700_000_003_000,
            ),
            Segment(3, 15, writer_id="", created_ms=1_700_000_003_000),
        ),
        writers=(("app-1", 398), ("other", 5)),
    )


def test_a_log_value_round_trips() -> None:
    metadata = sample()
    assert decode_log(encode_log(metadata)) == metadata
    assert decode_log(encode_log(LogMetadata())) == LogMetadata()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: b"XXXX" + data[4:], "not a log"),
        (lambda data: data[:4] + struct.pack("<H", 9) + data[6:], "version 9"),
        (lambda data: data[:-3], "corrupt log metadata"),
        (lambda data: data + b"\0", "after the last segment"),
    ],
)
def test_a_damaged_log_value_is_refused_with_what_is_wrong(damage, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(LogFormatError, match=message):
        decode_log(damage(encode_log(sample())), "log ns/a")


def test_records_round_trip_through_an_entry_in_order() -> None:
    payloads = [b"", b"a", b"x" * 1000, bytes(range(256))]
    entry = encode_entry(500, [7, 8, 9, 10], [1, 2, 2, 3], payloads, "w", [40, 41, 42, 43])
    decoded = decode_entry(entry)
    assert decoded.payloads == payloads
    assert list(decoded.txids) == [7, 8, 9, 10]
    assert list(decoded.timestamps) == [1, 2, 2, 3]
    assert decoded.writer_id == "w" and list(decoded.writer_sequences or []) == [40, 41, 42, 43]
    records = decoded.records(12, 3, first_slot=1)
    assert [(r.position, r.sequence, r.txid, r.data) for r in records] == [
        (Position(12, 3, 1), 501, 8, b"a"),
        (Position(12, 3, 2), 502, 9, b"x" * 1000),
        (Position(12, 3, 3), 503, 10, bytes(range(256))),
    ]


def test_a_control_entry_carries_no_records() -> None:
    decoded = decode_entry(encode_control(EntryFlags.END_OF_SEGMENT, 42))
    assert decoded.is_control and decoded.flags & EntryFlags.END_OF_SEGMENT
    assert decoded.payloads == [] and decoded.first_sequence == 42


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (b"\x01", "too short"),
        (b"\x07" + encode_control(0, 1)[1:], "version 7"),
        (encode_entry(0, [1], [1], [b"abc"])[:-1], "add up to"),
        (encode_entry(0, [1, 2], [1, 2], [b"a", b"b"])[:20], "past the end"),
        (encode_control(0x80, 1), "unknown log entry flags 0x81 .*upgrade"),
    ],
)
def test_what_is_not_a_log_entry_is_refused(entry: bytes, message: str) -> None:
    with pytest.raises(LogFormatError, match=message):
        decode_entry(entry, "ledger 5 entry 0")


def test_a_subscription_round_trips() -> None:
    subscription = Subscription("spark-job", Position(12, 40, 3), 1234, 1_700_000_000_000)
    assert decode_subscription("spark-job", encode_subscription(subscription)) == subscription
    with pytest.raises(LogFormatError, match="corrupt"):
        decode_subscription("x", b"nope")


def test_positions_order_as_the_log_and_parse_from_their_text() -> None:
    assert Position(3, 0, 0) > Position(2, 999, 999) > Position(2, 999, 1)
    assert Position.parse(str(Position(12, 4, 0))) == Position(12, 4, 0)
    with pytest.raises(IncorrectParameterError, match="ledger:entry:slot"):
        Position.parse("12:4")


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "x" * 256, "sp ace", "_x"])
def test_names_that_cannot_be_path_components_are_refused(name: str) -> None:
    with pytest.raises(IncorrectParameterError, match="invalid log name"):
        check_name("log", name)


def test_a_config_that_breaks_the_quorum_rule_is_refused() -> None:
    with pytest.raises(IncorrectParameterError, match="ensemble >= write quorum"):
        LogConfig(2, 3, 2)
    with pytest.raises(IncorrectParameterError, match="max_entry_bytes"):
        LogConfig(max_entry_bytes=10)
    with pytest.raises(IncorrectParameterError, match="unknown placement policy 'racks'"):
        LogConfig(placement="racks")
