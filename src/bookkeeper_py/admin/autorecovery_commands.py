"""AutoRecovery from the command line: the ``bookkeeper autorecovery`` process, and the shell's
``recover``, ``decommissionbookie``, ``whoisauditor`` and ``triggeraudit`` (BookKeeper's names
and option letters). ``listunderreplicated``, ``autorecovery`` (the switch) and
``lostbookierecoverydelay`` are in ``cluster_commands``.

``recover`` and ``decommissionbookie`` show a progress bar of the entries copied (rate, ETA) on
stderr when it is a terminal and ``--quiet`` is not given (``bookkeeper_py.progress``); the
result, with the ledgers, entries and MB copied, goes to stdout."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
from collections.abc import Callable

from bookkeeper_py import progress as shown_progress
from bookkeeper_py.admin import CommandError
from bookkeeper_py.admin.client_auth import client_options
from bookkeeper_py.autorecovery import admin
from bookkeeper_py.autorecovery.replication import Progress
from bookkeeper_py.client.client import BookKeeper

Register = Callable[[str, str, Callable[[argparse.Namespace], None]], argparse.ArgumentParser]
UriOf = Callable[[argparse.Namespace], str]


class ProgressFollower:
    """Shows a replication run's ``Progress`` (read every second by ``admin.recover``) as a
    task of ``display``: the entries copied of the total. A new run (decommission's next round)
    opens a new task."""

    def __init__(self, display: shown_progress.Display, what: str) -> None:
        self.display = display
        self.what = what
        self.source: Progress | None = None
        self.task = shown_progress.Task()
        self.shown = 0

    def __call__(self, progress: Progress) -> None:
        if progress is not self.source:
            self.task.close()
            self.task = self.display.task(
                f"{self.what}: copying", progress.entries_total, "entries"
            )
            self.source, self.shown = progress, 0
        self.task.set_total(progress.entries_total)
        self.task.advance(progress.entries_done - self.shown)
        self.shown = progress.entries_done

    def close(self) -> None:
        self.task.close()


def add_shell_commands(shell_command: Register, uri_of: UriOf) -> None:
    def recover(args: argparse.Namespace) -> None:
        bookies = [bookie for part in args.bookies for bookie in part.split(",") if bookie]
        if not bookies:
            raise CommandError("name the bookie(s) to recover: recover HOST:PORT[,HOST:PORT]")

        async def run() -> None:
            async with BookKeeper(uri_of(args), **client_options(args)) as client:
                await admin.check_known(client.metadata_port, bookies)
                if args.dryrun:
                    for planned in await admin.plan(client, bookies, args.ledger):
                        print(_describe(planned))
                    return
                with shown_progress.terminal(args.quiet) as display:
                    follower = ProgressFollower(display, "recover")
                    try:
                        report = await admin.recover(
                            client,
                            bookies,
                            skip_open=args.skipOpenLedgers,
                            ledger_id=args.ledger,
                            on_progress=follower,
                        )
                    finally:
                        follower.close()
                if args.deleteCookie and not report.failed and not report.left_open:
                    for bookie in bookies:
                        await _delete_cookie(client, bookie)
                print(
                    f"recovered {len(report.whole)} of {len(report.planned)} ledgers "
                    f"({report.progress.line()})"
                )
                for ledger_id in report.left_open:
                    print(f"ledger {ledger_id}: open, its writer's fragment skipped (-sk)")
                if report.failed:
                    details = "; ".join(
                        f"ledger {lid}: {why}" for lid, why in report.failed.items()
                    )
                    raise CommandError(
                        f"{len(report.failed)} ledgers could not be recovered ({details}); "
                        "run recover again once the cause is fixed"
                    )

        asyncio.run(run())

    def decommissionbookie(args: argparse.Namespace) -> None:
        async def run() -> None:
            async with BookKeeper(uri_of(args), **client_options(args)) as client:
                with shown_progress.terminal(args.quiet) as display:
                    follower = ProgressFollower(display, "decommission")
                    try:
                        report = await admin.decommission(
                            client,
                            args.bookieid,
                            open_ledger_grace_s=args.open_ledger_grace_s,
                            timeout_s=args.timeout_s,
                            on_progress=follower,
                        )
                    finally:
                        follower.close()
                stopped = " and stopped" if report.was_live else ""
                print(
                    f"bookie {args.bookieid} decommissioned{stopped}: its data is on other "
                    f"bookies ({report.recovery.progress.line()}), its cookie deleted"
                )

        asyncio.run(run())

    def whoisauditor(args: argparse.Namespace) -> None:
        from bookkeeper_py.admin.service import ClusterAdmin
        from bookkeeper_py.metadata.manager import MetadataClient

        with MetadataClient.connect(uri_of(args)) as metadata:
            auditor = ClusterAdmin(metadata).auditor()
        if auditor is None:
            raise CommandError(
                "no auditor: no AutoRecovery process runs (start bookies with "
                "autoRecoveryDaemonEnabled=true, or 'bookkeeper autorecovery')"
            )
        print(f"Auditor: {auditor}")

    def triggeraudit(args: argparse.Namespace) -> None:
        from bookkeeper_py.admin.service import ClusterAdmin
        from bookkeeper_py.metadata.manager import MetadataClient

        with MetadataClient.connect(uri_of(args)) as metadata:
            ClusterAdmin(metadata).trigger_audit()
        print("audit triggered: the auditor checks every lost bookie's ledgers now")

    def forceauditchecks(args: argparse.Namespace) -> None:
        from bookkeeper_py.admin.service import ClusterAdmin
        from bookkeeper_py.metadata.manager import MetadataClient
        from bookkeeper_py.metadata.underreplication import (
            CHECK_ALL_LEDGERS,
            PLACEMENT_POLICY_CHECK,
            REPLICAS_CHECK,
        )

        chosen = [
            check
            for check, wanted in (
                (CHECK_ALL_LEDGERS, args.checkallledgerscheck),
                (PLACEMENT_POLICY_CHECK, args.placementpolicycheck),
                (REPLICAS_CHECK, args.replicascheck),
            )
            if wanted
        ]
        if not chosen:
            raise CommandError("name the checks to force: -calc, -ppc and/or -rc")
        with MetadataClient.connect(uri_of(args)) as metadata:
            ClusterAdmin(metadata).force_audit_checks(chosen)
        print(f"{', '.join(chosen)} set to 0: the next auditor elected runs those checks at once")

    def queryautorecoverystatus(args: argparse.Namespace) -> None:
        from bookkeeper_py.admin.service import ClusterAdmin
        from bookkeeper_py.metadata.manager import MetadataClient

        with MetadataClient.connect(uri_of(args)) as metadata:
            admin_service = ClusterAdmin(metadata)
            being = [
                ledger for ledger in admin_service.underreplicated() if ledger.replication_worker
            ]
            print("CurrentRecoverLedgerInfo:")
            for ledger in being:
                line = f"LedgerId: {ledger.ledger_id}, BookieId: {ledger.replication_worker}"
                if args.verbose:
                    try:
                        size = admin_service.ledger(ledger.ledger_id)[0].length
                        line += f", LedgerSize: {size}"
                    except CommandError:
                        line += ", LedgerSize: (deleted)"
                print(line)
            if not being:
                print("No Ledger is being recovered")

    command = shell_command(
        "forceauditchecks",
        "make the next auditor run the periodic checks named at once",
        forceauditchecks,
    )
    command.add_argument(
        "-calc", "--checkallledgerscheck", action="store_true", help="the check of every ledger"
    )
    command.add_argument(
        "-ppc", "--placementpolicycheck", action="store_true", help="the placement policy check"
    )
    command.add_argument(
        "-rc",
        "--replicascheck",
        action="store_true",
        help="the replicas check (its time is kept for BookKeeper's auditors; ours runs none)",
    )
    command = shell_command(
        "queryautorecoverystatus",
        "the under-replicated ledgers being re-replicated now, and by whom",
        queryautorecoverystatus,
    )
    command.add_argument("-v", "--verbose", action="store_true", help="with each ledger's size")
    command = shell_command(
        "recover", "copy the data of lost bookies to other bookies now", recover
    )
    command.add_argument("bookies", nargs="+", help="bookie ids, comma or space separated")
    command.add_argument(
        "-dr",
        "--dryrun",
        action="store_true",
        help="list the ledgers and fragments; change nothing",
    )
    command.add_argument(
        "-sk",
        "--skipOpenLedgers",
        action="store_true",
        help="leave open ledgers' last fragments to their writers (no fencing)",
    )
    command.add_argument("-l", "--ledger", type=int, help="only this ledger")
    command.add_argument(
        "-d", "--deleteCookie", action="store_true", help="then delete the bookies' cookies"
    )
    command = shell_command(
        "decommissionbookie",
        "move a bookie's data to others, then remove it (a live one is stopped)",
        decommissionbookie,
    )
    command.add_argument("-bookieid", "--bookieid", required=True, help="the bookie's id")
    command.add_argument(
        "--open-ledger-grace-s",
        type=float,
        default=30.0,
        help="seconds open ledgers' writers get to move away before they are fenced [30]",
    )
    command.add_argument(
        "--timeout-s", type=float, default=3600.0, help="give up after this long [3600]"
    )
    shell_command("whoisauditor", "print the elected auditor", whoisauditor)
    shell_command(
        "triggeraudit", "make the auditor check every lost bookie's ledgers now", triggeraudit
    )


def _describe(planned: admin.PlannedLedger) -> str:
    state = "closed" if planned.closed else "open"
    lines = [f"ledger {planned.ledger_id} ({state}): {planned.entries} entries to copy"]
    for fragment in planned.fragments:
        lines.append(
            f"\tfragment {fragment.first_entry}..{fragment.last_entry} on "
            f"{', '.join(fragment.ensemble)}: copies of {', '.join(fragment.missing.values())}"
        )
    if planned.open_short:
        lines.append("\tits writer's fragment is on them too (fenced unless -sk)")
    return "\n".join(lines)


async def _delete_cookie(client: BookKeeper, bookie_id: str) -> None:
    from bookkeeper_py.metadata.driver import NoNodeError

    port = client.metadata_port
    try:
        await port.delete_node(f"{port.ledgers_root}/cookies/{bookie_id}")
    except NoNodeError:
        pass


def add_process_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from bookkeeper_py.server import config

    process = commands.add_parser(
        "autorecovery",
        help="run AutoRecovery (auditor candidate and replication worker) on its own",
    )
    # Every AutoRecovery key but the switch: this process is AutoRecovery.
    config.add_arguments(process, config.AUTORECOVERY_SETTINGS[1:], metadata=True)
    process.add_argument("--name", help="this process's name in locks and votes [host:pid]")
    process.set_defaults(run=run_process)


def run_process(args: argparse.Namespace) -> None:
    from bookkeeper_py import loop as event_loop
    from bookkeeper_py.server import config
    from bookkeeper_py.server.main import start_autorecovery, stop_autorecovery

    values = config.resolve(args)
    uri = values["metadataServiceUri"] or os.environ.get("BOOKKEEPER_METADATA_URI")
    if not uri:
        raise CommandError(
            "no metadata service URI; pass --metadata-uri URI, metadataServiceUri in --conf, or "
            "set BOOKKEEPER_METADATA_URI"
        )
    options = config.autorecovery_options(values)
    session_timeout_s = config.session_timeout_s(values)
    name = args.name or f"{socket.gethostname()}:{os.getpid()}"

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        from bookkeeper_py.prometheus import PrometheusMetrics

        service = await start_autorecovery(
            uri, name, options, PrometheusMetrics(), session_timeout_s
        )
        try:
            await stop.wait()
        finally:
            await stop_autorecovery(service)

    event_loop.run(serve())
