"""Namespaces of logs in the metadata store: create, list, describe and delete logs; their
subscriptions; truncation and retention. Writers and readers are opened here too.

Layout (``docs/formats/logs.md``): beside the ledgers' root (``/ledgers`` -> ``/ledgers-logs``,
out of the way of Apache BookKeeper's ledger iteration), ``<logs>/<namespace>`` holds a namespace,
``<logs>/<namespace>/<log>`` a log's ``LogMetadata`` and ``.../<log>/subscriptions/<name>`` its
subscriptions. Every change of a log is a compare-and-swap of its value (``cas_update``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from bookkeeper_py import errors
from bookkeeper_py.log.format import (
    DecodedEntry,
    LogConfig,
    LogError,
    LogExistsError,
    LogMetadata,
    LogNotFoundError,
    Position,
    Segment,
    SegmentState,
    Subscription,
    WrittenLedger,
    check_name,
    decode_entry,
    decode_log,
    decode_subscription,
    encode_log,
    encode_namespace,
    encode_subscription,
)
from bookkeeper_py.metadata.driver import (
    ANY_VERSION,
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from bookkeeper_py.metadata.port import MetadataPort, cas_update

if TYPE_CHECKING:
    from bookkeeper_py.client.client import BookKeeper
    from bookkeeper_py.client.ledger import ReadHandle
    from bookkeeper_py.log.reader import LogReader, Start
    from bookkeeper_py.log.writer import LogWriter

log = logging.getLogger(__name__)

LOG_LEDGER_PROPERTY = "bookkeeper-py.log"  # custom metadata of a log's ledgers: "<ns>/<log>"
PAGE = 1000
NOTHING_CONSUMED = Position(0, -1, -1)


STAGED = "staged"  # <log>/staged/<job>/<ledger id>: ledgers written for a commit to come
JOB_ENDED = b"ended "  # a staged job's value once committed or aborted, then its time (ms)


class JobEndedError(LogError):
    """A ledger was staged for a job that has ended (``LogNamespace.end_job``)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def backoff(first: float, longest: float) -> Iterator[float]:
    """Pauses (s) that double from ``first`` up to ``longest``: ``asyncio.sleep(next(...))``
    between the attempts of a bounded retry loop."""
    pause = first
    while True:
        yield pause
        pause = min(2 * pause, longest)


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    """A subscription with its lag: records appended after its position."""

    subscription: Subscription
    lag: int


@dataclass(frozen=True, slots=True)
class LogDescription:
    """What ``describe`` tells of a log."""

    namespace: str
    name: str
    metadata: LogMetadata
    version: int
    next_sequence: int  # the log sequence number the next record will get (confirmed tail)
    record_count: int  # records not truncated
    byte_count: int  # bytes of the ledgers not truncated
    subscriptions: tuple[SubscriptionInfo, ...]


class LogNamespace:
    """The logs of one namespace, through a client (``bookkeeper_py.aio.BookKeeper``).

    ``password`` is the password of the logs' ledgers (BookKeeper's per-ledger password),
    given to every writer and reader of this namespace object."""

    def __init__(self, client: BookKeeper, name: str = "default", *, password: bytes = b"") -> None:
        self.client = client
        self.name = check_name("namespace", name)
        self.password = password

    # -- paths ----------------------------------------------------------------------------------

    @property
    def port(self) -> MetadataPort:
        return self.client.metadata_port

    def _root(self) -> str:
        return logs_root(self.port)

    def _namespace_path(self) -> str:
        return f"{self._root()}/{self.name}"

    def _log_path(self, log_name: str) -> str:
        return f"{self._namespace_path()}/{check_name('log', log_name)}"

    def _subscriptions_path(self, log_name: str) -> str:
        return f"{self._log_path(log_name)}/subscriptions"

    # -- namespaces -----------------------------------------------------------------------------

    async def create(self, *, exist_ok: bool = True) -> None:
        """Creates the namespace (``LogExistsError`` if it exists and not ``exist_ok``)."""
        await self.client._ready()
        try:
            await self.port.create_node(self._namespace_path(), encode_namespace(now_ms()))
        except NodeExistsError:
            if not exist_ok:
                raise LogExistsError(f"namespace {self.name!r} exists already") from None

    # -- logs -----------------------------------------------------------------------------------

    async def create_log(self, log_name: str, config: LogConfig | None = None) -> LogMetadata:
        """A new empty log (its namespace made if missing); ``LogExistsError`` if it exists."""
        await self.create()
        metadata = LogMetadata(config=config or LogConfig(), created_ms=now_ms())
        try:
            await self.port.create_node(self._log_path(log_name), encode_log(metadata))
        except NodeExistsError:
            raise LogExistsError(
                f"log {log_name!r} exists already in namespace {self.name!r}"
            ) from None
        return metadata

    async def list_logs(self, after: str | None = None, limit: int = PAGE) -> list[str]:
        """Up to ``limit`` log names after ``after``, sorted (page through with the last)."""
        await self.client._ready()
        try:
            return await self.port.node_children(self._namespace_path(), after, limit)
        except NoNodeError:
            raise LogNotFoundError(
                f"no namespace {self.name!r}: create a log in it first"
            ) from None

    async def read_log(self, log_name: str) -> tuple[LogMetadata, int]:
        """(metadata, version) of a log; ``LogNotFoundError`` if there is none."""
        await self.client._ready()
        path = self._log_path(log_name)
        try:
            data, version = await self.port.get_node(path)
        except NoNodeError:
            raise LogNotFoundError(
                f"no log {log_name!r} in namespace {self.name!r}: create it first "
                "(`bookkeeper log create`)"
            ) from None
        metadata = decode_log(data, f"log {self.name}/{log_name}")
        if metadata.deleting:
            raise LogNotFoundError(f"log {self.name}/{log_name} is being deleted")
        return metadata, version

    async def update_log(
        self,
        log_name: str,
        needs_change: Callable[[LogMetadata], bool],
        transform: Callable[[LogMetadata], LogMetadata],
    ) -> tuple[LogMetadata, int]:
        """A compare-and-swap change of a log's value (retried on conflicts)."""
        path = self._log_path(log_name)

        async def write(metadata: LogMetadata, version: int) -> int:
            try:
                return await self.port.set_node(path, encode_log(metadata), version)
            except NoNodeError:
                raise LogNotFoundError(f"log {self.name}/{log_name} was deleted") from None

        return await cas_update(
            f"log {self.name}/{log_name}",
            lambda: self.read_log(log_name),
            write,
            needs_change,
            transform,
        )

    async def write_log(self, log_name: str, metadata: LogMetadata, version: int) -> int:
        """One compare-and-swap: the new version; ``BadVersionError`` when it changed."""
        return await self.port.set_node(self._log_path(log_name), encode_log(metadata), version)

    async def delete_log(self, log_name: str) -> None:
        """Deletes a log: its ledgers, its subscriptions and its node. Writers are fenced off
        first (the log is marked deleted); a delete cut short is finished by running it again."""
        await self.client._ready()
        path = self._log_path(log_name)
        try:
            data, version = await self.port.get_node(path)
        except NoNodeError:
            raise LogNotFoundError(f"no log {log_name!r} in namespace {self.name!r}") from None
        metadata = decode_log(data, f"log {self.name}/{log_name}")
        while not metadata.deleting:
            try:
                version = await self.port.set_node(
                    path, encode_log(replace(metadata, deleting=True)), version
                )
                break
            except BadVersionError:
                data, version = await self.port.get_node(path)
                metadata = decode_log(data, f"log {self.name}/{log_name}")
        for segment in metadata.segments:
            if segment.is_open:  # a live writer is fenced before its ledger goes
                try:
                    await (await self.open_ledger(segment.ledger_id, recover=True)).close()
                except errors.NoSuchLedgerError:
                    pass
            await self._delete_ledger(segment.ledger_id)
        subscriptions = self._subscriptions_path(log_name)
        for name in await self._all_children(subscriptions):
            await self._delete_quietly(f"{subscriptions}/{name}")
        await self._delete_quietly(subscriptions)
        for job in await self.staged_jobs(log_name):
            await self.unstage(log_name, job, delete_ledgers=True, forget=True)
        await self._delete_quietly(f"{path}/{STAGED}")
        await self._delete_quietly(path)

    # -- staged ledgers: written for a log before a commit appends them -------------------------

    def _staged_path(self, log_name: str, job: str) -> str:
        return f"{self._log_path(log_name)}/{STAGED}/{check_name('job', job)}"

    async def stage_ledger(self, log_name: str, job: str, ledger_id: int) -> None:
        """Records that ``job`` wrote ``ledger_id`` for the log, before a single record is in
        it: a job that never commits leaves a list to sweep, not a lost ledger. A job that has
        ended (``end_job``) takes no more: a task attempt still running after its job was
        committed or aborted gets ``LogError`` (and must delete its ledger)."""
        path = self._staged_path(log_name, job)
        await self.port.create_node(f"{path}/{ledger_id}", b"")
        data, _ = await self.port.get_node(path)
        if data.startswith(JOB_ENDED):
            await self._delete_quietly(f"{path}/{ledger_id}")
            raise JobEndedError(
                f"job {job} of log {self.name}/{log_name} has ended (committed or aborted): "
                f"ledger {ledger_id} of this late task attempt is not part of it"
            )

    async def end_job(self, log_name: str, job: str) -> None:
        """Marks ``job`` ended, before its staged ledgers are swept: from then on a late task
        attempt cannot stage one (it sees the mark right after staging, or the sweep sees its
        ledger)."""
        path = self._staged_path(log_name, job)
        mark = JOB_ENDED + b"%d" % now_ms()
        try:
            await self.port.create_node(path, mark)
        except NodeExistsError:
            _, version = await self.port.get_node(path)
            await self.port.set_node(path, mark, version)

    async def forget_ended_jobs(self, log_name: str, older_than_ms: int) -> None:
        """Removes the marks of jobs that ended more than ``older_than_ms`` ago."""
        for job in await self.staged_jobs(log_name):
            path = self._staged_path(log_name, job)
            try:
                data, _ = await self.port.get_node(path)
            except NoNodeError:
                continue
            if not data.startswith(JOB_ENDED):
                continue
            if now_ms() - int(data[len(JOB_ENDED) :] or 0) > older_than_ms:
                try:
                    await self.port.delete_node(path, ANY_VERSION)
                except (NoNodeError, NotEmptyError):
                    pass

    async def staged_ledgers(self, log_name: str, job: str) -> list[int]:
        return sorted(
            int(name) for name in await self._all_children(self._staged_path(log_name, job))
        )

    async def staged_jobs(self, log_name: str) -> list[str]:
        return await self._all_children(f"{self._log_path(log_name)}/{STAGED}")

    async def unstage(
        self,
        log_name: str,
        job: str,
        *,
        delete_ledgers: bool,
        keep: frozenset[int] = frozenset(),
        forget: bool = False,
    ) -> list[int]:
        """Forgets ``job``'s staged ledgers, deleting those not in ``keep`` when
        ``delete_ledgers`` (a failed job's, or a retried task's orphans); the ones deleted.
        The job's own node (its ended mark) goes too with ``forget``."""
        path = self._staged_path(log_name, job)
        deleted = []
        for name in await self._all_children(path):
            ledger_id = int(name)
            if delete_ledgers and ledger_id not in keep:
                await self._delete_ledger(ledger_id)
                deleted.append(ledger_id)
            await self._delete_quietly(f"{path}/{name}")
        if forget:
            await self._delete_quietly(path)
        return deleted

    async def commit_ledgers(
        self,
        log_name: str,
        ledgers: list[WrittenLedger],
        *,
        writer_id: str,
        writer_sequence: int,
        overwrite: bool = False,
    ) -> bool:
        """Appends closed ledgers of relative entries to the log in one compare-and-swap
        (``writer.commit_ledgers``); False when ``writer_id`` had committed
        ``writer_sequence`` already (nothing changes)."""
        from bookkeeper_py.log.writer import commit_ledgers

        return await commit_ledgers(
            self,
            log_name,
            ledgers,
            writer_id=writer_id,
            writer_sequence=writer_sequence,
            overwrite=overwrite,
        )

    async def _all_children(self, path: str) -> list[str]:
        names: list[str] = []
        after = None
        while True:
            try:
                page = await self.port.node_children(path, after, PAGE)
            except NoNodeError:
                return names
            names += page
            if len(page) < PAGE:
                return names
            after = page[-1]

    async def _delete_quietly(self, path: str) -> None:
        try:
            await self.port.delete_node(path, ANY_VERSION)
        except NoNodeError:
            pass

    async def _delete_ledger(self, ledger_id: int) -> None:
        try:
            await self.client.delete_ledger(ledger_id)
        except errors.NoSuchLedgerError:
            pass

    async def delete(self) -> None:
        """Deletes the namespace; it must hold no logs."""
        await self.client._ready()
        try:
            await self.port.delete_node(self._namespace_path(), ANY_VERSION)
        except NoNodeError:
            raise LogNotFoundError(f"no namespace {self.name!r}") from None
        except NotEmptyError:
            raise errors.IncorrectParameterError(
                f"namespace {self.name!r} still holds logs: delete them first"
            ) from None

    # -- writers and readers --------------------------------------------------------------------

    async def open_writer(self, log_name: str, **options: object) -> LogWriter:
        """Takes the log over as its writer (``LogWriter.open``'s options)."""
        from bookkeeper_py.log.writer import LogWriter

        return await LogWriter.open(self, log_name, **options)  # type: ignore[arg-type]

    async def open_reader(
        self, log_name: str, start: Start = "earliest", **options: object
    ) -> LogReader:
        """A reader from ``start`` (``LogReader.open``'s options)."""
        from bookkeeper_py.log.reader import LogReader

        return await LogReader.open(self, log_name, start, **options)  # type: ignore[arg-type]

    async def open_ledger(self, ledger_id: int, *, recover: bool) -> ReadHandle:
        if recover:
            return await self.client.open_ledger(ledger_id, self.password)
        return await self.client.open_ledger_no_recovery(ledger_id, self.password)

    # -- the tail -------------------------------------------------------------------------------

    async def next_sequence(self, log_name: str, metadata: LogMetadata | None = None) -> int:
        """The log sequence number the next record will get, as far as readers can tell (the
        open segment's last confirmed entry)."""
        if metadata is None:
            metadata, _ = await self.read_log(log_name)
        known = metadata.base_sequence
        for segment in metadata.segments:
            if not segment.is_open:
                known = max(known, segment.end_sequence)
                continue
            try:
                handle = await self.open_ledger(segment.ledger_id, recover=False)
            except errors.NoSuchLedgerError:
                continue
            try:
                lac = handle.last_add_confirmed
                if lac >= 0:
                    entry = decode_entry((await handle.read_entry(lac)).data, "the tail", segment)
                    known = max(known, entry.first_sequence + len(entry.payloads))
            finally:
                await handle.close()
        return known

    async def describe(self, log_name: str) -> LogDescription:
        metadata, version = await self.read_log(log_name)
        next_sequence = await self.next_sequence(log_name, metadata)
        live = metadata.live_segments
        first = next((s.start_sequence for s in live if s.start_sequence >= 0), next_sequence)
        if live and (live[0].min_entry > 0 or live[0].min_slot > 0):
            marked = await self._sequence_at(live[0], live[0].first_position)
            first = first if marked is None else marked
        subscriptions = tuple(
            SubscriptionInfo(s, max(0, next_sequence - s.sequence - 1))
            for s in await self.list_subscriptions(log_name)
        )
        return LogDescription(
            self.name,
            log_name,
            metadata,
            version,
            next_sequence,
            max(0, next_sequence - first),
            sum(s.byte_count for s in live if not s.is_open),
            subscriptions,
        )

    async def _sequence_before(self, metadata: LogMetadata, position: Position) -> int:
        """The log sequence number of the first record at or after ``position`` (the tail's
        when there is none)."""
        for segment in metadata.live_segments:
            if segment.ledger_id < position.ledger_id or (
                segment.ledger_id == position.ledger_id
                and segment.last_position is not None
                and position > segment.last_position
            ):
                continue
            if segment.ledger_id > position.ledger_id:
                if segment.start_sequence >= 0:
                    return segment.start_sequence
                position = Position(segment.ledger_id, 0, 0)
            found = await self._sequence_at(segment, position)
            if found is not None:
                return found
        return await self.next_sequence("", metadata)

    async def _sequence_at(self, segment: Segment, position: Position) -> int | None:
        """The log sequence number of the first record at or after ``position`` in its entry
        (None when that entry is not confirmed)."""
        try:
            handle = await self.open_ledger(segment.ledger_id, recover=False)
        except errors.NoSuchLedgerError:
            return None
        try:
            if position.entry_id > handle.last_add_confirmed:
                return None
            entry = decode_entry(
                (await handle.read_entry(position.entry_id)).data, str(position), segment
            )
            return entry.first_sequence + min(max(position.slot, 0), len(entry.payloads))
        finally:
            await handle.close()

    # -- subscriptions --------------------------------------------------------------------------

    async def list_subscriptions(self, log_name: str) -> list[Subscription]:
        path = self._subscriptions_path(log_name)
        found = []
        for name in await self._all_children(path):
            try:
                data, _ = await self.port.get_node(f"{path}/{name}")
            except NoNodeError:
                continue
            found.append(decode_subscription(name, data))
        return found

    async def subscriptions(self, log_name: str) -> list[SubscriptionInfo]:
        """Every subscription of a log, with its lag in records."""
        return list((await self.describe(log_name)).subscriptions)

    async def get_subscription(self, log_name: str, name: str) -> Subscription | None:
        path = f"{self._subscriptions_path(log_name)}/{check_name('subscription', name)}"
        try:
            data, _ = await self.port.get_node(path)
        except NoNodeError:
            return None
        return decode_subscription(name, data)

    async def subscribe(self, log_name: str, name: str, *, at_latest: bool = False) -> Subscription:
        """Creates a subscription (or returns the one that exists): from the earliest record,
        or, with ``at_latest``, from the next record appended."""
        check_name("subscription", name)
        existing = await self.get_subscription(log_name, name)
        if existing is not None:
            return existing
        await self.read_log(log_name)  # the log exists
        position, sequence = NOTHING_CONSUMED, -1
        if at_latest:
            from bookkeeper_py.log.reader import LogReader

            reader = await LogReader.open(self, log_name, "latest")
            try:
                position, sequence = reader.last_position, reader.next_sequence - 1
            finally:
                await reader.close()
        subscription = Subscription(name, position, sequence, now_ms())
        try:
            await self.port.create_node(
                f"{self._subscriptions_path(log_name)}/{name}", encode_subscription(subscription)
            )
        except NodeExistsError:
            found = await self.get_subscription(log_name, name)
            assert found is not None
            return found
        return subscription

    async def commit(self, log_name: str, name: str, position: Position, sequence: int) -> None:
        """Moves a subscription to ``position`` (the last record its consumer is done with);
        a position behind the stored one is ignored (positions only move forward)."""
        path = f"{self._subscriptions_path(log_name)}/{check_name('subscription', name)}"

        async def read() -> tuple[Subscription, int]:
            try:
                data, version = await self.port.get_node(path)
            except NoNodeError:
                raise LogNotFoundError(
                    f"no subscription {name!r} on log {self.name}/{log_name}"
                ) from None
            return decode_subscription(name, data), version

        async def write(subscription: Subscription, version: int) -> int:
            return await self.port.set_node(path, encode_subscription(subscription), version)

        await cas_update(
            f"subscription {name!r}",
            read,
            write,
            lambda current: position > current.position,
            lambda current: Subscription(name, position, sequence, now_ms()),
        )

    async def delete_subscription(self, log_name: str, name: str) -> None:
        path = f"{self._subscriptions_path(log_name)}/{check_name('subscription', name)}"
        try:
            await self.port.delete_node(path)
        except NoNodeError:
            raise LogNotFoundError(
                f"no subscription {name!r} on log {self.name}/{log_name}"
            ) from None

    # -- truncation and retention ---------------------------------------------------------------

    async def truncate(self, log_name: str, before: Position, *, force: bool = False) -> int:
        """Deletes every record before ``before``: whole ledgers are deleted, the segment that
        holds ``before`` is marked. Refused past a subscription's position unless ``force``.
        Returns the number of ledgers deleted."""
        subscriptions = [] if force else await self.list_subscriptions(log_name)
        if subscriptions:
            metadata, _ = await self.read_log(log_name)
            first_kept = await self._sequence_before(metadata, before)
            live = metadata.live_segments
            earliest = await self._sequence_before(
                metadata, live[0].first_position if live else Position(0, 0, 0)
            )
            for subscription in subscriptions:
                after = subscription.position
                if first_kept > max(subscription.sequence + 1, earliest):
                    raise errors.IncorrectParameterError(
                        f"truncating log {self.name}/{log_name} before {before} would delete "
                        f"records subscription {subscription.name!r} has not consumed (it is at "
                        f"{after}): move it on, delete it, or force"
                    )

        def cut(metadata: LogMetadata) -> LogMetadata:
            segments = []
            for segment in metadata.segments:
                if segment.state == SegmentState.CLOSED and (
                    segment.ledger_id < before.ledger_id
                    or (segment.last_position is not None and segment.last_position < before)
                    or (segment.last_position is None and segment.ledger_id < before.ledger_id)
                ):
                    segment = replace(segment, state=SegmentState.TRUNCATED)
                elif segment.ledger_id == before.ledger_id and before > segment.first_position:
                    segment = replace(segment, min_entry=before.entry_id, min_slot=before.slot)
                segments.append(segment)
            return replace(metadata, segments=tuple(segments))

        metadata, _ = await self.update_log(log_name, lambda current: cut(current) != current, cut)
        return await self._delete_truncated(log_name, metadata)

    async def _delete_truncated(self, log_name: str, metadata: LogMetadata) -> int:
        """Deletes the ledgers of truncated segments, then drops them from the list (a delete
        cut short is finished by the next truncation)."""
        gone = [s for s in metadata.segments if s.state == SegmentState.TRUNCATED]
        for segment in gone:
            await self._delete_ledger(segment.ledger_id)
        if gone:
            deleted = {s.sequence for s in gone}

            def drop(current: LogMetadata) -> LogMetadata:
                return current.without_segments(deleted)

            await self.update_log(
                log_name, lambda current: any(s.sequence in deleted for s in current.segments), drop
            )
        return len(gone)

    async def apply_retention(
        self, log_name: str, *, now: int | None = None, force: bool = False
    ) -> int:
        """Truncates what the log's retention policy no longer keeps (closed segments older
        than ``retention_age_ms``, the oldest while the log is over ``retention_bytes``),
        never past the slowest subscription unless ``force``. The number of ledgers deleted."""
        metadata, _ = await self.read_log(log_name)
        config = metadata.config
        now = now_ms() if now is None else now
        live = [s for s in metadata.live_segments]
        closed = [s for s in live if not s.is_open]
        expired = set()
        if config.retention_age_ms:
            expired |= {
                s.sequence
                for s in closed
                if (s.last_timestamp if s.last_timestamp >= 0 else s.closed_ms)
                < now - config.retention_age_ms
            }
        if config.retention_bytes:
            total = sum(s.byte_count for s in live)
            for segment in closed:
                if total <= config.retention_bytes:
                    break
                expired.add(segment.sequence)
                total -= segment.byte_count
        # only a prefix of the list can go
        cut_at = 0
        while cut_at < len(live) and live[cut_at].sequence in expired:
            cut_at += 1
        if cut_at == 0:
            return (
                await self._delete_truncated(log_name, metadata)
                if any(s.state == SegmentState.TRUNCATED for s in metadata.segments)
                else 0
            )
        if not force:
            # never a record the slowest subscription has not consumed (sequence numbers:
            # the same rule as ``truncate``)
            slowest = min(
                (s.sequence for s in await self.list_subscriptions(log_name)), default=None
            )
            if slowest is not None:
                while cut_at > 0 and live[cut_at - 1].end_sequence > slowest + 1:
                    cut_at -= 1

        if cut_at == 0:
            return 0
        boundary = live[cut_at].first_position if cut_at < len(live) else None
        if boundary is None:
            last = live[cut_at - 1]
            boundary = Position(last.ledger_id + 1, 0, 0)
        return await self.truncate(log_name, boundary, force=True)


def logs_root(port: MetadataPort) -> str:
    """Where the logs' tree is: beside the ledgers' root."""
    return port.ledgers_root.rstrip("/") + "-logs"


async def list_namespaces(
    client: BookKeeper, after: str | None = None, limit: int = PAGE
) -> list[str]:
    """Up to ``limit`` namespace names after ``after``, sorted."""
    await client._ready()
    try:
        return await client.metadata_port.node_children(
            logs_root(client.metadata_port), after, limit
        )
    except NoNodeError:
        return []


async def data_entry(
    handle: ReadHandle, start: int, stop: int, step: int, segment: Segment | None = None
) -> tuple[int, DecodedEntry] | None:
    """The first entry from ``start`` towards ``stop`` (inclusive) that holds records, as
    (entry id, decoded, made whole from ``segment`` when relative); None when there is none.
    Control entries are few in a row."""
    window = 16
    entry_id = start
    while (step > 0 and entry_id <= stop) or (step < 0 and entry_id >= stop):
        low, high = (
            (entry_id, min(stop, entry_id + window - 1))
            if step > 0
            else (
                max(stop, entry_id - window + 1),
                entry_id,
            )
        )
        entries = await handle.read_entries(low, high)
        if step < 0:
            entries.reverse()
        for entry in entries:
            decoded = decode_entry(
                entry.data, f"ledger {handle.ledger_id} entry {entry.entry_id}", segment
            )
            if decoded.payloads:
                return entry.entry_id, decoded
        entry_id = high + 1 if step > 0 else low - 1
        window = min(window * 4, 4096)
    return None
