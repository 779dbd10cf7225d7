"""The ``underreplication/`` tree that AutoRecovery works from (reference sections 1.9 and 1.14),
laid out as BookKeeper's ZkLedgerUnderreplicationManager lays it out, on any metadata port::

    <root>/underreplication/LAYOUT                 text LedgerRereplicationLayoutFormat "BASIC" 1
    <root>/underreplication/ledgers/<hex4>/<hex4>/<hex4>/<hex4>/urL%010d
                                                   text UnderreplicatedLedgerFormat{replica, ctime}
    <root>/underreplication/locks/urL%010d         ephemeral, text LockDataFormat{bookieId}
    <root>/underreplication/auditorelection/V_%010d  ephemeral sequential, text AuditorVoteFormat
    <root>/underreplication/decommission/<bookieId>  "draining" or "done": a live bookie being
                                                   decommissioned (ours; BookKeeper decommissions
                                                   stopped bookies only)
    <root>/underreplication/disable                present: AutoRecovery paused
    <root>/underreplication/lostBookieRecoveryDelay  seconds, decimal text; rewriting it (even
                                                   with the same value) makes the auditor audit

Every change of a marker is a compare-and-swap, so auditors and workers on several machines
share it. It is written once, over the asyncio ``MetadataPort``: the auditor and replication
workers, the simulator and (through ``ThreadedMetadata``) the blocking admin commands use it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TypeVar

from google.protobuf import text_format
from google.protobuf.message import DecodeError, Message

from bookkeeper_py.errors import MetadataStoreError
from bookkeeper_py.metadata.driver import (
    ANY_VERSION,
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from bookkeeper_py.metadata.manager import MAX_UPDATE_ATTEMPTS
from bookkeeper_py.metadata.port import MetadataPort
from bookkeeper_py.wire.proto import data_formats_pb2 as formats

LAYOUT_TYPE = "BASIC"
LAYOUT_VERSION = 1
VOTE_PREFIX = "V_"


def marker_name(ledger_id: int) -> str:
    return f"urL{ledger_id:010d}"


def marker_parent(base: str, ledger_id: int) -> str:
    """``<base>/<hex4>/<hex4>/<hex4>/<hex4>``: the id's 64 bits, 16 at a time."""
    parts = [f"{(ledger_id >> shift) & 0xFFFF:04x}" for shift in (48, 32, 16, 0)]
    return "/".join([base, *parts])


def _text(message: Message) -> bytes:
    return text_format.MessageToString(message).encode()


# The auditor's periodic checks whose last-run times live under underreplication/ (their node
# names, as BookKeeper's BookKeeperConstants).
CHECK_ALL_LEDGERS = "checkallledgersctime"
PLACEMENT_POLICY_CHECK = "placementpolicycheckctime"
REPLICAS_CHECK = "replicascheckctime"

M = TypeVar("M", bound=Message)


def _parse(message: M, data: bytes, what: str, remedy: str) -> M:
    """``message`` filled from protobuf text ``data``; ``MetadataStoreError`` naming ``what``
    and the ``remedy`` when it is not."""
    try:
        text_format.Parse(data.decode("utf-8"), message)
    except (text_format.ParseError, UnicodeDecodeError) as error:
        raise MetadataStoreError(f"{what} is unreadable ({error}); {remedy}") from error
    return message


class UnderReplication:
    """Marks, lists, locks and clears under-replicated ledgers; pauses and resumes AutoRecovery;
    holds the auditor election's votes and the lost-bookie delay.

    ``await ensure_layout()`` checks (and on a new cluster writes) the tree's layout, as
    BookKeeper does: an incompatible layout raises ``MetadataStoreError``."""

    def __init__(self, port: MetadataPort) -> None:
        self.port = port
        self.base = f"{port.ledgers_root}/underreplication"
        self.ledgers = f"{self.base}/ledgers"
        self.locks = f"{self.base}/locks"
        self.election = f"{self.base}/auditorelection"
        self.delay_path = f"{self.base}/lostBookieRecoveryDelay"
        # ledger -> the version of its marker when this process took its lock
        self._held: dict[int, int] = {}
        self.decommissions = f"{self.base}/decommission"

    async def ensure_layout(self) -> UnderReplication:
        for path in (self.base, self.ledgers, self.locks, self.election):
            try:
                await self.port.create_node(path, b"")
            except NodeExistsError:
                pass
        wanted = formats.LedgerRereplicationLayoutFormat(type=LAYOUT_TYPE, version=LAYOUT_VERSION)
        try:
            await self.port.create_node(f"{self.base}/LAYOUT", _text(wanted))
            return self
        except NodeExistsError:
            pass
        data, _ = await self.port.get_node(f"{self.base}/LAYOUT")
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
        return self

    async def _children(self, path: str) -> list[str]:
        """Every child name of ``path`` (read a page at a time); [] when it does not exist."""
        names: list[str] = []
        after: str | None = None
        while True:
            try:
                page = await self.port.node_children(path, after, 1000)
            except NoNodeError:
                return names
            names += page
            if len(page) < 1000:
                return names
            after = page[-1]

    # -- markers ---------------------------------------------------------------------------------

    def _marker(self, ledger_id: int) -> str:
        return f"{marker_parent(self.ledgers, ledger_id)}/{marker_name(ledger_id)}"

    async def mark(self, ledger_id: int, missing_replicas: Iterable[str]) -> bool:
        """Records that ``ledger_id`` lost its copies on ``missing_replicas`` (bookie ids),
        adding to any replicas already recorded. True when the marker changed."""
        missing = list(dict.fromkeys(missing_replicas))
        path = self._marker(ledger_id)
        for _ in range(MAX_UPDATE_ATTEMPTS):
            try:
                data, version = await self.port.get_node(path)
            except NoNodeError:
                marker = formats.UnderreplicatedLedgerFormat(
                    replica=missing, ctime=int(time.time() * 1000)
                )
                try:
                    await self.port.create_node(path, _text(marker))
                    return True
                except NodeExistsError:
                    continue  # another auditor marked it meanwhile: merge into theirs
            marker = self._parse_marker(ledger_id, data)
            new = [replica for replica in missing if replica not in marker.replica]
            if not new:
                return False
            marker.replica.extend(new)
            try:
                await self.port.set_node(path, _text(marker), version)
                return True
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

    async def marker(self, ledger_id: int) -> tuple[list[str], int] | None:
        """(missing bookies, when it was marked in ms since the epoch), or None when the ledger
        is not marked."""
        try:
            data, _ = await self.port.get_node(self._marker(ledger_id))
        except NoNodeError:
            return None
        found = self._parse_marker(ledger_id, data)
        return list(found.replica), found.ctime

    async def missing_replicas(self, ledger_id: int) -> list[str] | None:
        """The bookies recorded as missing for ``ledger_id``, or None when it is not marked."""
        found = await self.marker(ledger_id)
        return None if found is None else found[0]

    async def marked(self) -> list[int]:
        """Every marked ledger id, in increasing order."""
        found: list[int] = []
        await self._walk(self.ledgers, 4, found)
        return found

    async def _walk(self, path: str, levels_left: int, found: list[int]) -> None:
        for name in await self._children(path):
            if levels_left == 0:
                if name.startswith("urL") and name[3:].isdigit():
                    found.append(int(name[3:]))
            elif len(name) == 4:
                await self._walk(f"{path}/{name}", levels_left - 1, found)

    async def unmark(self, ledger_id: int) -> None:
        """Clears the marker of a ledger whose copies are whole again (and its lock), and the
        directories it leaves empty. Under this process's lock, only the marker as it was when
        the lock was taken: one rewritten since (the auditor added a bookie lost while the copies
        were made) stays for the next worker, as BookKeeper's markLedgerReplicated leaves it."""
        try:
            await self.port.delete_node(
                self._marker(ledger_id), self._held.get(ledger_id, ANY_VERSION)
            )
        except NoNodeError:
            pass
        except BadVersionError:
            await self.release(ledger_id)
            return
        parent = marker_parent(self.ledgers, ledger_id)
        while parent != self.ledgers:
            try:
                await self.port.delete_node(parent)
            except (NoNodeError, NotEmptyError):
                break  # other markers live there (or another worker tidied it)
            parent = parent.rsplit("/", 1)[0]
        await self.release(ledger_id)

    # -- locks held by replication workers --------------------------------------------------------

    async def acquire(self, ledger_id: int, holder: str) -> bool:
        """Takes the ephemeral lock of a marked ledger; False when another worker holds it or the
        ledger is not marked. The lock ends with this client's session."""
        try:
            marker, version = await self.port.get_node(self._marker(ledger_id))
        except NoNodeError:
            return False
        self._parse_marker(ledger_id, marker)
        data = _text(formats.LockDataFormat(bookieId=holder))
        try:
            await self.port.create_ephemeral(f"{self.locks}/{marker_name(ledger_id)}", data)
        except NodeExistsError:
            return False
        self._held[ledger_id] = version
        return True

    async def release(self, ledger_id: int) -> None:
        try:
            await self.port.delete_node(f"{self.locks}/{marker_name(ledger_id)}")
        except NoNodeError:
            pass
        self._held.pop(ledger_id, None)

    async def lock_holder(self, ledger_id: int) -> str | None:
        try:
            data, _ = await self.port.get_node(f"{self.locks}/{marker_name(ledger_id)}")
        except NoNodeError:
            return None
        try:
            lock = _parse(formats.LockDataFormat(), data, "lock", "")
        except MetadataStoreError:
            return ""  # held, by a holder that wrote something else
        return lock.bookieId

    # -- the auditor election --------------------------------------------------------------------

    async def vote(self, candidate: str) -> str:
        """Enters ``candidate`` (a bookie id or host name) in the auditor election: the name of
        its ephemeral vote. The lowest vote is the auditor."""
        data = _text(formats.AuditorVoteFormat(bookieId=candidate))
        path = await self.port.create_ephemeral(
            f"{self.election}/{VOTE_PREFIX}", data, sequential=True
        )
        return path.rsplit("/", 1)[1]

    async def votes(self) -> list[tuple[str, str]]:
        """(vote name, candidate) of every vote, lowest (the auditor) first."""
        names = [name for name in await self._children(self.election) if name[:2] == VOTE_PREFIX]
        names.sort(key=lambda name: int(name[2:]) if name[2:].lstrip("-").isdigit() else 2**63)
        found = []
        for name in names:
            try:
                data, _ = await self.port.get_node(f"{self.election}/{name}")
            except NoNodeError:
                continue  # its session ended while we listed
            try:
                vote = _parse(formats.AuditorVoteFormat(), data, "vote", "")
                found.append((name, vote.bookieId))
            except MetadataStoreError:
                found.append((name, ""))
        return found

    async def auditor(self) -> str | None:
        """The elected auditor (its candidate name), or None when nobody stands."""
        votes = await self.votes()
        return votes[0][1] if votes else None

    async def withdraw(self, vote: str) -> None:
        try:
            await self.port.delete_node(f"{self.election}/{vote}")
        except NoNodeError:
            pass

    # -- decommissioning a live bookie -------------------------------------------------------------

    async def decommission_state(self, bookie_id: str) -> str | None:
        """ "draining" (the bookie turns read-only and its data is being moved), "done" (it is to
        stop) or None."""
        try:
            data, _ = await self.port.get_node(f"{self.decommissions}/{bookie_id}")
        except NoNodeError:
            return None
        return data.decode("utf-8", errors="replace")

    async def set_decommission_state(self, bookie_id: str, state: str | None) -> None:
        path = f"{self.decommissions}/{bookie_id}"
        if state is None:
            try:
                await self.port.delete_node(path)
            except NoNodeError:
                pass
            return
        try:
            await self.port.create_node(path, state.encode())
        except NodeExistsError:
            await self.port.set_node(path, state.encode(), ANY_VERSION)

    # -- switches ----------------------------------------------------------------------------------

    async def is_enabled(self) -> bool:
        try:
            await self.port.get_node(f"{self.base}/disable")
        except NoNodeError:
            return True
        return False

    async def set_enabled(self, enabled: bool) -> None:
        """Resumes or pauses AutoRecovery cluster-wide (shell ``autorecovery -enable/-disable``)."""
        try:
            if enabled:
                await self.port.delete_node(f"{self.base}/disable")
            else:
                await self.port.create_node(f"{self.base}/disable", b"")
        except (NoNodeError, NodeExistsError):
            pass

    async def lost_bookie_recovery_delay(self) -> tuple[int, int]:
        """(seconds the auditor waits after losing a bookie before it marks its ledgers, the
        node's version: -1 when never set, and the delay is BookKeeper's default 0)."""
        try:
            data, version = await self.port.get_node(self.delay_path)
        except NoNodeError:
            return 0, -1
        text = data.decode("utf-8", errors="replace").strip()
        if not text.lstrip("-").isdigit():
            raise MetadataStoreError(
                f"{self.delay_path} holds {text!r}, not a number of seconds; "
                "set it again with 'bookkeeper shell lostbookierecoverydelay -set N'"
            )
        return int(text), version

    async def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        """Sets the delay; every write (the same value too) makes the auditor audit at once
        (``triggeraudit`` rewrites the value in force, as BookKeeper's does)."""
        if seconds < 0:
            raise ValueError(f"the lost bookie recovery delay is not negative: {seconds}")
        data = str(seconds).encode()
        try:
            await self.port.create_node(self.delay_path, data)
        except NodeExistsError:
            await self.port.set_node(self.delay_path, data, ANY_VERSION)

    # -- when the auditor's periodic checks last ran ---------------------------------------------

    def _check_node(self, check: str) -> tuple[str, type[Message], str]:
        """(path, message type, field) of a periodic check's last-run time (BookKeeper's
        ``checkallledgersctime``, ``placementpolicycheckctime``, ``replicascheckctime``)."""
        kinds = {
            CHECK_ALL_LEDGERS: (formats.CheckAllLedgersFormat, "checkAllLedgersCTime"),
            PLACEMENT_POLICY_CHECK: (
                formats.PlacementPolicyCheckFormat,
                "placementPolicyCheckCTime",
            ),
            REPLICAS_CHECK: (formats.ReplicasCheckFormat, "replicasCheckCTime"),
        }
        kind, field = kinds[check]
        return f"{self.base}/{check}", kind, field

    async def check_ctime(self, check: str) -> int | None:
        """When a periodic check last ran (ms since the epoch; 0 after ``forceauditchecks``),
        or None if it never did. A node that does not parse counts as never (the check then
        runs on its own schedule, and its next run writes the node again)."""
        path, kind, field = self._check_node(check)
        try:
            data, _ = await self.port.get_node(path)
        except NoNodeError:
            return None
        message = kind()
        try:
            message.ParseFromString(data)
        except DecodeError:
            return None
        return int(getattr(message, field)) if message.HasField(field) else None

    async def set_check_ctime(self, check: str, ms: int) -> None:
        """Records when a periodic check ran (0: it is overdue: the next auditor elected runs
        it at once), as BookKeeper's binary protobuf."""
        path, kind, field = self._check_node(check)
        data = kind(**{field: ms}).SerializeToString()
        try:
            await self.port.create_node(path, data)
        except NodeExistsError:
            await self.port.set_node(path, data, ANY_VERSION)

    async def trigger_audit(self) -> None:
        seconds, _ = await self.lost_bookie_recovery_delay()
        await self.set_lost_bookie_recovery_delay(seconds)
