"""Shell commands that administer a cluster's metadata, on any driver (BookKeeper's names):
``initnewcluster``, ``metaformat``, ``nukeexistingcluster``, ``whatisinstanceid``, the
cookie commands ``cookie_get``, ``cookie_create``, ``cookie_update``, ``cookie_delete``, and the
AutoRecovery switches ``listunderreplicated``, ``autorecovery``, ``lostbookierecoverydelay``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from bookkeeper_py.admin import CommandError
from bookkeeper_py.metadata.driver import NodeExistsError, NoNodeError
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.metadata.underreplication import UnderReplicationManager
from bookkeeper_py.storage.cookie import Cookie

Register = Callable[[str, str, Callable[[argparse.Namespace], None]], argparse.ArgumentParser]
UriOf = Callable[[argparse.Namespace], str]


def add_commands(shell_command: Register, uri_of: UriOf) -> None:
    """Adds the commands through ``shell_command(name, help, run)`` (which adds --metadata-uri)."""

    def connect(args: argparse.Namespace, create: bool = False) -> MetadataClient:
        return MetadataClient.connect(uri_of(args), create=create)

    def initnewcluster(args: argparse.Namespace) -> None:
        with connect(args, create=True) as metadata:
            existing = metadata.instance_id()
            if existing is not None:
                raise CommandError(
                    f"a cluster already exists at {metadata.root} (instance id {existing}); "
                    "nothing changed; use nukeexistingcluster or metaformat to start over"
                )
            metadata.init_cluster()
            print(f"new cluster at {metadata.root}, instance id {metadata.instance_id()}")

    def metaformat(args: argparse.Namespace) -> None:
        with connect(args, create=True) as metadata:
            existing = metadata.instance_id()
            if existing is not None and not args.force:
                raise CommandError(
                    f"the cluster at {metadata.root} (instance id {existing}) holds metadata; "
                    "metaformat -f deletes all of it (ledgers, registrations, cookies)"
                )
            deleted = metadata.delete_cluster(None)
            metadata.init_cluster()
            print(
                f"formatted {metadata.root}: {deleted} nodes deleted, "
                f"new instance id {metadata.instance_id()}"
            )

    def nukeexistingcluster(args: argparse.Namespace) -> None:
        if not args.force and not args.instanceid:
            raise CommandError(
                "name the cluster to delete with -i INSTANCEID (see whatisinstanceid), or -f"
            )
        with connect(args) as metadata:
            if args.zkledgersrootpath and args.zkledgersrootpath != metadata.root:
                raise CommandError(
                    f"-p {args.zkledgersrootpath} is not the metadata URI's root {metadata.root}; "
                    "drop -p or make it the URI's root"
                )
            deleted = metadata.delete_cluster(None if args.force else args.instanceid)
            print(f"deleted the cluster at {metadata.root}: {deleted} nodes")

    def whatisinstanceid(args: argparse.Namespace) -> None:
        with connect(args) as metadata:
            instance_id = metadata.instance_id()
        if instance_id is None:
            raise CommandError(f"no cluster at {metadata.root}: run initnewcluster")
        print(instance_id)

    def cookie_get(args: argparse.Namespace) -> None:
        with connect(args) as metadata:
            found = metadata.read_cookie(args.bookie_id)
        if found is None:
            raise CommandError(
                f"no cookie for bookie {args.bookie_id}; check the bookie id (see listbookies)"
            )
        data, version = found
        print(f"cookie of {args.bookie_id} (version {version}):")
        print(data.decode("utf-8", errors="replace"), end="")

    def _read_cookie_file(path: str, bookie_id: str) -> bytes:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as error:
            raise CommandError(f"cannot read cookie file {path}: {error}; check the path") from None
        cookie = Cookie.decode(data, path)  # refuses a file that is not a cookie
        if cookie.bookie_id != bookie_id:
            raise CommandError(
                f"cookie file {path} is for bookie {cookie.bookie_id}, not {bookie_id}; "
                "pass the cookie file of that bookie"
            )
        return data

    def store_cookie(args: argparse.Namespace, *, update: bool) -> None:
        data = _read_cookie_file(args.cookie_file, args.bookie_id)
        with connect(args) as metadata:
            try:
                if update:
                    version = metadata.update_cookie(args.bookie_id, data)
                else:
                    metadata.create_cookie(args.bookie_id, data)
                    version = 0
            except (NodeExistsError, NoNodeError):
                advice = (
                    "has no cookie; use cookie_create"
                    if update
                    else "already has a cookie; use cookie_update"
                )
                raise CommandError(f"bookie {args.bookie_id} {advice}") from None
        print(
            f"cookie of {args.bookie_id} {'updated' if update else 'created'} (version {version})"
        )

    def cookie_delete(args: argparse.Namespace) -> None:
        with connect(args) as metadata:
            try:
                metadata.delete_cookie(args.bookie_id)
            except NoNodeError:
                raise CommandError(
                    f"no cookie for bookie {args.bookie_id}; check the bookie id (see listbookies)"
                ) from None
        print(f"cookie of {args.bookie_id} deleted")

    def listunderreplicated(args: argparse.Namespace) -> None:
        with connect(args) as metadata:
            manager = UnderReplicationManager(metadata)
            for ledger_id in manager.underreplicated_ledgers():
                missing = manager.missing_replicas(ledger_id)
                if missing is None:
                    continue  # re-replicated while we listed
                if args.missingreplica and args.missingreplica not in missing:
                    continue
                if args.excludingmissingreplica and args.excludingmissingreplica in missing:
                    continue
                print(ledger_id)
                if args.printmissingreplica:
                    print("\tmissing replicas: " + ", ".join(missing))
                if args.printreplicationworkerid:
                    holder = manager.lock_holder(ledger_id)
                    print(f"\treplication worker: {holder or '-'}")

    def autorecovery(args: argparse.Namespace) -> None:
        with connect(args) as metadata:
            manager = UnderReplicationManager(metadata)
            if args.enable:
                manager.enable()
            elif args.disable:
                manager.disable()
            print(f"autorecovery is {'enabled' if manager.is_enabled() else 'disabled'}")

    def lostbookierecoverydelay(args: argparse.Namespace) -> None:
        with connect(args) as metadata:
            manager = UnderReplicationManager(metadata)
            if args.set is not None:
                if args.set < 0:
                    raise CommandError(f"-set takes seconds, 0 or more, got {args.set}")
                manager.set_lost_bookie_recovery_delay(args.set)
                print(f"lostBookieRecoveryDelay set to {args.set} s")
            else:
                print(f"lostBookieRecoveryDelay: {manager.lost_bookie_recovery_delay()} s")

    shell_command("initnewcluster", "create a new cluster's metadata", initnewcluster)
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
