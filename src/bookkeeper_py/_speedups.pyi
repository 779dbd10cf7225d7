"""Types of the C speedups (``_speedups.c``)."""

import mmap
from array import array
from collections import deque
from typing import Any, TypeVar

_E = TypeVar("_E", bound=tuple[Any, ...])

def crc32c_payload(data: bytes, ledger_id: int, entry_id: int, /) -> bytes | None: ...
def crc32c_package(
    ledger_id: int, entry_id: int, last_add_confirmed: int, length: int, payload: bytes, /
) -> bytes: ...
def crc32c_package_run(
    ledger_id: int,
    first_entry_id: int,
    last_add_confirmed: int,
    lengths: list[int],
    payloads: list[bytes],
    /,
) -> list[bytes]: ...
def entry_log_record(
    block: bytes | memoryview, at: int, ledger_id: int, entry_id: int, /
) -> bytes | None: ...
def entry_log_frame(
    out: bytearray | mmap.mmap, entries: list[bytes], location: int, at: int = ..., /
) -> list[int]: ...
def index_pairs(
    ledger_id: int, entry_ids: list[int], locations: list[int], start: int, stop: int, /
) -> list[tuple[bytes, bytes]]: ...
def entry_log_pick(
    block: bytes | memoryview,
    at: int,
    ledger_id: int,
    wanted: list[int],
    start: int,
    max_bytes: int,
    /,
) -> tuple[list[bytes], int, int]: ...
def take_plain_reads(
    backlog: deque[bytes], first: bytes, room: int, head: bytes, size: int, /
) -> tuple[list[tuple[int, list[int]]], int]: ...
def v2_answers(
    ledger_id: int,
    entry_ids: list[int],
    entries: list[bytes] | None,
    statuses: dict[int, int] | int,
    header: int,
    /,
) -> bytes | None: ...
def v2_batch_answer(head: bytes, entries: list[bytes], /) -> bytes | None: ...
def take_plain_adds(
    backlog: deque[bytes], first: bytes, room: int, head: bytes, min_size: int, /
) -> tuple[list[tuple[int, bytes, list[int], list[bytes], int | None]], int]: ...
def cut_plain_adds(
    data: bytes, start: int, room: int, head: bytes, min_size: int, max_frame: int, /
) -> tuple[list[tuple[int, bytes, list[int], list[bytes], int | None]], int, int]: ...
def cache_add_new(
    chunks: dict[int, dict[int, bytes]],
    entry_ids: list[int],
    entries: list[bytes],
    chunk_bits: int,
    /,
) -> int: ...
def journal_group(
    batch: list[tuple[int, bytes, Any, bool]], gather_min: int, /
) -> tuple[list[bytes], list[Any]] | None: ...
def group_adds(
    entry_ids: list[int],
    targets: list[tuple[tuple[int, str], ...]],
    entries: dict[int, bytes],
    head: bytes,
    batches: dict[tuple[int, str], tuple[list[int], list[bytes]]],
    start: int,
    /,
) -> int: ...
def complete_adds(
    entries: dict[int, bytes],
    futures: dict[int, Any],
    first: int,
    last: int,
    future_type: type,
    ready: list[tuple[Any, int, None]],
    /,
) -> None: ...
def split_frames(data: bytes, start: int, max_frame: int, /) -> tuple[list[bytes], int]: ...
def crc32c_batch_entries(
    body: bytes, ledger_id: int, first_entry_id: int, max_count: int, entry_type: type[_E], /
) -> list[_E] | None: ...
def stripe_answers(
    frames: list[bytes],
    pending: dict[int, Any],
    results: list[Any],
    first: int,
    ledger_id: int,
    entry_type: type[_E],
    gone: object,
    /,
) -> tuple[list[int], list[tuple[int, int, bytes, Any]]]: ...
def v2_register(row: dict[int, Any], entry_ids: list[int], request: object, /) -> list[int]: ...
def v2_register_reads(
    row: dict[int, Any],
    ledger_id: int,
    entry_ids: list[int],
    request: object,
    header: int,
    /,
) -> tuple[bytes, list[int]]: ...
def v2_take_answers(
    frames: list[bytes],
    pending: dict[tuple[int, int], dict[int, Any]],
    add_sink_type: type,
    read_sink_type: type,
    /,
) -> tuple[dict[Any, list[int]], dict[Any, list[bytes]], int]: ...
def pending_ack(
    acked: array[int],
    failed: array[int],
    sent: array[int],
    base: int,
    entry_ids: list[int],
    index: int,
    ensemble_size: int,
    write_quorum: int,
    first: int,
    /,
) -> list[int]: ...
def pending_done(acked: array[int], sent: array[int], ack_quorum: int, /) -> int: ...

class JournalSyncer:
    """A thread that fdatasyncs a journal file on request and signals an eventfd."""

    def __init__(self, fd: int) -> None: ...
    def request(self, seq: int, /) -> None: ...
    def take(self) -> tuple[int, int, tuple[float, ...], float]: ...
    def drain(self) -> None: ...
    def set_fd(self, fd: int, /) -> None: ...
    def close(self) -> None: ...
    @property
    def eventfd(self) -> int: ...
    @property
    def idle(self) -> bool: ...

class LatencyBuckets:
    """A latency histogram: counts per bucket of increasing upper bounds, and the sum."""

    def __init__(self, bounds: tuple[float, ...]) -> None: ...
    def observe(self, seconds: float, /) -> None: ...
    def observe_many(self, seconds: float, count: int, /) -> None: ...
    @property
    def counts(self) -> list[int]: ...
    @property
    def total(self) -> float: ...
