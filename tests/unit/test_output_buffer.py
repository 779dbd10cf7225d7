"""Coalesced output (``wire/output.py``): a pass's frames go out in one write per connection, at
the pass's end or at once where the owner says so (``PassFlusher.flush_now``)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from bookkeeper_py.wire.output import OutputBuffer, PassFlusher


def _on_loop(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


def _pass() -> asyncio.Future[None]:
    """A future done a loop iteration or two later: after the callbacks scheduled now."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    loop.call_soon(loop.call_soon, done.set_result, None)
    return done


@_on_loop
async def test_frames_of_a_pass_go_out_together_at_its_end() -> None:
    loop = asyncio.get_running_loop()
    sent: list[tuple[str, bytes]] = []
    one = OutputBuffer(loop, lambda data: sent.append(("one", data)))
    two = OutputBuffer(loop, lambda data: sent.append(("two", data)))
    one.write(b"a")
    two.write(b"x")
    one.write(b"b")
    assert sent == []  # nothing before the pass ends
    await _pass()
    assert sent == [("one", b"ab"), ("two", b"x")]


@_on_loop
async def test_flush_now_sends_at_once_and_a_later_write_waits_for_its_pass() -> None:
    loop = asyncio.get_running_loop()
    sent: list[bytes] = []
    flusher = PassFlusher.of(loop)
    buffer = OutputBuffer(loop, sent.append)
    buffer.write(b"answer")
    flusher.flush_now()
    assert sent == [b"answer"]
    buffer.write(b"next")
    assert sent == [b"answer"]
    await _pass()
    assert sent == [b"answer", b"next"]  # once: the first pass's callback found nothing left


@_on_loop
async def test_a_buffer_flushed_on_its_own_is_not_sent_twice() -> None:
    loop = asyncio.get_running_loop()
    sent: list[bytes] = []
    buffer = OutputBuffer(loop, sent.append, max_buffered=4)
    buffer.write(b"ab")
    buffer.write(b"cd")  # past max_buffered: out at once
    buffer.write(b"e")
    await _pass()
    assert sent == [b"abcd", b"e"]


@_on_loop
async def test_a_batch_sent_goes_out_at_once_after_what_came_before() -> None:
    loop = asyncio.get_running_loop()
    sent: list[bytes] = []
    buffer = OutputBuffer(loop, sent.append)
    assert PassFlusher.of(loop) is PassFlusher.of(loop)  # one per loop, shared by its buffers
    buffer.write(b"a")
    buffer.send([b"b", b"c"])  # a batch goes out now, after what came before it
    assert sent == [b"abc"]
    buffer.write(b"d")
    await _pass()
    assert sent == [b"abc", b"d"]
