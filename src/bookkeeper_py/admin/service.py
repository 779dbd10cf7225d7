"""Cluster administration as a service returning data: the operations of BookKeeper's shell
(bookies, ledgers, cluster creation and deletion, cookies, AutoRecovery switches) over one
metadata store. The ``bookkeeper`` command line prints what it returns; the REST API and the
dashboard will serve it. An operation the cluster's state refuses raises ``CommandError`` (one
line: what is wrong and what to do)."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from bookkeeper_py.admin import CommandError
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.errors import LedgerExistsError, MetadataStoreError, NoSuchLedgerError
from bookkeeper_py.metadata.driver import ANY_VERSION, BadVersionError, NodeExistsError, NoNodeError
from bookkeeper_py.metadata.format import deserialize, serialize
from bookkeeper_py.metadata.manager import MetadataClient, parse_bookie_id
from bookkeeper_py.metadata.port import MetadataPort, run_blocking
from bookkeeper_py.metadata.underreplication import UnderReplication
from bookkeeper_py.progress import SILENT, Display
from bookkeeper_py.storage.cookie import Cookie

# Reads and compare-and-set writes of one ledger's metadata before giving up on it.
MAX_METADATA_RETRIES = 10


@dataclass(frozen=True)
class BookieStatus:
    bookie_id: str
    read_only: bool


@dataclass(frozen=True)
class UnderReplicatedLedger:
    ledger_id: int
    missing_replicas: tuple[str, ...]
    replication_worker: str | None  # who holds its replication lock, if anyone
    marked_ms: int = 0  # when it was marked, ms since the epoch


@dataclass(frozen=True)
class ClusterInfo:
    """BookKeeper's ``clusterinfo`` / ``bookie/cluster_info``: ``as_json`` has its keys."""

    auditor: str | None
    under_replicated: bool
    replication_enabled: bool
    total_bookies: int  # with a cookie or registered
    writable_bookies: int
    read_only_bookies: int

    def as_json(self) -> dict[str, object]:
        return {
            "auditorElected": self.auditor is not None,
            "auditorId": self.auditor or "",
            "clusterUnderReplicated": self.under_replicated,
            "ledgerReplicationEnabled": self.replication_enabled,
            "totalBookiesCount": self.total_bookies,
            "writableBookiesCount": self.writable_bookies,
            "readonlyBookiesCount": self.read_only_bookies,
            "unavailableBookiesCount": self.total_bookies
            - self.writable_bookies
            - self.read_only_bookies,
        }


async def cluster_info(port: MetadataPort) -> ClusterInfo:
    """The cluster at a glance: its auditor, whether any ledger is marked under-replicated and
    AutoRecovery is on, and its bookies: every one with a cookie or a registration (total), the
    writable and the read-only ones (the others are unavailable)."""
    markers = await UnderReplication(port).ensure_layout()
    writable, read_only = await port.bookies_now()
    known: set[str] = {*writable, *read_only, *await bookies_with_cookies(port)}
    return ClusterInfo(
        auditor=await markers.auditor(),
        under_replicated=bool(await markers.marked()),
        replication_enabled=await markers.is_enabled(),
        total_bookies=len(known),
        writable_bookies=len(writable),
        read_only_bookies=len(read_only),
    )


async def bookies_with_cookies(port: MetadataPort) -> set[str]:
    """Every bookie with a cookie: each that ever joined the cluster and was not removed."""
    known: set[str] = set()
    cookies, after = f"{port.ledgers_root}/cookies", None
    for _ in range(1_000_000):  # pages of names, bounded
        try:
            names = await port.node_children(cookies, after)
        except NoNodeError:
            break  # no bookie ever started
        known.update(names)
        if len(names) < 1000:
            break
        after = names[-1]
    return known


def ledger_metadata_json(metadata: LedgerMetadata) -> dict[str, object]:
    """A ledger's metadata with the keys BookKeeper's REST API gives it (its
    ``LedgerMetadataImpl`` as Jackson writes it): bookies as ``{"id": bookie}``, the password and
    custom values in base64, ``digestType`` null for legacy metadata that keeps none."""
    return {
        "ledgerId": metadata.ledger_id,
        "metadataFormatVersion": metadata.format_version,
        "ensembleSize": metadata.ensemble_size,
        "writeQuorumSize": metadata.write_quorum_size,
        "ackQuorumSize": metadata.ack_quorum_size,
        "state": metadata.state.name,
        "length": metadata.length,
        "lastEntryId": metadata.last_entry_id,
        "ctime": metadata.ctime_ms,
        "digestType": metadata.digest_type.name if metadata.stores_password else None,
        "password": base64.b64encode(metadata.password).decode(),
        "customMetadata": {
            key: base64.b64encode(value).decode() for key, value in metadata.custom_metadata.items()
        },
        "closed": metadata.is_closed,
        "allEnsembles": {
            str(first): [{"id": bookie} for bookie in bookies]
            for first, bookies in metadata.ensembles
        },
        "ctoken": metadata.c_token,
    }


class ClusterAdmin:
    """Administration of the cluster whose metadata ``metadata`` reaches."""

    def __init__(self, metadata: MetadataClient) -> None:
        self.metadata = metadata

    @property
    def root(self) -> str:
        return self.metadata.root

    # -- bookies and ledgers -------------------------------------------------------------------

    def bookies(self, writable: bool = True, read_only: bool = True) -> list[BookieStatus]:
        """The registered bookies: writable ones first, then read-only ones."""
        found = []
        if writable:
            found += [BookieStatus(b, False) for b in self.metadata.writable_bookies()]
        if read_only:
            found += [BookieStatus(b, True) for b in self.metadata.readonly_bookies()]
        return found

    def endpoint_info(self, bookie_id: str) -> list[str]:
        """BookKeeper's ``endpointinfo``: the lines of a live bookie's registered service info
        (its properties, then each endpoint: id, protocol, address, auth, extensions);
        ``CommandError`` when it is not registered."""
        info = self.metadata.bookie_service_info(bookie_id)
        if info is None:
            known = [status.bookie_id for status in self.bookies()]
            raise CommandError(
                f"bookie {bookie_id} is not registered (it is down, or the id is wrong); "
                f"registered: {', '.join(known) or 'none'}"
            )
        if not info.endpoints:
            raise CommandError(
                f"bookie {bookie_id} did not publish any endpoint info; maybe it is down"
            )
        lines = [f"BookieId: {bookie_id}"]
        if info.properties:
            lines.append("Properties")
            lines += [f"{key} : {value}" for key, value in sorted(info.properties.items())]
        for endpoint in info.endpoints:
            lines += [
                f"Endpoint: {endpoint.id}",
                f"Protocol: {endpoint.protocol}",
                f"Address: {endpoint.host} : {endpoint.port}",
                f"Auth: {list(endpoint.auth)}",
                f"Extensions: {list(endpoint.extensions)}",
            ]
        return lines

    def ledgers(self, bookie_id: str | None = None) -> list[int]:
        """The ledger ids; with ``bookie_id``, those whose ensembles (any fragment) hold it
        (``listledgers -bookieid``; ``CommandError`` for a bookie unknown here)."""
        if bookie_id is None:
            return list(self.metadata.list_ledgers())
        return [ledger.ledger_id for ledger, _ in self.described_ledgers(bookie_id)]

    def described_ledgers(
        self, bookie_id: str | None = None
    ) -> Iterator[tuple[LedgerMetadata, int]]:
        """Each ledger's metadata and its version, each read once (``listledgers -m``); with
        ``bookie_id`` only those whose ensembles hold it, as ``ledgers``. Ledgers deleted while
        listed are left out. A ``bookie_id`` the cluster does not know (no cookie, not
        registered, in no ledger's ensemble: the rule of ``autorecovery.admin.check_known``) is
        refused."""
        known = bookie_id is None or (
            self.metadata.read_cookie(bookie_id) is not None
            or bookie_id in self.metadata.writable_bookies()
            or bookie_id in self.metadata.readonly_bookies()
        )
        found = self._described_ledgers(bookie_id)
        if not known:  # known only if a ledger names it: look before listing anything
            found = iter(list(found))
            first = next(found, None)
            if first is None:
                raise CommandError(
                    f"bookie {bookie_id} is unknown here (no cookie, not registered, in no "
                    "ledger's ensemble); check the id (see listbookies)"
                )
            yield first
        yield from found

    def _described_ledgers(self, bookie_id: str | None) -> Iterator[tuple[LedgerMetadata, int]]:
        for ledger_id in self.metadata.list_ledgers():
            try:
                ledger, version = self.metadata.read_ledger_metadata(ledger_id)
            except NoSuchLedgerError:
                continue  # deleted while we listed
            if bookie_id is None or any(bookie_id in bookies for _, bookies in ledger.ensembles):
                yield ledger, version

    def ledger(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """The ledger's metadata and its version."""
        try:
            return self.metadata.read_ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            raise CommandError(
                f"no ledger {ledger_id} in the cluster at {self.root}; see listledgers"
            ) from None

    def dump_ledger_metadata(self, ledger_id: int) -> bytes:
        """The ledger's metadata as the metadata store keeps it (BookKeeper's serialized form:
        ``ledgermetadata --dumptofile``)."""
        metadata, _ = self.ledger(ledger_id)
        return serialize(metadata)

    def restore_ledger_metadata(self, ledger_id: int, data: bytes, update: bool) -> bool:
        """Stores ``data`` (a dump) as ledger ``ledger_id``'s metadata: created, or with
        ``update`` written over the metadata there (``ledgermetadata --restorefromfile
        [--update]``). True if it was updated. A dump that does not parse, or a ledger that
        exists without ``update``, is a ``CommandError`` and nothing is written."""
        try:
            metadata = deserialize(ledger_id, data)
        except (MetadataStoreError, ValueError) as error:
            raise CommandError(
                f"the file is not a ledger's metadata as ledgermetadata --dumptofile writes it: "
                f"{error}"
            ) from None
        try:
            self.metadata.create_ledger_metadata(metadata)
            return False
        except LedgerExistsError:
            if not update:
                raise CommandError(
                    f"ledger {ledger_id} already has metadata; pass --update to write the file's "
                    "over it"
                ) from None
        self.metadata.write_ledger_metadata(metadata, ANY_VERSION)
        return True

    def replace_bookie_in_ledgers(
        self,
        source: str,
        destination: str,
        *,
        per_second: float = 5.0,
        limit: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> tuple[int, int, list[str]]:
        """BookKeeper's ``updateBookieInLedger``: every ledger whose ensembles (any fragment)
        hold ``source`` gets ``destination`` in its place (a compare-and-set write, read again
        and redone when another writer got there first), at most ``per_second`` ledgers a second
        and ``limit`` ledgers in all. ``source`` must not be a live bookie. Returns (ledgers
        holding it, ledgers updated, one line per ledger left as it was and why).
        ``progress(updated, seen)`` after each ledger."""
        for bookie_id in (source, destination):
            try:
                parse_bookie_id(bookie_id)
            except ValueError:
                raise CommandError(f"bookie id {bookie_id!r} is not host:port") from None
        if source == destination:
            raise CommandError("the source and destination bookies are the same")
        if source in (*self.metadata.writable_bookies(), *self.metadata.readonly_bookies()):
            raise CommandError(
                f"bookie {source} is registered (running): stop it before moving its ledgers' "
                "entries to another id"
            )
        if per_second <= 0 or (limit is not None and limit <= 0):
            raise CommandError("the rate and the limit must be positive")
        seen = updated = 0
        skipped: list[str] = []
        for ledger_id in self.metadata.list_ledgers():
            if limit is not None and updated >= limit:
                break
            for _ in range(MAX_METADATA_RETRIES):
                try:
                    metadata, version = self.metadata.read_ledger_metadata(ledger_id)
                except NoSuchLedgerError:
                    break  # deleted meanwhile
                if not any(source in bookies for _, bookies in metadata.ensembles):
                    break
                clash = [first for first, bookies in metadata.ensembles if destination in bookies]
                if clash:
                    seen += 1
                    skipped.append(
                        f"ledger {ledger_id}: not updated: its fragment from entry {clash[0]} "
                        f"already holds {destination}"
                    )
                    break
                moved = replace(
                    metadata,
                    ensembles=tuple(
                        (first, tuple(destination if b == source else b for b in bookies))
                        for first, bookies in metadata.ensembles
                    ),
                )
                try:
                    self.metadata.write_ledger_metadata(moved, version)
                except BadVersionError:
                    continue  # changed since read: read it again
                except NoSuchLedgerError:
                    break
                seen += 1
                updated += 1
                time.sleep(1.0 / per_second)
                break
            else:
                seen += 1
                skipped.append(f"ledger {ledger_id}: not updated: its metadata kept changing")
            if progress is not None:
                progress(updated, seen)
        return seen, updated, skipped

    def delete_ledger(self, ledger_id: int) -> None:
        """Deletes the ledger's metadata; bookies reclaim its data in garbage collection."""
        try:
            self.metadata.delete_ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            raise CommandError(
                f"no ledger {ledger_id} in the cluster at {self.root}; see listledgers"
            ) from None

    # -- the cluster ---------------------------------------------------------------------------

    def instance_id(self) -> str:
        instance_id = self.metadata.instance_id()
        if instance_id is None:
            raise CommandError(f"no cluster at {self.root}: run initnewcluster")
        return instance_id

    def init_new_cluster(self) -> str:
        """Creates the cluster's metadata; its instance id. Refused where a cluster exists."""
        existing = self.metadata.instance_id()
        if existing is not None:
            raise CommandError(
                f"a cluster already exists at {self.root} (instance id {existing}); "
                "nothing changed; use nukeexistingcluster or metaformat to start over"
            )
        self.metadata.init_cluster()
        return self.instance_id()

    def format(self, force: bool, progress: Display = SILENT) -> tuple[int, str]:
        """Deletes all metadata (with ``force`` when a cluster holds some) and creates a new
        cluster: (nodes deleted, the new instance id). ``progress`` shows the nodes deleted."""
        existing = self.metadata.instance_id()
        if existing is not None and not force:
            raise CommandError(
                f"the cluster at {self.root} (instance id {existing}) holds metadata; "
                "metaformat -f deletes all of it (ledgers, registrations, cookies)"
            )
        with progress.task(f"deleting the metadata under {self.root}", unit="nodes") as task:
            deleted = self.metadata.delete_cluster(None, task.advance)
        self.metadata.init_cluster()
        return deleted, self.instance_id()

    def nuke(
        self,
        instance_id: str | None,
        force: bool,
        root: str | None = None,
        progress: Display = SILENT,
    ) -> int:
        """Deletes the cluster's metadata: the one named by ``instance_id``, or any with
        ``force``; the number of nodes deleted (``progress`` shows them)."""
        if not force and not instance_id:
            raise CommandError(
                "name the cluster to delete with -i INSTANCEID (see whatisinstanceid), or -f"
            )
        if root and root != self.root:
            raise CommandError(
                f"-p {root} is not the metadata URI's root {self.root}; "
                "drop -p or make it the URI's root"
            )
        with progress.task(f"deleting the metadata under {self.root}", unit="nodes") as task:
            return self.metadata.delete_cluster(None if force else instance_id, task.advance)

    # -- cookies -------------------------------------------------------------------------------

    def cookie(self, bookie_id: str) -> tuple[bytes, int]:
        """The bookie's cookie as stored, and its version."""
        found = self.metadata.read_cookie(bookie_id)
        if found is None:
            raise CommandError(
                f"no cookie for bookie {bookie_id}; check the bookie id (see listbookies)"
            )
        return found

    def store_cookie(self, bookie_id: str, data: bytes, source: str, *, update: bool) -> int:
        """Creates (or with ``update`` replaces) the bookie's cookie from ``data`` (read from
        ``source``, named in errors); the new version."""
        cookie = Cookie.decode(data, source)  # refuses what is not a cookie
        if cookie.bookie_id != bookie_id:
            raise CommandError(
                f"cookie file {source} is for bookie {cookie.bookie_id}, not {bookie_id}; "
                "pass the cookie file of that bookie"
            )
        try:
            if update:
                return self.metadata.update_cookie(bookie_id, data)
            self.metadata.create_cookie(bookie_id, data)
            return 0
        except (NodeExistsError, NoNodeError):
            advice = (
                "has no cookie; use cookie_create"
                if update
                else "already has a cookie; use cookie_update"
            )
            raise CommandError(f"bookie {bookie_id} {advice}") from None

    def delete_cookie(self, bookie_id: str) -> None:
        try:
            self.metadata.delete_cookie(bookie_id)
        except NoNodeError:
            raise CommandError(
                f"no cookie for bookie {bookie_id}; check the bookie id (see listbookies)"
            ) from None

    # -- AutoRecovery --------------------------------------------------------------------------

    def underreplicated(
        self, missing: str | None = None, excluding: str | None = None
    ) -> list[UnderReplicatedLedger]:
        """Ledgers marked under-replicated (those missing replica ``missing``, and not
        ``excluding``, when given)."""

        async def work(port: MetadataPort) -> list[UnderReplicatedLedger]:
            markers = await UnderReplication(port).ensure_layout()
            found = []
            for ledger_id in await markers.marked():
                marker = await markers.marker(ledger_id)
                if marker is None:
                    continue  # re-replicated while we listed
                replicas, ctime = marker
                if missing and missing not in replicas:
                    continue
                if excluding and excluding in replicas:
                    continue
                found.append(
                    UnderReplicatedLedger(
                        ledger_id, tuple(replicas), await markers.lock_holder(ledger_id), ctime
                    )
                )
            return found

        return run_blocking(self.metadata, work)

    def autorecovery(self, enable: bool | None = None) -> bool:
        """Switches AutoRecovery on or off (None: leaves it); whether it is on."""

        async def work(port: MetadataPort) -> bool:
            markers = await UnderReplication(port).ensure_layout()
            if enable is not None:
                await markers.set_enabled(enable)
            return await markers.is_enabled()

        return run_blocking(self.metadata, work)

    def lost_bookie_recovery_delay(self, seconds: int | None = None) -> int:
        """Sets lostBookieRecoveryDelay (None: leaves it); the value in force, in seconds."""
        if seconds is not None and seconds < 0:
            raise CommandError(f"-set takes seconds, 0 or more, got {seconds}")

        async def work(port: MetadataPort) -> int:
            markers = await UnderReplication(port).ensure_layout()
            if seconds is not None:
                await markers.set_lost_bookie_recovery_delay(seconds)
            return (await markers.lost_bookie_recovery_delay())[0]

        return run_blocking(self.metadata, work)

    def auditor(self) -> str | None:
        """The elected auditor (None when no AutoRecovery process runs)."""

        async def work(port: MetadataPort) -> str | None:
            return await (await UnderReplication(port).ensure_layout()).auditor()

        return run_blocking(self.metadata, work)

    def cluster_info(self) -> ClusterInfo:
        """``clusterinfo``: see ``cluster_info``."""
        return run_blocking(self.metadata, cluster_info)

    def force_audit_checks(self, checks: list[str]) -> None:
        """Sets when each of ``checks`` last ran to 0 (``forceauditchecks``): the next auditor
        elected runs them at once (the one in office keeps its schedule, as in BookKeeper)."""

        async def work(port: MetadataPort) -> None:
            markers = await UnderReplication(port).ensure_layout()
            for check in checks:
                await markers.set_check_ctime(check, 0)

        run_blocking(self.metadata, work)

    def trigger_audit(self) -> None:
        """Makes the auditor check every bookie's ledgers now (``triggeraudit``)."""

        async def work(port: MetadataPort) -> None:
            await (await UnderReplication(port).ensure_layout()).trigger_audit()

        run_blocking(self.metadata, work)
