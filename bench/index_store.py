"""Which embedded store should hold the bookie's entry-location index? (issue 3)

Measures, for LMDB (``lmdb``), RocksDB (``rocksdict``) and SQLite (stdlib), the operations the
index does: batched durable puts of (ledgerId, entryId) -> location at checkpoint time, point
lookups of random entries, and "last entry of a ledger" (a reverse seek). Keys are 16 bytes
(big-endian ledger id and entry id), values 8 bytes.

    python bench/index_store.py [--ledgers 1000000] [--entries-per-ledger 3] [--runs 3]

Prints the median of the runs for each store and operation.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import statistics
import struct
import tempfile
import time
from collections.abc import Callable

KEY = struct.Struct(">qq")
VALUE = struct.Struct(">q")
BATCH = 50_000


def keys(ledgers: int, per_ledger: int) -> list[bytes]:
    return [KEY.pack(ledger, entry) for ledger in range(ledgers) for entry in range(per_ledger)]


class LmdbIndex:
    def __init__(self, path: str) -> None:
        import lmdb

        self.env = lmdb.open(path, map_size=64 << 30, sync=True, metasync=True, writemap=False)

    def put_batch(self, items: list[tuple[bytes, bytes]]) -> None:
        with self.env.begin(write=True) as txn:
            cursor = txn.cursor()
            cursor.putmulti(items, append=False)

    def get(self, key: bytes) -> bytes | None:
        with self.env.begin() as txn:
            return txn.get(key)

    def last_entry(self, ledger: int) -> int:
        with self.env.begin() as txn:
            cursor = txn.cursor()
            found = cursor.prev() if cursor.set_range(KEY.pack(ledger + 1, 0)) else cursor.last()
            if not found:
                return -1
            key_ledger, entry = KEY.unpack(cursor.key())
            return entry if key_ledger == ledger else -1

    def close(self) -> None:
        self.env.close()


class RocksIndex:
    def __init__(self, path: str) -> None:
        from rocksdict import Rdict, WriteBatch, WriteOptions

        self.db = Rdict(path)
        self.batch_type = WriteBatch
        self.write_options = WriteOptions()
        self.write_options.sync = True

    def put_batch(self, items: list[tuple[bytes, bytes]]) -> None:
        batch = self.batch_type(raw_mode=False)
        for key, value in items:
            batch.put(key, value)
        self.db.write(batch, self.write_options)

    def get(self, key: bytes) -> bytes | None:
        return self.db.get(key)

    def last_entry(self, ledger: int) -> int:
        iterator = self.db.iter()
        iterator.seek_for_prev(KEY.pack(ledger, 2**63 - 1))
        if not iterator.valid():
            return -1
        key_ledger, entry = KEY.unpack(iterator.key())
        return entry if key_ledger == ledger else -1

    def close(self) -> None:
        self.db.close()


class SqliteIndex:
    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(os.path.join(path, "index.db"), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS loc (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")

    def put_batch(self, items: list[tuple[bytes, bytes]]) -> None:
        self.db.execute("BEGIN")
        self.db.executemany("INSERT OR REPLACE INTO loc VALUES (?, ?)", items)
        self.db.execute("COMMIT")

    def get(self, key: bytes) -> bytes | None:
        row = self.db.execute("SELECT v FROM loc WHERE k = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def last_entry(self, ledger: int) -> int:
        row = self.db.execute(
            "SELECT k FROM loc WHERE k >= ? AND k < ? ORDER BY k DESC LIMIT 1",
            (KEY.pack(ledger, 0), KEY.pack(ledger + 1, 0)),
        ).fetchone()
        return -1 if row is None else KEY.unpack(row[0])[1]

    def close(self) -> None:
        self.db.close()


STORES: dict[str, Callable[[str], object]] = {
    "lmdb": LmdbIndex,
    "rocksdb": RocksIndex,
    "sqlite": SqliteIndex,
}


def run_once(name: str, all_keys: list[bytes], ledgers: int, lookups: int) -> dict[str, float]:
    directory = tempfile.mkdtemp(prefix=f"bench-index-{name}-")
    try:
        store = STORES[name](directory)
        items = [(key, VALUE.pack(index)) for index, key in enumerate(all_keys)]
        start = time.perf_counter()
        for first in range(0, len(items), BATCH):
            store.put_batch(items[first : first + BATCH])  # type: ignore[attr-defined]
        put_s = time.perf_counter() - start
        rng = random.Random(1)
        probes = [rng.choice(all_keys) for _ in range(lookups)]
        start = time.perf_counter()
        for key in probes:
            assert store.get(key) is not None  # type: ignore[attr-defined]
        get_s = time.perf_counter() - start
        ledger_probes = [rng.randrange(ledgers) for _ in range(lookups)]
        start = time.perf_counter()
        for ledger in ledger_probes:
            assert store.last_entry(ledger) >= 0  # type: ignore[attr-defined]
        last_s = time.perf_counter() - start
        store.close()  # type: ignore[attr-defined]
        size = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(directory) for f in fs
        )
        return {
            "puts/s": len(items) / put_s,
            "gets/s": lookups / get_s,
            "last-entry/s": lookups / last_s,
            "MB on disk": size / 1e6,
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ledgers", type=int, default=1_000_000)
    parser.add_argument("--entries-per-ledger", type=int, default=3)
    parser.add_argument("--lookups", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stores", default="lmdb,rocksdb,sqlite")
    args = parser.parse_args()
    all_keys = keys(args.ledgers, args.entries_per_ledger)
    print(
        f"{len(all_keys):,} keys ({args.ledgers:,} ledgers x {args.entries_per_ledger}), batches of {BATCH:,}"
    )
    for name in args.stores.split(","):
        runs = [run_once(name, all_keys, args.ledgers, args.lookups) for _ in range(args.runs)]
        medians = {metric: statistics.median(run[metric] for run in runs) for metric in runs[0]}
        print(
            f"{name:8s} "
            + "  ".join(f"{metric} {value:>12,.0f}" for metric, value in medians.items())
        )


if __name__ == "__main__":
    main()
