"""A writer in its own process, for crash tests: creates a ledger, prints its id, then adds
entries with many in flight and prints each acknowledged entry id until it is killed, or
prints ``failed <error>`` and exits once an add fails (after being fenced).

    python writer_process.py METADATA_URI PASSWORD
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from workloads import payload

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.errors import BKError

MAX_ENTRIES = 1_000_000


def main() -> None:
    uri, password = sys.argv[1], sys.argv[2].encode()
    bk = BookKeeper(uri)
    handle = bk.create_ledger(3, 2, 2, DigestType.CRC32C, password)
    print(f"ledger {handle.ledger_id}", flush=True)
    window: collections.deque[concurrent.futures.Future[int]] = collections.deque()
    for entry_id in range(MAX_ENTRIES):
        if len(window) >= 200:
            try:
                print(f"acked {window.popleft().result()}", flush=True)
            except BKError as error:  # fenced by a recovering reader, for instance
                print(f"failed {type(error).__name__}: {error}", flush=True)
                os._exit(0)  # at once: the client's threads need no orderly shutdown here
        window.append(handle.add_entry_async(payload(entry_id, 100 + entry_id % 900)))


if __name__ == "__main__":
    main()
