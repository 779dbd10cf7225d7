"""Types of the C speedups (``_speedups.c``)."""

from array import array

def crc32c_payload(data: bytes, ledger_id: int, entry_id: int, /) -> bytes | None: ...
def crc32c_package(
    ledger_id: int, entry_id: int, last_add_confirmed: int, length: int, payload: bytes, /
) -> bytes: ...
def entry_log_record(
    block: bytes | memoryview, at: int, ledger_id: int, entry_id: int, /
) -> bytes | None: ...
def entry_log_pick(
    block: bytes | memoryview,
    at: int,
    ledger_id: int,
    wanted: list[int],
    start: int,
    max_bytes: int,
    /,
) -> tuple[list[bytes], int, int]: ...
def crc32c_batch_payloads(
    body: bytes, ledger_id: int, first_entry_id: int, max_count: int, /
) -> list[bytes] | None: ...
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
