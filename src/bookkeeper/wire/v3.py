"""The v3 protobuf protocol (``BookkeeperProtocol.proto``; reference sections 2.3 and 4).

A frame holds one serialized ``Request`` or ``Response``. Responses carry the request's txnId and
may arrive out of order.
"""

from __future__ import annotations

import struct
from typing import Any, cast

from google.protobuf.message import DecodeError

from bookkeeper.wire.errors import MalformedMessageError
from bookkeeper.wire.proto import bookkeeper_protocol_pb2 as pb

Request = pb.Request
Response = pb.Response
OperationType = pb.OperationType
PROTOCOL_VERSION = pb.VERSION_THREE


def encode(message: pb.Request | pb.Response) -> bytes:
    """A framed v3 message."""
    body = message.SerializeToString()
    return struct.pack(">I", len(body)) + body


def _missing_fields(message: pb.Request | pb.Response) -> list[str]:
    # FindInitializationErrors exists on every message but is missing from the type stubs.
    return list(cast(Any, message).FindInitializationErrors())


def decode_request(frame: bytes) -> pb.Request:
    """Parses a v3 request frame; raises ``MalformedMessageError`` when it is not one."""
    request = pb.Request()
    try:
        request.ParseFromString(frame)
    except (DecodeError, ValueError, RuntimeError) as error:
        raise MalformedMessageError(f"not a v3 request: {error}") from error
    if not request.IsInitialized():
        missing = ", ".join(_missing_fields(request))
        raise MalformedMessageError(f"v3 request lacks required fields: {missing}")
    return request


def decode_response(frame: bytes) -> pb.Response:
    """Parses a v3 response frame; raises ``MalformedMessageError`` when it is not one."""
    response = pb.Response()
    try:
        response.ParseFromString(frame)
    except (DecodeError, ValueError, RuntimeError) as error:
        raise MalformedMessageError(f"not a v3 response: {error}") from error
    if not response.IsInitialized():
        missing = ", ".join(_missing_fields(response))
        raise MalformedMessageError(f"v3 response lacks required fields: {missing}")
    return response


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
