"""This machine's raw limits, measured next to every benchmark so that each figure is also a
ratio to what the hardware allows: the fsync rate (4 KiB write + fdatasync), sequential write
bandwidth (4 MiB writes, fdatasync after each), the loopback TCP round trip (64-byte
ping-pong with another process), and the interpreter's speed (a fixed pure-Python loop): the
CPU per entry of the same code moves with it when the machine is slower or faster, so a figure
can be compared across the machine's periods as a ratio to it."""

from __future__ import annotations

import multiprocessing
import os
import socket
import statistics
import struct
import time


def fsync_rate(directory: str, seconds: float = 1.0) -> float:
    """fdatasyncs per second of 4 KiB appends in ``directory``."""
    path = os.path.join(directory, "fsync.probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    block = b"\0" * 4096
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    try:
        while time.perf_counter() < deadline:
            os.write(fd, block)
            os.fdatasync(fd)
            count += 1
    finally:
        os.close(fd)
        os.unlink(path)
    return count / (time.perf_counter() - start)


def sequential_mb_s(directory: str, seconds: float = 2.0) -> float:
    """MB/s of 4 MiB appends, each followed by fdatasync (at most 8 GiB)."""
    path = os.path.join(directory, "seq.probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    block = os.urandom(4 * 1024 * 1024)
    written = 0
    start = time.perf_counter()
    deadline = start + seconds
    try:
        while time.perf_counter() < deadline and written < 8 * 1024**3:
            os.write(fd, block)
            os.fdatasync(fd)
            written += len(block)
    finally:
        os.close(fd)
        os.unlink(path)
    return written / (time.perf_counter() - start) / 1e6


def _echo(server: socket.socket, count: int) -> None:
    connection, _ = server.accept()
    with connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            data = connection.recv(64)
            if not data:
                return
            connection.sendall(data)


def loopback_round_trip_us(count: int = 20_000) -> float:
    """Median round trip of a 64-byte message over loopback TCP (TCP_NODELAY) to an echo in
    another process (two processes, as client and bookie are), in µs."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    echo = multiprocessing.get_context("fork").Process(
        target=_echo, args=(server, count), daemon=True
    )
    echo.start()
    samples = []
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        message = b"x" * 64
        for _ in range(count):
            started = time.perf_counter()
            client.sendall(message)
            received = 0
            while received < len(message):
                received += len(client.recv(64))
            samples.append(time.perf_counter() - started)
    echo.join(10)
    if echo.is_alive():
        echo.kill()
    server.close()
    return statistics.median(samples) * 1e6


class _Request:
    __slots__ = ("entry_id", "ledger_id")

    def __init__(self, ledger_id: int, entry_id: int) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id


def interpreter_ns(iterations: int = 100_000, repeats: int = 5) -> float:
    """ns per iteration of a fixed loop of what a request costs here in Python (an object made
    and its attributes read, a struct packed, a dict updated, a list appended), the median of
    ``repeats`` timings: this interpreter's speed on this machine now."""
    header = struct.Struct(">qq")
    timings = []
    for _ in range(repeats):
        pending: dict[int, bytes] = {}
        out: list[bytes] = []
        started = time.perf_counter()
        for index in range(iterations):
            request = _Request(7, index)
            frame = header.pack(request.ledger_id, request.entry_id)
            pending[index & 1023] = frame
            out.append(frame)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) / iterations * 1e9


def measure(directory: str) -> dict[str, float]:
    return {
        "fsyncs_per_s": fsync_rate(directory),
        "sequential_mb_s": sequential_mb_s(directory),
        "loopback_rtt_us": loopback_round_trip_us(),
        "interpreter_ns": interpreter_ns(),
    }
