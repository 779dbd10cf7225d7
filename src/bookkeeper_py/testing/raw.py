"""Raw protocol helpers for tests that speak to a bookie byte by byte."""

from __future__ import annotations

import socket


def recv_exactly(connection: socket.socket, count: int) -> bytes:
    """``count`` bytes from a blocking socket; ``ConnectionError`` if the peer closes first."""
    data = bytearray()
    while len(data) < count:
        chunk = connection.recv(count - len(data))
        if not chunk:
            raise ConnectionError(
                f"the peer closed the connection after {len(data)} of {count} bytes"
            )
        data += chunk
    return bytes(data)


def recv_frame(connection: socket.socket) -> bytes:
    """One length-prefixed frame (without its 4-byte length)."""
    return recv_exactly(connection, int.from_bytes(recv_exactly(connection, 4), "big"))


def frame(body: bytes) -> bytes:
    """``body`` behind its 4-byte big-endian length (written here, not with the project's
    encoder, for tests that build frames by hand)."""
    return len(body).to_bytes(4, "big") + body
