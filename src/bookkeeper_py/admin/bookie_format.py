"""BookKeeper's ``shell bookieformat`` and ``shell initbookie`` for the bookie a configuration
describes: empty its directories (with its cookie in the metadata store, if asked), or check that
it can start as a new bookie (empty directories, no registration, no cookie).

Formatting takes the bookie's directory locks first, as the bookie itself does when it starts:
a running bookie (or a second tool) holds them, and its directories are then left untouched."""

from __future__ import annotations

import os
import shutil

from bookkeeper_py.admin import CommandError
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.server.bookie import BookieConfig
from bookkeeper_py.server.main import lock_directories
from bookkeeper_py.storage.disk import LOCK_FILE, DataDirectoryError, DirectoryLocks


def _contents(directory: str) -> list[str]:
    """What a directory holds besides its lock file (nothing if it does not exist)."""
    try:
        return sorted(name for name in os.listdir(directory) if name != LOCK_FILE)
    except FileNotFoundError:
        return []


def format_bookie(config: BookieConfig, metadata: MetadataClient | None) -> list[str]:
    """Deletes everything in the bookie's journal and ledger directories (the directories stay)
    and, with ``metadata``, its cookie there; returns the directories emptied. ``CommandError``
    (and nothing deleted) while a process holds the directories."""
    locks = DirectoryLocks({"bookie": config.effective_bookie_id, "tool": "bookieformat"})
    directories = lock_directories(config)
    try:
        locks.acquire_all(directories)
    except DataDirectoryError as error:
        raise CommandError(f"not formatting: {error}") from None
    emptied = []
    try:
        for directory, _ in directories:
            names = _contents(directory)
            for name in names:
                path = os.path.join(directory, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
            if names:
                emptied.append(directory)
    finally:
        locks.release()
    if metadata is not None and metadata.read_cookie(config.effective_bookie_id) is not None:
        metadata.delete_cookie(config.effective_bookie_id)
    return emptied


def init_check(config: BookieConfig, metadata: MetadataClient) -> None:
    """``CommandError`` saying what stops the bookie from starting as a new one: a directory
    that holds anything, a live registration under its id, or its cookie in the metadata
    store."""
    for directory, role in lock_directories(config):
        names = _contents(directory)
        if names:
            shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            raise CommandError(
                f"the {role} {directory} is not empty ({shown}): format the bookie first "
                "(bookieformat) if its data is to go"
            )
    bookie_id = config.effective_bookie_id
    if bookie_id in (*metadata.writable_bookies(), *metadata.readonly_bookies()):
        raise CommandError(
            f"bookie {bookie_id} is registered: a bookie with this id is running; stop it first"
        )
    if metadata.read_cookie(bookie_id) is not None:
        raise CommandError(
            f"the cookie of bookie {bookie_id} is still in the metadata store: format the bookie "
            "with bookieformat -d (or delete the cookie: cookie_delete) first"
        )
