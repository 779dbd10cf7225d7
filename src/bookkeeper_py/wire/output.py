"""Coalesced output: every frame a connection writes during one pass of the event loop goes out
in one ``transport.write`` (one syscall, one TLS record run) at the end of that pass.

A pipelined writer sends an add to each bookie of its write set per entry, and a bookie answers
a whole journal group at once; writing each frame on its own costs a syscall per frame, which
the profile of ``bookkeeper bench writes`` showed as a fifth of the client's time. The delay is
one loop iteration (``call_soon``).

The loop's one ``PassFlusher`` (``PassFlusher.of(loop)``), shared by every buffer on that loop,
flushes every buffer written in a pass with one callback, and lets the owner send them at once
where the answers are complete before the pass ends (a bookie right after a journal sync it made
on the loop: the acknowledgements of that sync go out without waiting for another iteration)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable


class PassFlusher:
    """The buffers of one loop that hold frames of this pass: flushed together by one callback
    at the pass's end, or at once by ``flush_now``. One per loop (``of``)."""

    __slots__ = ("__weakref__", "_dirty", "_loop", "_scheduled")
    _of_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PassFlusher] = (
        weakref.WeakKeyDictionary()
    )

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> PassFlusher:
        """The flusher of ``loop``'s buffers (made on first use, gone with the loop)."""
        flusher = cls._of_loop.get(loop)
        if flusher is None:
            flusher = cls._of_loop[loop] = cls(loop)
        return flusher

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._dirty: list[OutputBuffer] = []
        self._scheduled = False

    def mark(self, buffer: OutputBuffer) -> None:
        """``buffer`` took its first frame of this pass."""
        self._dirty.append(buffer)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._at_pass_end)

    def _at_pass_end(self) -> None:
        self._scheduled = False
        self.flush_now()

    def flush_now(self) -> None:
        """Sends what every buffer collected so far (the callback, if due, finds them empty)."""
        dirty, self._dirty = self._dirty, []
        for buffer in dirty:
            buffer.flush()  # a buffer written again meanwhile is marked again


class OutputBuffer:
    """Collects frames; ``send`` gets them joined once per loop iteration, through the loop's
    ``PassFlusher`` (or at ``flush``)."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_flusher",
        "_max_buffered",
        "_scheduled",
        "_send",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        send: Callable[[bytes], None],
        max_buffered: int = 64 * 1024,
    ) -> None:
        self._send = send
        self._max_buffered = max_buffered
        self._flusher = PassFlusher.of(loop)
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._scheduled = False

    def write(self, data: bytes) -> None:
        """Queues ``data``; past ``max_buffered`` bytes it all goes out at once, so that the
        transport's flow control (pause_writing) still sees a flood as it happens."""
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered >= self._max_buffered:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._flusher.mark(self)

    def send(self, chunks: list[bytes]) -> None:
        """Sends ``chunks`` now, after what was collected before them, in one write (a batch
        made at the end of a pass has nothing to wait for)."""
        self._chunks.extend(chunks)
        self.flush()

    def flush(self) -> None:
        """Sends what was collected now (also before the connection changes how it sends, e.g.
        when TLS starts: the frames before must go out as they were)."""
        self._scheduled = False
        chunks = self._chunks
        if not chunks:
            return
        self._chunks = []
        self._buffered = 0
        self._send(chunks[0] if len(chunks) == 1 else b"".join(chunks))
