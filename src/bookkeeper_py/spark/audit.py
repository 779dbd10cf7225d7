"""The audit: every entry of every ledger, read from every replica its metadata names, in
parallel across bookies; under-replicated and corrupt fragments reported.

What is checked. A closed ledger up to its last entry; an open one up to its LAC, read without
fencing (its writer goes on writing; entries past the LAC may still be on their way). Each
fragment of a ledger (``LedgerMetadata.ensembles``: its first entry and its ensemble) holds
its entries on the bookies of their write sets (``core.quorum.write_set``: entry ``e`` on the
ensemble's places ``e``, ``e+1``, ... ``e+Qw-1``, modulo E), and each of those bookies is asked
for the entry itself, exactly as it stores it. An answer is one of:

    the entry asked for, digest good, its LAC      fine
      below its id (sent before it was confirmed)
    ENOENTRY, ENOLEDGER                            missing: the metadata says it is there
    EUNKNOWNLEDGERSTATE                            missing: the bookie lost data (in limbo)
    the entry, digest bad, another entry, or its   corrupt
      LAC not below its id
    EIO                                            corrupt: the bookie cannot read it back
    no connection, a timeout, another status       asked once more; then unreachable

A bookie that cannot be reached, or fails a second time, is not asked for the rest of its
partition: what is left is reported unreachable, not missing (its data may be intact). In an
open ledger a missing replica is asked for once more too: with Qa < Qw, an entry up to the LAC
may still be on its way to the last bookies of its write set. An open ledger whose LAC no
bookie can tell is checked up to its last fragment (whose first entry was the writer's LAC + 1
when it chose that ensemble) and reported as a problem: the audit is then not healthy.

Findings are per fragment: consecutive bad entries of one bookie in one fragment with the same
kind are one finding (consecutive among the entries that bookie holds: with E > Qw it holds
some of the fragment's entries only).

How it runs. The driver reads the metadata (``bookkeeper_py.aio.BookKeeper``), finds each open
ledger's LAC and plans partitions of at most ``PARTITION_REPLICAS`` replicas, each of one
bookie, interleaved across bookies so that Spark checks the bookies at the same time. A
partition is plain data (ids, ranges, the digest type and password, the bookie's endpoint):
a task reads with a client that knows the endpoint and has no metadata session
(``tasks.Runtime.reading_client``), on its worker's event loop (``tasks.runtime``). Tasks
return their findings merged, the driver merges those that meet across partitions.

The ledger's password for digests is the one its metadata stores (the metadata of every
ledger made by BookKeeper 4.6+ or this project holds it); the ``password`` argument serves
ledgers whose metadata holds none (format v1). With a wrong password a MAC digest fails (every
entry corrupt); CRC32 and CRC32C digests do not depend on it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from bookkeeper_py import errors
from bookkeeper_py.client.client import BookKeeper, password_bytes
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.spark.options import client_config
from bookkeeper_py.spark.tasks import runtime
from bookkeeper_py.wire.digest import DigestManager, DigestType
from bookkeeper_py.wire.status import StatusCode

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

MISSING = "missing"
CORRUPT = "corrupt"
UNREACHABLE = "unreachable"
KINDS = (MISSING, CORRUPT, UNREACHABLE)

PARTITION_REPLICAS = 50_000  # replica reads in one Spark partition, at most
WINDOW = 256  # reads in flight in a task, at most
METADATA_READS = 32  # ledger metadata (and LAC) reads in flight on the driver, at most
RETRY_PAUSE_S = 0.2  # before asking a bookie once more for the entries it did not answer
PLAN_TIMEOUT_S = 600.0
TASK_TIMEOUT_S = 3600.0

# A bookie's answer other than EOK, and what it makes of the replica (any status not here:
# asked once more, then unreachable).
STATUS_KINDS: Mapping[StatusCode, str] = {
    StatusCode.ENOENTRY: MISSING,
    StatusCode.ENOLEDGER: MISSING,
    StatusCode.EUNKNOWNLEDGERSTATE: MISSING,
    StatusCode.EIO: CORRUPT,
}
STATUS_MEANINGS: Mapping[StatusCode, str] = {
    StatusCode.ENOENTRY: "the bookie has no such entry",
    StatusCode.ENOLEDGER: "the bookie has no such ledger",
    StatusCode.EUNKNOWNLEDGERSTATE: "the bookie lost data and cannot tell (in limbo)",
    StatusCode.EIO: "the bookie cannot read the entry back",
}


# -- the plan: plain data, pickled to the tasks --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Check:
    """Entries ``first``..``last`` of one fragment of a ledger, as far as the bookie at place
    ``index`` of the fragment's ensemble holds them (those whose write set includes it)."""

    ledger_id: int
    digest_type: DigestType
    password: bytes
    ensemble_size: int
    write_quorum_size: int
    fragment: int  # the fragment's first entry
    index: int
    first: int
    last: int
    # the ledger was open: a replica found missing is asked for once more (with Qa < Qw, an
    # entry up to the LAC may still be on its way to the last bookies of its write set)
    open_ledger: bool = False

    def entries(self) -> Iterator[int]:
        """The entries of the range the bookie holds, in order."""
        return (e for e in range(self.first, self.last + 1) if self.holds(e))

    def holds(self, entry_id: int) -> bool:
        # write_set(e) = [(e + i) % E for i < Qw], so place `index` holds e when
        # (index - e) mod E < Qw
        return (self.index - entry_id) % self.ensemble_size < self.write_quorum_size

    @property
    def replicas(self) -> int:
        """How many entries of the range the bookie holds."""
        cycles, rest = divmod(self.last - self.first + 1, self.ensemble_size)
        tail = range(self.last - rest + 1, self.last + 1)
        return cycles * self.write_quorum_size + sum(1 for e in tail if self.holds(e))


@dataclass(frozen=True, slots=True)
class AuditPartition:
    """The checks of one Spark task, all on one bookie."""

    bookie: str
    endpoint: tuple[str, int] | None  # None: the metadata store does not say where it listens
    checks: tuple[Check, ...]


@dataclass(frozen=True, slots=True, order=True)
class Finding:
    """Entries ``first_entry``..``last_entry`` of the fragment starting at entry ``fragment``
    of ledger ``ledger_id``: each one that ``bookie`` should hold is ``kind`` there (missing,
    corrupt or unreachable); ``detail`` says why, for the first of them."""

    ledger_id: int
    fragment: int
    first_entry: int
    last_entry: int
    bookie: str
    kind: str
    detail: str = ""

    def line(self) -> str:
        span = (
            str(self.first_entry)
            if self.first_entry == self.last_entry
            else f"{self.first_entry}-{self.last_entry}"
        )
        return (
            f"{self.kind} ledger {self.ledger_id} fragment {self.fragment} entries {span} "
            f"bookie {self.bookie}: {self.detail}"
        )


@dataclass
class AuditReport:
    """What an audit found, and how much it checked."""

    findings: list[Finding] = field(default_factory=list)
    ledgers: int = 0  # ledgers audited
    entries: int = 0  # entries to check: a closed ledger's all, an open one's up to its LAC
    replicas: int = 0  # replicas read from their bookie and answered (unreachable ones not)
    # what could not be planned (an open ledger whose LAC no bookie could tell), one line each
    problems: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        """Every replica of every entry present and sound, every bookie reached."""
        return not self.findings and not self.problems

    def under_replicated(self) -> list[int]:
        """The ledgers with a finding (a corrupt or unreachable replica is one sound copy
        fewer, as a missing one is)."""
        return sorted({finding.ledger_id for finding in self.findings})

    def lines(self) -> list[str]:
        """One line per finding, one per problem, then a summary (for ``bookkeeper spark
        audit``)."""
        out = [finding.line() for finding in self.findings]
        out += [f"unchecked {problem}" for problem in self.problems]
        return [*out, self.summary()]

    def summary(self) -> str:
        checked = (
            f"audited {_counted(self.ledgers, 'ledger')}, {_counted(self.entries, 'entry')}, "
            f"{_counted(self.replicas, 'replica')} answered"
        )
        if self.healthy:
            return f"{checked}: healthy"
        kinds = Counter(finding.kind for finding in self.findings)
        found = ", ".join(f"{kinds[kind]} {kind}" for kind in KINDS if kinds[kind])
        parts = []
        if self.findings:
            parts.append(
                f"{_counted(len(self.findings), 'finding')} ({found}) in "
                f"{_counted(len(self.under_replicated()), 'ledger')}"
            )
        if self.problems:
            parts.append(f"{_counted(len(self.problems), 'ledger')} unchecked")
        return f"{checked}: {'; '.join(parts)}"


def _counted(count: int, noun: str) -> str:
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{count} {noun if count == 1 else plural}"


# -- the driver ----------------------------------------------------------------------------------


def audit(
    spark: SparkSession,
    metadata_uri: str,
    *,
    ledgers: Iterable[int] | None = None,
    client_options: Mapping[str, Any] | None = None,
    password: str | bytes = b"",
) -> AuditReport:
    """Audits the ledgers of the cluster at ``metadata_uri`` (every ledger, or the ids in
    ``ledgers``) in a Spark job of a classic session (``spark.sparkContext``), any master.
    ``client_options`` are ``ClientConfig`` fields as plain data, as ``spark.options`` parses
    them (``{"request_timeout_s": 2.0}``; TLS as ``_tls``): they travel to every task.
    ``password`` is for ledgers whose metadata stores none (format v1).
    A malformed URI, an unknown client option or a ledger id that does not exist raises a
    ``BKError`` whose one line says so."""
    options = dict(client_options or {})
    client_config(options)  # an unknown option fails here, not in a task
    wanted = _ledger_ids(ledgers)
    context = _spark_context(spark)
    plan = runtime().loop.run(
        _plan(metadata_uri, wanted, options, password_bytes(password)), PLAN_TIMEOUT_S
    )
    results: list[tuple[int, list[tuple[Any, ...]]]] = []
    if plan.partitions:
        context.setJobDescription(
            f"bookkeeper audit: {_counted(plan.report.ledgers, 'ledger')}, "
            f"{_counted(len(plan.partitions), 'partition')}"
        )
        try:
            results = (
                context.parallelize(plan.partitions, len(plan.partitions))
                .mapPartitions(partial(check_partitions, options))
                .collect()
            )
        finally:
            context.setJobDescription(None)
    report = plan.report
    found: list[Finding] = []
    for replicas, rows in results:
        report.replicas += replicas
        found.extend(Finding(*row) for row in rows)
    report.findings = merge(found, plan.shapes)
    log.info("%s", report.summary())
    return report


def _spark_context(spark: SparkSession) -> Any:
    try:
        return spark.sparkContext
    except Exception:  # Spark Connect's sessions raise PySparkNotImplementedError
        raise errors.IncorrectParameterError(
            "the audit runs its tasks through spark.sparkContext, which this session has not "
            "(a Spark Connect session?): use a classic session, e.g. "
            "bookkeeper_py.spark.session.spark_session(master)"
        ) from None


def _ledger_ids(ledgers: Iterable[int] | None) -> list[int] | None:
    if ledgers is None:
        return None
    if isinstance(ledgers, str | bytes):
        raise errors.IncorrectParameterError(
            f"ledgers={ledgers!r}: give ledger ids as integers (a list), or None for every ledger"
        )
    ids = list(ledgers)
    bad = [x for x in ids if not isinstance(x, int) or isinstance(x, bool) or x < 0]
    if bad:
        raise errors.IncorrectParameterError(
            f"ledgers: {bad[0]!r} is not a ledger id; ledger ids are integers of 0 or more"
        )
    return sorted(set(ids))


@dataclass
class _Plan:
    report: AuditReport
    partitions: list[AuditPartition]
    # (ledger, fragment, bookie) -> (E, Qw, place): to merge findings across partitions
    shapes: dict[tuple[int, int, str], tuple[int, int, int]]


async def _plan(
    uri: str, wanted: list[int] | None, client_options: Mapping[str, Any], password: bytes
) -> _Plan:
    async with BookKeeper(uri, client_config(client_options)) as client:
        ids = await client.list_ledgers() if wanted is None else wanted
        ranges: list[tuple[LedgerMetadata, int, str]] = []
        for low in range(0, len(ids), METADATA_READS):  # METADATA_READS reads at a time
            ranges += [
                found
                for found in await asyncio.gather(
                    *(
                        _ledger_range(client, ledger_id, password, wanted is not None)
                        for ledger_id in ids[low : low + METADATA_READS]
                    )
                )
                if found is not None
            ]
        bookies = sorted({b for metadata, _, _ in ranges for b in metadata.bookies()})
        endpoints = dict(
            zip(
                bookies,
                await asyncio.gather(*map(partial(_endpoint, client), bookies)),
                strict=True,
            )
        )
    report = AuditReport(ledgers=len(ranges))
    checks: dict[str, list[Check]] = {bookie: [] for bookie in bookies}
    shapes: dict[tuple[int, int, str], tuple[int, int, int]] = {}
    for metadata, last, problem in ranges:
        if problem:
            report.problems.append(problem)
        report.entries += last + 1
        for check in ledger_checks(metadata, last, password):
            bookie = _bookie(metadata, check)
            checks[bookie].append(check)
            shapes[check.ledger_id, check.fragment, bookie] = (
                check.ensemble_size,
                check.write_quorum_size,
                check.index,
            )
    partitions = [
        AuditPartition(bookie, endpoints[bookie], tuple(group))
        for bookie in bookies
        for group in pack(checks[bookie], PARTITION_REPLICAS)
    ]
    return _Plan(report, interleave(partitions), shapes)


async def _ledger_range(
    client: BookKeeper, ledger_id: int, password: bytes, named: bool
) -> tuple[LedgerMetadata, int, str] | None:
    """(metadata, the last entry to check, a problem or ""); None for a ledger deleted since
    it was listed."""
    try:
        metadata = await client.get_ledger_metadata(ledger_id)
        if metadata.is_closed:
            return metadata, metadata.last_entry_id, ""
        key = metadata.password if metadata.stores_password else password
        handle = await client.open_ledger_no_recovery(ledger_id, key, metadata.digest_type)
    except errors.NoSuchLedgerError:
        if named:
            raise errors.NoSuchLedgerError(
                f"ledger {ledger_id} does not exist: check the id (bookkeeper shell "
                "listledgers lists them)"
            ) from None
        return None  # deleted since it was listed
    except errors.MetadataStoreError:
        raise
    except (errors.ReadError, errors.LedgerRecoveryError, errors.TimeoutError) as error:
        # an open ledger whose LAC no bookie could tell: its earlier fragments, whose entries
        # were confirmed before the last ensemble was chosen, are still checked
        last = metadata.last_ensemble[0] - 1
        return (
            metadata,
            last,
            f"ledger {ledger_id}: open, and its LAC could not be read ({error}); "
            f"checked entries up to {last} only",
        )
    try:
        return handle.metadata, handle.last_add_confirmed, ""
    finally:
        await handle.close()


async def _endpoint(client: BookKeeper, bookie: str) -> tuple[str, int] | None:
    try:
        endpoint = await client.metadata_port.bookie_endpoint(bookie)
    except (errors.BKError, ValueError) as error:
        log.warning("bookie %s: where it listens is not known (%s)", bookie, error)
        return None
    return endpoint.host, endpoint.port


def ledger_checks(metadata: LedgerMetadata, last: int, password: bytes) -> Iterator[Check]:
    """The checks of a ledger's entries up to ``last``: one per fragment and bookie of its
    ensemble."""
    key = metadata.password if metadata.stores_password else password
    starts = [first for first, _ in metadata.ensembles]
    for number, (first, ensemble) in enumerate(metadata.ensembles):
        end = starts[number + 1] - 1 if number + 1 < len(starts) else last
        end = min(end, last)
        if end < first:
            continue
        for index in range(len(ensemble)):
            yield Check(
                metadata.ledger_id,
                metadata.digest_type,
                key,
                metadata.ensemble_size,
                metadata.write_quorum_size,
                fragment=first,
                index=index,
                first=first,
                last=end,
                open_ledger=not metadata.is_closed,
            )


def _bookie(metadata: LedgerMetadata, check: Check) -> str:
    return metadata.ensemble_at(check.fragment)[check.index]


def pack(checks: list[Check], limit: int) -> Iterator[list[Check]]:
    """``checks`` in groups of at most ``limit`` replicas (a larger check split in ranges)."""
    group: list[Check] = []
    size = 0
    for check in checks:
        # about `limit` replicas of this check per range (Qw of every E entries are held)
        span = max(1, limit * check.ensemble_size // check.write_quorum_size)
        for low in range(check.first, check.last + 1, span):
            piece = replace(check, first=low, last=min(check.last, low + span - 1))
            if group and size + piece.replicas > limit:
                yield group
                group, size = [], 0
            group.append(piece)
            size += piece.replicas
    if group:
        yield group


def interleave(partitions: list[AuditPartition]) -> list[AuditPartition]:
    """The partitions in turns of their bookies (Spark starts tasks in partition order, so
    the bookies are checked at the same time, not one after another)."""
    by_bookie: dict[str, list[AuditPartition]] = {}
    for part in partitions:
        by_bookie.setdefault(part.bookie, []).append(part)
    turns = itertools.zip_longest(*by_bookie.values())
    return [part for turn in turns for part in turn if part is not None]


def merge(
    findings: Iterable[Finding], shapes: Mapping[tuple[int, int, str], tuple[int, int, int]]
) -> list[Finding]:
    """``findings`` sorted, those of one bookie, fragment and kind that meet (no entry the
    bookie holds between them) made one."""
    out: list[Finding] = []
    for finding in sorted(findings, key=_merge_key):
        previous = out[-1] if out else None
        if (
            previous is not None
            and _merge_key(previous)[:4] == _merge_key(finding)[:4]
            and finding.first_entry
            <= _next_held(
                previous.last_entry,
                *shapes[finding.ledger_id, finding.fragment, finding.bookie],
            )
        ):
            out[-1] = Finding(
                previous.ledger_id,
                previous.fragment,
                previous.first_entry,
                max(previous.last_entry, finding.last_entry),
                previous.bookie,
                previous.kind,
                previous.detail,
            )
        else:
            out.append(finding)
    return sorted(out)


def _merge_key(finding: Finding) -> tuple[int, int, str, str, int]:
    return (finding.ledger_id, finding.fragment, finding.bookie, finding.kind, finding.first_entry)


def _next_held(entry_id: int, ensemble_size: int, write_quorum_size: int, index: int) -> int:
    """The next entry after ``entry_id`` that the bookie at place ``index`` holds."""
    following = entry_id + 1
    while (index - following) % ensemble_size >= write_quorum_size:
        following += 1
    return following


# -- the tasks -----------------------------------------------------------------------------------


def check_partitions(
    client_options: Mapping[str, Any], partitions: Iterable[AuditPartition]
) -> Iterator[tuple[int, list[tuple[Any, ...]]]]:
    """What a Spark task runs: for each partition, (replicas answered, its findings as
    tuples of ``Finding``'s fields)."""
    run = runtime()
    for part in partitions:
        endpoints = () if part.endpoint is None else ((part.bookie, *part.endpoint),)
        client = run.reading_client(client_options, endpoints)
        replicas, findings = run.loop.run(check_partition(client, part), TASK_TIMEOUT_S)
        yield (
            replicas,
            [
                (f.ledger_id, f.fragment, f.first_entry, f.last_entry, f.bookie, f.kind, f.detail)
                for f in findings
            ],
        )


class _Runs:
    """Findings of one bookie, built entry by entry in order: a bad entry extends the run of
    its kind when the entries between (of those the bookie holds) were all that kind too."""

    def __init__(self, bookie: str) -> None:
        self.bookie = bookie
        self.findings: list[Finding] = []
        self._open: Finding | None = None

    def good(self) -> None:
        self._close()

    def bad(self, check: Check, entry_id: int, kind: str, detail: str) -> None:
        run = self._open
        if (
            run is not None
            and run.kind == kind
            and (run.ledger_id, run.fragment) == (check.ledger_id, check.fragment)
        ):
            self._open = Finding(
                run.ledger_id, run.fragment, run.first_entry, entry_id, run.bookie, kind, run.detail
            )
            return
        self._close()
        self._open = Finding(
            check.ledger_id, check.fragment, entry_id, entry_id, self.bookie, kind, detail
        )

    def _close(self) -> None:
        if self._open is not None:
            self.findings.append(self._open)
            self._open = None

    def done(self) -> list[Finding]:
        self._close()
        return self.findings


async def check_partition(client: BookKeeper, part: AuditPartition) -> tuple[int, list[Finding]]:
    """Reads every entry of ``part`` from its bookie: (replicas answered, findings)."""
    runs = _Runs(part.bookie)
    answered = 0
    lost = await _reach(client, part)
    for number, check in enumerate(part.checks):
        if lost:
            _unreachable(runs, part.checks[number:], lost)
            break
        digest = DigestManager(check.ledger_id, check.digest_type, check.password)
        entries = check.entries()
        while not lost:
            window = list(itertools.islice(entries, WINDOW))
            if not window:
                break
            outcomes = await _read_window(client, part.bookie, digest, window, check.open_ledger)
            for entry_id, outcome in zip(window, outcomes, strict=True):
                if outcome is None:
                    answered += 1
                    runs.good()
                    continue
                kind, detail = outcome
                if kind == UNREACHABLE:
                    lost = detail
                else:
                    answered += 1
                runs.bad(check, entry_id, kind, detail)
        if lost:  # the rest of this check
            for entry_id in entries:
                runs.bad(check, entry_id, UNREACHABLE, lost)
    return answered, runs.done()


async def _reach(client: BookKeeper, part: AuditPartition) -> str:
    """Why the bookie cannot be reached ("" when it takes a connection)."""
    if part.endpoint is None:
        return "the metadata store does not say where this bookie listens"
    try:
        await client.bookie_client.pool.get(part.bookie)
    except errors.BKError as error:
        return f"cannot connect ({error})"
    return ""


def _unreachable(runs: _Runs, checks: Iterable[Check], detail: str) -> None:
    for check in checks:
        for entry_id in check.entries():
            runs.bad(check, entry_id, UNREACHABLE, detail)


Outcome = tuple[str, str] | None  # (kind, detail) of a bad replica; None: a good one


async def _read_window(
    client: BookKeeper, bookie: str, digest: DigestManager, window: list[int], open_ledger: bool
) -> list[Outcome]:
    """The outcomes of reading ``window``'s entries from ``bookie``; entries whose read failed
    (no answer, a status that says nothing of the entry), and in an open ledger those found
    missing, are asked once more."""
    outcomes = await asyncio.gather(*(_read_one(client, bookie, digest, e) for e in window))
    retried_kinds = (UNREACHABLE, MISSING) if open_ledger else (UNREACHABLE,)
    again = [i for i, outcome in enumerate(outcomes) if outcome and outcome[0] in retried_kinds]
    if again:
        await asyncio.sleep(RETRY_PAUSE_S)
        retried = await asyncio.gather(
            *(_read_one(client, bookie, digest, window[i]) for i in again)
        )
        for i, outcome in zip(again, retried, strict=True):
            outcomes[i] = outcome
    return outcomes


async def _read_one(
    client: BookKeeper, bookie: str, digest: DigestManager, entry_id: int
) -> Outcome:
    try:
        status, body = await client.bookie_client.read_entry(bookie, digest.ledger_id, entry_id)
    except errors.BKError as error:
        return UNREACHABLE, str(error) or type(error).__name__
    if status == StatusCode.EOK:
        try:
            entry = digest.verify(body, entry_id)
        except errors.DigestMismatchError as error:
            return CORRUPT, str(error)
        if entry.last_add_confirmed >= entry_id:  # a writer sends an entry before it is confirmed
            return CORRUPT, (
                f"ledger {digest.ledger_id} entry {entry_id} carries LAC "
                f"{entry.last_add_confirmed}, not below its own id"
            )
        return None
    kind = STATUS_KINDS.get(status, UNREACHABLE)
    meaning = STATUS_MEANINGS.get(status, "the bookie could not serve the read")
    return kind, f"{status.name}: {meaning}"
