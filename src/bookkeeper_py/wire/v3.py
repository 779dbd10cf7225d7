"""The v3 protobuf protocol (``BookkeeperProtocol.proto``; reference sections 2.3 and 4).

A frame holds one serialized ``Request`` or ``Response``. Responses carry the request's txnId and
may arrive out of order.
"""

from __future__ import annotations

import struct
from typing import Any, TypeVar, cast

from google.protobuf.message import DecodeError, Message

from bookkeeper_py.wire.errors import MalformedMessageError
from bookkeeper_py.wire.proto import bookkeeper_protocol_pb2 as pb

Request = pb.Request
Response = pb.Response
OperationType = pb.OperationType
PROTOCOL_VERSION = pb.VERSION_THREE
M = TypeVar("M", bound=Message)


WRITE_FLAG_DEFERRED_SYNC = 0x1  # AddRequest.writeFlags: answer before the journal sync


def encode(message: pb.Request | pb.Response) -> bytes:
    """A framed v3 message."""
    body = message.SerializeToString()
    return struct.pack(">I", len(body)) + body


def _missing_fields(message: Message) -> list[str]:
    # FindInitializationErrors exists on every message but is missing from the type stubs.
    return list(cast(Any, message).FindInitializationErrors())


def parse(message: M, data: bytes, what: str) -> M:
    """Fills ``message`` from ``data``; ``MalformedMessageError`` naming ``what`` when the bytes
    do not parse or leave a required field unset."""
    try:
        message.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as error:
        raise MalformedMessageError(f"not a {what}: {error}") from error
    if not message.IsInitialized():
        missing = ", ".join(_missing_fields(message))
        raise MalformedMessageError(f"{what} lacks required fields: {missing}")
    return message


def decode_request(frame: bytes) -> pb.Request:
    """Parses a v3 request frame; raises ``MalformedMessageError`` when it is not one."""
    return parse(pb.Request(), frame, "v3 request")


def decode_response(frame: bytes) -> pb.Response:
    """Parses a v3 response frame; raises ``MalformedMessageError`` when it is not one."""
    return parse(pb.Response(), frame, "v3 response")


def is_v3_request(frame: bytes) -> bool:
    """Protocol detection for a connection's first frame, as the Java bookie does it: a frame
    that parses as a complete v3 ``Request`` is v3; anything else is v2.

    A v2 frame starts with its version byte (2, or 0 for legacy), which as a protobuf tag names
    field 0, so it never parses as a v3 request.
    """
    try:
        decode_request(frame)
    except MalformedMessageError:
        return False
    return True


def header(operation: int, txn_id: int, priority: int = 0) -> pb.BKPacketHeader:
    """A v3 packet header."""
    h = pb.BKPacketHeader(version=PROTOCOL_VERSION, operation=operation, txnId=txn_id)  # type: ignore[arg-type]
    if priority:
        h.priority = priority
    return h


def long_poll_request(
    txn_id: int, ledger_id: int, previous_lac: int, timeout_ms: int
) -> pb.Request:
    """A long-poll READ_ENTRY: answered once the bookie's LAC passes ``previous_lac``, with entry
    ``previous_lac + 1`` piggybacked if the bookie has it, or after ``timeout_ms``. The entry id
    is -1 (LAST_ADD_CONFIRMED), as Java's client sends it and Java's bookie requires (any other
    is EBADREQ there): the bookie works out the entry to piggyback itself."""
    request = pb.Request()
    request.header.CopyFrom(header(pb.READ_ENTRY, txn_id))
    read = request.readRequest
    read.ledgerId, read.entryId, read.previousLAC, read.timeOut = (
        ledger_id,
        -1,
        previous_lac,
        timeout_ms,
    )
    read.flag = pb.ReadRequest.ENTRY_PIGGYBACK
    return request
