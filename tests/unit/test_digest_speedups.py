"""The C speedups of CRC32C entries (``_speedups.c``) against the pure-Python path: the
same bytes packaged, the same payloads accepted, the same entries refused (with the pure path's
error). Where a C compiler and an x86-64 CPU are at hand (CI), the speedups must have been built
by the install, so that the suite runs on them."""

from __future__ import annotations

import asyncio
import collections
import itertools
import platform
import shutil
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper_py import errors, metrics, prometheus, speedups
from bookkeeper_py.client.ledger import LedgerEntry
from bookkeeper_py.storage import journal
from bookkeeper_py.wire import digest, framing, v2
from bookkeeper_py.wire.digest import DigestManager, DigestType
from bookkeeper_py.wire.errors import MalformedMessageError
from bookkeeper_py.wire.status import StatusCode, to_v2

needs_speedups = pytest.mark.skipif(not speedups.SPEEDUPS, reason="C speedups not built here")


def pure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digest, "_c_payload", None)
    monkeypatch.setattr(digest, "_c_package", None)
    monkeypatch.setattr(digest, "_c_package_run", None)


@pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("cc") is None,
    reason="no C compiler or not x86-64: the pure path is the one in use",
)
def test_the_install_built_the_speedups_where_it_can() -> None:
    assert speedups.SPEEDUPS


@needs_speedups
@given(
    ledger_id=st.integers(0, 2**63 - 1),
    entry_id=st.integers(0, 2**63 - 1),
    lac=st.integers(-1, 2**63 - 1),
    length=st.integers(0, 2**63 - 1),
    payload=st.binary(max_size=3000),
)
def test_c_and_python_package_and_check_entries_alike(
    ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes
) -> None:
    manager = DigestManager(ledger_id, DigestType.CRC32C, b"pw")
    packaged = manager.package(entry_id, lac, length, payload)
    with pytest.MonkeyPatch.context() as patch:
        pure(patch)
        assert manager.package(entry_id, lac, length, payload) == packaged
        assert manager.payload(packaged, entry_id) == payload
    assert manager.payload(packaged, entry_id) == payload
    assert manager.verify(packaged, entry_id).payload == payload


@needs_speedups
@given(
    first=st.integers(0, 2**40),
    lac=st.integers(-1, 2**40),
    payloads=st.lists(st.binary(max_size=1500), max_size=20),
)
def test_a_run_packaged_in_one_c_call_is_the_entries_packaged_one_by_one(
    first: int, lac: int, payloads: list[bytes]
) -> None:
    manager = DigestManager(7, DigestType.CRC32C, b"pw")
    lengths = list(itertools.accumulate(map(len, payloads), initial=100))[1:]
    run = manager.package_run(first, lac, lengths, [bytes(p) for p in payloads])
    assert run == [
        manager.package(first + at, lac, lengths[at], payload)
        for at, payload in enumerate(payloads)
    ]
    with pytest.MonkeyPatch.context() as patch:
        pure(patch)
        assert manager.package_run(first, lac, lengths, payloads) == run
    with pytest.raises(TypeError, match="package_run"):
        speedups.native.crc32c_package_run(7, first, lac, [*lengths, 1], payloads)


@needs_speedups
@pytest.mark.parametrize(
    # around the C CRC32C's stretches of three lanes (3 x 256 and 3 x 64 bytes, after the 32-byte
    # header), one or several of them, and a tail of single bytes
    "size",
    [0, 1, 7, 8, 159, 160, 161, 735, 736, 737, 928, 992, 1024, 2339, 2340, 65_536, 100_003],
)
def test_c_and_python_agree_on_crc32c_across_its_lanes(size: int) -> None:
    payload = bytes((i * 131 + size) % 251 for i in range(size))
    manager = DigestManager(11, DigestType.CRC32C, b"pw")
    packaged = manager.package(5, 4, size, payload)
    with pytest.MonkeyPatch.context() as patch:
        pure(patch)
        assert manager.package(5, 4, size, payload) == packaged
    damaged = bytearray(packaged)
    damaged[-1 if size else 20] ^= 0x10
    with pytest.raises(errors.DigestMismatchError):
        manager.payload(bytes(damaged), 5)


@needs_speedups
@pytest.mark.parametrize(
    "damage",
    ["payload bit", "digest bit", "header bit", "other entry", "other ledger", "too short"],
)
def test_c_and_python_refuse_the_same_entries_with_the_same_error(damage: str) -> None:
    manager = DigestManager(7, DigestType.CRC32C, b"pw")
    good = manager.package(3, 2, 100, b"x" * 100)
    bad, entry_id = bytearray(good), 3
    if damage == "payload bit":
        bad[-1] ^= 1
    elif damage == "digest bit":
        bad[33] ^= 1
    elif damage == "header bit":
        bad[20] ^= 1
    elif damage == "other entry":
        entry_id = 4
    elif damage == "other ledger":
        bad = bytearray(DigestManager(8, DigestType.CRC32C, b"pw").package(3, 2, 100, b"x" * 100))
    else:
        bad = bad[:30]
    with pytest.raises(errors.DigestMismatchError) as c_error:
        manager.payload(bytes(bad), entry_id)
    with pytest.MonkeyPatch.context() as patch:
        pure(patch)
        with pytest.raises(errors.DigestMismatchError) as python_error:
            manager.payload(bytes(bad), entry_id)
    assert str(c_error.value) == str(python_error.value)


@needs_speedups
def test_the_speedups_take_any_buffer_and_leave_other_digests_to_python() -> None:
    manager = DigestManager(7, DigestType.CRC32C, b"pw")
    packaged = manager.package(1, 0, 5, b"hello")
    assert manager.payload(memoryview(bytearray(packaged)), 1) == b"hello"  # type: ignore[arg-type]
    for kind in (DigestType.CRC32, DigestType.MAC, DigestType.DUMMY):
        other = DigestManager(7, kind, b"pw")
        assert other.payload(other.package(1, 0, 5, b"hello"), 1) == b"hello"


def batch_body(records: list[bytes]) -> bytes:
    """A BATCH_READ_ENTRY answer body: the request id, then ``[int32 length][entry]`` records."""
    return (7).to_bytes(8, "big") + b"".join(len(r).to_bytes(4, "big") + r for r in records)


def long_way(manager: DigestManager, body: bytes, first: int, count: int) -> list[bytes]:
    """The client's entry-by-entry path for a batch answer (what it serves before any fault)."""
    served = []
    for offset, raw in enumerate(v2.batch_entries(body)):
        if offset >= count:
            break
        served.append(manager.payload(raw, first + offset))
    return served


@needs_speedups
@given(
    payloads=st.lists(st.binary(max_size=1500), max_size=12),
    first=st.integers(0, 2**40),
    extra=st.integers(0, 3),
    damage=st.sampled_from(
        ["none", "payload bit", "digest bit", "other entry", "length overrun", "too short", "cut"]
    ),
    where=st.integers(0, 11),
)
def test_a_batch_answer_checked_in_one_c_call_is_what_the_long_way_serves(
    payloads: list[bytes], first: int, extra: int, damage: str, where: int
) -> None:
    """The C path takes a batch answer only when every record is whole and good, and then gives
    the payloads the entry-by-entry path gives; anything else (a damaged record anywhere, more
    records than asked for) goes the long way, which names the fault."""
    manager = DigestManager(42, DigestType.CRC32C, b"pw")
    records = [manager.package(first + i, first + i - 1, 0, p) for i, p in enumerate(payloads)]
    body = batch_body(records)
    if records and damage != "none":
        at = where % len(records)
        record = bytearray(records[at])
        if damage == "payload bit":
            record[-1 if len(record) > 36 else 20] ^= 0x01
        elif damage == "digest bit":
            record[33] ^= 0x80
        elif damage == "other entry":
            record[8:16] = (first + at + 1).to_bytes(8, "big")
        records[at] = bytes(record)
        body = batch_body(records)
        if damage == "length overrun":
            body = body[:-1]  # the last record's length now overruns the body
        elif damage == "too short":
            records[at] = records[at][:20]
            body = batch_body(records)
        elif damage == "cut":
            body = body[: 8 + 4 + 10]
    count = max(len(records) - extra, 0)
    native = speedups.native
    assert native is not None
    entries = native.crc32c_batch_entries(body, 42, first, count, LedgerEntry)
    fast = None if entries is None else [entry.data for entry in entries]
    if entries is not None:
        assert entries == [LedgerEntry(42, first + i, data) for i, data in enumerate(fast or [])]
    try:
        slow: list[bytes] | Exception = long_way(manager, body, first, count)
    except (errors.DigestMismatchError, MalformedMessageError, ValueError) as error:
        slow = error
    if fast is not None:
        assert fast == slow
    if damage == "none" and extra == 0:
        assert fast == payloads


@needs_speedups
def test_the_batch_pass_refuses_a_type_it_cannot_fill() -> None:
    native = speedups.native
    assert native is not None
    with pytest.raises(TypeError, match="entry_type"):
        native.crc32c_batch_entries(batch_body([]), 1, 0, 1, list)


def decoded(chunks: list[bytes], max_frame: int) -> tuple[list[bytes], str | None, int]:
    """What a FrameDecoder makes of ``chunks``: the frames, the error that stopped it, and the
    bytes it holds back."""
    decoder = framing.FrameDecoder(max_frame_size=max_frame)
    frames: list[bytes] = []
    for chunk in chunks:
        try:
            frames += decoder.feed(chunk)
        except framing.FrameError as error:
            return frames, str(error), decoder.buffered
    return frames, None, decoder.buffered


@needs_speedups
@given(
    bodies=st.lists(st.binary(max_size=300), max_size=30),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
    oversize=st.booleans(),
    tail=st.binary(max_size=6),
)
def test_c_and_python_split_frames_alike(
    bodies: list[bytes], cuts: list[int], oversize: bool, tail: bytes
) -> None:
    """Frames cut anywhere across chunks, a frame larger than allowed, a partial tail: the C
    splitter gives the same frames, error and held-back bytes as the pure loop."""
    stream = b"".join(framing.encode_frame(body) for body in bodies)
    if oversize:
        stream += (301).to_bytes(4, "big") + bytes(301)
    stream += tail
    points = sorted({min(cut, len(stream)) for cut in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points)]
    with_c = decoded(chunks, 300)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(framing, "_split", None)
        assert decoded(chunks, 300) == with_c
    if not oversize and not tail:
        assert with_c == (bodies, None, 0)


def stripe_long_way(
    frames: list[bytes],
    pending: dict[int, object],
    results: list[object],
    first: int,
    manager: DigestManager,
    gone: object,
) -> tuple[list[int], list[tuple[int, int, bytes, object]]]:
    """What the C stripe pass stands for: each stripe answer that checks out kept, the rest
    left with their attempts."""
    delivered: list[int] = []
    rest: list[tuple[int, int, bytes, object]] = []
    for frame in frames:
        entry_id, rc, body = v2.read_answer(frame)
        attempt = pending.pop(entry_id, gone)
        if attempt is None and rc == 0 and 0 <= entry_id - first < len(results):
            try:
                data = manager.payload(body, entry_id)
            except errors.DigestMismatchError:
                pass
            else:
                results[entry_id - first] = LedgerEntry(manager.ledger_id, entry_id, data)
                delivered.append(entry_id)
                continue
        rest.append((entry_id, rc, body, attempt))
    return delivered, rest


@needs_speedups
@given(
    kinds=st.lists(
        st.sampled_from(["good", "refused", "bit", "other entry", "gone", "attempt", "beyond"]),
        max_size=40,
    ),
    first=st.integers(0, 2**40),
)
def test_a_stripe_pass_in_c_keeps_what_the_long_way_keeps(kinds: list[str], first: int) -> None:
    """The client's C pass over a bookie's stripe answers keeps the entries that check out, as
    named tuples equal to the long way's, takes every answer's attempt out of the pending reads,
    and leaves the others (refusals, damaged or misplaced entries, speculative attempts,
    answers nobody waits for) in the same order for the long way."""
    native = speedups.native
    assert native is not None
    manager = DigestManager(7, DigestType.CRC32C, b"pw")
    gone, attempt = object(), object()
    frames: list[bytes] = []
    pending: dict[int, object] = {}
    for offset, kind in enumerate(kinds):
        entry_id = first + offset + (len(kinds) if kind == "beyond" else 0)
        body = manager.package(entry_id, entry_id - 1, 0, bytes([offset % 251]) * (offset * 37))
        if kind == "bit":
            body = body[:-1] + bytes([body[-1] ^ 1]) if len(body) > 36 else body[:20]
        elif kind == "other entry":
            body = manager.package(entry_id + 1, entry_id, 0, b"x")
        status = StatusCode.ENOENTRY if kind == "refused" else StatusCode.EOK
        frames.append(v2.encode_response(v2.OpCode.READ_ENTRY, status, 7, entry_id, body)[4:])
        if kind != "gone":
            pending[entry_id] = attempt if kind == "attempt" else None
    fast_pending, slow_pending = dict(pending), dict(pending)
    fast_results: list[object] = [None] * len(kinds)
    slow_results: list[object] = [None] * len(kinds)
    fast = native.stripe_answers(frames, fast_pending, fast_results, first, 7, LedgerEntry, gone)
    slow = stripe_long_way(frames, slow_pending, slow_results, first, manager, gone)
    assert fast == slow
    assert fast_results == slow_results and fast_pending == slow_pending == {}
    assert all(type(entry) is LedgerEntry for entry in fast_results if entry is not None)
    assert fast[0] == [first + i for i, kind in enumerate(kinds) if kind == "good"]


@needs_speedups
def test_the_stripe_pass_refuses_a_type_it_cannot_fill() -> None:
    native = speedups.native
    assert native is not None
    with pytest.raises(TypeError, match="entry_type"):
        native.stripe_answers([], {}, [], 0, 1, object, None)


@needs_speedups
@given(
    st.lists(
        st.one_of(
            st.tuples(st.integers(0, 2), st.integers(-1, 2**40)).map(
                lambda ids: v2.encode_read_request(ids[0], ids[1])[4:]
            ),
            st.sampled_from(
                [b"", b"\x00" * 20, v2.encode_read_request(1, 2, v2.FLAG_DO_FENCING, b"k" * 20)[4:]]
            ),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 50),
)
def test_c_and_python_take_the_same_run_of_plain_reads(frames: list[bytes], room: int) -> None:
    """A bookie's run of plain reads: the frames taken off the backlog, and their ids grouped
    by ledger, are the same either way; the run stops at the first frame that is not a plain
    read, and at ``room``."""
    native = speedups.native
    assert native is not None
    first = v2.encode_read_request(5, 9)[4:]
    python_backlog, c_backlog = collections.deque(frames), collections.deque(frames)
    expected = v2._take_plain_reads(
        python_backlog, first, room, v2.PLAIN_READ_HEAD, v2.PLAIN_READ_SIZE
    )
    got = native.take_plain_reads(c_backlog, first, room, v2.PLAIN_READ_HEAD, v2.PLAIN_READ_SIZE)
    assert got == expected
    assert c_backlog == python_backlog
    groups, count = got
    plain = list(
        itertools.takewhile(lambda f: len(f) == 20 and f.startswith(v2.PLAIN_READ_HEAD), frames)
    )
    assert count == min(room, 1 + len(plain))
    taken = [struct.unpack_from(">qq", f, 4) for f in [first, *plain][:count]]
    assert [(lid, eid) for lid, ids in groups for eid in ids] == taken
    assert all(a[0] != b[0] for a, b in itertools.pairwise(groups))  # one group per stretch


@needs_speedups
@given(
    st.lists(
        st.tuples(st.integers(0, 2**62), st.binary(max_size=64), st.sampled_from(list(StatusCode))),
        max_size=20,
    )
)
def test_c_and_python_frame_read_answers_alike(
    answers: list[tuple[int, bytes, StatusCode]],
) -> None:
    """The answers to a ledger's plain reads framed in one C call are the Python path's bytes,
    and each decodes to its entry id, status and entry."""
    native = speedups.native
    assert native is not None
    entry_ids = [entry_id for entry_id, _, _ in answers]
    entries = [body if status is StatusCode.EOK else b"" for _, body, status in answers]
    statuses = {i: s for i, (_, _, s) in enumerate(answers) if s is not StatusCode.EOK}
    codes = {i: to_v2(s) for i, s in statuses.items()}
    header = v2.pack_header(v2.OpCode.READ_ENTRY, 0)
    framed = native.v2_answers(77, entry_ids, entries, codes, header)
    assert framed == v2._v2_answers(77, entry_ids, entries, codes, header)
    assert framed == v2.encode_read_responses(77, entry_ids, entries, statuses)
    views = [memoryview(entry) for entry in entries]  # not bytes: the Python path's, alike
    if views:
        assert native.v2_answers(77, entry_ids, views, codes, header) is None
    assert v2._answers(77, entry_ids, views, codes, header) == framed  # type: ignore[arg-type]
    decoded = [v2.decode_response(frame) for frame in framing.FrameDecoder().feed(framed)]
    assert [(r.entry_id, r.status, r.body) for r in decoded] == [
        (entry_id, status, entry)
        for entry_id, entry, status in zip(
            entry_ids,
            entries,
            [statuses.get(i, StatusCode.EOK) for i in range(len(entries))],
            strict=True,
        )
    ]


@needs_speedups
@given(
    st.lists(st.binary(max_size=64), max_size=20),
    st.sampled_from(list(StatusCode)),
    st.integers(0, 2**62),
    st.integers(-(2**63), 2**63 - 1),
)
def test_c_and_python_frame_batch_read_answers_alike(
    entries: list[bytes], status: StatusCode, start: int, request_id: int
) -> None:
    """A batch read's answer framed in one C call is the Python path's bytes (which also takes
    other buffer types, where the C call leaves them to it), and decodes to its fields and
    entries."""
    framed = v2.encode_batch_read_response(status, 7, start, request_id, entries)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(v2, "native", None)
        assert v2.encode_batch_read_response(status, 7, start, request_id, entries) == framed
    assert speedups.native is not None
    head = framed[: v2._FRAMED_BATCH_RESPONSE.size]  # the fixed part and the request id
    assert speedups.native.v2_batch_answer(head, entries) == framed
    assert v2._batch_answer(head, entries) == framed
    views = [memoryview(entry) for entry in entries]
    if views:
        assert speedups.native.v2_batch_answer(head, views) is None
    assert v2.encode_batch_read_response(status, 7, start, request_id, views) == framed  # type: ignore[arg-type]
    (frame,) = framing.FrameDecoder().feed(framed)
    response = v2.decode_response(frame)
    assert (response.opcode, response.status, response.ledger_id, response.entry_id) == (
        v2.OpCode.BATCH_READ_ENTRY,
        status,
        7,
        start,
    )
    assert struct.unpack_from(">q", response.body)[0] == request_id
    assert v2.batch_entries(response.body) == entries


def _add_frame(ledger_id: int, entry_id: int, key: bytes, tail: bytes) -> bytes:
    """A plain add frame (no length prefix) whose entry is its ids then ``tail``."""
    entry = struct.pack(">qq", ledger_id, entry_id) + tail
    return v2.encode_add_request(key, entry)[4:]


_ADD_FRAMES = st.lists(
    st.one_of(
        st.tuples(
            st.integers(0, 2),
            st.integers(-2, 2**40),
            st.sampled_from([b"a" * 20, b"b" * 20]),
            st.one_of(
                st.binary(max_size=8),
                st.integers(-1, 2**40).map(lambda lac: struct.pack(">q", lac) + b"x" * 24),
            ),
        ).map(lambda f: _add_frame(*f)),
        st.sampled_from([b"", b"\x00" * 40, v2.encode_read_request(1, 2)[4:]]),
    ),
    min_size=1,
    max_size=40,
)


@needs_speedups
@given(_ADD_FRAMES, st.integers(1, 50))
def test_c_and_python_take_the_same_run_of_plain_adds(frames: list[bytes], room: int) -> None:
    """A bookie's run of plain adds: the frames taken off the backlog, their entries cut out
    and grouped by ledger and master key, and each group's LAC (None where an entry is too short
    to carry one or an id is negative) are the same either way."""
    native = speedups.native
    assert native is not None
    first = _add_frame(5, 9, b"a" * 20, struct.pack(">q", 3) + b"y" * 30)
    python_backlog, c_backlog = collections.deque(frames), collections.deque(frames)
    args = (first, room, v2.PLAIN_ADD_HEAD, v2.PLAIN_ADD_MIN_SIZE)
    expected = v2._take_plain_adds(python_backlog, *args)
    got = native.take_plain_adds(c_backlog, *args)
    assert got == expected
    assert c_backlog == python_backlog
    groups, count = got
    plain = list(
        itertools.takewhile(
            lambda f: len(f) >= v2.PLAIN_ADD_MIN_SIZE and f.startswith(v2.PLAIN_ADD_HEAD), frames
        )
    )
    taken = [first, *plain][:count]
    assert count == min(room, 1 + len(plain))
    assert [e for group in groups for e in group[3]] == [f[24:] for f in taken]
    for ledger_id, _, entry_ids, entries, lac in groups:
        assert entry_ids == [struct.unpack_from(">q", e, 8)[0] for e in entries]
        assert {struct.unpack_from(">q", e)[0] for e in entries} == {ledger_id}
        whole = all(len(e) >= 24 for e in entries) and min(entry_ids) >= 0
        assert lac == (max(struct.unpack_from(">q", e, 16)[0] for e in entries) if whole else None)


@needs_speedups
@given(_ADD_FRAMES, st.integers(1, 50), st.integers(0, 8), st.integers(0, 60), st.integers(40, 200))
def test_c_and_python_cut_the_same_run_of_plain_adds_out_of_received_bytes(
    frames: list[bytes], room: int, start: int, cut_tail: int, max_frame: int
) -> None:
    """A bookie's run of plain adds cut straight out of the bytes it received: the same groups,
    count and stopping place either way; and the same groups as the frames taken off a backlog
    (``take_plain_adds``), up to the first frame that is not a whole plain add of at most
    ``max_frame`` bytes (the tail of the bytes cut short: a frame still arriving)."""
    native = speedups.native
    assert native is not None
    received = b"\xee" * start + b"".join(struct.pack(">I", len(f)) + f for f in frames)
    received = received[: max(start, len(received) - cut_tail)]
    args = (start, room, v2.PLAIN_ADD_HEAD, v2.PLAIN_ADD_MIN_SIZE, max_frame)
    expected = v2._cut_plain_adds(received, *args)
    got = native.cut_plain_adds(received, *args)
    assert got == expected
    groups, count, position = got
    # The frames a decoder would split there, in order; those taken are the plain adds ahead.
    whole = framing.FrameDecoder(max_frame_size=2**20).feed(received, start)
    plain = list(
        itertools.takewhile(
            lambda f: (
                len(f) <= max_frame
                and len(f) >= v2.PLAIN_ADD_MIN_SIZE
                and f.startswith(v2.PLAIN_ADD_HEAD)
            ),
            whole,
        )
    )
    assert count == min(room, len(plain))
    assert position == start + sum(4 + len(f) for f in plain[:count])
    if count:
        backlog = collections.deque(plain[1:count])
        taken = v2._take_plain_adds(
            backlog, plain[0], count, v2.PLAIN_ADD_HEAD, v2.PLAIN_ADD_MIN_SIZE
        )
        assert (groups, count) == taken
    else:
        assert groups == []


@needs_speedups
@given(st.lists(st.integers(0, 2**62), max_size=30), st.sampled_from(list(StatusCode)))
def test_c_and_python_frame_add_answers_alike(entry_ids: list[int], status: StatusCode) -> None:
    native = speedups.native
    assert native is not None
    header = v2.pack_header(v2.OpCode.ADD_ENTRY, 0)
    framed = native.v2_answers(3, entry_ids, None, to_v2(status), header)
    assert framed == v2._v2_answers(3, entry_ids, None, to_v2(status), header)
    assert framed == v2.encode_add_responses(status, 3, entry_ids)
    decoded = [v2.decode_response(frame) for frame in framing.FrameDecoder().feed(framed)]
    assert [(r.opcode, r.status, r.ledger_id, r.entry_id) for r in decoded] == [
        (v2.OpCode.ADD_ENTRY, status, 3, e) for e in entry_ids
    ]


@needs_speedups
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.sampled_from(list(journal.RecordType)),
                st.binary(max_size=300),
                st.one_of(st.none(), st.integers()),
                st.booleans(),
            ),
            st.tuples(  # a run of entries appended together
                st.just(journal._ENTRIES),
                st.lists(st.binary(max_size=300), min_size=1, max_size=5),
                st.one_of(st.none(), st.integers()),
                st.just(False),
            ),
        ),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from([1, 64, 4096]),
)
def test_c_and_python_make_the_same_journal_group(
    batch: list[tuple[int, Any, int | None, bool]], gather_min: int
) -> None:
    """A journal group made in one C call is the Python path's bytes (header, count, types,
    lengths, bodies; joined or not), reads back as its records (a run as one ENTRY record a
    body), and names the same tokens (a run's once)."""
    native = speedups.native
    assert native is not None
    pieces, tokens = native.journal_group(list(batch), gather_min)
    python_pieces, python_tokens = journal._group_pieces(list(batch), gather_min)
    assert b"".join(pieces) == b"".join(python_pieces)
    assert tokens == python_tokens == [t for _, _, t, _ in batch if t is not None]
    records, problem, _ = journal._parse_group(b"".join(pieces), 0)
    assert problem is None
    expected = []
    for kind, body, _, _ in batch:
        if kind == journal._ENTRIES:
            expected += [(journal.RecordType.ENTRY, one) for one in body]
        else:
            expected.append((kind, body))
    assert records == expected
    assert journal._records(list(batch)) == len(expected)
    # a body of another buffer type: left to the Python path, which gives the same bytes
    other = [
        (kind, [bytearray(b) for b in body] if kind == journal._ENTRIES else bytearray(body), t, g)
        for kind, body, t, g in batch
    ]
    assert native.journal_group(list(other), gather_min) is None
    assert b"".join(journal._group_pieces(list(other), gather_min)[0]) == b"".join(pieces)


@needs_speedups
@given(
    st.lists(
        st.tuples(st.sampled_from([None, 3, 3, 3, 5]), st.integers(0, 5), st.integers(1, 3)),
        max_size=30,
    )
)
def test_a_writers_adds_grouped_in_c_are_grouped_as_the_long_way_groups_them(
    adds: list[tuple[int | None, int, int]],
) -> None:
    """A writer's sends of one pass, grouped by bookie in C up to an entry of another length:
    each bookie's batch has the entry ids and the request chunks (head, entry) the Python loop
    gives, entries gone (failed) are left out, and the C pass stops where the length changes."""
    native = speedups.native
    assert native is not None
    bookies = [(i, f"b{i}:3181") for i in range(4)]
    entry_ids = list(range(len(adds)))
    targets = [tuple(bookies[(first + k) % 4] for k in range(width)) for _, first, width in adds]
    entries = {i: bytes([i % 251]) * size for i, (size, _, _) in enumerate(adds) if size}
    key = b"k" * 20
    expected: dict[tuple[int, str], tuple[list[int], list[bytes]]] = {}
    for entry_id, to in zip(entry_ids, targets, strict=True):
        if entry_id in entries:
            for target in to:
                batch = expected.setdefault(target, ([], []))
                batch[0].append(entry_id)
                batch[1].extend(
                    (v2.add_request_head(key, len(entries[entry_id])), entries[entry_id])
                )
    got: dict[tuple[int, str], tuple[list[int], list[bytes]]] = {}
    at = 0
    while at < len(entry_ids):  # as WriteHandle._send_batches goes on after a length change
        entry = entries.get(entry_ids[at])
        if entry is None:
            at += 1
            continue
        head = v2.add_request_head(key, len(entry))
        stop = native.group_adds(entry_ids, targets, entries, head, got, at)
        assert stop > at
        assert stop == len(entry_ids) or len(entries[entry_ids[stop]]) != len(entry)
        at = stop
    assert got == expected


@needs_speedups
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.floats(allow_nan=False, allow_infinity=True),
                st.sampled_from(metrics.LATENCY_BUCKETS_S),  # on a bound: that bucket
            ),
            st.integers(0, 1000),
        ),
        max_size=40,
    )
)
def test_a_latency_histogram_in_c_counts_as_the_python_one(
    latencies: list[tuple[float, int]],
) -> None:
    """``LatencyBuckets``: the same count in the same bucket as ``prometheus._Buckets`` (a
    latency on a bound in that bound's bucket, below every bound in the first, above them in
    the last), and the same sum."""
    native = speedups.native
    assert native is not None
    c_buckets = native.LatencyBuckets(metrics.LATENCY_BUCKETS_S)
    python_buckets = prometheus._Buckets()
    for seconds, count in latencies:
        if count == 1:
            c_buckets.observe(seconds)
            python_buckets.observe(seconds)
        else:
            c_buckets.observe_many(seconds, count)
            python_buckets.observe_many(seconds, count)
    assert c_buckets.counts == python_buckets.counts
    assert c_buckets.total == pytest.approx(python_buckets.total, nan_ok=True)
    with pytest.raises(ValueError, match="the bounds must increase"):
        native.LatencyBuckets((0.1, 0.1))
    with pytest.raises(TypeError):
        c_buckets.observe("0.1")  # type: ignore[arg-type]


@needs_speedups
def test_completed_adds_in_c_get_their_ids_leave_cancelled_ones_alone_and_list_callbacks() -> None:
    native = speedups.native
    assert native is not None

    async def main() -> None:
        loop = asyncio.get_running_loop()
        futures: dict[int, object] = {i: loop.create_future() for i in range(10)}
        taken = dict(futures)
        entries = {i: b"e" for i in range(12)}
        futures[4].cancel()  # type: ignore[attr-defined]
        del futures[6]  # its caller is gone
        futures[5] = callback = print  # an add's callback: listed, not called
        ready: list[tuple[object, int, None]] = []
        native.complete_adds(entries, futures, 2, 7, asyncio.Future, ready)
        assert sorted(entries) == [0, 1, 8, 9, 10, 11]
        assert sorted(futures) == [0, 1, 8, 9]
        assert [taken[i].result() for i in (2, 3, 7)] == [2, 3, 7]  # type: ignore[attr-defined]
        assert taken[4].cancelled() and not taken[6].done()  # type: ignore[attr-defined]
        assert ready == [(callback, 5, None)]

    asyncio.run(main())


def test_a_stale_build_of_the_speedups_falls_back_to_python(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``_speedups`` built from an older ``_speedups.c`` (a name the code uses is missing) is
    not used: the pure-Python paths are, and a warning names what is missing and how to rebuild,
    rather than an AttributeError when the first module that needs the name is imported."""
    import sys
    import types

    import bookkeeper_py

    stale = types.ModuleType("bookkeeper_py._speedups")
    for name in speedups.REQUIRED:
        if name != "index_pairs":
            setattr(stale, name, object())
    monkeypatch.setattr(bookkeeper_py, "_speedups", stale, raising=False)
    monkeypatch.setitem(sys.modules, "bookkeeper_py._speedups", stale)
    monkeypatch.delenv("BOOKKEEPER_PY_PURE", raising=False)
    with caplog.at_level("WARNING", logger="bookkeeper_py.speedups"):
        assert speedups._load() is None
    assert "index_pairs" in caplog.text and "rebuild" in caplog.text
    stale.index_pairs = object()  # type: ignore[attr-defined]
    assert speedups._load() is stale


def test_every_name_the_code_takes_from_the_speedups_is_required() -> None:
    """``speedups.REQUIRED`` lists every ``native.NAME`` the package uses, so that a build
    without one of them falls back as a whole."""
    import pathlib
    import re

    package = pathlib.Path(speedups.__file__).parent
    used = {
        match
        for path in package.rglob("*.py")
        if path.name != "speedups.py"  # the list itself, and its comment
        for match in re.findall(r"\bnative\.([A-Za-z_]\w*)", path.read_text())
    }
    assert used and used <= set(speedups.REQUIRED), sorted(used - set(speedups.REQUIRED))
