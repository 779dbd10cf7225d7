"""BATCH_READ_ENTRY on the client side: the request the bookie decodes, the answer it encodes
split back into entries, and a truncated answer refused."""

from __future__ import annotations

import pytest

from bookkeeper_py.wire import v2
from bookkeeper_py.wire.errors import MalformedMessageError
from bookkeeper_py.wire.status import StatusCode


def test_a_batch_request_is_what_the_bookie_decodes() -> None:
    frame = v2.encode_batch_read_request(7, 100, 42, 512, 4 << 20)
    request = v2.decode_request(frame[4:])
    assert isinstance(request, v2.BatchReadRequest)
    assert (request.ledger_id, request.start_entry_id, request.request_id) == (7, 100, 42)
    assert (request.max_count, request.max_size, request.master_key) == (512, 4 << 20, None)


def test_a_batch_answer_splits_into_its_entries() -> None:
    entries = [b"a" * 10, b"", b"c" * 3000]
    frame = v2.encode_batch_read_response(StatusCode.EOK, 7, 100, 42, entries)
    response = v2.decode_response(frame[4:])
    assert (response.opcode, response.status, response.entry_id) == (
        v2.OpCode.BATCH_READ_ENTRY,
        StatusCode.EOK,
        100,
    )
    assert v2.batch_entries(response.body) == entries


def test_a_truncated_batch_answer_is_refused() -> None:
    frame = v2.encode_batch_read_response(StatusCode.EOK, 7, 100, 42, [b"x" * 100])
    body = v2.decode_response(frame[4:]).body
    with pytest.raises(MalformedMessageError, match="overruns"):
        v2.batch_entries(body[:-1])
