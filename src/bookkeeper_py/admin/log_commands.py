"""``bookkeeper log``: logs built from ledgers (``bookkeeper_py.log``) from the command line.

    bookkeeper log create NAME [-e 3 -w 2 -a 2] [--digest crc32c] [--roll-bytes N] ...
    bookkeeper log list [--after NAME] [--limit N]
    bookkeeper log describe NAME [--json]
    bookkeeper log append NAME [--format lines|binary] [--writer-id ID] [--verbose] < records
    bookkeeper log read NAME [--from earliest|latest|POSITION | --txid N | --timestamp MS]
                             [--to POSITION] [--max N] [--subscription SUB] [--show-position]
    bookkeeper log tail NAME [the same options; follows the log until Ctrl-C or --max]
    bookkeeper log truncate NAME --before POSITION [--force] | --retention [--force]
    bookkeeper log delete NAME
    bookkeeper log subscriptions NAME [--create SUB [--at-latest] | --delete SUB]

Every command takes ``--metadata-uri URI`` (or $BOOKKEEPER_METADATA_URI), ``--namespace NS``
(default ``default``) and ``--password`` (the logs' ledger password, or
$BOOKKEEPER_LOG_PASSWORD; empty by default). A position is ``ledger:entry:slot``, as ``append``
and ``read --show-position`` print them.

Records on stdin and stdout are one per line (``--format lines``: the line without its newline;
a record holding a newline cannot be told apart from two) or length-prefixed (``--format
binary``: a 4-byte big-endian length, then that many bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import struct
import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import IO, TYPE_CHECKING, Any, NoReturn

from bookkeeper_py.admin import CommandError
from bookkeeper_py.admin.client_auth import client_options
from bookkeeper_py.admin.log_report import (
    consumed,
    counted,
    describe_config,
    description_dict,
    description_lines,
    listed,
    subscription_lines,
)
from bookkeeper_py.errors import IncorrectParameterError
from bookkeeper_py.log.format import (
    DUPLICATE,
    LogConfig,
    LogExistsError,
    LogNotFoundError,
    LogRecord,
    Position,
    check_name,
)
from bookkeeper_py.progress import SILENT, Task, quiet_option, terminal
from bookkeeper_py.wire.digest import DigestType

if TYPE_CHECKING:
    import concurrent.futures

    from bookkeeper_py.log.facade import LogNamespace, LogWriter
    from bookkeeper_py.log.reader import LogReader as AsyncLogReader

UriOf = Callable[[argparse.Namespace], str]

DIGESTS = {digest.name.lower(): digest for digest in DigestType}
LENGTH = struct.Struct(">I")  # the length prefix of --format binary
# append waits for its records' acknowledgements every so many records or bytes, so that a
# long stdin is not held in memory
APPEND_WINDOW_RECORDS = 10_000
APPEND_WINDOW_BYTES = 16 * 1024 * 1024


# -- option values ---------------------------------------------------------------------------


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is below {minimum}")
        return value

    return parse


def _name(kind: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return check_name(kind, text)
        except IncorrectParameterError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def position(text: str) -> Position:
    """``ledger:entry:slot``, each 0 or more."""
    try:
        parsed = Position.parse(text)
    except IncorrectParameterError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if min(parsed) < 0:
        raise argparse.ArgumentTypeError(
            f"invalid position {text!r}: ledger, entry and slot are 0 or more, e.g. 12:0:0"
        )
    return parsed


def start(text: str) -> str | Position:
    """Where a reader starts: ``earliest``, ``latest`` or a position."""
    if text in ("earliest", "latest"):
        return text
    try:
        return position(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"invalid start {text!r}: use earliest, latest or a position ledger:entry:slot "
            "(e.g. 12:0:0)"
        ) from None


def usage_error(args: argparse.Namespace, message: str) -> NoReturn:
    """A usage error found after parsing: one line, exit status 2 (as argparse's own)."""
    parser: argparse.ArgumentParser = args.log_parser
    parser.error(message)


# -- commands --------------------------------------------------------------------------------


@contextlib.contextmanager
def connect(args: argparse.Namespace, uri_of: UriOf) -> Iterator[LogNamespace]:
    """The namespace of ``--namespace`` through a blocking client of the cluster."""
    from bookkeeper_py.client.facade import BookKeeper
    from bookkeeper_py.log.facade import LogNamespace

    with BookKeeper(uri_of(args), **client_options(args)) as client:
        yield LogNamespace(client, args.namespace, password=args.password.encode())


def config_from(args: argparse.Namespace) -> LogConfig:
    """The ``LogConfig`` of ``create``'s options (a field not given keeps its default)."""
    given: dict[str, Any] = {
        field.name: getattr(args, field.name)
        for field in fields(LogConfig)
        if getattr(args, field.name, None) is not None
    }
    if args.digest is not None:
        given["digest_type"] = DIGESTS[args.digest]
    try:
        return LogConfig(**given)
    except IncorrectParameterError as error:
        usage_error(args, str(error))


def check_create(args: argparse.Namespace) -> None:
    args.config = config_from(args)


def cmd_create(args: argparse.Namespace, namespace: LogNamespace) -> None:
    config = args.config
    try:
        namespace.create_log(args.log, config)
    except LogExistsError as error:
        raise CommandError(
            f"{error}; pick another name, or delete it first (bookkeeper log delete)"
        ) from None
    print(f"created log {namespace.name}/{args.log}: {describe_config(config)}")


def cmd_list(args: argparse.Namespace, namespace: LogNamespace) -> None:
    names = namespace.list_logs(args.after, args.limit)
    for name in names:
        print(name)
    if len(names) == args.limit:
        print(f"more logs may follow: --after {names[-1]}", file=sys.stderr)


def cmd_describe(args: argparse.Namespace, namespace: LogNamespace) -> None:
    description = namespace.describe(args.log)
    if args.json:
        print(json.dumps(description_dict(description), indent=2))
    else:
        print("\n".join(description_lines(description)))


def check_append(args: argparse.Namespace) -> None:
    if args.first_sequence is not None and not args.writer_id:
        usage_error(
            args, "--first-sequence numbers the records of an idempotent writer: add --writer-id"
        )


def cmd_append(args: argparse.Namespace, namespace: LogNamespace) -> None:
    writer = namespace.open_writer(args.log, writer_id=args.writer_id or "")
    appender = _Appender(writer, each=args.each, wait_each=sys.stdin.isatty())
    first = args.first_sequence or 0
    try:
        try:
            records = records_in(sys.stdin.buffer, args.format, writer.aio.max_record_bytes)
            for index, data in enumerate(records):
                appender.append(data, first + index if args.writer_id else None)
        except BadInputError as error:
            raise CommandError(f"{error} ({appender.summary()})") from None
        appender.finish()
        if args.end_of_stream:
            writer.mark_end_of_stream()
        else:
            writer.close()
    except BaseException:
        # what was appended before the error (or Ctrl-C) is acknowledged and said
        with contextlib.suppress(Exception):
            appender.finish()
            writer.close()
        if appender.last is not None and not args.each:
            print(appender.last, flush=True)
        raise
    if appender.last is not None and not args.each:
        print(appender.last)
    if appender.duplicates:
        print(
            f"{appender.duplicates} of {appender.count} records were appended before by writer "
            f"{args.writer_id!r} and were skipped (its sequence numbers up to "
            f"{writer.last_writer_sequence} are in the log; number new records after them with "
            "--first-sequence)",
            file=sys.stderr,
        )
    elif appender.count == 0:
        print("stdin held no records: nothing appended", file=sys.stderr)


class BadInputError(CommandError):
    """A record of stdin the log cannot take (the records before it are appended)."""


class _Appender:
    """Appends records, keeping a bounded window of them unacknowledged; prints each position
    (``each``) in order as they are acknowledged."""

    def __init__(self, writer: LogWriter, *, each: bool, wait_each: bool) -> None:
        self.writer = writer
        self.each = each
        self.wait_each = wait_each  # a person typing: each position (or error) at once
        self.pending: deque[concurrent.futures.Future[Position]] = deque()
        self.pending_bytes = 0
        self.count = 0
        self.duplicates = 0
        self.last: Position | None = None

    def append(self, data: bytes, sequence: int | None) -> None:
        self.pending.append(self.writer.append(data, sequence=sequence))
        self.pending_bytes += len(data)
        self.count += 1
        if (
            self.wait_each
            or len(self.pending) >= APPEND_WINDOW_RECORDS
            or self.pending_bytes >= APPEND_WINDOW_BYTES
        ):
            self._settle(wait=True)
        elif self.each:
            self._settle(wait=False)

    def finish(self) -> None:
        self.writer.flush()
        self._settle(wait=True)

    def _settle(self, *, wait: bool) -> None:
        """Takes the acknowledged records off the window (all of them, with ``wait``)."""
        while self.pending and (wait or self.pending[0].done()):
            where = self.pending.popleft().result()
            if where == DUPLICATE:
                self.duplicates += 1
            else:
                self.last = where
            if self.each:
                print(where, flush=True)
        if not self.pending:
            self.pending_bytes = 0

    def summary(self) -> str:
        """What was appended before a bad record."""
        self.finish()
        appended = self.count - self.duplicates
        if self.last is None:
            return "nothing before it was appended"
        return f"{counted(appended, 'record')} before it appended, the last at {self.last}"


def records_in(stream: IO[bytes], form: str, max_bytes: int) -> Iterator[bytes]:
    """The records of ``stream``, as they arrive: its lines without their newline, or its
    length-prefixed records; ``BadInputError`` for one over ``max_bytes`` (before reading it
    all) or cut short."""

    def too_large(size: str) -> BadInputError:
        return BadInputError(
            f"record {count + 1} of stdin is {size} bytes; the log takes records of at most "
            f"{max_bytes} bytes: split it, or create the log with a larger --max-entry-bytes"
        )

    count = 0
    if form == "lines":
        while line := stream.readline(max_bytes + 1):
            if line.endswith(b"\n"):
                line = line[:-1]
            elif len(line) > max_bytes:
                raise too_large("more than " + str(max_bytes))
            count += 1
            yield line
        return
    while True:
        header = stream.read(LENGTH.size)
        if not header:
            return
        if len(header) < LENGTH.size:
            raise BadInputError(
                f"stdin ended inside the length of record {count + 1} ({len(header)} of 4 "
                "bytes): --format binary takes a 4-byte big-endian length before each record"
            )
        (length,) = LENGTH.unpack(header)
        if length > max_bytes:
            raise too_large(str(length))
        data = stream.read(length)
        if len(data) < length:
            raise BadInputError(
                f"stdin ended inside record {count + 1} ({len(data)} of its {length} bytes): "
                "--format binary takes a 4-byte big-endian length before each record"
            )
        count += 1
        yield data


def check_read(args: argparse.Namespace) -> None:
    if args.subscription is not None and (
        isinstance(args.start, Position) or args.txid is not None or args.timestamp is not None
    ):
        usage_error(
            args,
            "--subscription reads from the subscription's position; --from POSITION, --txid "
            "and --timestamp cannot move it (--from earliest|latest says where a new one starts)",
        )
    if args.show_position and args.format == "binary":
        usage_error(args, "--show-position goes with --format lines")


def cmd_read(args: argparse.Namespace, uri_of: UriOf, *, follow: bool) -> None:
    """``read`` and ``tail``, on the asyncio API: Ctrl-C cancels the one task that reads, so the
    reader is unwound before it is closed. (The blocking ``LogReader.close`` cancels a read in
    progress and closes at once, racing the read's unwinding: "aclose(): asynchronous
    generator is already running".)"""
    uri = uri_of(args)
    try:
        asyncio.run(read_records(args, uri, follow))
    except BrokenPipeError:
        # whoever read our output went away (``| head``): stop as quietly as it did
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except KeyboardInterrupt:
        if not follow:
            raise
        # (tail -f: Ctrl-C is how it ends)


async def read_records(args: argparse.Namespace, uri: str, follow: bool) -> None:
    from bookkeeper_py.aio import BookKeeper
    from bookkeeper_py.log import LogNamespace as AsyncLogNamespace

    async with BookKeeper(uri, **client_options(args)) as client:
        namespace = AsyncLogNamespace(client, args.namespace, password=args.password.encode())
        reader = await namespace.open_reader(
            args.log,
            args.start or ("latest" if follow else "earliest"),
            txid=args.txid,
            timestamp=args.timestamp,
            subscription=args.subscription,
            end=args.to,
            follow=follow,
        )
        # read (not tail, which never ends): a bar while the records go to a file or pipe
        display = SILENT if follow else terminal(args.quiet, prints_lines=True)
        try:
            with display, display.task(f"reading log {args.log}", args.max, "records") as task:
                await copy_records(reader, sys.stdout.buffer, args, task)
        finally:
            await reader.close()


async def copy_records(
    reader: AsyncLogReader,
    out: IO[bytes],
    args: argparse.Namespace,
    progress: Task | None = None,
) -> None:
    """Writes records to ``out`` until the reader ends or ``--max`` are written, committing the
    subscription after each batch written (up to the last record written: ``--max`` may stop
    inside a batch). ``progress`` counts the records written."""
    left = args.max
    while left is None or left > 0:
        records = await reader.read_batch()
        if not records:
            return
        if left is not None:
            records = records[:left]
            left -= len(records)
        out.write(b"".join(encode_record(record, args) for record in records))
        out.flush()
        if progress is not None:
            progress.advance(len(records))
        if args.subscription is not None:
            last = records[-1]
            await reader.namespace.commit(
                reader.log_name, args.subscription, last.position, last.sequence
            )


def encode_record(record: LogRecord, args: argparse.Namespace) -> bytes:
    if args.format == "binary":
        return LENGTH.pack(len(record.data)) + record.data
    if args.show_position:
        return f"{record.position}\t".encode() + record.data + b"\n"
    return record.data + b"\n"


def cmd_truncate(args: argparse.Namespace, namespace: LogNamespace) -> None:
    where = f"{namespace.name}/{args.log}"
    try:
        if args.retention:
            deleted = namespace.apply_retention(args.log, force=args.force)
            print(
                f"applied the retention policy of log {where}: {counted(deleted, 'ledger')} deleted"
            )
        else:
            deleted = namespace.truncate(args.log, args.before, force=args.force)
            print(
                f"truncated log {where} before {args.before}: {counted(deleted, 'ledger')} deleted"
            )
    except IncorrectParameterError as error:  # records a subscription still needs
        raise CommandError(f"{error} (--force)") from None


def cmd_delete(args: argparse.Namespace, namespace: LogNamespace) -> None:
    where = f"{namespace.name}/{args.log}"
    try:
        description = namespace.describe(args.log)
    except LogNotFoundError:
        description = None  # none, or a delete cut short (marked deleting): finish it
    try:
        namespace.delete_log(args.log)
    except LogNotFoundError as error:
        raise CommandError(f"{error}; see bookkeeper log list") from None
    if description is None:
        print(f"deleted log {where} (finished a delete cut short)")
        return
    ledgers = [segment.ledger_id for segment in description.metadata.segments]
    subscriptions = [info.subscription.name for info in description.subscriptions]
    print(
        f"deleted log {where}: {counted(description.record_count, 'record')}, "
        f"{listed(ledgers, 'ledger')}, {listed(subscriptions, 'subscription')}"
    )


def check_subscriptions(args: argparse.Namespace) -> None:
    if args.at_latest and not args.create:
        usage_error(args, "--at-latest goes with --create SUB")


def cmd_subscriptions(args: argparse.Namespace, namespace: LogNamespace) -> None:
    where = f"{namespace.name}/{args.log}"
    if args.create:
        existed = any(
            info.subscription.name == args.create for info in namespace.subscriptions(args.log)
        )
        made = namespace.subscribe(args.log, args.create, at_latest=args.at_latest)
        state = "exists already" if existed else "created"
        print(f"subscription {made.name} of log {where} {state} at {consumed(made.position)}")
        return
    if args.delete:
        try:
            namespace.delete_subscription(args.log, args.delete)
        except LogNotFoundError as error:
            raise CommandError(f"{error}; see bookkeeper log subscriptions {args.log}") from None
        print(f"subscription {args.delete} of log {where} deleted")
        return
    print("\n".join(subscription_lines(namespace.subscriptions(args.log))))


# -- the parser ------------------------------------------------------------------------------


def add_commands(log_parser: argparse.ArgumentParser, uri_of: UriOf) -> None:
    """Adds ``log``'s subcommands to ``log_parser``; ``uri_of`` finds the metadata URI."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--metadata-uri", metavar="URI", help="metadataServiceUri (or $BOOKKEEPER_METADATA_URI)"
    )
    common.add_argument(
        "--namespace",
        metavar="NS",
        default="default",
        type=_name("namespace"),
        help="(default: default)",
    )
    common.add_argument(
        "--password",
        default=os.environ.get("BOOKKEEPER_LOG_PASSWORD", ""),
        help="the password of the logs' ledgers (or $BOOKKEEPER_LOG_PASSWORD; default empty)",
    )
    subcommands = log_parser.add_subparsers(dest="log_command", required=True)

    def command(
        name: str,
        help_text: str,
        run: Callable[..., None],
        check: Callable[[argparse.Namespace], None] | None = None,
        *,
        named: bool = True,
        connected: bool = True,
    ) -> argparse.ArgumentParser:
        """A subcommand; ``run(args, namespace)`` (the blocking API), or ``run(args)`` when
        not ``connected`` (it connects itself)."""
        sub = subcommands.add_parser(name, help=help_text, description=help_text, parents=[common])
        if named:
            sub.add_argument("log", type=_name("log"), help="the log's name")

        def execute(args: argparse.Namespace) -> None:
            if check is not None:
                check(args)  # usage errors before connecting
            if not args.verbose:
                # what a command did is its output or its one-line error; the client's INFO and
                # WARNING lines (recovery, fencing, ensemble changes) would only say it again
                logging.getLogger("bookkeeper_py").setLevel(logging.ERROR)
            if not connected:
                run(args)
                return
            with connect(args, uri_of) as namespace:
                run(args, namespace)

        sub.set_defaults(run=execute, log_parser=sub)
        return sub

    create = command("create", "create a log", cmd_create, check_create)
    defaults = LogConfig()
    for short, option, dest in (
        ("-e", "--ensemble", "ensemble_size"),
        ("-w", "--writeQuorum", "write_quorum_size"),
        ("-a", "--ackQuorum", "ack_quorum_size"),
    ):
        create.add_argument(
            short,
            option,
            dest=dest,
            type=_count(1),
            metavar="N",
            help=f"(default: {getattr(defaults, dest)})",
        )
    create.add_argument("--digest", choices=sorted(DIGESTS), help="(default: crc32c)")
    for option, metavar, help_text in (
        ("--roll-bytes", "BYTES", "start a new segment (ledger) once this many bytes are in it"),
        ("--roll-age-ms", "MS", "... once it is this old"),
        ("--roll-records", "N", "... once this many records are in it"),
        ("--retention-age-ms", "MS", "delete closed segments once their last record is this old"),
        ("--retention-bytes", "BYTES", "delete the oldest closed segments past this many bytes"),
    ):
        default = getattr(defaults, option[2:].replace("-", "_"))
        create.add_argument(
            option, type=_count(0), metavar=metavar, help=f"{help_text} (0: off; default {default})"
        )
    create.add_argument(
        "--placement",
        choices=("random", "rackaware", "regionaware"),
        help="the placement policy the log's writers must use (default: the writer's client's)",
    )
    create.add_argument(
        "--max-entry-bytes",
        type=_count(0),
        metavar="BYTES",
        help=f"the largest entry (a batch of records), 4096 to 4194304 (default "
        f"{defaults.max_entry_bytes})",
    )

    listing = command(
        "list", "list the logs of a namespace (a page at a time)", cmd_list, named=False
    )
    listing.add_argument("--after", type=_name("log"), help="the last name of the previous page")
    listing.add_argument("--limit", type=_count(1), default=1000, help="(default: 1000)")

    describe = command(
        "describe", "a log's segments, totals and subscriptions with their lag", cmd_describe
    )
    describe.add_argument("--json", action="store_true", help="one JSON object")

    append = command(
        "append", "append the records of stdin; print the last position", cmd_append, check_append
    )
    append.add_argument("--format", choices=("lines", "binary"), default="lines")
    append.add_argument(
        "--verbose", dest="each", action="store_true", help="print each record's position"
    )
    append.add_argument(
        "--writer-id",
        type=_name("writer id"),
        help="an idempotent writer: records numbered from --first-sequence; those the log "
        "holds already from this writer (an earlier run cut short) are skipped",
    )
    append.add_argument("--first-sequence", type=_count(0), help="(default: 0)")
    append.add_argument(
        "--end-of-stream", action="store_true", help="then end the log: no more appends"
    )

    for name, follow, help_text in (
        ("read", False, "print records, up to the log's end as it is now"),
        ("tail", True, "print records as they are appended, until Ctrl-C (or --max)"),
    ):
        reading = command(
            name,
            help_text,
            functools.partial(cmd_read, uri_of=uri_of, follow=follow),
            check_read,
            connected=False,
        )
        origin = reading.add_mutually_exclusive_group()
        origin.add_argument(
            "--from",
            dest="start",
            type=start,
            metavar="earliest|latest|POSITION",
            help=f"(default: {'latest' if follow else 'earliest'})",
        )
        origin.add_argument(
            "--txid",
            type=_count(0),
            metavar="N",
            help="from the first record with this txid or above",
        )
        origin.add_argument(
            "--timestamp",
            type=_count(0),
            metavar="MS",
            help="from the first record this recent (ms)",
        )
        reading.add_argument(
            "--to", type=position, metavar="POSITION", help="stop after this position"
        )
        reading.add_argument("--max", type=_count(1), metavar="N", help="stop after N records")
        if not follow:
            quiet_option(
                reading,
                "no progress bar (it shows on stderr when stderr is a terminal and stdout is not)",
            )
        reading.add_argument(
            "--subscription",
            type=_name("subscription"),
            metavar="SUB",
            help="from SUB's position (made if missing); committed after each batch printed",
        )
        reading.add_argument("--format", choices=("lines", "binary"), default="lines")
        reading.add_argument(
            "--show-position", action="store_true", help="prefix lines with ledger:entry:slot TAB"
        )

    truncate = command("truncate", "delete a log's oldest records", cmd_truncate)
    what = truncate.add_mutually_exclusive_group(required=True)
    what.add_argument("--before", type=position, metavar="POSITION", help="every record before it")
    what.add_argument("--retention", action="store_true", help="what the retention policy drops")
    truncate.add_argument(
        "--force", action="store_true", help="even records a subscription has not consumed"
    )

    command("delete", "delete a log, its ledgers and subscriptions (asks nothing)", cmd_delete)

    subscriptions = command(
        "subscriptions",
        "list a log's subscriptions with their lag; create or delete one",
        cmd_subscriptions,
        check_subscriptions,
    )
    change = subscriptions.add_mutually_exclusive_group()
    change.add_argument("--create", type=_name("subscription"), metavar="SUB")
    change.add_argument("--delete", type=_name("subscription"), metavar="SUB")
    subscriptions.add_argument(
        "--at-latest", action="store_true", help="a new subscription starts after the last record"
    )
