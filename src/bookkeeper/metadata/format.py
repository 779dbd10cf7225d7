"""Ledger metadata as BookKeeper stores it in a znode (reference section 1.7; docs/formats/ledger-metadata.md).

v3 (written): ``BookieMetadataFormatVersion\\t3\\n`` then a varint length then a serialized
``LedgerMetadataFormat``. v2 (read): the same header with version 2, then protobuf text format.
"""

from __future__ import annotations

from typing import Any, cast

from google.protobuf import text_format
from google.protobuf.message import DecodeError

from bookkeeper.core.metadata import NO_ENTRY, LedgerMetadata, LedgerState
from bookkeeper.errors import MetadataStoreError
from bookkeeper.wire.digest import DigestType
from bookkeeper.wire.proto import data_formats_pb2 as formats

HEADER_PREFIX = b"BookieMetadataFormatVersion\t"
CURRENT_VERSION = 3


def encode_varint(value: int) -> bytes:
    """Protobuf's unsigned varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(data: bytes, offset: int) -> tuple[int, int]:
    """(value, offset after it) of the varint at ``offset``."""
    result = shift = 0
    for index in range(offset, min(len(data), offset + 10)):
        byte = data[index]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, index + 1
        shift += 7
    raise ValueError("truncated or overlong varint")


def to_proto(metadata: LedgerMetadata) -> formats.LedgerMetadataFormat:
    """The protobuf message for ``metadata``."""
    message = formats.LedgerMetadataFormat(
        quorumSize=metadata.write_quorum_size,
        ensembleSize=metadata.ensemble_size,
        length=metadata.length,
        state=int(metadata.state),  # type: ignore[arg-type]
        digestType=int(metadata.digest_type),  # type: ignore[arg-type]
        password=metadata.password,
        ackQuorumSize=metadata.ack_quorum_size,
    )
    if metadata.state == LedgerState.CLOSED:
        message.lastEntryId = metadata.last_entry_id
    for first_entry_id, bookies in metadata.ensembles:
        message.segment.add(ensembleMember=list(bookies), firstEntryId=first_entry_id)
    if metadata.ctime_ms:
        message.ctime = metadata.ctime_ms
    for key in sorted(metadata.custom_metadata):
        message.customMetadata.add(key=key, value=metadata.custom_metadata[key])
    if metadata.c_token:
        message.cToken = metadata.c_token
    return message


def serialize(metadata: LedgerMetadata) -> bytes:
    """The znode bytes of ``metadata`` in format v3."""
    body = to_proto(metadata).SerializeToString()
    return HEADER_PREFIX + b"%d\n" % CURRENT_VERSION + encode_varint(len(body)) + body


def from_proto(
    ledger_id: int, message: formats.LedgerMetadataFormat, version: int
) -> LedgerMetadata:
    """The value object for a parsed ``LedgerMetadataFormat``."""
    state = LedgerState(message.state)
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=message.ensembleSize,
        write_quorum_size=message.quorumSize,
        # Metadata written before ack quorums existed has none: then Qa was Qw.
        ack_quorum_size=message.ackQuorumSize
        if message.HasField("ackQuorumSize")
        else message.quorumSize,
        digest_type=DigestType(message.digestType)
        if message.HasField("digestType")
        else DigestType.CRC32,
        password=bytes(message.password),
        ensembles=tuple((s.firstEntryId, tuple(s.ensembleMember)) for s in message.segment),
        state=state,
        last_entry_id=message.lastEntryId if message.HasField("lastEntryId") else NO_ENTRY,
        length=message.length,
        ctime_ms=message.ctime,
        custom_metadata={pair.key: bytes(pair.value) for pair in message.customMetadata},
        c_token=message.cToken,
        format_version=version,
    )


def deserialize(ledger_id: int, data: bytes) -> LedgerMetadata:
    """Parses znode bytes in format v3 or v2; raises ``MetadataStoreError`` for anything else."""
    if not data.startswith(HEADER_PREFIX):
        raise MetadataStoreError(
            f"ledger {ledger_id}: metadata lacks the BookieMetadataFormatVersion header "
            "(format v1 is not supported yet)"
        )
    line_end = data.find(b"\n", len(HEADER_PREFIX))
    try:
        version = int(data[len(HEADER_PREFIX) : line_end])
    except ValueError as error:
        raise MetadataStoreError(
            f"ledger {ledger_id}: unreadable metadata format version"
        ) from error
    body_start = line_end + 1
    message = formats.LedgerMetadataFormat()
    try:
        if version == 3:
            length, offset = decode_varint(data, body_start)
            body = data[offset : offset + length]
            if len(body) != length:
                raise ValueError(f"body has {len(body)} bytes, header says {length}")
            message.ParseFromString(body)
        elif version == 2:
            text_format.Parse(data[body_start:].decode("utf-8"), message)
        else:
            raise ValueError(f"unsupported metadata format version {version}")
        if not message.IsInitialized():
            missing = cast(Any, message).FindInitializationErrors()  # not in the type stubs
            raise ValueError("missing required fields: " + ", ".join(missing))
        return from_proto(ledger_id, message, version)
    except (DecodeError, ValueError, text_format.ParseError) as error:
        raise MetadataStoreError(f"ledger {ledger_id}: corrupt metadata: {error}") from error
