"""Durable file replacement, the one way the project writes a small file that must be either the
old or the new version after a crash: write a temporary file beside it, fsync it, rename it over
the old one, fsync the directory (dulwich's and ZODB's discipline)."""

from __future__ import annotations

import os


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
