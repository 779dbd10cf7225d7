"""Ledger metadata rates per driver (issue 5): create, read, CAS update, and list.

Each driver gets the same work through ``MetadataClient`` (one operation per call, as a client
creating, opening and closing ledgers does): --ledgers creates (id generation included), as
many reads, as many CAS updates through the update loop, and one listing. Rates are medians of
--runs runs. ZooKeeper is a standalone server started for the run (the OS's zookeeper package);
SQLite syncs every transaction (synchronous=FULL), ZooKeeper fsyncs its transaction log.

    python bench/metadata_store.py [--ledgers 2000] [--runs 3] [--drivers memory,sqlite,zookeeper]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable

from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing.zookeeper import ZooKeeperServer
from bookkeeper_py.wire.digest import DigestType


def rate(count: int, work: Callable[[], None]) -> float:
    started = time.perf_counter()
    work()
    return count / (time.perf_counter() - started)


def one_run(uri: str, ledgers: int) -> dict[str, float]:
    client = MetadataClient.connect(uri, create=True)
    try:
        client.init_cluster()
        ids: list[int] = []

        def create() -> None:
            for _ in range(ledgers):
                ledger_id = client.generate_ledger_id()
                client.create_ledger_metadata(
                    LedgerMetadata(
                        ledger_id=ledger_id,
                        ensemble_size=3,
                        write_quorum_size=2,
                        ack_quorum_size=2,
                        digest_type=DigestType.CRC32C,
                        password=b"bench",
                        ensembles=((0, ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")),),
                    )
                )
                ids.append(ledger_id)

        def read() -> None:
            for ledger_id in ids:
                client.read_ledger_metadata(ledger_id)

        def update() -> None:
            # One pass of the update loop (metadata.port.update_ledger_metadata): read, then
            # compare-and-swap.
            for ledger_id in ids:
                current, version = client.read_ledger_metadata(ledger_id)
                closed = dataclasses.replace(
                    current, state=LedgerState.CLOSED, last_entry_id=9, length=100
                )
                client.write_ledger_metadata(closed, version)

        def listing() -> None:
            assert sum(1 for _ in client.list_ledgers()) == ledgers

        return {
            "create": rate(ledgers, create),
            "read": rate(ledgers, read),
            "CAS update": rate(ledgers, update),
            "list": rate(ledgers, listing),
        }
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledgers", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--drivers", default="memory,sqlite,zookeeper")
    args = parser.parse_args()
    drivers = args.drivers.split(",")
    zookeeper = ZooKeeperServer() if "zookeeper" in drivers else None
    if zookeeper is not None:
        zookeeper.start()
    try:
        with tempfile.TemporaryDirectory() as directory:
            print(f"{args.ledgers} ledgers per run, median of {args.runs} runs (operations/s)")
            print(f"{'driver':<10} {'create':>10} {'read':>10} {'CAS update':>11} {'list':>11}")
            for driver in drivers:
                runs = []
                for run in range(args.runs):
                    if driver == "memory":
                        uri = f"memory://bench-{uuid.uuid4().hex}"
                    elif driver == "sqlite":
                        uri = f"sqlite:///{directory}/metadata-{run}.db"
                    else:
                        assert zookeeper is not None
                        uri = zookeeper.metadata_uri(f"/bench-{uuid.uuid4().hex[:8]}/ledgers")
                    runs.append(one_run(uri, args.ledgers))
                medians = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
                print(
                    f"{driver:<10} {medians['create']:>10,.0f} {medians['read']:>10,.0f} "
                    f"{medians['CAS update']:>11,.0f} {medians['list']:>11,.0f}"
                )
    finally:
        if zookeeper is not None:
            zookeeper.close()


if __name__ == "__main__":
    main()
