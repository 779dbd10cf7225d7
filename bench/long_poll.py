"""How soon a long-poll read parked on a bookie wakes after the writer's add is acknowledged.

One bookie process; a writer adds one entry at a time (E=Qw=Qa=1); before each add a raw v3
long-poll read is parked on the current LAC; the time from the add's acknowledgement to the
long-poll answer is recorded. Prints p50 / p90 / p99 / max over --count adds.

    python bench/long_poll.py [--count 500]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.raw import recv_frame
from bookkeeper_py.wire import v3
from bookkeeper_py.wire.proto import bookkeeper_protocol_pb2 as pb


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=500)
    args = parser.parse_args()
    with LocalCluster(1) as cluster, BookKeeper(cluster.metadata_uri) as client:
        host, port = cluster.bookie_ids[0].rsplit(":", 1)
        writer = client.create_ledger(1, 1, 1, DigestType.CRC32C, b"lp")
        writer.add_entry(b"first")
        waits = []
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(args.count):
                # after i+1 adds the bookie's LAC is i-1; the next add carries LAC i
                request = pb.Request()
                request.header.CopyFrom(v3.header(pb.READ_ENTRY, i + 1))
                read = request.readRequest
                read.ledgerId, read.entryId, read.previousLAC, read.timeOut = (
                    writer.ledger_id,
                    i,
                    i - 1,
                    10_000,
                )
                read.flag = pb.ReadRequest.ENTRY_PIGGYBACK
                connection.sendall(v3.encode(request))
                time.sleep(0.002)  # let it park
                writer.add_entry(b"entry")
                acked = time.perf_counter()
                response = v3.decode_response(recv_frame(connection))
                waits.append(time.perf_counter() - acked)
                assert response.readResponse.maxLAC == i, (response.readResponse.maxLAC, i)
        writer.close()
    waits.sort()
    ms = [w * 1000 for w in waits]
    print(
        f"long-poll wake after ack over {len(ms)} adds: p50 {statistics.median(ms):.2f} ms, "
        f"p90 {ms[int(len(ms) * 0.9)]:.2f} ms, p99 {ms[int(len(ms) * 0.99)]:.2f} ms, max {ms[-1]:.2f} ms"
    )


if __name__ == "__main__":
    main()
