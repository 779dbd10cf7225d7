"""A live bookie answers v2 and v3 on one port, detected per connection. Requests are built byte
by byte from the reference and every byte of the answers is checked."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator

import pytest

from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.raw import frame, recv_frame

KEY = bytes([0x22]) * 20
LEDGER = 9_000_000_005  # not created through metadata: the bookie does not care


@pytest.fixture(scope="module")
def bookie() -> Iterator[tuple[str, int]]:
    with LocalCluster(1) as local:
        host, port = local.bookie_ids[0].rsplit(":", 1)
        yield host, int(port)


def varint(value: int) -> bytes:
    out = b""
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out += bytes([low | 0x80])
        else:
            return out + bytes([low])


def v3_add_request(
    ledger_id: int, entry: bytes, txn: int, extra: bytes = b"", entry_id: int = 0
) -> bytes:
    """Request {header {VERSION_THREE, ADD_ENTRY, txnId}, addRequest (field 101, tag aa06)
    {ledgerId, entryId, masterKey, body, then ``extra`` fields}}, byte by byte."""
    body = (
        bytes([0x08])
        + varint(ledger_id)
        + bytes([0x10, entry_id])
        + bytes.fromhex("1a14")
        + KEY
        + bytes([0x22, len(entry)])
        + entry
    )
    body += extra
    return (
        bytes.fromhex("0a060803100218")
        + bytes([txn])
        + bytes.fromhex("aa06")
        + bytes([len(body)])
        + body
    )


def test_v3_then_v2_on_the_same_port(bookie: tuple[str, int]) -> None:
    ledger = LEDGER.to_bytes(8, "big")
    entry = (
        ledger + bytes(8) + b"payload"
    )  # ledgerId, entryId 0, then bytes the bookie keeps as they are
    lid = bytes([0x08]) + varint(LEDGER)
    v3_add = v3_add_request(LEDGER, entry, txn=7)
    with socket.create_connection(bookie, timeout=10) as v3_connection:
        v3_connection.sendall(frame(v3_add))
        answer = recv_frame(v3_connection)
        add_response = (
            bytes.fromhex("0800") + bytes([0x10]) + varint(LEDGER) + bytes.fromhex("1800")
        )
        assert answer == (
            bytes.fromhex("0a060803100218071000aa06") + bytes([len(add_response)]) + add_response
        )
        # READ_ENTRY of entry 1, txnId 8: ENOENTRY (403)
        read_body = lid + bytes.fromhex("1001")
        v3_connection.sendall(
            frame(bytes.fromhex("0a06080310011808a206") + bytes([len(read_body)]) + read_body)
        )
        read_response = (
            bytes.fromhex("089303") + bytes([0x10]) + varint(LEDGER) + bytes.fromhex("1801")
        )
        assert recv_frame(v3_connection) == (
            bytes.fromhex("0a06080310011808109303a206")
            + bytes([len(read_response)])
            + read_response
        )
    with socket.create_connection(bookie, timeout=10) as v2_connection:
        # v2 READ_ENTRY of the entry added over v3
        v2_connection.sendall(frame(bytes.fromhex("02020000") + ledger + bytes(8)))
        assert (
            recv_frame(v2_connection)
            == bytes.fromhex("0202000000000000") + ledger + bytes(8) + entry
        )
        # v2 fencing read of entry -1 (the last one) with a wrong master key: EUA (102)
        v2_connection.sendall(
            frame(bytes.fromhex("02020001") + ledger + b"\xff" * 8 + b"\x33" * 20)
        )
        assert recv_frame(v2_connection) == bytes.fromhex("0202000000000066") + ledger + b"\xff" * 8
        # with the right key: fenced, then the last entry
        v2_connection.sendall(frame(bytes.fromhex("02020001") + ledger + b"\xff" * 8 + KEY))
        assert (
            recv_frame(v2_connection)
            == bytes.fromhex("0202000000000000") + ledger + b"\xff" * 8 + entry
        )
        # an add to the fenced ledger: EFENCED (104)
        entry1 = ledger + (1).to_bytes(8, "big") + b"late"
        v2_connection.sendall(frame(bytes.fromhex("02010000") + KEY + entry1))
        assert recv_frame(v2_connection) == bytes.fromhex("0201000000000068") + ledger + (
            1
        ).to_bytes(8, "big")
        # ... unless it is a recovery add (RECOVERY_ADD flag 0x2): EOK
        v2_connection.sendall(frame(bytes.fromhex("02010002") + KEY + entry1))
        assert recv_frame(v2_connection) == bytes.fromhex("0201000000000000") + ledger + (
            1
        ).to_bytes(8, "big")


def test_oversized_and_garbage_frames_close_only_that_connection(bookie: tuple[str, int]) -> None:
    with socket.create_connection(bookie, timeout=10) as bad:
        bad.sendall((6 * 1024 * 1024).to_bytes(4, "big"))  # above the 5 MiB maximum
        assert bad.recv(1) == b""  # closed by the bookie
    with socket.create_connection(bookie, timeout=10) as bad:
        bad.sendall(frame(bytes.fromhex("02630000")))  # unknown v2 opcode 99
        assert bad.recv(1) == b""
    with socket.create_connection(bookie, timeout=10) as good:
        good.sendall(frame(bytes.fromhex("02020000") + LEDGER.to_bytes(8, "big") + bytes(8)))
        assert recv_frame(good)[4:8] == bytes(4)  # still serving: EOK


def test_v3_deferred_sync_add_then_force_ledger(bookie: tuple[str, int]) -> None:
    ledger_id = LEDGER + 1
    ledger = ledger_id.to_bytes(8, "big")
    entry = ledger + bytes(8) + b"deferred"
    lid = bytes([0x08]) + varint(ledger_id)
    # writeFlags (AddRequest field 5) = 1: DEFERRED_SYNC
    v3_add = v3_add_request(ledger_id, entry, txn=9, extra=bytes.fromhex("2801"))
    # ForceLedgerRequest (Request field 107, tag da06) {ledgerId}, operation FORCE_LEDGER (10), txnId 10
    v3_force = bytes.fromhex("0a060803100a180ada06") + bytes([len(lid)]) + lid
    with socket.create_connection(bookie, timeout=10) as connection:
        connection.sendall(frame(v3_add))
        add_response = (
            bytes.fromhex("0800") + bytes([0x10]) + varint(ledger_id) + bytes.fromhex("1800")
        )
        assert recv_frame(connection) == (
            bytes.fromhex("0a060803100218091000aa06") + bytes([len(add_response)]) + add_response
        )
        connection.sendall(frame(v3_force))
        force_response = bytes.fromhex("0800") + bytes([0x10]) + varint(ledger_id)
        assert recv_frame(connection) == (
            bytes.fromhex("0a060803100a180a1000da06")
            + bytes([len(force_response)])
            + force_response
        )


def test_v2_batch_read(bookie: tuple[str, int]) -> None:
    ledger_id = LEDGER + 2
    ledger = ledger_id.to_bytes(8, "big")
    entries = [ledger + i.to_bytes(8, "big") + b"p%d" % i for i in range(5)]
    with socket.create_connection(bookie, timeout=10) as connection:
        for entry in entries:
            connection.sendall(frame(bytes.fromhex("02010000") + KEY + entry))
            assert recv_frame(connection)[4:8] == bytes(4)
        # header (v2, BATCH_READ_ENTRY = 7), ledger, start 1, request id 77, max count 3, max size 1000
        request = (
            bytes.fromhex("02070000") + ledger + (1).to_bytes(8, "big") + (77).to_bytes(8, "big")
        )
        connection.sendall(frame(request + (3).to_bytes(4, "big") + (1000).to_bytes(8, "big")))
        body = b"".join(len(e).to_bytes(4, "big") + e for e in entries[1:4])
        assert recv_frame(connection) == (
            bytes.fromhex("0207000000000000")
            + ledger
            + (1).to_bytes(8, "big")
            + (77).to_bytes(8, "big")
            + body
        )
        # maxSize leaves room for one entry only: the first is always sent, the second is not
        small = 24 + 8 + 4 + len(entries[0]) + 3
        connection.sendall(frame(request + (3).to_bytes(4, "big") + small.to_bytes(8, "big")))
        assert recv_frame(connection)[32:] == len(entries[1]).to_bytes(4, "big") + entries[1]
        # starting past the last entry: ENOENTRY (2) and no entries
        past = bytes.fromhex("02070000") + ledger + (9).to_bytes(8, "big") + (78).to_bytes(8, "big")
        connection.sendall(frame(past + (3).to_bytes(4, "big") + (1000).to_bytes(8, "big")))
        assert recv_frame(connection) == (
            bytes.fromhex("0207000000000002")
            + ledger
            + (9).to_bytes(8, "big")
            + (78).to_bytes(8, "big")
        )


def test_v3_write_lac_read_lac_bookie_info_and_long_poll(bookie: tuple[str, int]) -> None:
    ledger_id = LEDGER + 3
    lid = bytes([0x08]) + varint(ledger_id)
    ledger = ledger_id.to_bytes(8, "big")
    # two entries in the packaging of reference 2.4 with the DUMMY digest: entry 1 carries LAC 0
    entries = [
        ledger
        + e.to_bytes(8, "big")
        + (e - 1).to_bytes(8, "big", signed=True)
        + (e + 1).to_bytes(8, "big")
        + b"e%d" % e
        for e in range(2)
    ]
    lac_body = ledger + (1).to_bytes(8, "big")  # WRITE_LAC body: ledgerId, lac (DUMMY: no digest)
    with socket.create_connection(bookie, timeout=10) as connection:
        for entry in entries:
            connection.sendall(frame(bytes.fromhex("02010000") + KEY + entry))
            assert recv_frame(connection)[4:8] == bytes(4)
    with socket.create_connection(bookie, timeout=10) as connection:
        # WRITE_LAC (op 6, txn 11): writeLacRequest is Request field 103 (tag ba06)
        body = (
            lid
            + bytes([0x10, 0x01])
            + bytes.fromhex("1a14")
            + KEY
            + bytes([0x22, len(lac_body)])
            + lac_body
        )
        connection.sendall(frame(bytes.fromhex("0a0608031006180bba06") + bytes([len(body)]) + body))
        answer = bytes.fromhex("0800") + bytes([0x10]) + varint(ledger_id)
        assert (
            recv_frame(connection)
            == bytes.fromhex("0a0608031006180b1000ba06") + bytes([len(answer)]) + answer
        )
        # READ_LAC (op 7, txn 12): readLacRequest is field 104 (tag c206); answer: lacBody, lastEntryBody
        connection.sendall(frame(bytes.fromhex("0a0608031007180cc206") + bytes([len(lid)]) + lid))
        answer = (
            bytes.fromhex("0800")
            + bytes([0x10])
            + varint(ledger_id)
            + bytes([0x1A, len(lac_body)])
            + lac_body
            + bytes([0x22, len(entries[1])])
            + entries[1]
        )
        assert (
            recv_frame(connection)
            == bytes.fromhex("0a0608031007180c1000c206") + bytes([len(answer)]) + answer
        )
        # long poll (READ_ENTRY, txn 13): entry 1, previousLAC 0 (field 4), timeOut 5000 (field 5),
        # flag ENTRY_PIGGYBACK (field 100 = tag a006, value 2). The LAC is already 1: answered at once.
        read = lid + bytes([0x10, 0x01, 0x20, 0x00, 0x28]) + varint(5000) + bytes.fromhex("a00602")
        connection.sendall(frame(bytes.fromhex("0a0608031001180da206") + bytes([len(read)]) + read))
        answer = (
            bytes.fromhex("0800")
            + bytes([0x10])
            + varint(ledger_id)
            + bytes.fromhex("1801")
            + bytes([0x22, len(entries[1])])
            + entries[1]
            + bytes.fromhex("2801")  # maxLAC 1
        )
        assert (
            recv_frame(connection)
            == bytes.fromhex("0a0608031001180d1000a206") + bytes([len(answer)]) + answer
        )
        # GET_BOOKIE_INFO (op 8, txn 14): getBookieInfoRequest is field 105 (tag ca06), requested = 3
        connection.sendall(frame(bytes.fromhex("0a0608031008180eca06020803")))
        got = recv_frame(connection)
    head = bytes.fromhex("0a0608031008180e1000ca06")
    assert got.startswith(head)
    info = got[len(head) + 1 :]
    assert got[len(head)] == len(info) and info[:2] == bytes.fromhex("0800")
    assert info[2] == 0x10  # totalDiskCapacity, then freeDiskSpace (field 3, tag 0x18)
    position, total = 3, 0
    for shift in range(0, 70, 7):
        byte = info[position]
        total |= (byte & 0x7F) << shift
        position += 1
        if not byte & 0x80:
            break
    assert info[position] == 0x18
    assert (
        total == shutil.disk_usage(tempfile.gettempdir()).total
    )  # LocalCluster's data lives there


def test_v3_get_list_of_entries_of_ledger(bookie: tuple[str, int]) -> None:
    ledger_id = LEDGER + 4
    ledger = ledger_id.to_bytes(8, "big")
    lid = bytes([0x08]) + varint(ledger_id)
    with socket.create_connection(bookie, timeout=10) as connection:
        for entry_id in (0, 1, 2, 5):
            entry = ledger + entry_id.to_bytes(8, "big") + b"x"
            connection.sendall(frame(bytes.fromhex("02010000") + KEY + entry))
            assert recv_frame(connection)[4:8] == bytes(4)
    with socket.create_connection(bookie, timeout=10) as connection:
        # GET_LIST_OF_ENTRIES_OF_LEDGER (op 11, txn 15): field 108 (tag e206) {ledgerId}
        connection.sendall(frame(bytes.fromhex("0a060803100b180fe206") + bytes([len(lid)]) + lid))
        # 64-byte header (version 0, 2 groups), then groups (first, last, size, period):
        # entries 0-2 as (0, 0, 3, 0) and entry 5 as (5, 5, 1, 0)
        available = (
            bytes(4)
            + (2).to_bytes(4, "big")
            + bytes(56)
            + bytes(16)
            + (3).to_bytes(4, "big")
            + bytes(4)
            + (5).to_bytes(8, "big") * 2
            + (1).to_bytes(4, "big")
            + bytes(4)
        )
        answer = (
            bytes.fromhex("0800")
            + bytes([0x10])
            + varint(ledger_id)
            + bytes([0x1A, len(available)])
            + available
        )
        assert (
            recv_frame(connection)
            == bytes.fromhex("0a060803100b180f1000e206") + bytes([len(answer)]) + answer
        )
        # a ledger the bookie never saw: ENOLEDGER (402), no availability
        other = bytes([0x08]) + varint(ledger_id + 1000)
        connection.sendall(
            frame(bytes.fromhex("0a060803100b1810e206") + bytes([len(other)]) + other)
        )
        answer = bytes.fromhex("089203") + bytes([0x10]) + varint(ledger_id + 1000)
        assert (
            recv_frame(connection)
            == bytes.fromhex("0a060803100b1810109203e206") + bytes([len(answer)]) + answer
        )


def test_v3_fencing_read_then_adds_with_and_without_recovery_flag(
    bookie: tuple[str, int],
) -> None:
    ledger_id = LEDGER + 5
    ledger = ledger_id.to_bytes(8, "big")
    lid = bytes([0x08]) + varint(ledger_id)
    entry0 = ledger + bytes(8) + b"first"
    entry1 = ledger + (1).to_bytes(8, "big") + b"second"
    with socket.create_connection(bookie, timeout=10) as connection:
        connection.sendall(frame(v3_add_request(ledger_id, entry0, txn=20)))
        add_ok = bytes.fromhex("0800") + bytes([0x10]) + varint(ledger_id) + bytes.fromhex("1800")
        assert recv_frame(connection) == (
            bytes.fromhex("0a060803100218141000aa06") + bytes([len(add_ok)]) + add_ok
        )
        # READ_ENTRY (txn 21) of entry 0 with flag FENCE_LEDGER (field 100 = a006, 1) and the
        # master key (field 3): fenced durably, then the entry
        read = lid + bytes.fromhex("1000") + bytes.fromhex("1a14") + KEY + bytes.fromhex("a00601")
        connection.sendall(frame(bytes.fromhex("0a06080310011815a206") + bytes([len(read)]) + read))
        answer = (
            bytes.fromhex("0800")
            + bytes([0x10])
            + varint(ledger_id)
            + bytes.fromhex("1800")
            + bytes([0x22, len(entry0)])
            + entry0
        )
        assert recv_frame(connection) == (
            bytes.fromhex("0a060803100118151000a206") + bytes([len(answer)]) + answer
        )
        # a plain add (txn 22) to the fenced ledger: EFENCED (504 = f803) at both levels
        connection.sendall(frame(v3_add_request(ledger_id, entry1, txn=22, entry_id=1)))
        fenced = bytes.fromhex("08f803") + bytes([0x10]) + varint(ledger_id) + bytes.fromhex("1801")
        assert recv_frame(connection) == (
            bytes.fromhex("0a0608031002181610f803aa06") + bytes([len(fenced)]) + fenced
        )
        # the same add with flag RECOVERY_ADD (AddRequest field 100 = a006, 1): EOK
        connection.sendall(
            frame(
                v3_add_request(ledger_id, entry1, txn=23, extra=bytes.fromhex("a00601"), entry_id=1)
            )
        )
        added = bytes.fromhex("0800") + bytes([0x10]) + varint(ledger_id) + bytes.fromhex("1801")
        assert recv_frame(connection) == (
            bytes.fromhex("0a060803100218171000aa06") + bytes([len(added)]) + added
        )
