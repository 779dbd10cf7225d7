"""A fault campaign over real processes: bookies and a writer killed, frozen and damaged while
they work, then a checker that every acknowledged entry survived.

    python -m bookkeeper_py.testing.chaos --cycles 1000 --seed 7 [--bookies 4] [--json]

A ``LocalCluster`` of ``--bookies`` bookie processes and a writer process (``chaos writer``)
that creates ledgers of mixed (E, Qw, Qa) (E = Qw and E > Qw), adds pipelined entries whose
bytes are a function of (ledger, entry), logs every acknowledgement to an append-only file, and
rolls to a new ledger every few hundred entries. Each cycle applies one seeded fault and heals
it: a bookie killed (SIGKILL) and restarted; frozen (SIGSTOP) for up to 1.5 s; killed with the
last group of its journal damaged (a flipped byte or a cut) before the restart, so that it starts
in limbo; the writer killed and started again; or an operator's mistake (a second bookie started
on a live bookie's directories, which must be refused, touching nothing). One fault at a time,
so at least E bookies are up once it is healed.

The checker (``check``), with every bookie up: recovers and closes every ledger through one
client; reads every ledger through two independent clients (v2 and v3) and compares each entry
with the bytes it must have; checks that each closed ledger ends at or after its last
acknowledged entry, that nothing past the close point is readable, and, once no bookie is in
limbo, that every acknowledged entry is held byte-identical by at least Qa of the replicas the
metadata names (read from each bookie directly). Violations are listed; operations that did not
end within their deadline are counted as hung. The result is a ``CampaignReport`` (JSON with
``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from bookkeeper_py import errors
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.server.limbo import LIMBO_FILE
from bookkeeper_py.storage.journal import list_journal_ids, scan
from bookkeeper_py.testing.local_cluster import LocalCluster, free_port
from bookkeeper_py.testing.raw import recv_frame
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.digest import DigestManager, DigestType
from bookkeeper_py.wire.status import StatusCode

PASSWORD = b"chaos"
CONFIGS = [(3, 3, 2), (3, 2, 2), (3, 3, 3), (2, 2, 2), (3, 2, 1), (2, 2, 1)]
FAULTS = {  # kind: weight
    "kill": 35,
    "pause": 30,
    "kill_writer": 15,
    "damage_journal": 10,
    "second_bookie": 10,
}
ENTRY_DEADLINE_S = 120.0  # an add not answered by then is a hung operation
T = TypeVar("T")


def payload(ledger_id: int, entry_id: int) -> bytes:
    """The bytes of an entry: a function of its ids (32 to 512 bytes)."""
    block = hashlib.blake2b(b"%d:%d" % (ledger_id, entry_id), digest_size=32).digest()
    return block * (1 + (ledger_id * 31 + entry_id) % 16)


# -- the writer process --------------------------------------------------------------------------


async def write(
    uri: str, log_path: str, seed: int, in_flight: int, per_ledger: int, rate: float
) -> None:
    """Writes ledgers for ever (until SIGTERM), logging to ``log_path``: ``C ledger E Qw Qa``
    when a ledger is created, ``A ledger entry`` per acknowledged entry (in order), ``X ledger
    last`` once closed, ``F ledger Type`` when its adds failed, ``H ledger entry`` for an add
    that did not end within its deadline."""
    from bookkeeper_py.client.client import BookKeeper

    rng = random.Random(seed)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def note(line: str) -> None:
        os.write(fd, line.encode())

    started = loop.time()
    submitted = 0

    async def pace() -> None:
        """Keeps the writer at ``rate`` entries a second (20 at a time)."""
        nonlocal submitted
        submitted += 20
        delay = started + submitted / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    async with BookKeeper(uri, throttle=in_flight) as client:
        while not stop.is_set():
            ensemble, write_quorum, ack_quorum = rng.choice(CONFIGS)
            try:
                handle = await client.create_ledger(
                    ensemble, write_quorum, ack_quorum, DigestType.CRC32C, PASSWORD
                )
            except errors.BKError as error:
                note(f"F - {type(error).__name__}\n")
                await asyncio.sleep(0.2)
                continue
            ledger = handle.ledger_id
            note(f"C {ledger} {ensemble} {write_quorum} {ack_quorum}\n")
            futures: list[asyncio.Future[int]] = []
            acked: list[str] = []
            failed = False
            for entry_id in range(per_ledger):
                # Keep up to in_flight adds sent ahead of the one awaited, at the paced rate.
                while len(futures) < min(per_ledger, entry_id + in_flight) and not failed:
                    if rate > 0 and len(futures) % 20 == 0:
                        await pace()
                    try:
                        futures.append(handle.add_entry_async(payload(ledger, len(futures))))
                    except errors.BKError as error:
                        note(f"F {ledger} {type(error).__name__}\n")
                        failed = True
                if entry_id >= len(futures):
                    break
                try:
                    await asyncio.wait_for(asyncio.shield(futures[entry_id]), ENTRY_DEADLINE_S)
                except TimeoutError:
                    note(f"H {ledger} {entry_id}\n")
                    failed = True
                    break
                except errors.BKError as error:
                    note(f"F {ledger} {type(error).__name__}\n")
                    failed = True
                    break
                acked.append(f"A {ledger} {entry_id}\n")
                if len(acked) >= 64:
                    note("".join(acked))
                    acked.clear()
            if acked:
                note("".join(acked))
            for future in futures:
                if not future.done():
                    future.cancel()
                elif not future.cancelled():
                    future.exception()  # retrieved: no "never retrieved" warning
            if failed:
                continue  # left open: the checker recovers it
            try:
                await asyncio.wait_for(handle.close(), ENTRY_DEADLINE_S)
                note(f"X {ledger} {handle.last_add_confirmed}\n")
            except TimeoutError:
                note(f"H {ledger} close\n")
            except errors.BKError as error:
                note(f"F {ledger} {type(error).__name__}\n")
    os.close(fd)


# -- the campaign ---------------------------------------------------------------------------------


@dataclass
class CampaignReport:
    seed: int
    cycles: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    ledgers: int = 0
    acknowledged: int = 0
    verified_entries: int = 0  # entries read back and compared, through each client
    replica_copies_checked: int = 0
    writer_errors: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    hung: int = 0
    elapsed_s: float = 0.0
    check_s: float = 0.0  # of which the checker

    @property
    def ok(self) -> bool:
        return not self.violations and self.hung == 0


class Campaign:
    """One seeded campaign on a cluster it starts in ``directory``."""

    def __init__(
        self,
        directory: str,
        seed: int,
        bookies: int = 4,
        in_flight: int = 200,
        per_ledger: int = 400,
        rate: float = 2000,
    ) -> None:
        self.directory = directory
        self.rng = random.Random(seed)
        self.report = CampaignReport(seed)
        self.cluster = LocalCluster(
            bookies,
            base_directory=os.path.join(directory, "cluster"),
            bookie_args=["--flush-interval-ms", "2000"],
        )
        self.log_path = os.path.join(directory, "acks.log")
        self.in_flight = in_flight
        self.per_ledger = per_ledger
        self.rate = rate
        self.writer: subprocess.Popen[bytes] | None = None
        self._writer_runs = 0

    # -- processes -------------------------------------------------------------------------------

    def start_writer(self) -> None:
        self._writer_runs += 1
        command = [
            sys.executable, "-m", "bookkeeper_py.testing.chaos", "writer",
            "--metadata-uri", self.cluster.metadata_uri, "--log", self.log_path,
            "--seed", str(self.rng.randrange(2**31)), "--in-flight", str(self.in_flight),
            "--per-ledger", str(self.per_ledger), "--rate", str(self.rate),
        ]  # fmt: skip
        with open(os.path.join(self.directory, "writer.log"), "ab") as output:
            self.writer = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def stop_writer(self, kill: bool = False) -> None:
        if self.writer is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.writer.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.writer.wait(ENTRY_DEADLINE_S + 30)
        except subprocess.TimeoutExpired:
            self.report.violations.append("the writer did not stop within its deadline")
            self.writer.kill()
            self.writer.wait()
        self.writer = None

    # -- faults ------------------------------------------------------------------------------------

    def run(self, cycles: int) -> CampaignReport:
        started = time.monotonic()
        with self.cluster:
            self.start_writer()
            try:
                for _ in range(cycles):
                    self.cycle()
                time.sleep(0.5)
                self.stop_writer()
                self.check()
            finally:
                self.stop_writer(kill=True)
        self.report.elapsed_s = round(time.monotonic() - started, 1)
        return self.report

    def cycle(self) -> None:
        kinds = list(FAULTS)
        kind = self.rng.choices(kinds, weights=[FAULTS[k] for k in kinds])[0]
        index = self.rng.randrange(len(self.cluster.bookies))
        if kind == "damage_journal" and any(
            self._in_limbo(i) for i in range(len(self.cluster.bookies))
        ):
            kind = "kill"  # one bookie in limbo at a time: two could leave a ledger unknown
        self.report.faults[kind] = self.report.faults.get(kind, 0) + 1
        self.report.cycles += 1
        if kind == "kill":
            self.cluster.kill_bookie(index)
            time.sleep(self.rng.uniform(0.05, 0.5))
            self.cluster.start_bookie(index)
        elif kind == "pause":
            self.cluster.pause_bookie(index)
            time.sleep(self.rng.uniform(0.1, 1.5))
            self.cluster.resume_bookie(index)
        elif kind == "kill_writer":
            self.stop_writer(kill=True)
            self.start_writer()
        elif kind == "damage_journal":
            self.cluster.kill_bookie(index)
            self._damage_journal_tail(index)
            self.cluster.start_bookie(index)
        elif kind == "second_bookie":
            self._second_bookie(index)
        if self.writer is not None and self.writer.poll() is not None:
            self.report.violations.append(
                f"cycle {self.report.cycles}: the writer exited with status {self.writer.returncode}"
            )
            self.start_writer()
        time.sleep(self.rng.uniform(0.0, 0.3))

    def _in_limbo(self, index: int) -> bool:
        directory = os.path.join(self.cluster.bookies[index].directory, "ledgers")
        return os.path.exists(os.path.join(directory, LIMBO_FILE))

    def _damage_journal_tail(self, index: int) -> None:
        """Flips a byte of, or cuts, the last group of the newest journal file."""
        directory = self.cluster.bookies[index].journal_directory
        ids = list_journal_ids(directory)
        if not ids:
            return
        path = os.path.join(directory, f"{ids[-1]:016x}.txn")
        ends = sorted({end for _, _, end in scan(path, is_last=False)})
        if not ends:
            return
        start = ends[-2] if len(ends) > 1 else 16
        with open(path, "r+b") as handle:
            if self.rng.random() < 0.5:
                offset = self.rng.randrange(start, ends[-1])
                handle.seek(offset)
                byte = handle.read(1)
                handle.seek(offset)
                handle.write(bytes([byte[0] ^ 0xFF]))
            else:
                handle.truncate(self.rng.randrange(start + 1, ends[-1]))

    def _second_bookie(self, index: int) -> None:
        """An operator starts a second bookie on a live bookie's directories: refused at once,
        with its files untouched."""
        live = self.cluster.bookies[index]
        before = sorted(os.listdir(live.journal_directory))
        result = subprocess.run(
            [
                sys.executable, "-m", "bookkeeper_py", "bookie",
                "--metadata-uri", self.cluster.metadata_uri, "--host", "127.0.0.1",
                "--port", str(free_port()), "--bookie-id", live.bookie_id,
                "--journal-dir", live.journal_directory,
            ],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if result.returncode != 1 or "is in use by" not in result.stderr:
            self.report.violations.append(
                f"cycle {self.report.cycles}: a second bookie on {live.bookie_id}'s directories "
                f"was not refused (status {result.returncode}: {result.stderr.strip()[-300:]})"
            )
        after = sorted(os.listdir(live.journal_directory))
        if [n for n in before if n.endswith(".txn")] and not set(before) & set(after):
            self.report.violations.append(f"the live bookie {live.bookie_id}'s journal changed")

    # -- the checker ---------------------------------------------------------------------------

    def _read_log(self) -> tuple[dict[int, tuple[int, int, int]], dict[int, int], dict[int, int]]:
        created: dict[int, tuple[int, int, int]] = {}
        acked: dict[int, int] = {}  # ledger -> highest acknowledged entry
        closed: dict[int, int] = {}
        errors_by_type: collections.Counter[str] = collections.Counter()
        count = 0
        with open(self.log_path, encoding="utf-8") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) < 2 or not line.endswith("\n"):
                    continue  # a line cut by a SIGKILL
                if parts[0] == "C":
                    created[int(parts[1])] = (int(parts[2]), int(parts[3]), int(parts[4]))
                elif parts[0] == "A":
                    ledger, entry = int(parts[1]), int(parts[2])
                    if entry != acked.get(ledger, -1) + 1:
                        self.report.violations.append(
                            f"ledger {ledger}: entry {entry} acknowledged out of order"
                        )
                    acked[ledger] = max(acked.get(ledger, -1), entry)
                    count += 1
                elif parts[0] == "X":
                    closed[int(parts[1])] = int(parts[2])
                elif parts[0] == "F":
                    errors_by_type[parts[2]] += 1
                elif parts[0] == "H":
                    self.report.hung += 1
                    self.report.violations.append(f"ledger {parts[1]}: {parts[2]} hung")
        self.report.acknowledged = count
        self.report.writer_errors = dict(errors_by_type)
        self.report.ledgers = len(created)
        return created, acked, closed

    def check(self) -> None:
        for index, bookie in enumerate(self.cluster.bookies):
            if not bookie.running:
                self.cluster.start_bookie(index)
        started = time.monotonic()
        created, acked, closed = self._read_log()
        from bookkeeper_py.metadata.manager import MetadataClient

        with MetadataClient.connect(self.cluster.metadata_uri) as metadata:
            for ledger in metadata.list_ledgers():  # a writer killed before it logged one
                created.setdefault(ledger, (0, 0, 0))
        self.report.ledgers = len(created)
        asyncio.run(self._check(created, acked, closed))
        self.report.check_s = round(time.monotonic() - started, 1)

    async def _check(
        self,
        created: dict[int, tuple[int, int, int]],
        acked: dict[int, int],
        closed: dict[int, int],
    ) -> None:
        from bookkeeper_py.client.client import BookKeeper

        uri = self.cluster.metadata_uri
        violations = self.report.violations
        lasts: dict[int, int] = {}
        async with BookKeeper(uri) as first, BookKeeper(uri, use_v3=True) as second:
            for ledger in sorted(created):
                # Recovers and closes a ledger left open.
                handle = await self._bounded(first.open_ledger(ledger, PASSWORD), ledger, "open")
                if handle is None:
                    continue
                last = handle.metadata.last_entry_id
                lasts[ledger] = last
                if last < acked.get(ledger, -1):
                    violations.append(
                        f"ledger {ledger}: closed at {last} before its acknowledged entry "
                        f"{acked[ledger]}"
                    )
                if ledger in closed and closed[ledger] != last:
                    violations.append(
                        f"ledger {ledger}: closed by its writer at {closed[ledger]}, now {last}"
                    )
                for client in (first, second):
                    reader = await client.open_ledger_no_recovery(ledger, PASSWORD)
                    if last >= 0:
                        entries = await self._bounded(
                            reader.read_entries(0, last), ledger, f"read 0..{last}"
                        )
                        if entries is None:
                            continue
                        for entry in entries:
                            if entry.data != payload(ledger, entry.entry_id):
                                violations.append(
                                    f"ledger {ledger} entry {entry.entry_id}: wrong bytes"
                                )
                        self.report.verified_entries += len(entries)
                    try:
                        await reader.read_entries(last + 1, last + 1)
                        violations.append(
                            f"ledger {ledger}: entry {last + 1} readable past its close"
                        )
                    except errors.BKError:
                        pass
        await self._wait_limbo_over()
        self._check_replicas(acked, lasts)

    async def _bounded(self, operation: Awaitable[T], ledger: int, what: str) -> T | None:
        """``operation``'s result; None, with a violation recorded, if it failed or hung."""
        try:
            return await asyncio.wait_for(operation, ENTRY_DEADLINE_S)
        except TimeoutError:
            self.report.hung += 1
            self.report.violations.append(f"ledger {ledger}: {what} hung")
        except errors.BKError as error:
            self.report.violations.append(f"ledger {ledger}: {what}: {error}")
        return None

    async def _wait_limbo_over(self) -> None:
        deadline = time.monotonic() + 120
        while any(self._in_limbo(i) for i in range(len(self.cluster.bookies))):
            if time.monotonic() > deadline:
                self.report.violations.append(
                    "a bookie stayed in limbo 120 s after every ledger closed"
                )
                return
            await asyncio.sleep(0.5)

    def _check_replicas(self, acked: dict[int, int], lasts: dict[int, int]) -> None:
        from bookkeeper_py.metadata.manager import MetadataClient

        ports = {bookie.bookie_id: bookie.port for bookie in self.cluster.bookies}
        with MetadataClient.connect(self.cluster.metadata_uri) as metadata:
            for ledger, highest in sorted(acked.items()):
                if ledger not in lasts:
                    continue
                meta, _ = metadata.read_ledger_metadata(ledger)
                digest = DigestManager(ledger, DigestType.CRC32C, PASSWORD)
                copies = self._copies(meta, highest, ports, digest)
                for entry_id, count in copies.items():
                    self.report.replica_copies_checked += count
                    if count < meta.ack_quorum_size:
                        self.report.violations.append(
                            f"ledger {ledger} entry {entry_id}: {count} good copies, Qa is "
                            f"{meta.ack_quorum_size}"
                        )

    def _copies(
        self, meta: LedgerMetadata, highest: int, ports: dict[str, int], digest: DigestManager
    ) -> dict[int, int]:
        """Per acknowledged entry, how many replicas of its write set hold its right bytes
        (each bookie asked directly, its reads pipelined on one connection)."""
        asked: dict[str, list[int]] = collections.defaultdict(list)
        starts = [start for start, _ in meta.ensembles]
        for position, (start, ensemble) in enumerate(meta.ensembles):
            end = starts[position + 1] - 1 if position + 1 < len(starts) else highest
            for entry_id in range(start, min(end, highest) + 1):
                for index in write_set(entry_id, meta.ensemble_size, meta.write_quorum_size):
                    asked[ensemble[index]].append(entry_id)
        counts = dict.fromkeys(range(highest + 1), 0)
        for bookie, entry_ids in asked.items():
            with socket.create_connection(("127.0.0.1", ports[bookie]), timeout=30) as connection:
                for chunk in range(0, len(entry_ids), 256):
                    batch = entry_ids[chunk : chunk + 256]
                    connection.sendall(
                        b"".join(v2.encode_read_request(meta.ledger_id, e) for e in batch)
                    )
                    for _ in batch:
                        answer = v2.decode_response(recv_frame(connection))
                        if answer.status != StatusCode.EOK:
                            continue
                        try:
                            entry = digest.verify(answer.body, answer.entry_id)
                        except errors.DigestMismatchError:
                            continue
                        if entry.payload == payload(meta.ledger_id, answer.entry_id):
                            counts[answer.entry_id] += 1
        return counts


def run_campaign(
    cycles: int, seed: int, bookies: int = 4, directory: str | None = None
) -> CampaignReport:
    """Runs a campaign in ``directory`` (a temporary one by default, removed after)."""
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
        return Campaign(directory, seed, bookies).run(cycles)
    with tempfile.TemporaryDirectory(prefix="bk-chaos-") as temporary:
        return Campaign(temporary, seed, bookies).run(cycles)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bookkeeper_py.testing.chaos")
    commands = parser.add_subparsers(dest="command")
    writer = commands.add_parser("writer", help="(internal) the writer process")
    writer.add_argument("--metadata-uri", required=True)
    writer.add_argument("--log", required=True)
    writer.add_argument("--seed", type=int, default=0)
    writer.add_argument("--in-flight", type=int, default=200)
    writer.add_argument("--per-ledger", type=int, default=400)
    writer.add_argument("--rate", type=float, default=2000, help="entries a second (0: no limit)")
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bookies", type=int, default=4)
    parser.add_argument("--dir", help="keep the cluster, logs and acknowledgement log here")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.command == "writer":
        asyncio.run(
            write(
                args.metadata_uri, args.log, args.seed, args.in_flight, args.per_ledger, args.rate
            )
        )
        return 0
    if args.bookies < 4:
        parser.error("--bookies: at least 4 (E is up to 3 and one bookie at a time is down)")
    report = run_campaign(args.cycles, args.seed, args.bookies, args.dir)
    if args.json:
        print(json.dumps(dataclasses.asdict(report), indent=2))
    else:
        for name, value in dataclasses.asdict(report).items():
            if name != "violations":
                print(f"{name}: {value}")
        for violation in report.violations:
            print(f"VIOLATION: {violation}")
        print("campaign passed" if report.ok else "campaign FAILED")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
