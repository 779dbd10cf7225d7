"""``bookkeeper spark``: the pipeline jobs (``bookkeeper_py.spark.jobs``) on any Spark master.

    bookkeeper spark export --path DIR (--log NS/LOG | --logs A,B | --logs-pattern RE |
                             --ledgers ID,ID) [--namespace NS]
    bookkeeper spark compact --log NS/LOG --into NS/LOG --key SQL-EXPRESSION
    bookkeeper spark audit [--ledgers ID,ID] [--password PW]

Every command takes ``--metadata-uri URI`` (or $BOOKKEEPER_METADATA_URI) and ``--master``
(``local[*]`` by default; ``spark://host:7077``, ``yarn``... for a cluster, whose executors must
reach the bookies and have this package installed). They need the ``spark`` extra and Java 17+.
``audit`` exits with status 1 when it found a problem. On a terminal a progress bar on stderr
follows the Spark tasks of the job (``spark.progress``); ``-q`` leaves it out. The jobs' clients
present the command's shared secret where it has one (``admin.client_auth``: ``bookkeeper
--auth-secret-file FILE spark ...`` or $BOOKKEEPER_AUTH_SECRET_FILE), in the driver and in every
task.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from bookkeeper_py import progress
from bookkeeper_py.admin import CommandError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

UriOf = Callable[[argparse.Namespace], str]


def _session(args: argparse.Namespace) -> SparkSession:
    from bookkeeper_py.spark.session import spark_session

    session = spark_session(args.master, f"bookkeeper-spark-{args.spark_command}")
    session.sparkContext.setLogLevel("ERROR")
    return session


@contextlib.contextmanager
def _followed(args: argparse.Namespace, spark: SparkSession, what: str) -> Iterator[None]:
    """The job's Spark tasks as a progress bar (on a terminal, without ``--quiet``)."""
    from bookkeeper_py.spark.progress import followed

    with progress.terminal(args.quiet) as display, followed(spark, display, what):
        yield


def client_source_options(args: argparse.Namespace) -> dict[str, str]:
    """The data source's client options of the command: its shared secret, if it has one (the
    executors read the file too: on a cluster it must be at that path on their machines)."""
    from bookkeeper_py.admin import client_auth

    path = client_auth.secret_file(args)
    if path is None:
        return {}
    return {"auth.sharedSecretFile": path, "auth.name": client_auth.PRINCIPAL}


def _ledger_ids(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CommandError(f"--ledgers {text!r}: use ledger ids separated by commas") from None
    if not ids or min(ids) < 0:
        raise CommandError(f"--ledgers {text!r}: use ledger ids (0 or more), comma-separated")
    return ids


def _export(args: argparse.Namespace, uri: str) -> None:
    from bookkeeper_py.spark.jobs import export_ledgers, export_logs

    named = [n for n in ("log", "logs", "logs_pattern", "ledgers") if getattr(args, n)]
    if len(named) != 1:
        raise CommandError("name one of --log, --logs, --logs-pattern or --ledgers")
    spark = _session(args)
    try:
        if args.ledgers:
            ids = _ledger_ids(args.ledgers) or []
            with _followed(args, spark, f"exporting {len(ids)} ledgers"):
                done = export_ledgers(
                    spark, uri, args.path, ids, args.password, client=client_source_options(args)
                )
            print(f"exported {done.batches} ledgers ({done.records} entries) to {done.path}")
            return
        subject = {"namespace": args.namespace}
        if args.log:
            subject["log"] = args.log
        elif args.logs:
            subject["logs"] = args.logs
        else:
            subject["logsPattern"] = args.logs_pattern
        with _followed(args, spark, "exporting"):
            done = export_logs(spark, uri, args.path, client=client_source_options(args), **subject)
        print(f"exported {done.records} records in {done.batches} batches to {done.path}")
    finally:
        spark.stop()


def _compact(args: argparse.Namespace, uri: str) -> None:
    from bookkeeper_py.spark.jobs import compact_log

    spark = _session(args)
    try:
        with _followed(args, spark, f"compacting {args.log}"):
            done = compact_log(
                spark,
                uri,
                args.log,
                args.into,
                args.key,
                namespace=args.namespace,
                client=client_source_options(args),
            )
    finally:
        spark.stop()
    print(
        f"compacted {args.log} into {args.into}: {done.read} records read, {done.kept} kept "
        f"({done.keys} keys, {done.tombstones} deleted by an empty last record)"
    )


def _audit(args: argparse.Namespace, uri: str) -> None:
    from bookkeeper_py.spark.audit import audit
    from bookkeeper_py.spark.options import parse_client_options

    client = parse_client_options(client_source_options(args))
    spark = _session(args)
    try:
        with _followed(args, spark, "auditing"):
            report = audit(
                spark,
                uri,
                ledgers=_ledger_ids(args.ledgers),
                password=args.password.encode(),
                client_options=client,
            )
    finally:
        spark.stop()
    for line in report.lines():
        print(line)
    if not report.healthy:
        sys.exit(1)


def add_commands(spark_parser: argparse.ArgumentParser, uri_of: UriOf) -> None:
    """Adds ``spark``'s subcommands to ``spark_parser``; ``uri_of`` finds the metadata URI."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--metadata-uri", metavar="URI", help="metadataServiceUri (or $BOOKKEEPER_METADATA_URI)"
    )
    common.add_argument("--master", default="local[*]", help="the Spark master (local[*])")
    common.add_argument("--password", default="", help="the ledgers' password (default empty)")
    progress.quiet_option(common)
    subcommands = spark_parser.add_subparsers(dest="spark_command", required=True)

    def command(name: str, help_text: str, run: Callable[[argparse.Namespace, str], None]):  # type: ignore[no-untyped-def]
        sub = subcommands.add_parser(name, help=help_text, parents=[common])
        sub.set_defaults(run=lambda args: run(args, uri_of(args)))
        return sub

    export = command("export", "logs or ledgers to Parquet (resumable)", _export)
    export.add_argument("--path", required=True, help="the Parquet directory")
    export.add_argument("--namespace", default="default", help="of the logs (default: default)")
    export.add_argument("--log", help="NS/LOG or LOG (in --namespace)")
    export.add_argument("--logs", help="logs separated by commas")
    export.add_argument("--logs-pattern", help="a regular expression over the namespace's logs")
    export.add_argument("--ledgers", help="raw ledgers: ids separated by commas")

    compact = command("compact", "the last record of each key into another log", _compact)
    compact.add_argument("--namespace", default="", help="of LOG and --into without NS/")
    compact.add_argument("--log", required=True, help="the log to compact")
    compact.add_argument("--into", required=True, help="the log that receives the result")
    compact.add_argument(
        "--key",
        required=True,
        help="a Spark SQL expression over the columns (payload, sequence, txid, timestamp...), "
        "e.g. \"get_json_object(cast(payload as string), '$.user')\"",
    )

    audit = command("audit", "check every entry on every replica (digest, presence)", _audit)
    audit.add_argument("--ledgers", help="ledger ids separated by commas (default: all)")
