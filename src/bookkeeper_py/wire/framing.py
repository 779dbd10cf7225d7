"""Length-prefixed framing shared by both protocols: a 4-byte big-endian length, then the frame.

``nettyMaxFrameSizeBytes`` (5 MiB by default) bounds a frame on both sides; a larger declared
length is a protocol error and the connection must be closed.
"""

from __future__ import annotations

import struct

from bookkeeper_py.speedups import native

# The C speedups' frame splitter, where they are in use: one call for a chunk's whole frames.
_split = native.split_frames if native is not None else None
DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024
_LENGTH = struct.Struct(">I")
# Pieces of a frame smaller than this are copied together rather than kept as views: a peer that
# sends a large frame a few bytes at a time must not cost a view object per few bytes.
_VIEW_MIN = 4096


class FrameError(Exception):
    """The peer sent a frame we cannot accept (too large). Close the connection."""


def encode_frame(body: bytes | bytearray | memoryview) -> bytes:
    """One frame: the length of ``body``, then ``body``."""
    return _LENGTH.pack(len(body)) + bytes(body)


class FrameDecoder:
    """Splits a byte stream into frames; feed it bytes as they arrive.

    Holds at most one partial frame (bounded by ``max_frame_size``) between calls. Each frame is
    copied once: a frame within one chunk is sliced out of it; a frame spread over several (a
    large entry comes in pieces of what one read returns) keeps views of its pieces (small pieces
    are copied together) until the last arrives and is then joined. Accumulating the stream in
    one buffer instead cost two more copies of every large frame, and the buffer shrank and grew
    again around each one.
    """

    __slots__ = ("_buffered", "_head", "_max_frame_size", "_missing", "_parts")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._head = b""  # the first bytes of a length prefix cut by the end of a chunk
        # The pieces of the frame being received (a small frame's as bytes).
        self._parts: list[bytes | memoryview | bytearray] = []
        self._missing = -1  # bytes the frame being received still lacks; -1: no length yet
        self._buffered = 0
        self._max_frame_size = max_frame_size

    @property
    def max_frame_size(self) -> int:
        return self._max_frame_size

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return self._buffered

    def _too_large(self, length: int) -> FrameError:
        return FrameError(
            f"peer declared a frame of {length} bytes, above the maximum of "
            f"{self._max_frame_size} (nettyMaxFrameSizeBytes); closing the connection"
        )

    def feed(self, data: bytes | bytearray | memoryview, start: int = 0) -> list[bytes]:
        """Add ``data`` (from ``start`` on) and return every frame it completes, in order."""
        if type(data) is not bytes:
            data = bytes(data)  # the views kept of it must not change under them
        frames: list[bytes] = []
        position = start
        end = len(data)
        if self._missing >= 0 or self._head:
            position = self._continue(data, frames, start)
        if _split is not None and end - position >= 4:
            whole: list[bytes]
            whole, position = _split(data, position, self._max_frame_size)
            if position == end and not frames:
                return whole  # the usual chunk: whole frames, nothing held back, one C call
            if frames:
                frames += whole
            else:
                frames = whole
        unpack_from = _LENGTH.unpack_from
        while end - position >= 4:  # whole frames, sliced out of this chunk
            (length,) = unpack_from(data, position)
            if length > self._max_frame_size:
                raise self._too_large(length)
            if end - position - 4 < length:
                if length < _VIEW_MIN:
                    self._parts = [data[position + 4 :]]
                else:
                    self._parts = []
                    self._keep(memoryview(data)[position + 4 :])
                self._missing = length - (end - position - 4)
                self._buffered = end - position
                return frames
            frames.append(data[position + 4 : position + 4 + length])
            position += 4 + length
        if position < end:
            self._head = data[position:]
            self._buffered = end - position
        return frames

    def complete(self, data: bytes) -> tuple[list[bytes], int]:
        """Takes from the start of ``data`` what the frame in progress (if any) lacks: (that
        frame if it is now whole, else nothing; where the rest of ``data`` begins). Whole frames
        there may then be taken by the caller (a bookie cuts plain adds straight out of them)
        before ``feed(data, position)`` takes the rest."""
        frames: list[bytes] = []
        if self._missing < 0 and not self._head:
            return frames, 0
        return frames, self._continue(data, frames, 0)

    def _continue(self, data: bytes, frames: list[bytes], start: int) -> int:
        """Takes from ``data`` (from ``start``) what the frame (or length prefix) in progress
        lacks; returns where the rest of ``data`` starts."""
        position = start
        if self._missing < 0:  # a length prefix cut short
            taken = min(4 - len(self._head), len(data) - start)
            self._head += data[start : start + taken]
            position = start + taken
            if len(self._head) < 4:
                self._buffered = len(self._head)
                return position
            (length,) = _LENGTH.unpack(self._head)
            if length > self._max_frame_size:
                raise self._too_large(length)
            self._head = b""
            self._missing = length
            self._buffered = 4
        missing = self._missing
        available = len(data) - position
        if missing > available:  # still not whole
            if available:
                self._keep(memoryview(data)[position:])
            self._missing = missing - available
            self._buffered += available
            return len(data)
        parts = self._parts
        end = position + missing
        if missing >= _VIEW_MIN:
            parts.append(memoryview(data)[position:end])
        elif missing:
            parts.append(data[position:end])
        frames.append(b"".join(parts))
        self._parts = []
        self._missing = -1
        self._buffered = 0
        return end

    def _keep(self, piece: memoryview) -> None:
        """Holds a piece of the frame being received: a large one as the view it is, a small one
        copied into the small pieces before it."""
        parts = self._parts
        if len(piece) >= _VIEW_MIN:
            parts.append(piece)
        elif parts and isinstance(parts[-1], bytearray) and len(parts[-1]) < _VIEW_MIN:
            parts[-1] += piece
        else:
            parts.append(bytearray(piece))
