"""Length-prefixed framing shared by both protocols: a 4-byte big-endian length, then the frame.

``nettyMaxFrameSizeBytes`` (5 MiB by default) bounds a frame on both sides; a larger declared
length is a protocol error and the connection must be closed.
"""

from __future__ import annotations

import struct

DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024
_LENGTH = struct.Struct(">I")


class FrameError(Exception):
    """The peer sent a frame we cannot accept (too large). Close the connection."""


def encode_frame(body: bytes | bytearray | memoryview) -> bytes:
    """One frame: the length of ``body``, then ``body``."""
    return _LENGTH.pack(len(body)) + bytes(body)


class FrameDecoder:
    """Splits a byte stream into frames; feed it bytes as they arrive.

    Holds at most one partial frame (bounded by ``max_frame_size``) between calls.
    """

    __slots__ = ("_buffer", "_max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._buffer = bytearray()
        self._max_frame_size = max_frame_size

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data`` and return every frame it completes, in order."""
        buffer = self._buffer
        buffer += data
        frames: list[bytes] = []
        start = 0
        end = len(buffer)
        with memoryview(buffer) as view:  # one copy per frame (a bytearray slice is another)
            while end - start >= 4:
                (length,) = _LENGTH.unpack_from(buffer, start)
                if length > self._max_frame_size:
                    raise FrameError(
                        f"peer declared a frame of {length} bytes, above the maximum of "
                        f"{self._max_frame_size} (nettyMaxFrameSizeBytes); closing the connection"
                    )
                if end - start - 4 < length:
                    break
                frames.append(view[start + 4 : start + 4 + length].tobytes())
                start += 4 + length
        if start:
            del buffer[:start]
        return frames
