"""Ledger metadata as BookKeeper stores it in a znode (reference section 1.7; docs/formats/ledger-metadata.md).

v3 (new ledgers): ``BookieMetadataFormatVersion\\t3\\n`` then a varint length then a serialized
``LedgerMetadataFormat``. v2: the same header with version 2, then protobuf text format. v1: the
header (or, from the oldest clients, none) then tab/newline text::

    <write quorum>\\n<ensemble size>\\n<length>\\n
    <first entry id>\\t<bookie>\\t<bookie>...\\n      one line per fragment
    <last entry id>\\tCLOSED                       when closed (-102: in recovery)

Metadata is written back in the version it was read in, as BookKeeper does, so that the
clients that wrote a legacy ledger can still read it.
"""

from __future__ import annotations

from typing import Any, cast

from google.protobuf import text_format
from google.protobuf.message import DecodeError

from bookkeeper_py.core.metadata import NO_ENTRY, LedgerMetadata, LedgerState
from bookkeeper_py.errors import MetadataStoreError
from bookkeeper_py.wire.digest import DigestType
from bookkeeper_py.wire.proto import data_formats_pb2 as formats

HEADER_PREFIX = b"BookieMetadataFormatVersion\t"
CURRENT_VERSION = 3
V1_CLOSED_TAG = "CLOSED"
V1_IN_RECOVERY_ENTRY_ID = -102


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
        ackQuorumSize=metadata.ack_quorum_size,
    )
    if metadata.stores_password:
        message.digestType = int(metadata.digest_type)  # type: ignore[assignment]
        message.password = metadata.password
    if metadata.state == LedgerState.CLOSED or metadata.format_version == 2:
        message.lastEntryId = metadata.last_entry_id  # v2 writers always set it
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
    """The znode bytes of ``metadata`` in its format version (v3 for every new ledger)."""
    version = metadata.format_version
    header = HEADER_PREFIX + b"%d\n" % version
    if version == 3:
        body = to_proto(metadata).SerializeToString()
        return header + encode_varint(len(body)) + body
    if version == 2:
        return header + text_format.MessageToString(to_proto(metadata)).encode()
    if version == 1:
        return header + _v1_text(metadata).encode()
    raise ValueError(f"ledger {metadata.ledger_id}: no metadata format version {version}")


def _v1_text(metadata: LedgerMetadata) -> str:
    lines = [str(metadata.write_quorum_size), str(metadata.ensemble_size), str(metadata.length)]
    lines += ["\t".join((str(first), *bookies)) for first, bookies in metadata.ensembles]
    text = "".join(line + "\n" for line in lines)
    if metadata.state == LedgerState.IN_RECOVERY:
        text += f"{V1_IN_RECOVERY_ENTRY_ID}\t{V1_CLOSED_TAG}"
    elif metadata.state == LedgerState.CLOSED:
        text += f"{metadata.last_entry_id}\t{V1_CLOSED_TAG}"
    return text


def _parse_v1(ledger_id: int, text: str) -> LedgerMetadata:
    """Format v1 as BookKeeper reads it: Qa is Qw; no password, digest type, ctime or custom
    metadata are stored."""
    lines = text.splitlines()
    if len(lines) < 4:
        raise ValueError(f"format v1 needs at least 4 lines, found {len(lines)}")
    write_quorum, ensemble_size, length = int(lines[0]), int(lines[1]), int(lines[2])
    ensembles: list[tuple[int, tuple[str, ...]]] = []
    state, last_entry_id = LedgerState.OPEN, NO_ENTRY
    for line in lines[3:]:
        parts = line.split("\t")
        if len(parts) < 2:
            raise ValueError(f"format v1 line {line!r} has no tab")
        if parts[1] == V1_CLOSED_TAG:
            last = int(parts[0])
            if last == V1_IN_RECOVERY_ENTRY_ID:
                state = LedgerState.IN_RECOVERY
            else:
                state, last_entry_id = LedgerState.CLOSED, last
            break
        ensembles.append((int(parts[0]), tuple(parts[1:])))
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=ensemble_size,
        write_quorum_size=write_quorum,
        ack_quorum_size=write_quorum,
        digest_type=DigestType.CRC32,  # not stored: the opener names it
        password=b"",
        ensembles=tuple(ensembles),
        state=state,
        last_entry_id=last_entry_id,
        length=length if state == LedgerState.CLOSED else 0,
        format_version=1,
        stores_password=False,
    )


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
        # BookKeeper takes the digest type only together with a password.
        digest_type=DigestType(message.digestType)
        if message.HasField("digestType") and message.HasField("password")
        else DigestType.CRC32,
        password=bytes(message.password),
        stores_password=message.HasField("password"),
        ensembles=tuple((s.firstEntryId, tuple(s.ensembleMember)) for s in message.segment),
        state=state,
        last_entry_id=message.lastEntryId if state == LedgerState.CLOSED else NO_ENTRY,
        length=message.length if state == LedgerState.CLOSED else 0,
        ctime_ms=message.ctime,
        custom_metadata={pair.key: bytes(pair.value) for pair in message.customMetadata},
        c_token=message.cToken,
        format_version=version,
    )


def deserialize(ledger_id: int, data: bytes) -> LedgerMetadata:
    """Parses znode bytes in format v3, v2 or v1; raises ``MetadataStoreError`` for anything else."""
    try:
        if not data.startswith(HEADER_PREFIX):
            # The first clients wrote format v1 without a header.
            if data[:1].isdigit():
                return _parse_v1(ledger_id, data.decode("utf-8"))
            raise ValueError("no BookieMetadataFormatVersion header")
        line_end = data.find(b"\n", len(HEADER_PREFIX))
        if line_end < 0:
            raise ValueError("the header line has no end")
        header = data[len(HEADER_PREFIX) : line_end]
        if not header.isdigit():
            raise ValueError(f"unreadable format version {header!r}")
        version = int(header)
        body_start = line_end + 1
        if version == 1:
            return _parse_v1(ledger_id, data[body_start:].decode("utf-8"))
        message = formats.LedgerMetadataFormat()
        if version == 3:
            length, offset = decode_varint(data, body_start)
            body = data[offset : offset + length]
            if len(body) != length:
                raise ValueError(f"body has {len(body)} bytes, header says {length}")
            message.ParseFromString(body)
        elif version == 2:
            text_format.Parse(data[body_start:].decode("utf-8"), message)
        else:
            raise ValueError(f"unsupported metadata format version {version} (1 to 3 are read)")
        if not message.IsInitialized():
            missing = cast(Any, message).FindInitializationErrors()  # not in the type stubs
            raise ValueError("missing required fields: " + ", ".join(missing))
        return from_proto(ledger_id, message, version)
    except (DecodeError, ValueError, UnicodeDecodeError, text_format.ParseError) as error:
        raise MetadataStoreError(
            f"ledger {ledger_id}: corrupt or unreadable metadata ({error}); "
            "the ledger cannot be opened until its metadata is restored from a backup"
        ) from error
