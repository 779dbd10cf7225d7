"""Property tests of every decoder a peer can reach: arbitrary bytes give a message or the
protocol's own error, never a crash; well-formed messages survive any split into TCP chunks."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookkeeper_py.auth import SharedSecretBookieAuthProvider
from bookkeeper_py.server.bookie import Bookie, BookieConfig
from bookkeeper_py.server.connection import BookieConnection, Security
from bookkeeper_py.storage.engine import StorageConfig
from bookkeeper_py.tls import TlsConfig
from bookkeeper_py.wire import v2, v3
from bookkeeper_py.wire.errors import MalformedMessageError
from bookkeeper_py.wire.framing import FrameDecoder, FrameError, encode_frame

KEY = b"k" * 20


@given(st.binary(max_size=600))
def test_v2_request_decoder(data: bytes) -> None:
    try:
        v2.decode_request(data)
    except MalformedMessageError:
        pass


@given(st.binary(max_size=600))
def test_v2_auth_decoder(data: bytes) -> None:
    for candidate in (data, b"\x02\x03\x00\x00" + data):
        try:
            v2.decode_auth(candidate)
        except MalformedMessageError:
            pass


@given(st.binary(max_size=600))
def test_v2_response_decoder(data: bytes) -> None:
    try:
        v2.decode_response(data)
    except MalformedMessageError:
        pass


@given(st.binary(max_size=600))
def test_v3_decoders(data: bytes) -> None:
    for decode in (v3.decode_request, v3.decode_response):
        try:
            decode(data)
        except MalformedMessageError:
            pass


@given(
    st.lists(st.binary(max_size=300), max_size=20),
    st.lists(st.integers(1, 64), min_size=1, max_size=50),
)
def test_frames_survive_any_split(bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(body) for body in bodies)
    decoder = FrameDecoder(max_frame_size=1024)
    received: list[bytes] = []
    position = 0
    for cut in cuts * (len(stream) // max(sum(cuts), 1) + 1):
        if position >= len(stream):
            break
        received.extend(decoder.feed(stream[position : position + cut]))
        position += cut
    received.extend(decoder.feed(stream[position:]))
    assert received == bodies
    assert decoder.buffered == 0


@given(st.binary(max_size=64))
def test_frame_decoder_rejects_only_oversized_frames(data: bytes) -> None:
    decoder = FrameDecoder(max_frame_size=16)
    try:
        for frame in decoder.feed(data):
            assert len(frame) <= 16
    except FrameError:
        assert any(
            int.from_bytes(data[i : i + 4], "big") > 16 for i in range(0, max(len(data) - 3, 1))
        )


@given(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, 1, 2, 4, 7]),
)
def test_v2_requests_round_trip(ledger_id: int, entry_id: int, flags: int) -> None:
    entry = (
        ledger_id.to_bytes(8, "big", signed=True)
        + entry_id.to_bytes(8, "big", signed=True)
        + b"body"
    )
    add = v2.decode_request(v2.encode_add_request(KEY, entry, flags)[4:])
    assert isinstance(add, v2.AddRequest)
    assert (add.ledger_id, add.entry_id, add.flags, add.entry) == (
        ledger_id,
        entry_id,
        flags,
        entry,
    )
    fence_key = KEY if flags & v2.FLAG_DO_FENCING else None
    read = v2.decode_request(v2.encode_read_request(ledger_id, entry_id, flags, fence_key)[4:])
    assert isinstance(read, v2.ReadRequest)
    assert (read.ledger_id, read.entry_id, read.master_key) == (ledger_id, entry_id, fence_key)


class FakeTransport(asyncio.Transport):
    """Collects what the bookie writes; records whether it closed the connection."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


@pytest.fixture(scope="module")
def bookie() -> Iterator[Bookie]:
    loop = asyncio.new_event_loop()  # never run: journal completions just queue up on it
    with tempfile.TemporaryDirectory() as directory:
        config = BookieConfig(
            StorageConfig(f"{directory}/journal", f"{directory}/ledgers", flush_interval_s=3600)
        )
        subject = Bookie(config, loop)
        subject.start()
        yield subject
        subject.close()
    loop.close()


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=300)
@given(st.lists(st.binary(max_size=200), max_size=8))
def test_a_connection_fed_garbage_answers_or_closes_but_never_raises(
    bookie: Bookie, chunks: list[bytes]
) -> None:
    connection = BookieConnection(bookie, set())
    transport = FakeTransport()
    connection.connection_made(transport)
    for chunk in chunks:
        connection.data_received(chunk)  # must not raise, whatever the bytes
        if transport.closed:
            break
    connection.connection_lost(None)


@pytest.fixture(scope="module")
def security(tmp_path_factory: pytest.TempPathFactory) -> Security:
    """TLS and shared-secret authentication, as a bookie configured for both runs them."""
    directory = tmp_path_factory.mktemp("pki")
    cert = trustme.CA().issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(directory / "cert"))
    cert.private_key_pem.write_to_path(str(directory / "key"))
    tls = TlsConfig(certificate_path=str(directory / "cert"), key_path=str(directory / "key"))
    return Security(tls.server_context(), SharedSecretBookieAuthProvider(b"s" * 32))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=300)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=200),
            st.binary(max_size=200).map(lambda tail: b"\x16\x03\x01" + tail),  # TLS records
            st.binary(max_size=120).map(  # AUTH frames with arbitrary payloads
                lambda payload: v2.encode_auth("pybookkeeper-shared-secret", payload)
            ),
        ),
        max_size=8,
    )
)
def test_a_secured_connection_fed_garbage_answers_or_closes_but_never_raises(
    bookie: Bookie, security: Security, chunks: list[bytes]
) -> None:
    connection = BookieConnection(bookie, set(), security)
    transport = FakeTransport()
    connection.connection_made(transport)
    for chunk in chunks:
        connection.data_received(chunk)
        if transport.closed:
            break
    connection.connection_lost(None)


def _v3_request(operation: int, txn: int, ledger: int, entry: int, blob: bytes, flag: int) -> bytes:
    request = v3.Request()
    request.header.CopyFrom(v3.header(operation, txn))
    if operation == 1:
        request.readRequest.ledgerId, request.readRequest.entryId = ledger, entry
        if flag:
            request.readRequest.flag = flag  # type: ignore[assignment]
            request.readRequest.masterKey = blob[:20]
            request.readRequest.previousLAC = entry - 1
            request.readRequest.timeOut = 0
    elif operation == 2:
        add = request.addRequest
        add.ledgerId, add.entryId, add.masterKey, add.body = ledger, entry, blob[:20], blob
    elif operation == 6:
        write = request.writeLacRequest
        write.ledgerId, write.lac, write.masterKey, write.body = ledger, entry, blob[:20], blob
    elif operation == 7:
        request.readLacRequest.ledgerId = ledger
    elif operation == 10:
        request.forceLedgerRequest.ledgerId = ledger
    return v3.encode(request)


small_ids = st.integers(-2, 5)
v2_frames = st.builds(
    lambda opcode, flags, tail: encode_frame(bytes([2, opcode]) + flags.to_bytes(2, "big") + tail),
    st.integers(0, 9),
    st.sampled_from([0, 1, 2, 4, 3, 0xFFFF]),
    st.binary(max_size=80),
)
v3_frames = st.builds(
    _v3_request,
    st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
    st.integers(0, 2**64 - 1),
    small_ids,
    small_ids,
    st.binary(max_size=60),
    st.sampled_from([0, 1, 2]),
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=300)
@given(st.lists(st.one_of(v2_frames, v3_frames), min_size=1, max_size=6), st.booleans())
def test_structured_requests_never_crash_a_connection(
    bookie: Bookie, frames: list[bytes], split: bool
) -> None:
    connection = BookieConnection(bookie, set())
    transport = FakeTransport()
    connection.connection_made(transport)
    stream = b"".join(frames)
    pieces = [stream[i : i + 7] for i in range(0, len(stream), 7)] if split else [stream]
    for piece in pieces:
        connection.data_received(piece)
        if transport.closed:
            break
    connection.connection_lost(None)
