"""serverTcpNoDelay, serverSockKeepalive and serverTcpLinger (bk_server.conf) set the options of
the connections a bookie accepts; by default TCP_NODELAY and keep-alive are on, as in
BookKeeper, and SO_LINGER is left as the system has it."""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct
from pathlib import Path

import pytest

from bookkeeper_py.server import config
from bookkeeper_py.server.main import BookieServer
from bookkeeper_py.testing.local_cluster import free_port


def accepted_options(tmp_path: Path, text: str) -> tuple[int, int, tuple[int, int]]:
    """The options of the socket a standalone bookie accepted, with ``text`` as its file."""
    path = tmp_path / "bk_server.conf"
    path.write_text(text)
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    port = free_port()
    args = parser.parse_args(
        ["--conf", str(path), "--port", str(port), "--journal-dir", str(tmp_path / "j")]
    )
    server = BookieServer(config.build(config.resolve(args)), None)

    async def scenario() -> tuple[int, int, tuple[int, int]]:
        await server.start()
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                for _ in range(200):
                    if server._connections:
                        break
                    await asyncio.sleep(0.01)
                [connection] = server._connections
                sock = connection._transport.get_extra_info("socket")  # type: ignore[union-attr]
                linger = sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8)
                return (
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                    struct.unpack("ii", linger),
                )
            finally:
                writer.close()
        finally:
            await server.stop()

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    ("text", "options"),
    [
        ("", (1, 1, (0, 0))),
        ("serverTcpNoDelay=false\nserverSockKeepalive=false\nserverTcpLinger=5\n", (0, 0, (1, 5))),
        ("serverTcpLinger=0\n", (1, 1, (1, 0))),
    ],
)
def test_the_network_keys_set_the_options_of_accepted_connections(
    tmp_path: Path, text: str, options: tuple[int, int, tuple[int, int]]
) -> None:
    nodelay, keepalive, linger = accepted_options(tmp_path, text)
    assert (bool(nodelay), bool(keepalive), linger) == (
        bool(options[0]),
        bool(options[1]),
        options[2],
    )
