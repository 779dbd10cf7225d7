"""The LastLogMark: the journal position before which everything is in entry logs and the index.

Stored as ``lastMark`` in the ledger directory (docs/formats/last-log-mark.md)::

    0  8  journal file id (big-endian)
    8  8  offset in that file
    16 4  CRC32C of bytes 0-15

written to a temporary file, fsynced, renamed over the old one, and the directory fsynced, so a
crash leaves either the old mark or the new one. A missing or damaged mark means "replay every
journal file still present", which is always safe.
"""

from __future__ import annotations

import logging
import os
import struct

import crc32c

from bookkeeper_py.storage.files import write_atomically

log = logging.getLogger(__name__)

FILE_NAME = "lastMark"
_MARK = struct.Struct(">qq")


def mark_file_name(journal_index: int) -> str:
    """``lastMark`` for the first journal, ``lastMark.<i>`` for the others (journalDirectories)."""
    return FILE_NAME if journal_index == 0 else f"{FILE_NAME}.{journal_index}"


def read_mark(directory: str, name: str = FILE_NAME) -> tuple[int, int] | None:
    path = os.path.join(directory, name)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    if len(data) != _MARK.size + 4 or struct.unpack_from(">I", data, 16)[0] != crc32c.crc32c(
        data[:16]
    ):
        log.warning(
            "%s is damaged (%d bytes); replaying every journal file present", path, len(data)
        )
        return None
    file_id, offset = _MARK.unpack_from(data, 0)
    return int(file_id), int(offset)


def write_mark(directory: str, mark: tuple[int, int], name: str = FILE_NAME) -> None:
    body = _MARK.pack(*mark)
    data = body + struct.pack(">I", crc32c.crc32c(body))
    write_atomically(os.path.join(directory, name), data)
