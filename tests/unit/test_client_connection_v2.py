"""The client connection's v2 requests: answers matched by (operation, ledger, entry) in the
order sent, deadlines read from the clock once per loop pass, overdue requests failed (issue 21:
no object and no clock read per request)."""

from __future__ import annotations

import asyncio

from bookkeeper_py import errors
from bookkeeper_py.client.connection import BookieConnection
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.status import StatusCode

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
        conn.close()

    asyncio.run(main())
