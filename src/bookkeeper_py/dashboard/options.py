"""The options of ``bookkeeper dashboard`` (no import of the server's libraries: the command line
builds its parser from this module alone)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

DEFAULT_PORT = 8090
TICK_S = 1.0  # how often the dashboard polls the cluster


@dataclass(frozen=True)
class Options:
    metadata_uri: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    enable_actions: bool = False
    secret_file: str | None = None
    tick_s: float = TICK_S


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata-uri", help="the cluster's metadata service URI")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to listen on (default: {DEFAULT_PORT}; 0: any free port)",
    )
    parser.add_argument(
        "--enable-actions",
        action="store_true",
        help="allow the page's admin actions (read-only switch, GC, deleting ledgers); "
        "without it they are refused",
    )
    parser.add_argument(
        "--secret-file",
        help="a shared secret (as the bookies' authSharedSecretFile, 16 bytes or more) that every "
        "request must carry: HTTP Basic password (any user name) or a bearer token; the "
        "dashboard also authenticates its reads to bookies that ask for it",
    )
