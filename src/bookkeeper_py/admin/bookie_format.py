"""BookKeeper's ``shell bookieformat``, ``initbookie`` and ``updatecookie`` for the bookie a
configuration describes: empty its directories (with its cookie in the metadata store, if
asked), check that it can start as a new bookie (empty directories, no registration, no cookie),
list or delete its cookies, or move them to the bookie id the configuration now gives.

What changes a bookie's directories takes their locks first, as the bookie itself does when it
starts: a running bookie (or a second tool) holds them, and its directories are then left
untouched."""

from __future__ import annotations

import os
import shutil

from bookkeeper_py.admin import CommandError
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.server.bookie import BookieConfig
from bookkeeper_py.server.main import lock_directories
from bookkeeper_py.storage.cookie import VERSION_FILE, Cookie, read_local, write_local
from bookkeeper_py.storage.disk import LOCK_FILE, DataDirectoryError, DirectoryLocks


def _contents(directory: str) -> list[str]:
    """What a directory holds besides its lock file (nothing if it does not exist)."""
    try:
        return sorted(name for name in os.listdir(directory) if name != LOCK_FILE)
    except FileNotFoundError:
        return []


def _locked(config: BookieConfig, tool: str) -> DirectoryLocks:
    """The bookie's directory locks, taken (``CommandError``, nothing done, while a process
    holds one); release them when done."""
    locks = DirectoryLocks({"bookie": config.effective_bookie_id, "tool": tool})
    try:
        locks.acquire_all(lock_directories(config))
    except DataDirectoryError as error:
        raise CommandError(f"not done: {error}") from None
    return locks


def format_bookie(config: BookieConfig, metadata: MetadataClient | None) -> list[str]:
    """Deletes everything in the bookie's journal and ledger directories (the directories stay)
    and, with ``metadata``, its cookie there; returns the directories emptied. ``CommandError``
    (and nothing deleted) while a process holds the directories."""
    directories = lock_directories(config)
    locks = _locked(config, "bookieformat")
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


def cookie_paths(config: BookieConfig, metadata: MetadataClient) -> list[str]:
    """Where the bookie's cookies are (``updatecookie -l``): each directory's cookie file that
    exists, then the metadata store's node, if it exists."""
    found = [
        os.path.join(directory, VERSION_FILE)
        for directory, _ in lock_directories(config)
        if os.path.exists(os.path.join(directory, VERSION_FILE))
    ]
    if metadata.read_cookie(config.effective_bookie_id) is not None:
        found.append(f"{metadata.root}/cookies/{config.effective_bookie_id}")
    return found


def delete_cookies(config: BookieConfig, metadata: MetadataClient) -> list[str]:
    """Deletes the bookie's cookies, in its directories and the metadata store (``updatecookie
    -d``): it then starts as a new bookie, which only empty directories allow. Returns what was
    deleted; a running bookie's are refused."""
    locks = _locked(config, "updatecookie")
    try:
        deleted = cookie_paths(config, metadata)
        for directory, _ in lock_directories(config):
            path = os.path.join(directory, VERSION_FILE)
            if os.path.exists(path):
                os.unlink(path)
        if metadata.read_cookie(config.effective_bookie_id) is not None:
            metadata.delete_cookie(config.effective_bookie_id)
    finally:
        locks.release()
    return deleted


def change_bookie_id(config: BookieConfig, metadata: MetadataClient, old_id: str) -> Cookie:
    """Moves the bookie's cookies from ``old_id`` to the id its configuration now gives
    (``updatecookie -b OLD``): the directories' cookies and the metadata store's must be
    ``old_id``'s, for these very directories; they are rewritten with the new id, the metadata
    store's created under it and ``old_id``'s deleted. The ledgers' ensembles still name
    ``old_id``: ``updateBookieInLedger -sb OLD -db NEW`` moves them. Returns the new cookie."""
    new_id = config.effective_bookie_id
    if new_id == old_id:
        raise CommandError(
            f"the configuration's bookie id is {old_id} already: set bookieId (or "
            "advertisedAddress and bookiePort) to the new id first"
        )
    stored = metadata.read_cookie(old_id)
    if stored is None:
        raise CommandError(
            f"no cookie of bookie {old_id} in the metadata store (moved already?); check the id"
        )
    if metadata.read_cookie(new_id) is not None:
        raise CommandError(f"bookie {new_id} has a cookie already: that id is taken")
    old = Cookie.decode(stored[0], f"{metadata.root}/cookies/{old_id}")
    locks = _locked(config, "updatecookie")
    try:
        directories = [directory for directory, _ in lock_directories(config)]
        for directory in directories:
            local = read_local(directory)
            if local is None or not local.matches(old):
                raise CommandError(
                    f"the cookie in {directory} is not bookie {old_id}'s (as the metadata store "
                    "has it): these directories are not that bookie's; nothing changed"
                )
        configured = Cookie(
            old_id,
            tuple(config.storage.journal_directories),
            tuple(config.storage.ledger_directories),
            old.instance_id,
        )
        if not configured.matches(old):
            raise CommandError(
                f"bookie {old_id}'s cookie does not fit the configuration "
                f"({configured.describe_difference(old)}); nothing changed"
            )
        new = Cookie(new_id, old.journal_dirs, old.ledger_dirs, old.instance_id)
        metadata.create_cookie(new_id, new.encode())
        for directory in directories:
            write_local(directory, new)
        metadata.delete_cookie(old_id)
    finally:
        locks.release()
    return new
