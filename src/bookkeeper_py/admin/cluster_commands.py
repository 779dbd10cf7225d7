"""Shell commands that administer a cluster's metadata, on any driver (BookKeeper's names):
``initnewcluster``, ``metaformat``, ``nukeexistingcluster``, ``whatisinstanceid``, the
cookie commands ``cookie_get``, ``cookie_create``, ``cookie_update``, ``cookie_delete``, and the
AutoRecovery switches ``listunderreplicated``, ``autorecovery``, ``lostbookierecoverydelay``;
and ``bookierack`` (the bookies' racks, kept as Apache Pulsar keeps them: ``metadata.racks``)."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable

from bookkeeper_py import progress
from bookkeeper_py.admin import CommandError
from bookkeeper_py.admin.service import ClusterAdmin
from bookkeeper_py.metadata import racks
from bookkeeper_py.metadata.manager import MetadataClient, parse_bookie_id
from bookkeeper_py.metadata.port import ThreadedMetadata
from bookkeeper_py.storage.cookie import Cookie

Register = Callable[[str, str, Callable[[argparse.Namespace], None]], argparse.ArgumentParser]
UriOf = Callable[[argparse.Namespace], str]


def add_commands(shell_command: Register, uri_of: UriOf) -> None:
    """Adds the commands through ``shell_command(name, help, run)`` (which adds --metadata-uri)."""

    def connect(args: argparse.Namespace, create: bool = False) -> MetadataClient:
        return MetadataClient.connect(uri_of(args), create=create)

    def initnewcluster(args: argparse.Namespace) -> None:
        with connect(args, create=True) as metadata:
            admin = ClusterAdmin(metadata)
            print(f"new cluster at {admin.root}, instance id {admin.init_new_cluster()}")

    def metaformat(args: argparse.Namespace) -> None:
        with connect(args, create=True) as metadata:
            admin = ClusterAdmin(metadata)
            with progress.terminal(args.quiet) as shown:
                deleted, instance_id = admin.format(args.force, shown)
            print(f"formatted {admin.root}: {deleted} nodes deleted, new instance id {instance_id}")

    def nukeexistingcluster(args: argparse.Namespace) -> None:
        if not args.force and not args.instanceid:
            raise CommandError(
                "name the cluster to delete with -i INSTANCEID (see whatisinstanceid), or -f"
            )
        with connect(args) as metadata:
            admin = ClusterAdmin(metadata)
            with progress.terminal(args.quiet) as shown:
                deleted = admin.nuke(args.instanceid, args.force, args.zkledgersrootpath, shown)
            print(f"deleted the cluster at {admin.root}: {deleted} nodes")

    def whatisinstanceid(args: argparse.Namespace) -> None:
        with connect(args) as metadata:
            print(ClusterAdmin(metadata).instance_id())

    def cookie_get(args: argparse.Namespace) -> None:
        with connect(args) as metadata:
            data, version = ClusterAdmin(metadata).cookie(args.bookie_id)
        print(f"cookie of {args.bookie_id} (version {version}):")
        print(data.decode("utf-8", errors="replace"), end="")

    def store_cookie(args: argparse.Namespace, *, update: bool) -> None:
        path = args.cookie_file
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as error:
            raise CommandError(f"cannot read cookie file {path}: {error}; check the path") from None
        with connect(args) as metadata:
            version = ClusterAdmin(metadata).store_cookie(args.bookie_id, data, path, update=update)
        print(
            f"cookie of {args.bookie_id} {'updated' if update else 'created'} (version {version})"
        )

    def cookie_generate(args: argparse.Namespace) -> None:
        """BookKeeper's cookie_generate: a cookie file for a bookie (its id, directories and
        the cluster's instance id: the one given, else the cluster's), to store with
        cookie_create or cookie_update."""
        try:
            parse_bookie_id(args.bookie_id)
        except ValueError:
            raise CommandError(
                f"bookie id {args.bookie_id!r} is not host:port (as bookies register)"
            ) from None
        instance_id = args.instanceid
        if instance_id is None:
            with connect(args) as metadata:
                instance_id = ClusterAdmin(metadata).instance_id()
        cookie = Cookie(
            args.bookie_id,
            tuple(os.path.abspath(d) for d in args.journal_dirs.split(",")),
            tuple(os.path.abspath(d) for d in args.ledger_dirs.split(",")),
            instance_id,
        )
        try:
            with open(args.output_file, "xb") as handle:
                handle.write(cookie.encode())
        except FileExistsError:
            raise CommandError(
                f"{args.output_file} exists; not overwriting it: remove it or name another file"
            ) from None
        except OSError as error:
            raise CommandError(f"cannot write {args.output_file}: {error.strerror}") from None
        print(f"cookie of {args.bookie_id} written to {args.output_file}")

    def cookie_delete(args: argparse.Namespace) -> None:
        with connect(args) as metadata:
            ClusterAdmin(metadata).delete_cookie(args.bookie_id)
        print(f"cookie of {args.bookie_id} deleted")

    def listunderreplicated(args: argparse.Namespace) -> None:
        with connect(args) as metadata:
            found = ClusterAdmin(metadata).underreplicated(
                args.missingreplica, args.excludingmissingreplica
            )
        for ledger in found:
            print(ledger.ledger_id)
            if args.printmissingreplica:
                print("\tmissing replicas: " + ", ".join(ledger.missing_replicas))
            if args.printreplicationworkerid:
                print(f"\treplication worker: {ledger.replication_worker or '-'}")

    def autorecovery(args: argparse.Namespace) -> None:
        enable = True if args.enable else False if args.disable else None
        with connect(args) as metadata:
            enabled = ClusterAdmin(metadata).autorecovery(enable)
        print(f"autorecovery is {'enabled' if enabled else 'disabled'}")

    def lostbookierecoverydelay(args: argparse.Namespace) -> None:
        with connect(args) as metadata:
            delay = ClusterAdmin(metadata).lost_bookie_recovery_delay(args.set)
        if args.set is not None:
            print(f"lostBookieRecoveryDelay set to {delay} s")
        else:
            print(f"lostBookieRecoveryDelay: {delay} s")

    def bookierack(args: argparse.Namespace) -> None:
        """Pulsar's set-bookie-rack / get-bookie-rack / delete-bookie-rack / racks-placement on
        the racks node the rack- and region-aware placement and the dashboard read."""
        if args.action in ("set", "get", "delete") and not args.bookie_id:
            raise CommandError(f"bookierack {args.action} needs a bookie id")
        if args.action == "set":
            if not args.rack:
                raise CommandError("bookierack set needs a rack: BOOKIE_ID /rack or /region/rack")
            try:
                parse_bookie_id(args.bookie_id)
                racks.check_rack(args.rack)
            except ValueError as error:
                raise CommandError(f"{error}; nothing was changed") from None
        elif args.rack:
            raise CommandError(f"bookierack {args.action} takes no rack ({args.rack!r})")

        async def run(metadata: MetadataClient) -> None:
            port = ThreadedMetadata(metadata)
            if args.action == "set":
                await racks.set_rack(
                    port, args.bookie_id, args.rack, group=args.group, hostname=args.hostname
                )
                print(f"bookie {args.bookie_id}: rack {args.rack} (group {args.group})")
                return
            found = await racks.read_placements(port)
            if args.action == "list":
                if not found:
                    print(f"no bookie has a rack ({racks.racks_path(port)} is absent or empty)")
                for place in sorted(found.values(), key=lambda p: (p.group, p.rack, p.bookie_id)):
                    host = f" ({place.hostname})" if place.hostname else ""
                    print(f"{place.bookie_id}\t{place.rack}\t{place.group}{host}")
            elif args.action == "get":
                placed = found.get(args.bookie_id)
                if placed is None:
                    raise CommandError(
                        f"bookie {args.bookie_id} has no rack (it is placed in the default "
                        "rack); set one with bookierack set"
                    )
                print(f"{placed.bookie_id}\t{placed.rack}\t{placed.group}")
            elif not await racks.delete_rack(port, args.bookie_id):
                raise CommandError(f"bookie {args.bookie_id} has no rack to delete")
            else:
                print(f"bookie {args.bookie_id}: rack deleted (placed in the default rack now)")

        with connect(args) as metadata:
            asyncio.run(run(metadata))

    shell_command("initnewcluster", "create a new cluster's metadata", initnewcluster)
    rack = shell_command(
        "bookierack",
        "the bookies' racks, read by rack-aware placement and the dashboard (Pulsar's layout)",
        bookierack,
    )
    rack.add_argument("action", choices=("list", "get", "set", "delete"))
    rack.add_argument("bookie_id", nargs="?", help="host:port or a bookie id")
    rack.add_argument("rack", nargs="?", help="/rack or /region/rack (set)")
    rack.add_argument("--group", default=racks.DEFAULT_GROUP, help="(set; default: default)")
    rack.add_argument("--hostname", help="the bookie's host name, kept beside its rack (set)")
    listing = shell_command(
        "listunderreplicated", "list the ledgers marked under-replicated", listunderreplicated
    )
    listing.add_argument("-mr", "--missingreplica", help="only ledgers missing this bookie")
    listing.add_argument(
        "-emr", "--excludingmissingreplica", help="only ledgers not missing this bookie"
    )
    listing.add_argument("-pmr", "--printmissingreplica", action="store_true")
    listing.add_argument("-prw", "--printreplicationworkerid", action="store_true")
    switch = shell_command("autorecovery", "pause or resume AutoRecovery", autorecovery)
    choice = switch.add_mutually_exclusive_group()
    choice.add_argument("-e", "--enable", action="store_true")
    choice.add_argument("-d", "--disable", action="store_true")
    delay = shell_command(
        "lostbookierecoverydelay",
        "show or set how long the auditor waits after losing a bookie",
        lostbookierecoverydelay,
    )
    delay_choice = delay.add_mutually_exclusive_group()
    delay_choice.add_argument("-g", "--get", action="store_true", help="(the default)")
    delay_choice.add_argument("-s", "--set", type=int, metavar="SECONDS")
    formatting = shell_command(
        "metaformat", "delete all metadata and start a new cluster", metaformat
    )
    formatting.add_argument("-n", "--nonInteractive", action="store_true", help="(always)")
    formatting.add_argument("-f", "--force", action="store_true", help="delete existing metadata")
    nuke = shell_command("nukeexistingcluster", "delete a cluster's metadata", nukeexistingcluster)
    nuke.add_argument("-p", "--zkledgersrootpath", help="the ledgers root (checked)")
    nuke.add_argument("-i", "--instanceid", help="delete only a cluster with this instance id")
    nuke.add_argument("-f", "--force", action="store_true", help="whatever its instance id")
    shell_command("whatisinstanceid", "print the cluster's instance id", whatisinstanceid)
    generate = shell_command(
        "cookie_generate", "write a cookie file for a bookie (see cookie_create)", cookie_generate
    )
    generate.add_argument("bookie_id")
    generate.add_argument(
        "-j", "--journal-dirs", required=True, help="its journal directories, comma-separated"
    )
    generate.add_argument(
        "-l", "--ledger-dirs", required=True, help="its ledger directories, comma-separated"
    )
    generate.add_argument("-i", "--instanceid", help="the cluster's instance id (default: read)")
    generate.add_argument("-o", "--output-file", required=True, help="the cookie file to write")
    for name, run, help_text, needs_file in (
        ("cookie_get", cookie_get, "print a bookie's cookie", False),
        (
            "cookie_create",
            lambda args: store_cookie(args, update=False),
            "store a cookie file as a bookie's cookie",
            True,
        ),
        (
            "cookie_update",
            lambda args: store_cookie(args, update=True),
            "replace a bookie's cookie with a cookie file",
            True,
        ),
        ("cookie_delete", cookie_delete, "delete a bookie's cookie", False),
    ):
        sub = shell_command(name, help_text, run)
        sub.add_argument("bookie_id")
        if needs_file:
            sub.add_argument("-cf", "--cookie-file", required=True)
