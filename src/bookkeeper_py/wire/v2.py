"""The v2 binary protocol (``BookieProtocol``; reference section 2.2).

Every frame starts with a header int ``version << 24 | opcode << 16 | flags``. Layouts after the
4-byte frame length, all integers big-endian:

* add request: header, masterKey[20], entry (the packaged entry; it begins with ledgerId, entryId)
* read request: header, ledgerId i64, entryId i64, masterKey[20] only when DO_FENCING is set
* add / read response: header (flags 0), rc i32, ledgerId i64, entryId i64, then for reads the
  stored entry bytes
* auth request and answer: header, then a protobuf ``AuthMessage``
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from dataclasses import dataclass

from bookkeeper_py.speedups import native
from bookkeeper_py.wire import v3
from bookkeeper_py.wire.errors import MalformedMessageError
from bookkeeper_py.wire.proto import bookkeeper_protocol_pb2 as pb
from bookkeeper_py.wire.status import StatusCode, from_v2, to_v2

CURRENT_PROTOCOL_VERSION = 2
MASTER_KEY_SIZE = 20

FLAG_NONE = 0
FLAG_DO_FENCING = 0x1
FLAG_RECOVERY_ADD = 0x2
FLAG_HIGH_PRIORITY = 0x4

_HEADER = struct.Struct(">i")
_READ_REQUEST = struct.Struct(">iqq")
_BATCH_READ_REQUEST = struct.Struct(
    ">iqqqiq"
)  # header, ledger, start entry, request id, count, size
_FRAMED_BATCH_RESPONSE = struct.Struct(">Iiiqqq")
_ENTRY_LENGTH = struct.Struct(">i")
_FRAME_LENGTH = struct.Struct(">I")
_RESPONSE = struct.Struct(">iiqq")
_FRAMED_RESPONSE = struct.Struct(">Iiiqq")
RESPONSE_FIXED_SIZE = _RESPONSE.size  # 24


class OpCode(enum.IntEnum):
    """v2 operation codes."""

    ADD_ENTRY = 1
    READ_ENTRY = 2
    AUTH = 3
    READ_LAC = 4
    WRITE_LAC = 5
    GET_BOOKIE_INFO = 6
    BATCH_READ_ENTRY = 7


def pack_header(opcode: int, flags: int, version: int = CURRENT_PROTOCOL_VERSION) -> int:
    """The v2 header int."""
    return (version << 24) | (opcode << 16) | (flags & 0xFFFF)


def unpack_header(header: int) -> tuple[int, int, int]:
    """(version, opcode, flags) of a header int; version 0 is the legacy opcode-only form."""
    version = (header >> 24) & 0xFF
    if version == 0:
        return 0, header & 0xFF, 0
    return version, (header >> 16) & 0xFF, header & 0xFFFF


@dataclass(slots=True)  # not frozen: one per entry, and frozen __init__ costs 3.5x
class AddRequest:
    """ADD_ENTRY: store ``entry`` (ledger and entry ids are read from the entry itself)."""

    flags: int
    master_key: bytes
    ledger_id: int
    entry_id: int
    entry: bytes

    @property
    def is_recovery_add(self) -> bool:
        return bool(self.flags & FLAG_RECOVERY_ADD)


@dataclass(slots=True)  # not frozen: one per entry, and frozen __init__ costs 3.5x
class ReadRequest:
    """READ_ENTRY: return an entry; entry -1 means the last entry; DO_FENCING fences first."""

    flags: int
    ledger_id: int
    entry_id: int
    master_key: bytes | None

    @property
    def is_fencing(self) -> bool:
        return bool(self.flags & FLAG_DO_FENCING)


@dataclass(frozen=True, slots=True)
class BatchReadRequest:
    """BATCH_READ_ENTRY: up to ``max_count`` entries from ``start_entry_id``, at most ``max_size``
    bytes in the answer; answered with the same ``request_id``."""

    flags: int
    ledger_id: int
    start_entry_id: int
    request_id: int
    max_count: int
    max_size: int
    master_key: bytes | None


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """AUTH: one message of an authentication plugin's exchange (a protobuf ``AuthMessage``
    after the header, in requests and answers alike)."""

    flags: int
    plugin_name: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class UnsupportedRequest:
    """A well-formed header with an operation this bookie does not serve over v2."""

    opcode: int
    flags: int


@dataclass(slots=True)  # not frozen: one per entry, and frozen __init__ costs 3.5x
class Response:
    """A bookie's answer to an add or read."""

    opcode: int
    status: StatusCode
    ledger_id: int
    entry_id: int
    body: bytes = b""


def encode_add_request(master_key: bytes, entry: bytes, flags: int = FLAG_NONE) -> bytes:
    """A framed ADD_ENTRY request."""
    return add_request_head(master_key, len(entry), flags) + entry


def add_request_head(master_key: bytes, entry_length: int, flags: int = FLAG_NONE) -> bytes:
    """A framed ADD_ENTRY request up to its entry (frame length, header, master key): a writer
    sends it and the same entry bytes to each bookie without joining them first."""
    if len(master_key) != MASTER_KEY_SIZE:
        raise ValueError(f"master key must be {MASTER_KEY_SIZE} bytes, got {len(master_key)}")
    length = 4 + MASTER_KEY_SIZE + entry_length
    return struct.pack(">Ii", length, pack_header(OpCode.ADD_ENTRY, flags)) + master_key


def encode_read_request(
    ledger_id: int, entry_id: int, flags: int = FLAG_NONE, master_key: bytes | None = None
) -> bytes:
    """A framed READ_ENTRY request (with the master key when fencing)."""
    fencing = bool(flags & FLAG_DO_FENCING)
    if fencing and (master_key is None or len(master_key) != MASTER_KEY_SIZE):
        raise ValueError("a fencing read needs the 20-byte master key")
    body = _READ_REQUEST.pack(pack_header(OpCode.READ_ENTRY, flags), ledger_id, entry_id)
    if fencing:
        assert master_key is not None
        body += master_key
    return struct.pack(">I", len(body)) + body


_FRAMED_READ_REQUEST = struct.Struct(">I" + _READ_REQUEST.format[1:])
PLAIN_READ_HEADER = pack_header(OpCode.READ_ENTRY, FLAG_NONE)


def encode_read_requests(ledger_id: int, entry_ids: list[int]) -> bytes:
    """Framed plain READ_ENTRY requests of ``entry_ids`` of one ledger, one after another."""
    pack, size, header = _FRAMED_READ_REQUEST.pack, _READ_REQUEST.size, PLAIN_READ_HEADER
    return b"".join([pack(size, header, ledger_id, entry_id) for entry_id in entry_ids])


def encode_batch_read_request(
    ledger_id: int, start_entry_id: int, request_id: int, max_count: int, max_size: int
) -> bytes:
    """A framed BATCH_READ_ENTRY request (no fencing: a fencing batch read is not served)."""
    body = _BATCH_READ_REQUEST.pack(
        pack_header(OpCode.BATCH_READ_ENTRY, FLAG_NONE),
        ledger_id,
        start_entry_id,
        request_id,
        max_count,
        max_size,
    )
    return _HEADER.pack(len(body)) + body


def batch_entries(body: bytes) -> list[bytes]:
    """The entries of a BATCH_READ_ENTRY answer body (after the fixed 24 bytes: the request id,
    then ``[int32 length][entry]`` records)."""
    entries = []
    position, end = 8, len(body)
    while position + 4 <= end:
        (length,) = _ENTRY_LENGTH.unpack_from(body, position)
        position += 4
        if length < 0 or position + length > end:
            raise MalformedMessageError(
                f"batch read answer: an entry of {length} bytes at {position} overruns the "
                f"{end}-byte body"
            )
        entries.append(body[position : position + length])
        position += length
    return entries


def encode_auth(plugin_name: str, payload: bytes) -> bytes:
    """A framed AUTH message (request or answer): header, then the ``AuthMessage``."""
    message = pb.AuthMessage(authPluginName=plugin_name, payload=payload).SerializeToString()
    return struct.pack(">Ii", 4 + len(message), pack_header(OpCode.AUTH, 0)) + message


def decode_auth(frame: bytes) -> AuthRequest:
    """Parses an AUTH frame (without its length prefix), in either direction."""
    if len(frame) < 4:
        raise MalformedMessageError(f"v2 frame of {len(frame)} bytes has no header")
    (header,) = _HEADER.unpack_from(frame, 0)
    _version, opcode, flags = unpack_header(header)
    if opcode != OpCode.AUTH:
        raise MalformedMessageError(f"expected a v2 AUTH message, got opcode {opcode}")
    message = v3.parse(pb.AuthMessage(), frame[4:], "v2 AUTH message")
    return AuthRequest(flags, message.authPluginName, message.payload)


def decode_request(
    frame: bytes,
) -> AddRequest | ReadRequest | BatchReadRequest | AuthRequest | UnsupportedRequest:
    """Parses one v2 request frame (without its length prefix)."""
    if len(frame) < 4:
        raise MalformedMessageError(f"v2 frame of {len(frame)} bytes has no header")
    (header,) = _HEADER.unpack_from(frame, 0)
    version, opcode, flags = unpack_header(header)
    if version > CURRENT_PROTOCOL_VERSION:
        raise MalformedMessageError(f"v2 frame announces protocol version {version}")
    if opcode == OpCode.ADD_ENTRY:
        if len(frame) < 4 + MASTER_KEY_SIZE + 16:
            raise MalformedMessageError(f"v2 add request of {len(frame)} bytes is truncated")
        master_key = frame[4 : 4 + MASTER_KEY_SIZE]
        entry = frame[4 + MASTER_KEY_SIZE :]
        ledger_id, entry_id = struct.unpack_from(">qq", entry, 0)
        return AddRequest(flags, master_key, ledger_id, entry_id, entry)
    if opcode == OpCode.READ_ENTRY:
        if len(frame) < _READ_REQUEST.size:
            raise MalformedMessageError(f"v2 read request of {len(frame)} bytes is truncated")
        _, ledger_id, entry_id = _READ_REQUEST.unpack_from(frame, 0)
        key: bytes | None = None
        if flags & FLAG_DO_FENCING:
            key = frame[_READ_REQUEST.size : _READ_REQUEST.size + MASTER_KEY_SIZE]
            if len(key) != MASTER_KEY_SIZE:
                raise MalformedMessageError("v2 fencing read request lacks its 20-byte master key")
        return ReadRequest(flags, ledger_id, entry_id, key)
    if opcode == OpCode.BATCH_READ_ENTRY:
        if len(frame) < _BATCH_READ_REQUEST.size:
            raise MalformedMessageError(f"v2 batch read request of {len(frame)} bytes is truncated")
        _, ledger_id, start, request_id, count, size = _BATCH_READ_REQUEST.unpack_from(frame, 0)
        batch_key: bytes | None = None
        if flags & FLAG_DO_FENCING:
            batch_key = frame[_BATCH_READ_REQUEST.size : _BATCH_READ_REQUEST.size + MASTER_KEY_SIZE]
            if len(batch_key) != MASTER_KEY_SIZE:
                raise MalformedMessageError("v2 fencing batch read lacks its 20-byte master key")
        return BatchReadRequest(flags, ledger_id, start, request_id, count, size, batch_key)
    if opcode == OpCode.AUTH:
        return decode_auth(frame)
    if opcode in OpCode.__members__.values():
        return UnsupportedRequest(opcode, flags)
    raise MalformedMessageError(f"unknown v2 opcode {opcode}")


def encode_response(
    opcode: int, status: StatusCode, ledger_id: int, entry_id: int, body: bytes = b""
) -> bytes:
    """A framed add or read response."""
    head = _FRAMED_RESPONSE.pack(
        RESPONSE_FIXED_SIZE + len(body), pack_header(opcode, 0), to_v2(status), ledger_id, entry_id
    )
    return head + body if body else head


# The first bytes of a plain (not recovery, current version) ADD_ENTRY request frame, and its
# least size (header, master key, ledger and entry ids): a bookie takes runs of such frames in bulk.
PLAIN_ADD_HEAD = _HEADER.pack(pack_header(OpCode.ADD_ENTRY, FLAG_NONE))
PLAIN_ADD_MIN_SIZE = 4 + MASTER_KEY_SIZE + 16
_ADD_IDS = struct.Struct(">qq")
_LAC = struct.Struct(">q")  # an entry's LAC, after its ledger and entry ids


PLAIN_READ_HEAD = _HEADER.pack(PLAIN_READ_HEADER)
PLAIN_READ_SIZE = _READ_REQUEST.size  # a plain read is its header and ids, nothing more


def _next_plain(backlog: deque[bytes], head: bytes, size: int, exact: bool) -> bytes | None:
    """The pure-Python ``next_plain`` of the C speedups: the frame at the head of ``backlog``,
    taken off it if it starts with ``head`` and is ``size`` bytes long (``exact``) or at least
    that; None otherwise."""
    if not backlog:
        return None
    frame = backlog[0]
    if (len(frame) != size if exact else len(frame) < size) or not frame.startswith(head):
        return None
    return backlog.popleft()


def _take_plain_reads(
    backlog: deque[bytes], first: bytes, room: int, head: bytes, size: int
) -> tuple[list[tuple[int, list[int]]], int]:
    """The pure-Python ``take_plain_reads`` of the C speedups (see ``take_plain_reads``)."""
    groups: list[tuple[int, list[int]]] = []
    frame: bytes | None = first
    count = 0
    while frame is not None:
        ledger_id, entry_id = _ADD_IDS.unpack_from(frame, len(head))
        if not groups or groups[-1][0] != ledger_id:
            groups.append((ledger_id, []))
        groups[-1][1].append(entry_id)
        count += 1
        frame = _next_plain(backlog, head, size, True) if count < room else None
    return groups, count


def take_plain_reads(
    backlog: deque[bytes], first: bytes, room: int
) -> tuple[list[tuple[int, list[int]]], int]:
    """A bookie's run of plain reads: ``first`` (a plain read frame, taken off the backlog
    already) and the plain reads right behind it in ``backlog``, taken off it up to ``room``
    frames in all; (``[(ledger id, [entry ids])]`` for each stretch of one ledger, in order, how
    many frames were taken)."""
    return _take(backlog, first, room, PLAIN_READ_HEAD, PLAIN_READ_SIZE)


def _v2_answers(
    ledger_id: int,
    entry_ids: list[int],
    entries: list[bytes] | None,
    statuses: dict[int, int] | int,
    header: int,
) -> bytes:
    """The pure-Python ``v2_answers`` of the C speedups (see ``encode_read_responses`` and
    ``encode_add_responses``)."""
    pack = _FRAMED_RESPONSE.pack
    if entries is None:
        assert isinstance(statuses, int)
        rc = statuses
        return b"".join([pack(RESPONSE_FIXED_SIZE, header, rc, ledger_id, e) for e in entry_ids])
    assert isinstance(statuses, dict)
    pieces: list[bytes] = []
    append = pieces.append
    for index, body in enumerate(entries):
        rc = statuses.get(index, 0) if statuses else 0
        append(pack(RESPONSE_FIXED_SIZE + len(body), header, rc, ledger_id, entry_ids[index]))
        if body:
            append(body)
    return b"".join(pieces)


_READ_ANSWER_HEADER = pack_header(OpCode.READ_ENTRY, 0)
_ADD_ANSWER_HEADER = pack_header(OpCode.ADD_ENTRY, 0)


def encode_read_responses(
    ledger_id: int,
    entry_ids: list[int],
    entries: list[bytes],
    statuses: dict[int, StatusCode] | None = None,
) -> bytes:
    """The framed answers to reads of one ledger: ``entries[i]`` answers ``entry_ids[i]``, EOK
    unless ``statuses`` holds another status under ``i`` (then its entry is empty)."""
    codes = {index: to_v2(status) for index, status in statuses.items()} if statuses else {}
    return _answers(ledger_id, entry_ids, entries, codes, _READ_ANSWER_HEADER)


def encode_add_responses(status: StatusCode, ledger_id: int, entry_ids: list[int]) -> bytes:
    """The framed answers, all with ``status``, to adds of ``entry_ids`` of one ledger."""
    return _answers(ledger_id, entry_ids, None, to_v2(status), _ADD_ANSWER_HEADER)


# A run of plain adds of one ledger and master key: (ledger id, master key, entry ids, entries,
# the highest LAC they carry or None; see take_plain_adds)
AddGroup = tuple[int, bytes, list[int], list[bytes], int | None]


def _group_plain_add(groups: list[AddGroup], frame: bytes, head_size: int) -> None:
    """Adds the plain add ``frame`` to ``groups``: to the last group if it is of the same
    ledger and master key, else as a new one (``take_plain_adds``)."""
    at = head_size + MASTER_KEY_SIZE
    ledger_id, entry_id = _ADD_IDS.unpack_from(frame, at)
    key = frame[head_size:at]
    if not groups or groups[-1][0] != ledger_id or groups[-1][1] != key:
        groups.append((ledger_id, key, [], [], -(2**63)))  # below any LAC
    _, _, entry_ids, entries, lac = groups[-1]
    entry_ids.append(entry_id)
    entries.append(frame[at:])
    if lac is not None:  # None once an entry cannot carry one
        whole = len(frame) >= at + 24 and entry_id >= 0
        lac = max(lac, _LAC.unpack_from(frame, at + 16)[0]) if whole else None
        groups[-1] = (ledger_id, key, entry_ids, entries, lac)


def _take_plain_adds(
    backlog: deque[bytes], first: bytes, room: int, head: bytes, min_size: int
) -> tuple[list[AddGroup], int]:
    """The pure-Python ``take_plain_adds`` of the C speedups (see ``take_plain_adds``)."""
    groups: list[AddGroup] = []
    frame: bytes | None = first
    count = 0
    while frame is not None:
        _group_plain_add(groups, frame, len(head))
        count += 1
        frame = _next_plain(backlog, head, min_size, False) if count < room else None
    return groups, count


def take_plain_adds(backlog: deque[bytes], first: bytes, room: int) -> tuple[list[AddGroup], int]:
    """A bookie's run of plain adds: ``first`` (a plain add frame, taken off the backlog
    already) and the plain adds right behind it in ``backlog``, taken off it up to ``room``
    frames in all; (one ``AddGroup`` for each stretch of one ledger and master key, in order,
    how many frames were taken). A group's LAC is the highest its entries carry, or None when
    an entry is too short to carry one or an id is negative (each is then checked alone)."""
    return _take_adds(backlog, first, room, PLAIN_ADD_HEAD, PLAIN_ADD_MIN_SIZE)


def _cut_plain_adds(
    data: bytes, start: int, room: int, head: bytes, min_size: int, max_frame: int
) -> tuple[list[AddGroup], int, int]:
    """The pure-Python ``cut_plain_adds`` of the C speedups (see ``cut_plain_adds``)."""
    groups: list[AddGroup] = []
    position, end, count = start, len(data), 0
    while count < room and end - position >= 4:
        (length,) = _FRAME_LENGTH.unpack_from(data, position)
        if (
            length > max_frame
            or length > end - position - 4
            or length < min_size
            or not data.startswith(head, position + 4)
        ):
            break
        _group_plain_add(groups, data[position + 4 : position + 4 + length], len(head))
        position += 4 + length
        count += 1
    return groups, count, position


def cut_plain_adds(
    data: bytes, start: int, room: int, max_frame: int
) -> tuple[list[AddGroup], int, int]:
    """A bookie's run of plain adds cut straight out of the bytes it received: the whole
    length-prefixed frames of ``data`` from ``start`` (each of at most ``max_frame`` bytes) that
    are plain adds, up to ``room`` of them; (the groups as ``take_plain_adds`` gives them, how
    many frames were taken, where the first frame not taken begins). No frame object is made on
    the way: each entry is copied once, out of ``data``."""
    return _cut_adds(data, start, room, PLAIN_ADD_HEAD, PLAIN_ADD_MIN_SIZE, max_frame)


_take = native.take_plain_reads if native is not None else _take_plain_reads
_take_adds = native.take_plain_adds if native is not None else _take_plain_adds
_cut_adds = native.cut_plain_adds if native is not None else _cut_plain_adds


def _answers(
    ledger_id: int,
    entry_ids: list[int],
    entries: list[bytes] | None,
    statuses: dict[int, int] | int,
    header: int,
) -> bytes:
    """``_v2_answers`` in one C call where the speedups are built (and every entry is bytes)."""
    if native is not None:
        framed: bytes | None = native.v2_answers(ledger_id, entry_ids, entries, statuses, header)
        if framed is not None:
            return framed
    return _v2_answers(ledger_id, entry_ids, entries, statuses, header)


def encode_batch_read_response(
    status: StatusCode, ledger_id: int, start_entry_id: int, request_id: int, entries: list[bytes]
) -> bytes:
    """A framed BATCH_READ_ENTRY response: the fixed part, the request id, then [len][entry]...
    (one C call where the speedups are built and every entry is bytes)."""
    head = _FRAMED_BATCH_RESPONSE.pack(
        0,  # the frame length, written once the entries are counted
        pack_header(OpCode.BATCH_READ_ENTRY, 0),
        to_v2(status),
        ledger_id,
        start_entry_id,
        request_id,
    )
    if native is not None:
        framed: bytes | None = native.v2_batch_answer(head, entries)
        if framed is not None:
            return framed
    return _batch_answer(head, entries)


def _batch_answer(head: bytes, entries: list[bytes]) -> bytes:
    """The pure-Python ``v2_batch_answer`` of the C speedups: ``head`` with its frame length
    written, then each entry as [4-byte length][entry] (any buffer type)."""
    parts = [b""]
    for entry in entries:
        parts.append(_ENTRY_LENGTH.pack(len(entry)))
        parts.append(entry)
    parts[0] = _FRAME_LENGTH.pack(len(head) - 4 + sum(map(len, parts))) + head[4:]
    return b"".join(parts)


def decode_response(frame: bytes) -> Response:
    """Parses one v2 response frame (without its length prefix)."""
    return Response(*response_fields(frame))


# A response's fixed part split as a client reads it in bulk: (version, opcode, flags, return
# code, ledger id, entry id); a version 0 (legacy) header has its opcode in the flags' low byte.
RESPONSE_HEAD = struct.Struct(">BBHiqq")


def read_answer(frame: bytes) -> tuple[int, int, bytes]:
    """(entry id, v2 return code, body) of a READ_ENTRY answer frame, whole and at least
    ``RESPONSE_FIXED_SIZE`` long: what a client's batch of reads gets back (the frame itself,
    so that the body is copied once, into the entry read, and only if it is wanted)."""
    _, _, _, rc, _, entry_id = RESPONSE_HEAD.unpack_from(frame)
    return entry_id, rc, frame[RESPONSE_FIXED_SIZE:]


def response_fields(frame: bytes) -> tuple[int, StatusCode, int, int, bytes]:
    """(opcode, status, ledger id, entry id, body) of one v2 response frame (without its length
    prefix): ``decode_response`` without the object, for a client completing its answers."""
    if len(frame) < RESPONSE_FIXED_SIZE:
        raise MalformedMessageError(f"v2 response of {len(frame)} bytes is shorter than 24")
    header, rc, ledger_id, entry_id = _RESPONSE.unpack_from(frame, 0)
    body = frame[RESPONSE_FIXED_SIZE:] if len(frame) > RESPONSE_FIXED_SIZE else b""
    return unpack_header(header)[1], from_v2(rc), ledger_id, entry_id, body
