"""A log writer in its own process, for takeover tests: opens the log (fencing any writer
before it), prints ``open``, then appends records ``<tag>-<i>`` (i from START) with many in
flight and prints ``acked <i> <position>`` for each acknowledged one until it is killed, or
prints ``failed <ErrorName>: <error>`` and exits once an append fails (after being fenced).

    python log_writer_process.py METADATA_URI NAMESPACE LOG TAG [WRITER_ID] [START]

With WRITER_ID the writer is idempotent and record i carries sequence number i.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import sys

from bookkeeper_py import BookKeeper
from bookkeeper_py.errors import BKError
from bookkeeper_py.log.facade import LogNamespace
from bookkeeper_py.log.format import Position

MAX_RECORDS = 10_000_000


def main() -> None:
    uri, namespace, log_name, tag = sys.argv[1:5]
    writer_id = sys.argv[5] if len(sys.argv) > 5 else ""
    start = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    bk = BookKeeper(uri)
    logs = LogNamespace(bk, namespace)
    writer = logs.open_writer(log_name, writer_id=writer_id, flush_delay_ms=1)
    print(f"open {writer.last_writer_sequence}", flush=True)
    window: collections.deque[tuple[int, concurrent.futures.Future[Position]]]
    window = collections.deque()
    for i in range(start, MAX_RECORDS):
        if len(window) >= 500:
            done, future = window.popleft()
            try:
                print(f"acked {done} {future.result()}", flush=True)
            except BKError as error:
                print(f"failed {type(error).__name__}: {error}", flush=True)
                os._exit(0)  # at once: the client's threads need no orderly shutdown here
        data = f"{tag}-{i}".encode()
        try:
            window.append((i, writer.append(data, sequence=i if writer_id else None)))
        except BKError as error:
            print(f"failed {type(error).__name__}: {error}", flush=True)
            os._exit(0)


if __name__ == "__main__":
    main()
