"""Wire formats checked against byte vectors written out by hand from the reference (sections
2.2-2.5 and 4), not produced by the code under test."""

from __future__ import annotations

import binascii
import hashlib
import hmac

import pytest

from bookkeeper_py.errors import DigestMismatchError
from bookkeeper_py.wire import v2, v3
from bookkeeper_py.wire.digest import DigestManager, DigestType, mac_key, master_key
from bookkeeper_py.wire.errors import MalformedMessageError
from bookkeeper_py.wire.framing import FrameDecoder, FrameError
from bookkeeper_py.wire.proto import bookkeeper_protocol_pb2 as pb
from bookkeeper_py.wire.status import StatusCode, from_v2, to_v2

KEY = bytes([0x11]) * 20


def crc32c_reference(data: bytes) -> int:
    """Bitwise CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), independent of the library."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc32c_reference_check_value() -> None:
    assert crc32c_reference(b"123456789") == 0xE3069283


# ledger 1, entry 0, LAC -1, length 5, then the payload "hello"
ENTRY_HEADER = bytes.fromhex("00000000000000010000000000000000ffffffffffffffff0000000000000005")
PAYLOAD = b"hello"


def test_crc32_entry_layout() -> None:
    crc = binascii.crc32(ENTRY_HEADER + PAYLOAD)
    expected = ENTRY_HEADER + bytes(4) + crc.to_bytes(4, "big") + PAYLOAD
    assert DigestManager(1, DigestType.CRC32, b"").package(0, -1, 5, PAYLOAD) == expected


def test_crc32c_entry_layout() -> None:
    expected = ENTRY_HEADER + crc32c_reference(ENTRY_HEADER + PAYLOAD).to_bytes(4, "big") + PAYLOAD
    assert DigestManager(1, DigestType.CRC32C, b"pw").package(0, -1, 5, PAYLOAD) == expected


def test_mac_entry_layout_and_keys() -> None:
    key = hashlib.sha1(b"macsecret").digest()
    assert mac_key(b"secret") == key
    assert master_key(b"secret") == hashlib.sha1(b"ledgersecret").digest()
    assert master_key(b"") == hashlib.sha1(b"ledger").digest()
    digest = hmac.new(key, ENTRY_HEADER + PAYLOAD, "sha1").digest()
    assert len(digest) == 20
    assert (
        DigestManager(1, DigestType.MAC, b"secret").package(0, -1, 5, PAYLOAD)
        == ENTRY_HEADER + digest + PAYLOAD
    )


def test_dummy_entry_layout() -> None:
    assert (
        DigestManager(1, DigestType.DUMMY, b"").package(0, -1, 5, PAYLOAD) == ENTRY_HEADER + PAYLOAD
    )


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_verify_round_trip_and_rejects_corruption(digest_type: DigestType) -> None:
    manager = DigestManager(1, digest_type, b"pw")
    data = manager.package(0, -1, 5, PAYLOAD)
    entry = manager.verify(data, 0)
    assert (
        entry.ledger_id,
        entry.entry_id,
        entry.last_add_confirmed,
        entry.length,
        entry.payload,
    ) == (1, 0, -1, 5, PAYLOAD)
    with pytest.raises(DigestMismatchError):
        manager.verify(data, 1)  # not the entry asked for
    if digest_type != DigestType.DUMMY:
        flipped = bytearray(data)
        flipped[-1] ^= 0x01
        with pytest.raises(DigestMismatchError):
            manager.verify(bytes(flipped), 0)


def test_mac_with_wrong_password_fails() -> None:
    data = DigestManager(1, DigestType.MAC, b"right").package(0, -1, 5, PAYLOAD)
    with pytest.raises(DigestMismatchError):
        DigestManager(1, DigestType.MAC, b"wrong").verify(data, 0)


def test_lac_body_layout() -> None:
    header = bytes.fromhex("00000000000000070000000000000009")
    expected = header + crc32c_reference(header).to_bytes(4, "big")
    manager = DigestManager(7, DigestType.CRC32C, b"")
    assert manager.package_lac(9) == expected
    assert manager.verify_lac(expected) == 9


def test_v2_add_request_bytes() -> None:
    entry = ENTRY_HEADER + PAYLOAD
    expected = bytes.fromhex("0000003d02010002") + KEY + entry  # length 61, v2, ADD, RECOVERY_ADD
    assert v2.encode_add_request(KEY, entry, v2.FLAG_RECOVERY_ADD) == expected
    request = v2.decode_request(expected[4:])
    assert isinstance(request, v2.AddRequest)
    assert (request.ledger_id, request.entry_id, request.master_key, request.entry) == (
        1,
        0,
        KEY,
        entry,
    )
    assert request.is_recovery_add


def test_v2_read_request_bytes() -> None:
    plain = bytes.fromhex("00000014020200000000000000000005ffffffffffffffff")
    assert v2.encode_read_request(5, -1) == plain
    fencing = bytes.fromhex("000000280202000100000000000000050000000000000003") + KEY
    assert v2.encode_read_request(5, 3, v2.FLAG_DO_FENCING, KEY) == fencing
    request = v2.decode_request(fencing[4:])
    assert isinstance(request, v2.ReadRequest)
    assert (request.ledger_id, request.entry_id, request.is_fencing, request.master_key) == (
        5,
        3,
        True,
        KEY,
    )


def test_v2_responses_bytes() -> None:
    no_entry = bytes.fromhex("00000018020200000000000200000000000000050000000000000003")
    assert v2.encode_response(v2.OpCode.READ_ENTRY, StatusCode.ENOENTRY, 5, 3) == no_entry
    read_ok = bytes.fromhex("0000001b020200000000000000000000000000050000000000000003") + b"abc"
    response = v2.decode_response(read_ok[4:])
    assert (
        response.opcode,
        response.status,
        response.ledger_id,
        response.entry_id,
        response.body,
    ) == (
        2,
        StatusCode.EOK,
        5,
        3,
        b"abc",
    )


def test_v2_return_codes() -> None:
    expected = {
        StatusCode.EOK: 0,
        StatusCode.ENOLEDGER: 1,
        StatusCode.ENOENTRY: 2,
        StatusCode.EBADREQ: 100,
        StatusCode.EIO: 101,
        StatusCode.EUA: 102,
        StatusCode.EBADVERSION: 103,
        StatusCode.EFENCED: 104,
        StatusCode.EREADONLY: 105,
        StatusCode.ETOOMANYREQUESTS: 106,
        StatusCode.EUNKNOWNLEDGERSTATE: 107,
    }
    for status, code in expected.items():
        assert to_v2(status) == code
        assert from_v2(code) == status


def test_v2_rejects_unknown_opcode_and_truncation() -> None:
    with pytest.raises(MalformedMessageError):
        v2.decode_request(bytes.fromhex("02630000"))  # opcode 99
    with pytest.raises(MalformedMessageError):
        v2.decode_request(bytes.fromhex("0202000000000000"))  # read without ids


# A v3 add request: header {version 3, ADD_ENTRY, txnId 7}, addRequest (field 101) {ledger 5,
# entry 0, masterKey 20 x 0x11, body "xy"}.
V3_ADD = (
    bytes.fromhex("0a06080310021807")
    + bytes.fromhex("aa061e080510001a14")
    + KEY
    + bytes.fromhex("2202")
    + b"xy"
)


def test_v3_add_request_decodes_from_hand_bytes() -> None:
    request = v3.decode_request(V3_ADD)
    assert request.header.version == pb.VERSION_THREE
    assert request.header.operation == pb.ADD_ENTRY
    assert request.header.txnId == 7
    add = request.addRequest
    assert (add.ledgerId, add.entryId, add.masterKey, add.body) == (5, 0, KEY, b"xy")
    assert not add.HasField("flag")
    assert v3.is_v3_request(V3_ADD)


def test_v3_add_response_bytes() -> None:
    response = pb.Response(status=pb.EOK)
    response.header.CopyFrom(v3.header(pb.ADD_ENTRY, 7))
    response.addResponse.status = pb.EOK
    response.addResponse.ledgerId = 5
    response.addResponse.entryId = 0
    body = bytes.fromhex("0a060803100218071000aa0606080010051800")
    assert v3.encode(response) == len(body).to_bytes(4, "big") + body


def test_v3_status_numbers() -> None:
    assert [int(s) for s in StatusCode] == [0, 402, 403, 404, 501, 502, 503, 504, 505, 506, 507]
    assert pb.ENOENTRY == 403 and pb.EUNKNOWNLEDGERSTATE == 507


def test_v2_frames_are_never_taken_for_v3() -> None:
    assert not v3.is_v3_request(v2.encode_read_request(5, -1)[4:])
    assert not v3.is_v3_request(v2.encode_add_request(KEY, ENTRY_HEADER + PAYLOAD)[4:])


def test_framing_splits_stream_and_bounds_size() -> None:
    decoder = FrameDecoder(max_frame_size=8)
    stream = bytes.fromhex("00000002aabb0000000000000003ccddee")
    frames = []
    for byte in stream:  # one byte at a time
        frames.extend(decoder.feed(bytes([byte])))
    assert frames == [b"\xaa\xbb", b"", b"\xcc\xdd\xee"]
    assert decoder.buffered == 0
    with pytest.raises(FrameError):
        FrameDecoder(max_frame_size=8).feed(bytes.fromhex("00000009"))


@pytest.mark.parametrize("chunk", [3, 1000, 4096, 65536, 300_000])
def test_large_frames_split_anywhere_come_out_whole(chunk: int) -> None:
    bodies = [bytes([n]) * size for n, size in enumerate([200_000, 5, 70_000, 0, 4096, 123_457])]
    stream = b"".join(len(body).to_bytes(4, "big") + body for body in bodies)
    decoder = FrameDecoder()
    frames = []
    for start in range(0, len(stream), chunk):
        frames.extend(decoder.feed(stream[start : start + chunk]))
        received = min(start + chunk, len(stream))
        assert decoder.buffered == received - sum(4 + len(frame) for frame in frames)
    assert frames == bodies
    assert decoder.buffered == 0
