"""A bookie started on Apache BookKeeper's stock ``bk_server.conf``, unchanged: run by
tests/integration/test_stock_configuration.py inside a user, network and mount namespace
(``unshare --user --map-root-user --net --mount``), because the file names fixed places: the
metadata store at ``localhost:2181``, the bookie on port 3181, its directories ``/tmp/bk-txn`` and
``/tmp/bk-data``. The namespace gives it a loopback of its own and a private ``/tmp``. Prints a
line per step and the bookie's log; exits non-zero on any failed check.

    python stock_conf_scenario.py STOCK_CONF
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import time

from bookkeeper_py import BookKeeper
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing.zookeeper import ZooKeeperServer

URI = "zk+hierarchical://localhost:2181/ledgers"  # the stock file's metadataServiceUri
START_S = 60.0


def check(condition: bool, what: str) -> None:
    if not condition:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def loopback_up() -> None:
    """``ip link set lo up``, without needing iproute2: a new network namespace starts with its
    loopback down."""
    request = struct.Struct("16sH14s")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = request.unpack(fcntl.ioctl(sock, 0x8913, request.pack(b"lo", 0, b"")))[1]
        fcntl.ioctl(sock, 0x8914, request.pack(b"lo", flags | 0x1, b""))  # SIOCSIFFLAGS, IFF_UP


def registered(metadata: MetadataClient) -> list[str]:
    return [name for name in metadata.store.children(f"{metadata.root}/available") if ":" in name]


def main() -> None:
    stock = sys.argv[1]
    loopback_up()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", "/tmp"], check=True)
    with ZooKeeperServer(port=2181):
        shell = [sys.executable, "-m", "bookkeeper_py", "shell", "--conf", stock]
        made = subprocess.run([*shell, "initnewcluster"], capture_output=True, text=True)
        check(made.returncode == 0, f"shell --conf initnewcluster: {made.stderr.strip()}")
        log_path = "/tmp/bookie.log"
        with open(log_path, "wb") as log:
            bookie = subprocess.Popen(
                [sys.executable, "-m", "bookkeeper_py", "bookie", "--conf", stock],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            metadata = MetadataClient.connect(URI)
            try:
                deadline = time.monotonic() + START_S
                while (
                    not registered(metadata)
                    and bookie.poll() is None
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.2)
                check(bookie.poll() is None, "the bookie runs")
                check(bool(registered(metadata)), "the bookie registers within 60 s")
                [bookie_id] = registered(metadata)
            finally:
                metadata.close()
            check(bookie_id.endswith(":3181"), f"registered as {bookie_id} (bookiePort=3181)")
            check(os.path.isdir("/tmp/bk-txn") and os.path.isdir("/tmp/bk-data"), "its dirs")
            with BookKeeper(URI) as client:
                writer = client.create_ledger(1, 1, 1)
                for number in range(20):
                    writer.add_entry(b"stock %d" % number)
                writer.close()
                reader = client.open_ledger(writer.ledger_id)
                data = [entry.data for entry in reader.read_entries(0, 19)]
            check(data == [b"stock %d" % n for n in range(20)], "20 entries written and read")
            bookie.send_signal(signal.SIGTERM)
            check(bookie.wait(timeout=60) == 0, "the bookie stops on SIGTERM with status 0")
        finally:
            if bookie.poll() is None:
                bookie.kill()
                bookie.wait()
            with open(log_path, errors="replace") as log:
                print("--- bookie log ---")
                print(log.read(), end="", flush=True)
    print("SCENARIO PASSED", flush=True)


if __name__ == "__main__":
    main()
