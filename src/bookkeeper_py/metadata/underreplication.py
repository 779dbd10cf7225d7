"""The ``underreplication/`` tree that AutoRecovery works from (reference sections 1.9 and 1.14),
laid out as BookKeeper's ZkLedgerUnderreplicationManager lays it out, on any driver::

    <root>/underreplication/LAYOUT                 text LedgerRereplicationLayoutFormat "BASIC" 1
    <root>/underreplication/ledgers/<hex4>/<hex4>/<hex4>/<hex4>/urL%010d
                                                   text UnderreplicatedLedgerFormat{replica, ctime}
    <root>/underreplication/locks/urL%010d         ephemeral, text LockDataFormat{bookieId}
    <root>/underreplication/disable                present: AutoRecovery paused
    <root>/underreplication/lostBookieRecoveryDelay  seconds, decimal text

Every change of a marker is a compare-and-swap, so auditors and workers on several machines
can share it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from google.protobuf import text_format
from google.protobuf.message import Message

from bookkeeper_py.errors import MetadataStoreError
from bookkeeper_py.metadata.driver import (
    ANY_VERSION,
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from bookkeeper_py.metadata.manager import MAX_UPDATE_ATTEMPTS, MetadataClient
from bookkeeper_py.wire.proto import data_formats_pb2 as formats

LAYOUT_TYPE = "BASIC"
LAYOUT_VERSION = 1


def marker_name(ledger_id: int) -> str:
    return f"urL{ledger_id:010d}"


def marker_parent(base: str, ledger_id: int) -> str:
    """``<base>/<hex4>/<hex4>/<hex4>/<hex4>``: the id's 64 bits, 16 at a time."""
    parts = [f"{(ledger_id >> shift) & 0xFFFF:04x}" for shift in (48, 32, 16, 0)]
    return "/".join([base, *parts])


def _text(message: Message) -> bytes:
    return text_format.MessageToString(message).encode()


M = TypeVar("M", bound=Message)


def _parse(message: M, data: bytes, what: str, remedy: str) -> M:
    """``message`` filled from protobuf text ``data``; ``MetadataStoreError`` naming ``what``
    and the ``remedy`` when it is not."""
    try:
        text_format.Parse(data.decode("utf-8"), message)
    except (text_format.ParseError, UnicodeDecodeError) as error:
        raise MetadataStoreError(f"{what} is unreadable ({error}); {remedy}") from error
    return message


class UnderReplicationManager:
    """Marks, lists, locks and clears under-replicated ledgers; pauses and resumes AutoRecovery.

    Creating one checks (and on a new cluster writes) the tree's layout, as BookKeeper does:
    an incompatible layout raises ``MetadataStoreError``."""

    def __init__(self, metadata: MetadataClient) -> None:
        self.metadata = metadata
        self.store = metadata.store
        self.base = f"{metadata.root}/underreplication"
        self.ledgers = f"{self.base}/ledgers"
        self.locks = f"{self.base}/locks"
        self._check_layout()

    def _check_layout(self) -> None:
        for path in (self.base, self.ledgers, self.locks):
            try:
                self.store.create(path)
            except NodeExistsError:
                pass
        wanted = formats.LedgerRereplicationLayoutFormat(type=LAYOUT_TYPE, version=LAYOUT_VERSION)
        try:
            self.store.create(f"{self.base}/LAYOUT", _text(wanted))
            return
        except NodeExistsError:
            pass
        data, _ = self.store.get(f"{self.base}/LAYOUT")
        found = _parse(
            formats.LedgerRereplicationLayoutFormat(),
            data,
            f"{self.base}/LAYOUT",
            "it is not an under-replication layout this version knows",
        )
        if (found.type, found.version) != (LAYOUT_TYPE, LAYOUT_VERSION):
            raise MetadataStoreError(
                f"{self.base}/LAYOUT is {found.type} version {found.version}; this version "
                f"reads {LAYOUT_TYPE} version {LAYOUT_VERSION} only"
            )

    # -- markers ---------------------------------------------------------------------------------

    def _marker(self, ledger_id: int) -> str:
        return f"{marker_parent(self.ledgers, ledger_id)}/{marker_name(ledger_id)}"

    def mark_underreplicated(self, ledger_id: int, missing_replicas: Iterable[str]) -> None:
        """Records that ``ledger_id`` lost its copies on ``missing_replicas`` (bookie ids),
        adding to any replicas already recorded."""
        missing = list(dict.fromkeys(missing_replicas))
        path = self._marker(ledger_id)
        for _ in range(MAX_UPDATE_ATTEMPTS):
            try:
                data, version = self.store.get(path)
            except NoNodeError:
                marker = formats.UnderreplicatedLedgerFormat(
                    replica=missing, ctime=int(time.time() * 1000)
                )
                try:
                    self.store.create(path, _text(marker), make_parents=True)
                    return
                except NodeExistsError:
                    continue  # another auditor marked it meanwhile: merge into theirs
            marker = self._parse_marker(ledger_id, data)
            new = [replica for replica in missing if replica not in marker.replica]
            if not new:
                return
            marker.replica.extend(new)
            try:
                self.store.set(path, _text(marker), version)
                return
            except (BadVersionError, NoNodeError):
                continue
        raise MetadataStoreError(f"{path} keeps changing; could not mark ledger {ledger_id}")

    def _parse_marker(self, ledger_id: int, data: bytes) -> formats.UnderreplicatedLedgerFormat:
        return _parse(
            formats.UnderreplicatedLedgerFormat(),
            data,
            f"the under-replication marker of ledger {ledger_id}",
            "delete it and let the auditor mark the ledger again",
        )

    def missing_replicas(self, ledger_id: int) -> list[str] | None:
        """The bookies recorded as missing for ``ledger_id``, or None when it is not marked."""
        try:
            data, _ = self.store.get(self._marker(ledger_id))
        except NoNodeError:
            return None
        return list(self._parse_marker(ledger_id, data).replica)

    def underreplicated_ledgers(self) -> Iterator[int]:
        """Every marked ledger id, in increasing order, a directory at a time."""
        yield from self._walk(self.ledgers, 4)

    def _walk(self, path: str, levels_left: int) -> Iterator[int]:
        try:
            for name in self.store.iter_children(path):
                if levels_left == 0:
                    if name.startswith("urL") and name[3:].isdigit():
                        yield int(name[3:])
                elif len(name) == 4:
                    yield from self._walk(f"{path}/{name}", levels_left - 1)
        except NoNodeError:
            return  # cleared meanwhile

    def mark_replicated(self, ledger_id: int) -> None:
        """Clears the marker of a ledger whose copies are whole again (and its lock), and the
        directories it leaves empty."""
        try:
            self.store.delete(self._marker(ledger_id), ANY_VERSION)
        except NoNodeError:
            pass
        parent = marker_parent(self.ledgers, ledger_id)
        while parent != self.ledgers:
            try:
                self.store.delete(parent)
            except (NoNodeError, NotEmptyError):
                break  # other markers live there (or another worker tidied it)
            parent = parent.rsplit("/", 1)[0]
        self.release(ledger_id)

    # -- locks held by replication workers --------------------------------------------------------

    def acquire(self, ledger_id: int, holder: str | None = None) -> bool:
        """Takes the ephemeral lock of a marked ledger; False when another worker holds it or the
        ledger is not marked. The lock ends with this client's session."""
        if self.missing_replicas(ledger_id) is None:
            return False
        data = _text(formats.LockDataFormat(bookieId=holder or socket.gethostname()))
        try:
            self.store.create(f"{self.locks}/{marker_name(ledger_id)}", data, ephemeral=True)
        except NodeExistsError:
            return False
        return True

    def release(self, ledger_id: int) -> None:
        try:
            self.store.delete(f"{self.locks}/{marker_name(ledger_id)}")
        except NoNodeError:
            pass

    def lock_holder(self, ledger_id: int) -> str | None:
        try:
            data, _ = self.store.get(f"{self.locks}/{marker_name(ledger_id)}")
        except NoNodeError:
            return None
        try:
            lock = _parse(formats.LockDataFormat(), data, "lock", "")
        except MetadataStoreError:
            return ""  # held, by a holder that wrote something else
        return lock.bookieId

    # -- switches ----------------------------------------------------------------------------------

    def is_enabled(self) -> bool:
        return self.store.exists(f"{self.base}/disable") is None

    def disable(self) -> None:
        """Pauses AutoRecovery cluster-wide (shell ``autorecovery -disable``)."""
        try:
            self.store.create(f"{self.base}/disable")
        except NodeExistsError:
            pass

    def enable(self) -> None:
        try:
            self.store.delete(f"{self.base}/disable")
        except NoNodeError:
            pass

    def lost_bookie_recovery_delay(self) -> int:
        """Seconds the auditor waits after losing a bookie before it marks its ledgers (0 when
        never set, BookKeeper's default)."""
        try:
            data, _ = self.store.get(f"{self.base}/lostBookieRecoveryDelay")
        except NoNodeError:
            return 0
        text = data.decode("utf-8", errors="replace").strip()
        if not text.lstrip("-").isdigit():
            raise MetadataStoreError(
                f"{self.base}/lostBookieRecoveryDelay holds {text!r}, not a number of seconds; "
                "set it again with 'bookkeeper shell lostbookierecoverydelay -set N'"
            )
        return int(text)

    def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        if seconds < 0:
            raise ValueError(f"the lost bookie recovery delay is not negative: {seconds}")
        path = f"{self.base}/lostBookieRecoveryDelay"
        data = str(seconds).encode()
        try:
            self.store.create(path, data)
        except NodeExistsError:
            self.store.set(path, data, ANY_VERSION)
