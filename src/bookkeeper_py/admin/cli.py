"""The ``bookkeeper`` command (modelled on Apache BookKeeper's ``bin/bookkeeper``).

    bookkeeper bookie --journal-dir DIR --port P --metadata-uri URI
    bookkeeper localbookie N [--data-dir DIR] [--demo] [--exit-after-demo]
    bookkeeper shell simpletest|listbookies|listledgers|ledgermetadata|deleteledger ... [--metadata-uri URI]
    bookkeeper shell initnewcluster|metaformat|nukeexistingcluster|whatisinstanceid ...
    bookkeeper shell cookie_get|cookie_create|cookie_update|cookie_delete BOOKIE_ID ...
    bookkeeper bench writes|reads [--local N | --metadata-uri URI] ...
    bookkeeper log create|list|describe|append|read|tail|truncate|delete|subscriptions ...
    bookkeeper spark export|compact|audit ... [--master local[*]]
    bookkeeper localbookie 3 --pipeline [--exit-after-demo] [--master local[*]]
    bookkeeper dashboard [--metadata-uri URI] [--host H] [--port P] [--enable-actions] [--secret-file F]

The metadata URI of shell and log commands comes from ``--metadata-uri`` or
$BOOKKEEPER_METADATA_URI.

Long commands draw a progress bar on stderr when it is a terminal (``-q``/``--quiet`` leaves it
out; see ``bookkeeper_py.progress``); stdout carries the result alone.

Errors are one line on stderr, ``error: <what happened>; <what to do>``, and exit status 1
(usage errors: 2; Ctrl-C: 130); ``--verbose`` adds tracebacks and the logging of the libraries
underneath (kazoo, aiohttp...), which is otherwise kept quiet.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from bookkeeper_py import progress
from bookkeeper_py.admin import (
    CommandError,
    autorecovery_commands,
    client_auth,
    log_commands,
    spark_commands,
)
from bookkeeper_py.admin import bench as bench_module
from bookkeeper_py.admin.client_auth import client_options, shell_conf
from bookkeeper_py.admin.cluster_commands import add_commands as add_cluster_commands
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.dashboard import options as dashboard_options
from bookkeeper_py.errors import BKError
from bookkeeper_py.wire.digest import DigestType

if TYPE_CHECKING:
    from bookkeeper_py.dashboard.command import DashboardThread
    from bookkeeper_py.server.bookie import BookieConfig
    from bookkeeper_py.testing.local_cluster import LocalCluster

DIGESTS = {
    "crc32": DigestType.CRC32,
    "mac": DigestType.MAC,
    "crc32c": DigestType.CRC32C,
    "dummy": DigestType.DUMMY,
}


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, naming the help to read (argparse prints the whole usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; see '{self.prog} --help'\n")


def hex_id(text: str) -> int:
    """A file id in hexadecimal, as the tools print them (``0``, ``1a``, ``000000000000001a``)."""
    try:
        value = int(text, 16)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a hexadecimal file id") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative; file ids are not")
    return value


LEDGER_DIR_HELP = "the bookie's ledger directory (default: that of shell --conf)"
JOURNAL_DIR_HELP = "the bookie's journal directory (default: that of shell --conf)"


def _metadata_uri(args: argparse.Namespace) -> str:
    uri = args.metadata_uri or os.environ.get("BOOKKEEPER_METADATA_URI")
    if not uri and getattr(args, "shell_conf", None):
        uri = shell_conf(args)["metadataServiceUri"]
    if not uri:
        raise CommandError(
            "no metadata service URI; pass --metadata-uri URI, set BOOKKEEPER_METADATA_URI, or "
            "give shell --conf bk_server.conf with metadataServiceUri (or zkServers)"
        )
    return str(uri)


def _bookie_directories(args: argparse.Namespace) -> None:
    """A local shell command's bookie directories: those given (--ledger-dir, --journal-dir),
    else those of ``shell --conf FILE`` (its ledgerDirectories and journalDirectories, with the
    bookie's defaults)."""
    if not getattr(args, "bookie_dirs", False):
        return  # not a command on a bookie's directories
    needs_ledger = hasattr(args, "ledger_dir") and args.ledger_dir is None
    needs_journal = hasattr(args, "journal_dir") and args.journal_dir is None
    if not (needs_ledger or needs_journal):
        return
    if not getattr(args, "shell_conf", None):
        missing = "--ledger-dir" if needs_ledger else "--journal-dir"
        raise CommandError(f"which bookie? pass {missing} DIR, or shell --conf bk_server.conf")
    from bookkeeper_py.server.config import build

    storage = build(shell_conf(args)).storage
    if needs_ledger:
        if len(storage.ledger_directories) > 1:
            raise CommandError(
                f"the bookie has {len(storage.ledger_directories)} ledger directories "
                f"({', '.join(storage.ledger_directories)}): name one with --ledger-dir"
            )
        args.ledger_dir = storage.ledger_directory
    if needs_journal:
        journals = list(storage.journal_directories)
        args.journal_dir = journals if args.journal_dir_many else journals[0]


def _cmd_bookie(args: argparse.Namespace) -> None:
    from bookkeeper_py.server import main as bookie_main

    bookie_main.main(args)


def _cmd_localbookie(args: argparse.Namespace) -> None:
    from bookkeeper_py.testing.local_cluster import LocalCluster

    data_directory = os.path.abspath(args.data_dir) if args.data_dir else None
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"starting {args.bookies} bookies on the embedded SQLite metadata store ...", flush=True)
    with LocalCluster(args.bookies, base_directory=data_directory) as cluster:
        print(f"metadata service URI: {cluster.metadata_uri}", flush=True)
        print(f"bookies: {', '.join(cluster.bookie_ids)}", flush=True)
        print(f"data directory: {cluster.base_directory}", flush=True)
        dashboard = _start_dashboard(cluster, args)
        try:
            _run_local(cluster, args, stop)
        finally:
            if dashboard is not None:
                dashboard.stop()


def _run_local(cluster: LocalCluster, args: argparse.Namespace, stop: threading.Event) -> None:
    """``localbookie``'s work once its cluster runs: the demo, the pipeline, or serving."""
    from bookkeeper_py.admin.workload import simple_test
    from bookkeeper_py.client.facade import BookKeeper

    if args.demo:
        ensemble = min(3, args.bookies)
        quorum = min(2, ensemble)
        with BookKeeper(cluster.metadata_uri) as bk:
            for digest in DigestType:
                result = simple_test(
                    bk,
                    entries=args.demo_entries,
                    entry_size=1024,
                    ensemble_size=ensemble,
                    write_quorum_size=quorum,
                    ack_quorum_size=quorum,
                    digest_type=digest,
                )
                print(
                    f"ledger {result.ledger_id} ({digest.name}, E={ensemble} Qw={quorum} Qa={quorum}): "
                    f"wrote {result.entries} x 1 KiB entries in {result.write_seconds:.2f} s "
                    f"({result.entries / result.write_seconds:,.0f} adds/s), closed, reopened and read "
                    f"them back in {result.read_seconds:.2f} s: every byte matches",
                    flush=True,
                )
            print(f"ledgers in the cluster: {bk.list_ledgers()}", flush=True)
    if args.pipeline:
        _run_pipeline(cluster, args, stop)
        return
    if args.exit_after_demo:
        return
    print(
        "cluster is up; try: bookkeeper shell simpletest --metadata-uri "
        + cluster.metadata_uri
        + "\npress Ctrl-C to stop",
        flush=True,
    )
    while not stop.wait(0.5):
        for bookie in cluster.bookies:
            if not bookie.running:
                print(f"bookie {bookie.bookie_id} exited; restarting it", flush=True)
                cluster.start_bookie(bookie.index)
    print("stopping the cluster ...", flush=True)


def _cmd_dashboard(args: argparse.Namespace) -> None:
    from bookkeeper_py.dashboard import command

    command.run(args, _metadata_uri(args))


def _start_dashboard(cluster: LocalCluster, args: argparse.Namespace) -> DashboardThread | None:
    """The local cluster's dashboard on a thread (None with --no-dashboard); prints where."""
    if args.no_dashboard:
        return None
    from bookkeeper_py.dashboard.command import DashboardThread

    dashboard = DashboardThread(
        dashboard_options.Options(
            cluster.metadata_uri,
            port=args.dashboard_port,
            enable_actions=args.dashboard_actions,
        )
    )
    print(f"dashboard: {dashboard.start()}", flush=True)
    return dashboard


def _run_pipeline(cluster: LocalCluster, args: argparse.Namespace, stop: threading.Event) -> None:
    """The Spark pipeline on the local cluster (``bookkeeper_py.spark.pipeline``) until Ctrl-C,
    or, with ``--exit-after-demo``, until ``--pipeline-events`` events are aggregated in both
    sinks (checked), keeping the cluster's bookies running meanwhile."""
    from bookkeeper_py.spark import pipeline as demo
    from bookkeeper_py.spark.session import spark_session

    print(f"starting Spark ({args.master}) ...", flush=True)
    spark = spark_session(args.master, "bookkeeper-py-pipeline")
    spark.sparkContext.setLogLevel("ERROR")
    limit = args.pipeline_events if args.exit_after_demo else 0
    running = demo.start(spark, cluster.metadata_uri, cluster.base_directory, limit=limit)
    print(
        f"pipeline: events -> log {demo.NAMESPACE}/{demo.EVENTS} -> Structured Streaming "
        f"(per user and {demo.WINDOW} window) -> log {demo.NAMESPACE}/{demo.AGGREGATES} "
        f"(exactly once) and Parquet {running.parquet_path}",
        flush=True,
    )
    seen: set[tuple[str, int]] = set()
    say = lambda line: print(line, flush=True)  # noqa: E731
    deadline = time.monotonic() + 600
    try:
        while not stop.wait(1.0):
            demo.report_progress(running, say, seen)
            for query in running.queries:
                if query.exception() is not None:
                    raise CommandError(f"query {query.name} failed: {query.exception()}")
            if args.exit_after_demo:
                if time.monotonic() > deadline:
                    raise CommandError("the pipeline did not aggregate every event in 600 s")
                found = demo.totals(spark, running)
                if found["log_events"] >= limit and found["parquet_events"] >= limit:
                    break
            for bookie in cluster.bookies:
                if not bookie.running:
                    print(f"bookie {bookie.bookie_id} exited; restarting it", flush=True)
                    cluster.start_bookie(bookie.index)
        demo.report_progress(running, say, seen)
        found = demo.totals(spark, running)
        print(
            f"{running.events_written} events written; log {demo.NAMESPACE}/{demo.AGGREGATES}: "
            f"{found['log_aggregates']} aggregates counting {found['log_events']} events, "
            f"{found['log_duplicates']} duplicates; Parquet: {found['parquet_aggregates']} "
            f"aggregates counting {found['parquet_events']} events, "
            f"{found['parquet_duplicates']} duplicates",
            flush=True,
        )
        if args.exit_after_demo and not (
            found["log_events"] == found["parquet_events"] == running.events_written
            and found["log_duplicates"] == found["parquet_duplicates"] == 0
        ):
            raise CommandError("the pipeline's sinks do not hold every event exactly once")
    finally:
        print("stopping the pipeline ...", flush=True)
        running.stop()
        spark.stop()


def _cmd_simpletest(args: argparse.Namespace) -> None:
    from bookkeeper_py.admin.workload import simple_test
    from bookkeeper_py.client.facade import BookKeeper

    with (
        BookKeeper(_metadata_uri(args), **client_options(args)) as bk,
        progress.terminal(args.quiet) as shown,
    ):
        result = simple_test(
            bk,
            entries=args.num_entries,
            entry_size=args.entry_size,
            ensemble_size=args.ensemble,
            write_quorum_size=args.writeQuorum,
            ack_quorum_size=args.ackQuorum,
            digest_type=DIGESTS[args.digest],
            progress=shown,
        )
    print(
        f"ledger {result.ledger_id}: wrote {result.entries} entries ({result.bytes:,} bytes) in "
        f"{result.write_seconds:.2f} s, read and verified them in {result.read_seconds:.2f} s"
    )


def _cmd_listbookies(args: argparse.Namespace) -> None:
    from bookkeeper_py.admin.service import ClusterAdmin
    from bookkeeper_py.metadata.manager import MetadataClient

    everything = args.all or args.readonly == args.readwrite
    with MetadataClient.connect(_metadata_uri(args)) as metadata:
        bookies = ClusterAdmin(metadata).bookies(
            writable=everything or args.readwrite, read_only=everything or args.readonly
        )
        for bookie in bookies:
            line = f"{bookie.bookie_id} (read-only)" if bookie.read_only else bookie.bookie_id
            if args.hostnames:
                endpoint = metadata.bookie_endpoint(bookie.bookie_id)
                line += f" host {endpoint.host} port {endpoint.port}"
            print(line)


def _cmd_clusterinfo(args: argparse.Namespace) -> None:
    from bookkeeper_py.admin.service import ClusterAdmin
    from bookkeeper_py.metadata.manager import MetadataClient

    with MetadataClient.connect(_metadata_uri(args)) as metadata:
        info = ClusterAdmin(metadata).cluster_info()
    print(json.dumps(info.as_json(), indent=2))


def _cmd_listledgers(args: argparse.Namespace) -> None:
    from bookkeeper_py.admin.service import ClusterAdmin
    from bookkeeper_py.metadata.manager import MetadataClient

    with MetadataClient.connect(_metadata_uri(args)) as metadata:
        admin = ClusterAdmin(metadata)
        if args.meta:
            for ledger, version in admin.described_ledgers(args.bookieid):
                _print_ledger(ledger, version)
        else:
            for ledger_id in admin.ledgers(args.bookieid):
                print(ledger_id)


def _print_ledger(ledger: LedgerMetadata, version: int) -> None:
    """A ledger's metadata as ``ledgermetadata`` and ``listledgers -m`` print it."""
    print(
        f"ledger {ledger.ledger_id} (metadata version {version}, format v{ledger.format_version})"
    )
    print(
        f"  state: {ledger.state.name}  last entry: {ledger.last_entry_id}  length: {ledger.length}"
    )
    print(
        f"  E={ledger.ensemble_size} Qw={ledger.write_quorum_size} Qa={ledger.ack_quorum_size} "
        f"digest: {ledger.digest_type.name}"
    )
    for first, bookies in ledger.ensembles:
        print(f"  from entry {first}: {', '.join(bookies)}")
    for key, value in sorted(ledger.custom_metadata.items()):
        print(f"  custom {key} = {value!r}")


def _cmd_ledgermetadata(args: argparse.Namespace) -> None:
    from bookkeeper_py.admin.service import ClusterAdmin
    from bookkeeper_py.metadata.manager import MetadataClient

    if args.dumptofile and args.restorefromfile:
        raise CommandError("--dumptofile and --restorefromfile do not go together: pick one")
    if args.update and not args.restorefromfile:
        raise CommandError("--update goes with --restorefromfile (it overwrites on restore)")
    data = b""
    if args.restorefromfile:
        try:
            with open(args.restorefromfile, "rb") as handle:
                data = handle.read()
        except OSError as error:
            raise CommandError(f"cannot read {args.restorefromfile}: {error.strerror}") from None
    with MetadataClient.connect(_metadata_uri(args)) as metadata:
        admin = ClusterAdmin(metadata)
        if args.dumptofile:
            dumped = admin.dump_ledger_metadata(args.ledgerid)
            try:
                with open(args.dumptofile, "wb") as handle:
                    handle.write(dumped)
            except OSError as error:
                raise CommandError(f"cannot write {args.dumptofile}: {error.strerror}") from None
            print(
                f"ledger {args.ledgerid}: metadata ({len(dumped)} bytes) written to {args.dumptofile}"
            )
        elif args.restorefromfile:
            updated = admin.restore_ledger_metadata(args.ledgerid, data, args.update)
            done = "written over its metadata" if updated else "created"
            print(f"ledger {args.ledgerid}: metadata from {args.restorefromfile} {done}")
        else:
            _print_ledger(*admin.ledger(args.ledgerid))


def _cmd_deleteledger(args: argparse.Namespace) -> None:
    from bookkeeper_py.admin.service import ClusterAdmin
    from bookkeeper_py.metadata.manager import MetadataClient

    if not args.force:
        if not sys.stdin.isatty():
            fail(f"deleting ledger {args.ledgerid} needs -f when not asked on a terminal")
        answer = input(f"delete ledger {args.ledgerid} and all its entries? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return
    with MetadataClient.connect(_metadata_uri(args)) as metadata:
        ClusterAdmin(metadata).delete_ledger(args.ledgerid)
    print(f"ledger {args.ledgerid} deleted; bookies reclaim its data in garbage collection")


def _cmd_readledger(args: argparse.Namespace) -> None:
    from bookkeeper_py import aio
    from bookkeeper_py import loop as event_loop
    from bookkeeper_py.admin.ledger_reader import (
        hex_dump,
        printable,
        read_entries,
        read_from_bookie,
    )

    password = args.password.encode()
    raw = args.entry_format == "raw"
    out = sys.stdout.buffer

    def show(entry_id: int, payload: bytes | str) -> None:
        if raw:  # the payloads alone, back to back, for a pipe
            if isinstance(payload, str):
                raise CommandError(f"entry {entry_id} of ledger {args.ledgerid}: {payload}")
            out.write(payload)
            return
        if isinstance(payload, str):
            print(f"--------- Lid={args.ledgerid}, Eid={entry_id}, {payload} ---------")
            return
        print(f"--------- Lid={args.ledgerid}, Eid={entry_id}, EntrySize={len(payload)} ---------")
        if args.msg:
            if args.entry_format == "hex":
                print(hex_dump(payload))
            else:
                print(printable(payload))

    async def run(reading: progress.Task) -> int:
        shown = 0
        async with await aio.BookKeeper.connect(
            _metadata_uri(args), **client_options(args)
        ) as client:
            entries = (
                read_from_bookie(
                    client,
                    args.ledgerid,
                    args.bookie,
                    args.firstentryid,
                    args.lastentryid,
                    password=password,
                    on_total=reading.set_total,
                )
                if args.bookie
                else read_entries(
                    client,
                    args.ledgerid,
                    args.firstentryid,
                    args.lastentryid,
                    recover=args.force_recovery,
                    password=password,
                    on_total=reading.set_total,
                )
            )
            async for entry_id, payload in entries:
                show(entry_id, payload)
                reading.advance()
                shown += 1
        return shown

    # A bar shows while the entries go to a file or pipe; on the terminal they show themselves.
    display = progress.terminal(args.quiet, prints_lines=True)
    with display, display.task(f"reading ledger {args.ledgerid}", unit="entries") as reading:
        shown = event_loop.run(run(reading))
    if raw:
        out.flush()
    else:
        print(f"{shown} entries of ledger {args.ledgerid}", file=sys.stderr)


def _cmd_bookieinfo(args: argparse.Namespace) -> None:
    from bookkeeper_py import aio
    from bookkeeper_py import loop as event_loop
    from bookkeeper_py.admin.bookie_info import disk_space, readable

    async def run() -> list[str]:
        async with await aio.BookKeeper.connect(
            _metadata_uri(args), **client_options(args)
        ) as client:
            found = await disk_space(client)
            if not found:
                raise CommandError(
                    "no bookie gave its disk space (none registered, or none answered): see "
                    "listbookies"
                )
            lines = ["Free disk space info:"]
            for bookie_id, space in found.items():
                try:
                    endpoint = await client.metadata_port.bookie_endpoint(bookie_id)
                    where = f"IP:{endpoint.host}, Port:{endpoint.port}, Hostname:{endpoint.host}"
                except BKError:
                    where = "IP:UNKNOWN, Port:0, Hostname:UNKNOWN"
                lines.append(
                    f"BookieID:{bookie_id}, {where}:\tFree: {space.free}{readable(space.free)}"
                    f"\tTotal: {space.total}{readable(space.total)}"
                )
            free = sum(space.free for space in found.values())
            total = sum(space.total for space in found.values())
            lines.append(f"Total free disk space in the cluster:\t{free}{readable(free)}")
            lines.append(f"Total disk capacity in the cluster:\t{total}{readable(total)}")
            return lines

    print("\n".join(event_loop.run(run())))


def _cmd_endpointinfo(args: argparse.Namespace) -> None:
    from bookkeeper_py.admin.service import ClusterAdmin
    from bookkeeper_py.metadata.manager import MetadataClient

    with MetadataClient.connect(_metadata_uri(args)) as metadata:
        print("\n".join(ClusterAdmin(metadata).endpoint_info(args.bookieid)))


def _cmd_bookiesanity(args: argparse.Namespace) -> None:
    from bookkeeper_py import aio
    from bookkeeper_py import loop as event_loop
    from bookkeeper_py.admin.sanity import SanityResult, sanity_test

    async def run() -> list[SanityResult]:
        uri = _metadata_uri(args)
        options = client_options(args)  # the secret read once, for every bookie's client
        async with await aio.BookKeeper.connect(uri, **options) as lister:
            writable = await lister.metadata_port.writable_bookies()
        bookies = [args.bookie] if args.bookie else sorted(writable)
        if not bookies:
            raise CommandError("no writable bookie is registered to test (see listbookies)")
        results = []
        for bookie_id in bookies:  # a client each: the test sets its placement
            async with await aio.BookKeeper.connect(
                uri, request_timeout_s=args.timeout, **options
            ) as client:
                results.append(await sanity_test(client, bookie_id, args.entries))
        return results

    results = event_loop.run(run())
    for result in results:
        verdict = "succeeded" if result.passed else "FAILED"
        print(f"bookie {result.bookie_id}: sanity test {verdict}: {result.message}")
    if not all(result.passed for result in results):
        raise SystemExit(1)


def _conf_bookie(args: argparse.Namespace, command: str) -> BookieConfig:
    """The bookie ``shell --conf FILE`` describes (``command`` needs one)."""
    if not getattr(args, "shell_conf", None):
        raise CommandError(
            f"{command} works on the bookie a configuration describes: give shell --conf "
            "bk_server.conf (before the command)"
        )
    from bookkeeper_py.server.config import build

    return build(shell_conf(args))


def _cmd_bookieformat(args: argparse.Namespace) -> None:
    from bookkeeper_py.admin.bookie_format import format_bookie
    from bookkeeper_py.metadata.manager import MetadataClient
    from bookkeeper_py.server.main import lock_directories

    config = _conf_bookie(args, "bookieformat")
    directories = [directory for directory, _ in lock_directories(config)]
    if not (args.force or args.nonInteractive):
        if not sys.stdin.isatty():
            raise CommandError(
                "formatting deletes the bookie's data: pass -f (--force) when not asked on a "
                "terminal"
            )
        answer = input(f"delete everything in {', '.join(directories)}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing formatted")
            return
    if args.deleteCookie:
        with MetadataClient.connect(_metadata_uri(args)) as metadata:
            emptied = format_bookie(config, metadata)
    else:
        emptied = format_bookie(config, None)
    print(
        f"bookie {config.effective_bookie_id}: formatted "
        f"{', '.join(emptied) if emptied else 'nothing (its directories were empty)'}"
        + ("; its cookie deleted" if args.deleteCookie else "")
    )


def _cmd_initbookie(args: argparse.Namespace) -> None:
    from bookkeeper_py.admin.bookie_format import init_check
    from bookkeeper_py.metadata.manager import MetadataClient

    config = _conf_bookie(args, "initbookie")
    with MetadataClient.connect(_metadata_uri(args)) as metadata:
        init_check(config, metadata)
    print(f"bookie {config.effective_bookie_id} can start as a new bookie")


def _cmd_update_bookie_in_ledger(args: argparse.Namespace) -> None:
    from bookkeeper_py.admin.service import ClusterAdmin
    from bookkeeper_py.metadata.manager import MetadataClient

    shown = [time.monotonic()]

    def progress(updated: int, seen: int) -> None:
        if args.verbose and time.monotonic() - shown[0] >= args.printprogress:
            shown[0] = time.monotonic()
            print(f"ledgers holding {args.srcBookie}: {seen}, updated: {updated}", flush=True)

    with MetadataClient.connect(_metadata_uri(args)) as metadata:
        seen, updated, skipped = ClusterAdmin(metadata).replace_bookie_in_ledgers(
            args.srcBookie,
            args.destBookie,
            per_second=args.updatespersec,
            limit=args.limit,
            progress=progress,
        )
    for line in skipped:
        print(line)
    print(
        f"{updated} of {seen} ledgers holding {args.srcBookie} now hold {args.destBookie} instead"
    )
    if skipped:
        raise SystemExit(1)


def _cmd_updatecookie(args: argparse.Namespace) -> None:
    from bookkeeper_py.admin.bookie_format import change_bookie_id, cookie_paths, delete_cookies
    from bookkeeper_py.metadata.manager import MetadataClient

    chosen = [
        name for name in ("bookieId", "expandstorage", "list", "delete") if getattr(args, name)
    ]
    if len(chosen) != 1:
        raise CommandError("give one of -b OLD_BOOKIE_ID, -e, -l or -d [force]")
    if args.expandstorage:
        raise CommandError(
            "-e (expandstorage) adds ledger directories, which a bookie cannot take: a ledger "
            "lives in directory ledgerId mod n, so a directory added would move every ledger"
        )
    config = _conf_bookie(args, "updatecookie")
    with MetadataClient.connect(_metadata_uri(args)) as metadata:
        if args.list:
            for path in cookie_paths(config, metadata):
                print(path)
            return
        if args.delete:
            if args.delete != "force" and not sys.stdin.isatty():
                raise CommandError(
                    "deleting the cookies makes this a new bookie: pass -d force when not asked "
                    "on a terminal"
                )
            if args.delete != "force":
                answer = input(f"delete the cookies of bookie {config.effective_bookie_id}? [y/N] ")
                if answer.strip().lower() not in ("y", "yes"):
                    print("nothing deleted")
                    return
            for path in delete_cookies(config, metadata):
                print(f"deleted {path}")
            return
        new = change_bookie_id(config, metadata, args.bookieId)
        print(
            f"cookies of bookie {args.bookieId} now name {new.bookie_id}; move its ledgers with "
            f"updateBookieInLedger -sb {args.bookieId} -db {new.bookie_id}"
        )


def _cmd_lastmark(args: argparse.Namespace) -> None:
    from bookkeeper_py.storage.inspect import last_marks

    marks = last_marks(args.ledger_dir)
    for index, mark in enumerate(marks):
        which = f"journal {index}: " if len(marks) > 1 else ""
        if mark is None:
            print(
                f"{which}no LastLogMark in {args.ledger_dir}: every journal file present would be replayed"
            )
        else:
            print(f"{which}LastLogMark: journal file {mark[0]:x} ({mark[0]}), offset {mark[1]}")


def _cmd_readjournal(args: argparse.Namespace) -> None:
    from bookkeeper_py.storage.inspect import journal_records

    counts: dict[str, int] = {}
    for record in journal_records(args.journal_dir, args.id):
        counts[record.record_type.name] = counts.get(record.record_type.name, 0) + 1
        if not args.summary:
            entry = "" if record.entry_id is None else f" entry {record.entry_id}"
            print(
                f"journal {record.file_id:x} group ending at {record.group_end}: "
                f"{record.record_type.name} ledger {record.ledger_id}{entry} ({record.length} bytes)"
            )
    summary = ", ".join(f"{name} {count}" for name, count in sorted(counts.items()))
    print(f"records: {summary}" if counts else "no records")


def _cmd_readlog(args: argparse.Namespace) -> None:
    from bookkeeper_py.admin.ledger_reader import printable
    from bookkeeper_py.storage.inspect import log_records

    if args.entryid is not None and args.ledgerid is None:
        raise CommandError("-e/--entryid picks an entry of a ledger: give --ledgerid too")
    if args.endpos is not None and args.endpos < args.startpos:
        raise CommandError(f"the end position {args.endpos} is before the start {args.startpos}")
    count = 0
    for record in log_records(args.ledger_dir, args.logid):
        if record.offset < args.startpos:
            continue
        if args.endpos is not None and record.offset > args.endpos:
            break
        if args.ledgerid is not None and record.ledger_id != args.ledgerid:
            continue
        if args.entryid is not None and record.entry_id != args.entryid:
            continue
        count += 1
        if not args.summary:
            print(
                f"offset {record.offset}: ledger {record.ledger_id} entry {record.entry_id} ({record.length} bytes)"
            )
            if args.msg:
                print(printable(record.body))
    print(f"{count} entries")


def _log_id_argument(text: str) -> int:
    """An entry log as BookKeeper's readlogmetadata takes it: its id in hex, or its file name."""
    name = os.path.basename(text)
    if name.endswith(".log"):
        name = name[: -len(".log")]
    try:
        return int(name, 16)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an entry log id in hex nor an entry log's file name (<hex>.log)"
        ) from None


def _cmd_readlogmetadata(args: argparse.Namespace) -> None:
    from bookkeeper_py.storage.entry_log import log_name
    from bookkeeper_py.storage.inspect import log_ledgers

    sizes = log_ledgers(args.ledger_dir, args.log)
    total = sum(sizes.values())
    print(f"Print entryLogMetadata of entrylog {args.log} ({log_name(args.log)})")
    print(f"entryLogId: {args.log}, remaining size: {total}, total size: {total}, usage: 1.0")
    for ledger_id, size in sorted(sizes.items()):
        print(f"--------- Lid={ledger_id}, TotalSizeOfEntriesOfLedger={size}  ---------")


def _cmd_activeledgers(args: argparse.Namespace) -> None:
    from bookkeeper_py.metadata.manager import MetadataClient
    from bookkeeper_py.storage.entry_log import log_name
    from bookkeeper_py.storage.inspect import log_ledgers

    sizes = log_ledgers(args.ledger_dir, args.logid)
    with MetadataClient.connect(_metadata_uri(args)) as metadata:
        existing = set(metadata.list_ledgers())
    active = sorted(ledger_id for ledger_id in sizes if ledger_id in existing)
    print(f"Active ledgers on entry log {args.logid} ({log_name(args.logid)}) as follow:")
    for ledger_id in active:
        print(f"{ledger_id} ({sizes[ledger_id]} bytes)")
    remaining, total = sum(sizes[ledger_id] for ledger_id in active), sum(sizes.values())
    usage = remaining / total if total else 0.0
    print(f"remaining size: {remaining}, total size: {total}, usage: {usage:.3f}")


def _cmd_listfilesondisc(args: argparse.Namespace) -> None:
    from bookkeeper_py.storage.inspect import entry_files

    journals, logs, index = entry_files(args.journal_dir, args.ledger_dir)
    wanted = {"journal": args.journal, "entrylog": args.entrylog, "index": args.index}
    if not any(wanted.values()):
        wanted = dict.fromkeys(wanted, True)  # BookKeeper's prints nothing then: all here
    for kind, title, paths in (
        ("journal", "Journal Files", journals),
        ("entrylog", "EntryLog/Ledger Files", logs),
        ("index", "Index Files", index),
    ):
        if wanted[kind]:
            print(f"--------- Printing the list of {title} ---------")
            for path in paths:
                print(os.path.realpath(path))


def _cmd_check_ledgers_index(args: argparse.Namespace) -> None:
    from bookkeeper_py.storage.index_rebuild import check_ledgers_index

    with progress.terminal(args.quiet) as shown:
        report = check_ledgers_index(args.ledger_dir, shown)
    for problem in report.problems:
        print(problem)
    if report.problems:
        raise CommandError(
            f"{len(report.problems)} of {report.ledgers} ledger states are damaged: rebuild them "
            "(rebuild-db-ledgers-index) with the bookie stopped"
        )
    print(f"ledgers index of {args.ledger_dir}: {report.ledgers} ledger states, all readable")


def _ledgers_of_directory(args: argparse.Namespace) -> Callable[[int], bool]:
    """Which ledgers the ledger directory given keeps: with ``shell --conf`` naming several,
    those of id mod n its place (the journals hold every directory's ledgers); else all."""
    if not getattr(args, "shell_conf", None):
        return lambda _ledger_id: True
    from bookkeeper_py.server.config import build

    directories = [os.path.realpath(d) for d in build(shell_conf(args)).storage.ledger_directories]
    place = os.path.realpath(args.ledger_dir)
    if place not in directories:
        raise CommandError(
            f"{args.ledger_dir} is none of the bookie's ledger directories ({', '.join(directories)})"
        )
    count, index = len(directories), directories.index(place)
    return lambda ledger_id: ledger_id % count == index


def _rebuild_index(args: argparse.Namespace, *, locations: bool, ledgers: bool) -> None:
    from bookkeeper_py.storage.index_rebuild import rebuild_index

    journals = args.journal_dir if isinstance(args.journal_dir, list) else [args.journal_dir]
    # The step lines of -v go to stdout, so the bar is drawn only without them.
    with progress.terminal(args.quiet, prints_lines=args.verbose_rebuild) as shown:
        report = rebuild_index(
            args.ledger_dir,
            journals,
            locations=locations or args.all,
            ledgers=ledgers or args.all,
            owns=_ledgers_of_directory(args),
            steps=(lambda line: print(line, flush=True))
            if args.verbose_rebuild
            else lambda _: None,
            progress=shown,
        )
    for problem in report.problems:
        print(problem)
    print(
        f"index of {args.ledger_dir} rebuilt: {report.ledgers} ledgers, {report.entries} entry "
        f"locations from {report.entry_logs} entry logs and {report.journal_files} journal files"
        + (f"; the old index is in {report.previous}" if report.previous else "")
    )


def _cmd_ledger(args: argparse.Namespace) -> None:
    from bookkeeper_py.storage.inspect import ledger_index_entries

    ledger_id = args.ledgerId if args.ledgerId is not None else args.ledger
    if ledger_id is None:
        raise CommandError("which ledger? give -id LEDGER_ID")
    state, entries = ledger_index_entries(args.ledger_dir, ledger_id)
    if args.meta:
        print(f"===== LEDGER: {ledger_id} =====")
        print(f"master key  : {state.masterKey.hex().upper()}")
        print(f"entries      : {len(entries)}")
        print(f"isFenced     : {str(state.fenced).lower()}")
    print(f"===== LEDGER: {ledger_id} =====")
    for entry_id, log_id, offset in entries:
        print(f"entry {entry_id}\t:\t(log: {log_id}, pos: {offset})")


def _cmd_localconsistencycheck(args: argparse.Namespace) -> None:
    from bookkeeper_py.storage.inspect import local_consistency_check

    with progress.terminal(args.quiet) as shown:
        report = local_consistency_check(args.ledger_dir, shown)
    for problem in report.problems or []:
        print(f"PROBLEM: {problem}")
    print(
        f"checked {report.entries} entries of {report.ledgers} ledgers: {'ok' if report.ok else 'PROBLEMS FOUND'}"
    )
    if not report.ok:
        sys.exit(1)


def build_parser() -> argparse.ArgumentParser:
    from bookkeeper_py.server import main as bookie_main

    parser = _Parser(prog="bookkeeper", description="bookkeeper-py: Apache BookKeeper in Python")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log at DEBUG level, libraries' logging included; tracebacks of errors",
    )
    parser.add_argument(
        "--auth-secret-file",
        dest="client_secret_file",
        metavar="FILE",
        help="the shared secret (as the bookies' authSharedSecretFile) the command's client "
        f"presents to bookies that ask for it (or ${client_auth.ENVIRONMENT}; shell --conf "
        "gives its own when its bookie uses the shared-secret plugin)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    bookie = commands.add_parser("bookie", help="run a bookie")
    bookie_main.add_arguments(bookie)
    bookie.set_defaults(run=_cmd_bookie)

    local = commands.add_parser("localbookie", help="run N bookies on the embedded metadata store")
    local.add_argument("bookies", type=int, help="number of bookies")
    local.add_argument(
        "--data-dir", help="directory for metadata and bookie data (default: a temporary one)"
    )
    local.add_argument(
        "--demo", action="store_true", help="write and read back ledgers of each digest type"
    )
    local.add_argument("--demo-entries", type=int, default=2000, help="entries per demo ledger")
    local.add_argument(
        "--exit-after-demo", action="store_true", help="stop the cluster once the demo is done"
    )
    local.add_argument(
        "--pipeline",
        action="store_true",
        help="run the Spark pipeline: events to a log, a streaming aggregation to another log "
        "(exactly once) and to Parquet (needs the spark extra and Java 17+)",
    )
    local.add_argument(
        "--pipeline-events",
        type=int,
        default=5000,
        help="with --exit-after-demo: events the pipeline writes and checks",
    )
    local.add_argument("--master", default="local[*]", help="the Spark master of --pipeline")
    local.add_argument(
        "--no-dashboard", action="store_true", help="do not serve the dashboard of the cluster"
    )
    local.add_argument(
        "--dashboard-port",
        type=int,
        default=0,
        help="the dashboard's port on 127.0.0.1 (default: any free port; printed)",
    )
    local.add_argument(
        "--dashboard-actions",
        action="store_true",
        help="allow the dashboard's admin actions (read-only switch, GC, deleting ledgers)",
    )
    local.set_defaults(run=_cmd_localbookie)

    autorecovery_commands.add_process_command(commands)

    dashboard = commands.add_parser(
        "dashboard",
        help="a web page of the cluster: bookies, ledgers, charts, recovery, logs, GC",
        description="Serves a web page of the cluster (bookkeeper_py.dashboard); see "
        "docs/operations.md, Dashboard.",
    )
    dashboard_options.add_arguments(dashboard)
    dashboard.set_defaults(run=_cmd_dashboard)

    bench = commands.add_parser(
        "bench",
        help="throughput and latency of writes or reads (see bookkeeper_py.admin.bench)",
        description=bench_module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench_module.add_arguments(bench)
    bench.set_defaults(run=bench_module.run)

    logs = commands.add_parser(
        "log",
        help="logs built from ledgers: create, append, read, tail, truncate... (bookkeeper_py.log)",
        description=log_commands.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    log_commands.add_commands(logs, _metadata_uri)

    spark = commands.add_parser(
        "spark",
        help="pipeline jobs on Spark: export to Parquet, compact a log, audit every replica",
        description=spark_commands.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    spark_commands.add_commands(spark, _metadata_uri)

    shell = commands.add_parser("shell", help="admin and test commands")
    shell.add_argument(
        "--conf",
        "-conf",
        dest="shell_conf",
        metavar="bk_server.conf",
        help="a bookie's configuration: the metadata URI and the directories the commands use "
        "when not given (before the command, as BookKeeper's)",
    )
    shell_commands = shell.add_subparsers(dest="shell_command", required=True)

    def shell_command(name: str, help_text: str, run) -> argparse.ArgumentParser:  # type: ignore[no-untyped-def]
        sub = shell_commands.add_parser(name, help=help_text)
        sub.add_argument("--metadata-uri", help="metadataServiceUri (or $BOOKKEEPER_METADATA_URI)")
        progress.quiet_option(sub)
        sub.set_defaults(run=run)
        return sub

    simple = shell_command(
        "simpletest", "create a ledger, write N entries, read them back, verify", _cmd_simpletest
    )
    simple.add_argument("-e", "--ensemble", type=int, default=3)
    simple.add_argument("-w", "--writeQuorum", type=int, default=2)
    simple.add_argument("-a", "--ackQuorum", type=int, default=2)
    simple.add_argument("-n", "--num-entries", type=int, default=1000)
    simple.add_argument("--entry-size", type=int, default=1024)
    simple.add_argument("--digest", choices=sorted(DIGESTS), default="crc32c")
    listbookies = shell_command("listbookies", "list registered bookies", _cmd_listbookies)
    listbookies.add_argument(
        "-rw", "--readwrite", action="store_true", help="only writable bookies"
    )
    listbookies.add_argument(
        "-ro", "--readonly", action="store_true", help="only read-only bookies"
    )
    listbookies.add_argument(
        "-a", "--all", action="store_true", help="writable and read-only bookies (the default)"
    )
    listbookies.add_argument(
        "--hostnames",
        action="store_true",
        help="each bookie's host and port (BookKeeper's -h; -h is help here)",
    )
    listledgers = shell_command("listledgers", "list ledger ids", _cmd_listledgers)
    listledgers.add_argument(
        "-m", "--meta", action="store_true", help="print each ledger's metadata"
    )
    listledgers.add_argument(
        "-bookieid", "--bookieid", help="only the ledgers whose ensembles hold this bookie"
    )
    shell_command(
        "clusterinfo",
        "the cluster at a glance: auditor, under-replication, bookie counts (JSON)",
        _cmd_clusterinfo,
    )
    ledgermetadata = shell_command(
        "ledgermetadata", "print a ledger's metadata", _cmd_ledgermetadata
    )
    ledgermetadata.add_argument("-l", "--ledgerid", type=int, required=True)
    ledgermetadata.add_argument(
        "-d", "--dumptofile", help="write the metadata, as stored, to this file"
    )
    ledgermetadata.add_argument(
        "-r", "--restorefromfile", help="store the metadata of a dump (a new ledger's)"
    )
    ledgermetadata.add_argument(
        "-u",
        "--update",
        action="store_true",
        help="with --restorefromfile: write over the metadata of a ledger that exists",
    )
    shell_command(
        "bookieinfo", "every bookie's free and total disk space, and the cluster's", _cmd_bookieinfo
    )
    endpointinfo = shell_command(
        "endpointinfo", "a live bookie's registered endpoints and properties", _cmd_endpointinfo
    )
    endpointinfo.add_argument("-b", "-bookieid", "--bookieid", required=True)
    sanity = shell_command(
        "bookiesanity",
        "write, recover and read back a ledger on a bookie alone (each writable one by default)",
        _cmd_bookiesanity,
    )
    sanity.add_argument("-b", "--bookie", help="the bookie to test (default: every writable one)")
    sanity.add_argument("-e", "--entries", type=int, default=10, help="entries to write [10]")
    sanity.add_argument(
        "-t", "--timeout", type=float, default=1.0, help="seconds an add or read may take [1]"
    )
    bookieformat = shell_command(
        "bookieformat",
        "delete the data of the bookie shell --conf describes (asks first on a terminal)",
        _cmd_bookieformat,
    )
    bookieformat.add_argument(
        "-n", "-nonInteractive", "--nonInteractive", action="store_true", help="do not ask"
    )
    bookieformat.add_argument(
        "-f", "-force", "--force", action="store_true", help="do not ask (needed off a terminal)"
    )
    bookieformat.add_argument(
        "-d",
        "-deleteCookie",
        "--deleteCookie",
        action="store_true",
        help="delete its cookie in the metadata store too",
    )
    shell_command(
        "initbookie",
        "check that the bookie shell --conf describes can start as a new one",
        _cmd_initbookie,
    )
    update_bookie = shell_command(
        "updateBookieInLedger",
        "put another bookie id in place of a stopped bookie's in every ledger's ensembles",
        _cmd_update_bookie_in_ledger,
    )
    update_bookie.add_argument("-sb", "--srcBookie", required=True, help="the bookie id to replace")
    update_bookie.add_argument("-db", "--destBookie", required=True, help="the bookie id to put")
    update_bookie.add_argument(
        "-s", "--updatespersec", type=float, default=5.0, help="ledgers updated a second [5]"
    )
    update_bookie.add_argument(
        "-r",
        "--maxOutstandingReads",
        type=int,
        default=25,
        help="accepted for BookKeeper's scripts: ledgers are read one at a time here",
    )
    update_bookie.add_argument("-l", "--limit", type=int, help="update at most this many ledgers")
    update_bookie.add_argument("-v", "--verbose", action="store_true", help="print progress")
    update_bookie.add_argument(
        "-p",
        "--printprogress",
        type=float,
        default=10.0,
        help="seconds between progress lines [10]",
    )
    updatecookie = shell_command(
        "updatecookie",
        "list, delete or re-id the cookies of the bookie shell --conf describes",
        _cmd_updatecookie,
    )
    updatecookie.add_argument(
        "-b",
        "--bookieId",
        metavar="OLD_BOOKIE_ID",
        help="move the cookies from this (old) id to the one the configuration now gives",
    )
    updatecookie.add_argument(
        "-e", "--expandstorage", action="store_true", help="(one ledger directory here)"
    )
    updatecookie.add_argument("-l", "--list", action="store_true", help="where the cookies are")
    updatecookie.add_argument(
        "-d",
        "--delete",
        nargs="?",
        const="ask",
        metavar="force",
        help="delete the cookies, in the directories and the metadata store",
    )
    readledger = shell_command(
        "readledger",
        "read a ledger's entries (through the client, or from one bookie with -b)",
        _cmd_readledger,
    )
    readledger.add_argument("-l", "-ledgerid", "--ledgerid", type=int, required=True)
    readledger.add_argument(
        "-fe", "-firstentryid", "--firstentryid", type=int, default=0, help="first entry id [0]"
    )
    readledger.add_argument(
        "-le",
        "-lastentryid",
        "--lastentryid",
        type=int,
        default=-1,
        help="last entry id, included (-1: the last confirmed one, or the bookie's last) [-1]",
    )
    readledger.add_argument(
        "-r",
        "-force-recovery",
        "--force-recovery",
        action="store_true",
        help="recover the ledger first (fences its writer and closes it)",
    )
    readledger.add_argument(
        "-b", "-bookie", "--bookie", help="read the entries this bookie holds, from it alone"
    )
    readledger.add_argument("-m", "-msg", "--msg", action="store_true", help="print payloads")
    readledger.add_argument(
        "-ef",
        "-entryformat",
        "--entry-format",
        choices=("string", "hex", "raw"),
        default="string",
        help="payloads as text, as a hex dump, or raw bytes only (no headers) [string]",
    )
    readledger.add_argument(
        "--password",
        default="",
        help="the ledger's password, for legacy ledgers whose metadata keeps none",
    )
    deleteledger = shell_command(
        "deleteledger", "delete a ledger (bookies reclaim its data)", _cmd_deleteledger
    )
    deleteledger.add_argument("-l", "--ledgerid", type=int, required=True)
    deleteledger.add_argument(
        "-f", "--force", action="store_true", help="delete without asking (needed off a terminal)"
    )
    add_cluster_commands(shell_command, _metadata_uri)
    autorecovery_commands.add_shell_commands(shell_command, _metadata_uri)

    def local_command(name: str, help_text: str, run) -> argparse.ArgumentParser:  # type: ignore[no-untyped-def]
        sub = shell_commands.add_parser(name, help=help_text)
        progress.quiet_option(sub)
        sub.set_defaults(run=run, bookie_dirs=True)
        return sub

    lastmark = local_command(
        "lastmark", "print the LastLogMark of a ledger directory", _cmd_lastmark
    )
    lastmark.add_argument("--ledger-dir", help=LEDGER_DIR_HELP)
    readjournal = local_command(
        "readjournal", "list the records of journal files", _cmd_readjournal
    )
    readjournal.add_argument("--journal-dir", help=JOURNAL_DIR_HELP)
    readjournal.set_defaults(journal_dir_many=False)
    readjournal.add_argument(
        "--id", type=hex_id, help="journal file id in hex (default: every file)"
    )
    readjournal.add_argument("--summary", action="store_true", help="only count records by type")
    readlog = local_command("readlog", "list the entries of an entry log", _cmd_readlog)
    readlog.add_argument("--ledger-dir", help=LEDGER_DIR_HELP)
    readlog.add_argument("-l", "--logid", type=hex_id, required=True, help="entry log id in hex")
    readlog.add_argument("--ledgerid", type=int, help="only this ledger's entries")
    readlog.add_argument(
        "-e", "--entryid", type=int, help="only this entry of the ledger (with --ledgerid)"
    )
    readlog.add_argument(
        "-sp", "--startpos", type=int, default=0, help="only records at this offset or after [0]"
    )
    readlog.add_argument("-ep", "--endpos", type=int, help="only records at this offset or before")
    readlog.add_argument("-m", "--msg", action="store_true", help="print each entry's bytes")
    readlog.add_argument("--summary", action="store_true", help="only count entries")
    readlogmetadata = local_command(
        "readlogmetadata",
        "the ledgers of an entry log and their bytes (its ledgers map)",
        _cmd_readlogmetadata,
    )
    readlogmetadata.add_argument("--ledger-dir", help=LEDGER_DIR_HELP)
    readlogmetadata.add_argument(
        "log", type=_log_id_argument, help="entry log id in hex, or its file name (<hex>.log)"
    )
    activeledgers = shell_command(
        "activeledgers",
        "the ledgers of an entry log that still exist in the metadata store",
        _cmd_activeledgers,
    )
    activeledgers.add_argument("--ledger-dir", help=LEDGER_DIR_HELP)
    activeledgers.set_defaults(bookie_dirs=True)
    activeledgers.add_argument(
        "-l", "-logId", "--logid", type=int, required=True, help="entry log id (decimal)"
    )
    listfiles = local_command(
        "listfilesondisc",
        "the journal files, entry logs and index files of a bookie's directories",
        _cmd_listfilesondisc,
    )
    listfiles.add_argument("--journal-dir", action="append", help=JOURNAL_DIR_HELP)
    listfiles.set_defaults(journal_dir_many=True)
    listfiles.add_argument("--ledger-dir", help=LEDGER_DIR_HELP)
    listfiles.add_argument("-txn", "--journal", action="store_true", help="journal files")
    listfiles.add_argument("-log", "--entrylog", action="store_true", help="entry logs")
    listfiles.add_argument("-idx", "--index", action="store_true", help="index files")
    ledger_command = local_command(
        "ledger", "a ledger's index entries: where each entry is (entry log, offset)", _cmd_ledger
    )
    ledger_command.add_argument("--ledger-dir", help=LEDGER_DIR_HELP)
    ledger_command.add_argument("ledger", nargs="?", type=int, help="the ledger id")
    ledger_command.add_argument("-id", "--ledgerId", type=int, help="the ledger id")
    ledger_command.add_argument(
        "-m", "--meta", action="store_true", help="its state too (master key, fenced)"
    )
    check_index = local_command(
        "check-db-ledgers-index",
        "read every ledger state of a bookie's index (nothing is changed)",
        _cmd_check_ledgers_index,
    )
    check_index.add_argument("--ledger-dir", help=LEDGER_DIR_HELP)
    for name, locations, ledgers, what in (
        (
            "rebuild-db-ledger-locations-index",
            True,
            False,
            "its entry locations, from the entry logs",
        ),
        (
            "rebuild-db-ledgers-index",
            False,
            True,
            "its ledger states, from the entry logs and journals",
        ),
    ):
        rebuild = local_command(
            name,
            f"rebuild a stopped bookie's index: {what} (the old index is kept aside)",
            lambda args, locations=locations, ledgers=ledgers: _rebuild_index(
                args, locations=locations, ledgers=ledgers
            ),
        )
        rebuild.add_argument("--ledger-dir", help=LEDGER_DIR_HELP)
        rebuild.add_argument("--journal-dir", action="append", help=JOURNAL_DIR_HELP)
        rebuild.set_defaults(journal_dir_many=True)
        rebuild.add_argument(
            "--all", action="store_true", help="rebuild both parts (needed when the index is gone)"
        )
        rebuild.add_argument(
            "-v", "--verbose", dest="verbose_rebuild", action="store_true", help="show progress"
        )
    consistency = local_command(
        "localconsistencycheck",
        "read every indexed entry back and check it",
        _cmd_localconsistencycheck,
    )
    consistency.add_argument("--ledger-dir", help=LEDGER_DIR_HELP)
    return parser


# Commands that run until stopped log what they do at INFO; the others print their result or a
# one-line error, and their logging shows warnings only (all of it with --verbose).
DAEMONS = {"bookie", "localbookie", "autorecovery", "dashboard"}


def configure_logging(verbose: bool, daemon: bool = True) -> None:
    """Our own logging at INFO for a daemon, WARNING for a command (DEBUG with ``--verbose``);
    the libraries' (kazoo's connection retries, aiohttp's access log...) only with
    ``--verbose``, except what is CRITICAL."""
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    if not verbose:
        handler.addFilter(
            lambda record: (
                record.name.split(".")[0] in OWN_LOGGERS or record.levelno >= logging.CRITICAL
            )
        )
    level = logging.DEBUG if verbose else logging.INFO if daemon else logging.WARNING
    logging.basicConfig(level=level, handlers=[handler])


OWN_LOGGERS = {"bookkeeper_py", "__main__", "root"}


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is at each record: while a progress bar is drawn that is
    the bar's console, which prints the line above the bar instead of through it."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass  # (StreamHandler's constructor sets it)


def describe_os_error(error: OSError) -> str:
    """One line for a file system or network error a command met, with what to do."""
    where = f": {error.filename}" if error.filename else ""
    what = f"{error.strerror or error}{where}"
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{what}; give a path this user can write (or fix its permissions)"
    if error.errno == errno.ENOSPC:
        return f"{what}; free some space or use another disk"
    if error.errno in (errno.EEXIST, errno.ENOTDIR):
        return f"{what}; a file is in the way of a directory: remove it or pick another path"
    if error.errno == errno.ENOENT:
        return f"{what}; check the path"
    if error.errno == errno.EADDRINUSE:
        return f"{what}; another process holds that port: stop it or pick another port"
    return f"{what}; check the path or address and try again"


def fail(message: str, status: int = 1) -> NoReturn:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose, daemon=args.command in DAEMONS)
    try:
        _bookie_directories(args)
        args.run(args)
    except KeyboardInterrupt:
        if args.verbose:
            raise
        fail("interrupted; the command stopped where it was", 130)
    except (BKError, CommandError) as error:
        if args.verbose:
            traceback.print_exc()
        fail(str(error))
    except OSError as error:
        if args.verbose:
            traceback.print_exc()
        fail(describe_os_error(error))
    except Exception as error:
        if args.verbose:
            raise
        fail(
            f"unexpected {type(error).__name__}: {error}; run again with --verbose for the "
            "traceback and report it"
        )
