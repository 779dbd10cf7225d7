"""Cookies: what stops a bookie from serving with an empty, swapped or foreign directory.

A cookie names the bookie id, its journal and ledger directories and the cluster's instance id
(reference section 1.10). One copy lives in ``current/VERSION`` of every journal and ledger
directory, one in the metadata store at ``<root>/cookies/<bookieId>``. Text, as BookKeeper writes
it: the layout version on the first line, then the ``CookieFormat`` protobuf in text format;
ledger directories are encoded ``<count>\\t<dir>\\t<dir>...``.

At start (``verify_or_create``):

* no cookie anywhere and no data in any directory: a new bookie; cookies are written everywhere;
* otherwise every directory and the metadata store must hold a cookie equal to the one the
  configuration describes. A directory without a cookie (a replaced disk), a cookie naming other
  directories or another bookie (swapped disks, two bookies on one identity), or another instance
  id (the wrong cluster) stops the bookie with ``InvalidCookieError`` saying what to check.
  Serving from such a directory would answer "no such entry" for data it never had, which is
  how a recovery can truncate a ledger.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from google.protobuf import text_format

from bookkeeper_py.errors import BKError
from bookkeeper_py.storage.files import write_atomically
from bookkeeper_py.wire.proto import data_formats_pb2 as formats

LAYOUT_VERSION = 5
VERSION_FILE = os.path.join("current", "VERSION")
DATA_MARKERS = (".txn", ".log", "data.mdb", "lastMark")


class InvalidCookieError(BKError):
    """The bookie's directories, its configuration and the metadata store disagree about who it is."""


@dataclass(frozen=True, slots=True)
class Cookie:
    bookie_id: str
    journal_dirs: tuple[str, ...]
    ledger_dirs: tuple[str, ...]
    instance_id: str | None
    layout_version: int = LAYOUT_VERSION

    def encode(self) -> bytes:
        message = formats.CookieFormat(
            bookieHost=self.bookie_id,
            journalDir=self.journal_dirs[0]
            if len(self.journal_dirs) == 1
            else _encode_dirs(self.journal_dirs),
            ledgerDirs=_encode_dirs(self.ledger_dirs),
        )
        if self.instance_id is not None:
            message.instanceId = self.instance_id
        return f"{self.layout_version}\n{text_format.MessageToString(message)}".encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> Cookie:
        try:
            version_line, _, body = data.decode("utf-8").partition("\n")
            version = int(version_line.strip())
            if version < 4:
                raise ValueError(f"cookie layout version {version} is too old (needs 4 or later)")
            message = text_format.Parse(body, formats.CookieFormat())
            dirs = _decode_dirs(message.ledgerDirs, "ledgerDirs")
            journal_dirs = (
                _decode_dirs(message.journalDir, "journalDir")
                if "\t" in message.journalDir
                else (message.journalDir,)
            )
        except (UnicodeDecodeError, ValueError, text_format.ParseError) as error:
            raise InvalidCookieError(f"the cookie in {where} is unreadable: {error}") from error
        return cls(
            message.bookieHost,
            journal_dirs,
            dirs,
            message.instanceId if message.HasField("instanceId") else None,
            version,
        )

    def describe_difference(self, other: Cookie) -> str:
        differences = []
        for name in ("bookie_id", "journal_dirs", "ledger_dirs", "instance_id"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                differences.append(f"{name} {theirs!r} instead of {mine!r}")
        return ", ".join(differences)

    def matches(self, other: Cookie) -> bool:
        return (self.bookie_id, self.journal_dirs, self.ledger_dirs, self.instance_id) == (
            other.bookie_id,
            other.journal_dirs,
            other.ledger_dirs,
            other.instance_id,
        )


def _encode_dirs(directories: tuple[str, ...]) -> str:
    """BookKeeper's encoding of a directory list: the count, then each directory, tab-separated."""
    return "\t".join([str(len(directories)), *directories])


def _decode_dirs(text: str, field: str) -> tuple[str, ...]:
    count, *directories = text.split("\t")
    if int(count) != len(directories):
        raise ValueError(f"{field} says {count} directories and lists {len(directories)}")
    return tuple(directories)


def read_local(directory: str) -> Cookie | None:
    path = os.path.join(directory, VERSION_FILE)
    try:
        with open(path, "rb") as handle:
            return Cookie.decode(handle.read(), path)
    except FileNotFoundError:
        return None


def write_local(directory: str, cookie: Cookie) -> None:
    current = os.path.join(directory, "current")
    os.makedirs(current, exist_ok=True)
    write_atomically(os.path.join(directory, VERSION_FILE), cookie.encode())


def holds_data(directory: str) -> bool:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return False
    return any(name.endswith(DATA_MARKERS) for name in names)


class CookieStore(Protocol):
    """Where the metadata copy of a cookie lives (the bookie adapts its metadata client)."""

    def read(self, bookie_id: str) -> Cookie | None: ...

    def create(self, cookie: Cookie) -> None: ...


def verify_or_create(expected: Cookie, directories: list[str], store: CookieStore | None) -> bool:
    """Checks the cookies of ``directories`` (and of the metadata store, if any) against
    ``expected``; makes them for a new bookie. Returns True when it made new cookies."""
    local = {directory: read_local(directory) for directory in directories}
    remote = store.read(expected.bookie_id) if store is not None else None
    with_data = [directory for directory in directories if holds_data(directory)]
    if remote is None and all(cookie is None for cookie in local.values()):
        if with_data:
            raise InvalidCookieError(
                f"{', '.join(with_data)} hold bookie data but no cookie, and the metadata store has none "
                f"for {expected.bookie_id}: these directories were not made by this bookie in this cluster. "
                "Point the bookie at its own directories, or format them (bookieformat) if the data is unwanted."
            )
        for directory in directories:
            write_local(directory, expected)
        if store is not None:
            store.create(expected)
        return True
    if remote is None and store is not None:
        raise InvalidCookieError(
            f"the directories hold a cookie but the metadata store has none for {expected.bookie_id}: "
            "the bookie is pointed at another cluster, or its cookie was deleted (decommissioned). "
            "Check metadataServiceUri; to rejoin on purpose, format the directories."
        )
    if remote is not None and not remote.matches(expected):
        raise InvalidCookieError(
            f"the metadata store's cookie for {expected.bookie_id} disagrees with this configuration: "
            f"{expected.describe_difference(remote)}. Restore the configuration the bookie ran with."
        )
    for directory, cookie in local.items():
        if cookie is None:
            raise InvalidCookieError(
                f"{directory} has no cookie while the bookie's other directories (or the metadata store) do: "
                "it is empty or was replaced, and serving from it would deny entries the bookie acknowledged. "
                "Restore the original disk; if its data is lost for good, decommission the bookie and let "
                "AutoRecovery re-replicate."
            )
        if not cookie.matches(expected):
            raise InvalidCookieError(
                f"the cookie in {directory} belongs elsewhere: {expected.describe_difference(cookie)}. "
                "Directories were swapped between bookies or moved; put them back where they were."
            )
    return False
