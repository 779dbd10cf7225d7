"""The client connection's v2 requests: answers matched by (operation, ledger, entry) in the
order sent, deadlines read from the clock once per loop pass, overdue requests failed (issue 21:
no object and no clock read per request), and the batches of adds a writer sends per pass."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper_py import errors
from bookkeeper_py.client import connection as connection_module
from bookkeeper_py.client.connection import AddSink, BookieConnection, ReadSink
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.status import StatusCode, to_v2
from tests.speedup_paths import take_path

from .test_decoders_fuzz import FakeTransport

KEY = b"k" * 20
TIMEOUT_S = 5.0


class CountingClock:
    def __init__(self) -> None:
        self.time = 100.0
        self.reads = 0

    def now(self) -> float:
        self.reads += 1
        return self.time


Answers = list[tuple[str, StatusCode | None, object]]


def recorder(answers: Answers, name: str):  # type: ignore[no-untyped-def]
    def callback(status: StatusCode | None, body: object) -> None:
        answers.append((name, status, body))

    return callback


def connection() -> tuple[BookieConnection, CountingClock, Answers]:
    """A v2 connection over a fake transport (on the running loop), its clock, and the list
    its callbacks (``recorder``) append to."""
    clock = CountingClock()
    conn = BookieConnection("bookie-1:3181", False, TIMEOUT_S, clock)
    conn.connection_made(FakeTransport())
    return conn, clock, []


def answer(conn: BookieConnection, *responses: tuple[int, StatusCode, int, int, bytes]) -> None:
    conn.data_received(b"".join(v2.encode_response(*response) for response in responses))


READ = int(v2.OpCode.READ_ENTRY)
ADD = int(v2.OpCode.ADD_ENTRY)


def test_answers_complete_their_requests_in_order_per_key() -> None:
    async def main() -> None:
        conn, clock, answers = connection()
        # the same entry read twice at once, and an add, in one pass
        conn.read(7, 1, False, None, recorder(answers, "first read"))
        conn.read(7, 1, False, None, recorder(answers, "second read"))
        conn.add(7, 2, KEY, b"x" * 30, False, recorder(answers, "add"))
        assert clock.reads == 1  # one deadline for the pass
        await asyncio.sleep(0)  # the pass's frames go out
        conn.read(7, 3, False, None, recorder(answers, "next pass"))
        assert clock.reads == 2
        # answers of one data_received: the add's, then both reads', then one nobody asked for
        answer(
            conn,
            (ADD, StatusCode.EOK, 7, 2, b""),
            (READ, StatusCode.EOK, 7, 1, b"one"),
            (READ, StatusCode.ENOENTRY, 7, 1, b""),
            (READ, StatusCode.EOK, 9, 9, b"stray"),
        )
        assert answers == [
            ("add", StatusCode.EOK, b""),
            ("first read", StatusCode.EOK, b"one"),
            ("second read", StatusCode.ENOENTRY, b""),
        ]
        conn.close()
        assert answers[-1][0] == "next pass" and isinstance(answers[-1][2], errors.BKError)

    asyncio.run(main())


def test_overdue_requests_fail_and_the_newer_of_a_key_stay() -> None:
    async def main() -> None:
        conn, clock, answers = connection()
        conn.read(7, 1, False, None, recorder(answers, "old"))
        conn.read(7, 1, False, None, recorder(answers, "old too"))
        await asyncio.sleep(0)
        clock.time += 3
        conn.read(7, 1, False, None, recorder(answers, "newer"))
        conn.read(7, 2, False, None, recorder(answers, "other"))
        await asyncio.sleep(0)
        clock.time += TIMEOUT_S - 1  # the first two are overdue, the newer ones are not
        conn._check_timeouts()
        assert [(name, status) for name, status, _ in answers] == [("old", None), ("old too", None)]
        assert all(isinstance(body, errors.TimeoutError) for _, _, body in answers)
        answer(conn, (READ, StatusCode.EOK, 7, 1, b"late"), (READ, StatusCode.EOK, 7, 2, b"two"))
        assert answers[2:] == [
            ("newer", StatusCode.EOK, b"late"),
            ("other", StatusCode.EOK, b"two"),
        ]
        clock.time += 2 * TIMEOUT_S
        conn._check_timeouts()
        assert len(answers) == 4  # nothing left to expire
        assert conn._v2_pending == {}  # the check dropped the rows left empty
        conn.close()

    asyncio.run(main())


class RecordingSink(AddSink):
    """An AddSink that records its calls."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def acked(self, entry_ids: list[int]) -> None:
        self.calls.append(("acked", list(entry_ids)))

    def refused(self, entry_id: int, status: StatusCode) -> None:
        self.calls.append(("refused", (entry_id, status)))

    def failed(self, entry_ids: list[int], error: errors.BKError) -> None:
        self.calls.append(("failed", (sorted(entry_ids), type(error).__name__)))


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_batch_of_adds_goes_out_in_one_write_and_its_acks_come_in_one_call(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the C registration of a batch (``v2_register``) and without it."""
    take_path(monkeypatch, connection_module, "_register", path)

    async def main() -> None:
        conn, clock, answers = connection()
        transport = conn._transport
        assert isinstance(transport, FakeTransport)
        conn.read(7, 9, False, None, recorder(answers, "read"))  # written before the batch
        sink = RecordingSink()
        entries = [v2.encode_add_request(KEY, b"e%d" % i) for i in range(3)]
        conn.add_batch(7, [0, 1, 2], entries, sink)
        # sent at once, after the read of the same pass, the frames as they were given
        assert bytes(transport.written) == v2.encode_read_request(7, 9) + b"".join(entries)
        assert clock.reads == 1
        answer(
            conn,
            (ADD, StatusCode.EOK, 7, 1, b""),
            (READ, StatusCode.EOK, 7, 9, b"nine"),
            (ADD, StatusCode.EOK, 7, 0, b""),
        )
        assert sink.calls == [("acked", [1, 0])]  # in the order answered, in one call
        assert answers == [("read", StatusCode.EOK, b"nine")]
        # a refusal comes after the acks the same data_received brought before it
        answer(conn, (ADD, StatusCode.EOK, 7, 2, b""), (ADD, StatusCode.EFENCED, 7, 2, b""))
        assert sink.calls[1:] == [("acked", [2])]  # the second answer to 2: nobody waits
        conn.add_batch(7, [3, 4], entries[:2], sink)
        answer(conn, (ADD, StatusCode.EOK, 7, 3, b""), (ADD, StatusCode.EFENCED, 7, 4, b""))
        assert sink.calls[2:] == [("acked", [3]), ("refused", (4, StatusCode.EFENCED))]
        conn.close()

    asyncio.run(main())


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_batch_whose_keys_are_taken_queues_them_behind_the_pending_ones(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch registers in one pass unless one of its keys is pending already or comes twice
    in it; then those wait behind the first of their key, and the answers of one key go to
    their requests in the order sent (with the C registration, ``v2_register``, and without)."""
    take_path(monkeypatch, connection_module, "_register", path)

    async def main() -> None:
        conn, _, _ = connection()
        first, second = RecordingSink(), RecordingSink()
        conn.add_batch(7, [1], [b"a"], first)
        conn.add_batch(7, [1, 2, 2], [b"b", b"c", b"d"], second)
        assert sorted(key for key, _ in conn._v2_requests()) == [
            (ADD, 7, 1),
            (ADD, 7, 1),
            (ADD, 7, 2),
            (ADD, 7, 2),
        ]
        answer(conn, *[(ADD, StatusCode.EOK, 7, entry, b"") for entry in (1, 1, 2, 2)])
        assert first.calls == [("acked", [1])]
        assert second.calls == [("acked", [1, 2, 2])]
        assert conn._v2_requests() == []
        conn.close()

    asyncio.run(main())


def test_adds_of_a_batch_time_out_and_fail_with_the_connection_in_one_call() -> None:
    async def main() -> None:
        conn, clock, _ = connection()
        sink = RecordingSink()
        conn.add_batch(7, [0, 1], [b"a", b"b"], sink)
        await asyncio.sleep(0)
        clock.time += 3
        conn.add_batch(7, [2, 3], [b"c", b"d"], sink)
        clock.time += TIMEOUT_S - 1  # the first batch is overdue, the second is not
        conn._check_timeouts()
        assert sink.calls == [("failed", ([0, 1], "TimeoutError"))]
        conn.connection_lost(None)
        assert sink.calls[1:] == [("failed", ([2, 3], "BookieHandleNotAvailableError"))]
        conn.add_batch(7, [4], [b"e"], sink)  # on a closed connection: failed at once
        assert sink.calls[2:] == [("failed", ([4], "BookieHandleNotAvailableError"))]

    asyncio.run(main())


class ReadRecorder(ReadSink):
    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def answered(self, frames: list[bytes]) -> None:
        self.calls.append(("answered", [v2.read_answer(frame) for frame in frames]))

    def failed(self, entry_ids: list[int], error: errors.BKError) -> None:
        self.calls.append(("failed", (sorted(entry_ids), type(error).__name__)))


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_batch_of_reads_goes_out_with_the_pass_and_its_answers_come_in_one_call(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the C registration of a batch (``v2_register_reads``) and without it: the requests
    written at the pass's end, one clock read, answers to the sink together, an entry read twice
    at once answered in the order asked."""
    take_path(monkeypatch, connection_module, "_register_reads", path)

    async def main() -> None:
        conn, clock, answers = connection()
        transport = conn._transport
        assert isinstance(transport, FakeTransport)
        sink, again = ReadRecorder(), ReadRecorder()
        conn.read_batch(7, [4, 5, 6], sink)
        conn.read(7, 9, False, None, recorder(answers, "one read"))
        conn.read_batch(7, [5], again)  # 5 is pending for the first batch: waits behind it
        assert clock.reads == 1 and transport.written == b""  # written at the pass's end
        await asyncio.sleep(0)
        assert bytes(transport.written) == b"".join(
            v2.encode_read_request(7, e) for e in (4, 5, 6, 9, 5)
        )
        answer(
            conn,
            (READ, StatusCode.EOK, 7, 5, b"five"),
            (READ, StatusCode.EOK, 7, 9, b"nine"),
            (READ, StatusCode.ENOENTRY, 7, 4, b""),
            (READ, StatusCode.EOK, 7, 5, b"five again"),
        )
        assert sink.calls == [("answered", [(5, 0, b"five"), (4, to_v2(StatusCode.ENOENTRY), b"")])]
        assert again.calls == [("answered", [(5, 0, b"five again")])]
        assert answers == [("one read", StatusCode.EOK, b"nine")]
        conn.connection_lost(None)
        assert sink.calls[1:] == [("failed", ([6], "BookieHandleNotAvailableError"))]
        assert again.calls[1:] == []
        v3_conn = BookieConnection("bookie-1:3181", True, TIMEOUT_S, clock)
        with pytest.raises(ValueError, match="v2"):
            v3_conn.read_batch(7, [1], sink)

    asyncio.run(main())


answer_kinds = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "refuse", "read", "stray", "sread", "sfail"]),
        st.sampled_from([7, 8]),
        st.integers(0, 5),
    ),
    max_size=40,
)


@pytest.mark.skipif(connection_module._take_answers is None, reason="C speedups not built here")
@given(kinds=answer_kinds, cut=st.integers(0, 40))
def test_c_and_python_take_add_acks_and_read_answers_alike(
    kinds: list[tuple[str, int, int]], cut: int
) -> None:
    """The C speedups' pass over a run of add acks and read answers and the pure loop: the same
    sink calls in the same order, the same callbacks, the same requests left pending, whatever
    mix of acks, refusals, answers to a batch of reads (entries or errors), a lone read's answer
    and answers nobody waits for arrives, in one chunk or two."""

    def run(pure: bool) -> tuple[object, ...]:
        async def main() -> tuple[object, ...]:
            conn, _, answers = connection()
            sinks = {7: RecordingSink(), 8: RecordingSink()}
            for ledger_id, sink in sinks.items():
                conn.add_batch(ledger_id, list(range(6)), [b"e"] * 6, sink)
            conn.read(7, 3, False, None, recorder(answers, "read"))
            reads = ReadRecorder()
            conn.read_batch(8, list(range(6)), reads)
            frames = []
            for kind, ledger_id, entry_id in kinds:
                if kind == "add":
                    frames.append((ADD, StatusCode.EOK, ledger_id, entry_id, b""))
                elif kind == "refuse":
                    frames.append((ADD, StatusCode.EFENCED, ledger_id, entry_id, b""))
                elif kind == "read":
                    frames.append((READ, StatusCode.EOK, 7, 3, b"three"))
                elif kind == "sread":
                    frames.append((READ, StatusCode.EOK, 8, entry_id, b"x%d" % entry_id))
                elif kind == "sfail":
                    frames.append((READ, StatusCode.ENOENTRY, 8, entry_id, b""))
                else:
                    frames.append((ADD, StatusCode.EOK, 9, entry_id, b""))
            stream = b"".join(v2.encode_response(*frame) for frame in frames)
            cut_at = min(cut * 28, len(stream))
            with pytest.MonkeyPatch.context() as patch:
                if pure:
                    patch.setattr(connection_module, "_take_answers", None)
                conn.data_received(stream[:cut_at])
                conn.data_received(stream[cut_at:])
            left = sorted(key for key, _ in conn._v2_requests())
            conn.close()
            said = [(n, s, b if isinstance(b, bytes) else type(b).__name__) for n, s, b in answers]
            return sinks[7].calls, sinks[8].calls, reads.calls, said, left

        return asyncio.run(main())

    assert run(pure=False) == run(pure=True)
