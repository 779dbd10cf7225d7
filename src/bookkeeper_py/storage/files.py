"""Durable file replacement, the one way the project writes a small file that must be either the
old or the new version after a crash: write a temporary file beside it, fsync it, rename it over
the old one, fsync the directory (dulwich's and ZODB's discipline). And appends with
``O_DIRECT`` (``DirectAppender``), the one way the entry logs and the journal write around the
page cache."""

from __future__ import annotations

import errno
import mmap
import os

O_DIRECT = getattr(os, "O_DIRECT", 0)  # 0 where the system has none
# Direct writes start at offsets and write sizes that are multiples of this (a multiple of any
# device's logical block size), from a page-aligned buffer this big at first.
ALIGN = 4096
DIRECT_BUFFER_BYTES = 2 * 1024 * 1024 + 2 * ALIGN


def fsync_directory(directory: str) -> None:
    """Makes the directory's entries (a file created, renamed or removed) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, data: bytes, *, durable: bool = True) -> None:
    """Replaces ``path`` by a file holding ``data``, all or nothing. ``durable=False`` skips the
    fsyncs, for files that need only atomicity (a readiness marker)."""
    temporary = path + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    if durable:
        fsync_directory(os.path.dirname(os.path.abspath(path)))


class DirectAppender:
    """Appends to a file with ``O_DIRECT``: from a page-aligned buffer straight to the disk,
    never through the page cache. Buffered, every 4 KiB written took a fresh page of the page
    cache, the kernel's delayed-allocation bookkeeping for it, its writeback at the next
    fdatasync and its dropping after: about half of a checkpoint's CPU, and of a journal group's
    write and sync (``bench/journal_writes.py``). Direct writes must start and end on ``ALIGN``
    bounds, so the buffer starts with the file's last partial block (the bytes already written
    from the block's start), new bytes go after it until ``write``, the rest of the last block is
    written as zeros, and the next write writes that block again with more bytes in it. The file
    may so end in up to ``ALIGN - 1`` zero bytes past the last record until it is cut; a zero
    length is a torn tail to every reader of our files. What was written is durable after the
    next fdatasync of the file (any descriptor of it), as buffered bytes are (that also writes
    the file's size and the disk's cache)."""

    def __init__(self, fd: int, base: int = 0) -> None:
        """``fd`` is opened with ``O_DIRECT`` on a file that ends at ``base`` (a multiple of
        ``ALIGN``; 0 for a new file)."""
        assert base % ALIGN == 0
        self.fd = fd
        self.base = base  # the file offset of the buffer's first byte
        self.tail = 0  # bytes of the buffer in the file already
        self.end = 0  # bytes of the buffer in use: the tail, then bytes to write
        self.buffer = mmap.mmap(-1, DIRECT_BUFFER_BYTES)

    @property
    def size(self) -> int:
        """The file's length once what waits is written (its bytes, not the padding)."""
        return self.base + self.end

    def reserve(self, size: int) -> int:
        """Makes room for ``size`` more bytes (writing what waits if they would not fit, growing
        the buffer for more than it holds) and takes them: the caller puts them into ``buffer``
        at the offset returned."""
        if self.end + size + ALIGN > len(self.buffer):
            self.write()
        needed = self.end + size + ALIGN
        if needed > len(self.buffer):
            grown = mmap.mmap(-1, needed + ALIGN - needed % ALIGN)
            grown[: self.end] = self.buffer[: self.end]
            self.buffer.close()
            self.buffer = grown
        at = self.end
        self.end += size
        return at

    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Puts ``data`` into the buffer."""
        at = self.reserve(len(data))
        self.buffer[at : at + len(data)] = data

    def undo(self, end: int) -> None:
        """Forgets what was put into the buffer after ``end`` (bytes in use then) and not written
        (after a failed write)."""
        assert self.tail <= end <= self.end
        self.end = end

    def write(self) -> None:
        """Writes the bytes in the buffer, with the tail's block before them and zeros to the
        next ``ALIGN`` bound after; keeps their last partial block as the new tail."""
        end = self.end
        if end == self.tail:
            return
        padded = end + (-end % ALIGN)
        self.buffer[end:padded] = bytes(padded - end)
        with memoryview(self.buffer) as whole, whole[:padded] as view:
            written = os.pwrite(self.fd, view, self.base)
        if written != padded:  # a direct write is all or nothing but for a full disk
            raise OSError(errno.ENOSPC, f"short direct write ({written} of {padded} bytes)")
        keep = end - end % ALIGN
        if keep:
            self.buffer[: end - keep] = self.buffer[keep:end]
            self.base += keep
        self.tail = self.end = end - keep

    def close(self) -> None:
        try:
            os.close(self.fd)
        finally:
            self.buffer.close()


def open_direct(path: str, head: bytes) -> DirectAppender | None:
    """``path`` (empty) opened for direct writes and ``head`` written through it: the first
    direct write, which proves the file system takes them (some refuse ``O_DIRECT`` at the open,
    some only at the first write). None where they are refused; other errors raise."""
    direct: DirectAppender | None = None
    try:
        direct = DirectAppender(os.open(path, os.O_WRONLY | O_DIRECT))
        direct.append(head)
        direct.write()
    except OSError as error:
        if direct is not None:
            direct.close()
        if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise
        return None
    return direct
