"""The bookie's full-disk state follows the thresholds with hysteresis: a write that ran out of
space keeps it read-only until usage is under the low-water mark and space was really freed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bookkeeper_py.server.bookie import Bookie, BookieConfig
from bookkeeper_py.storage.engine import StorageConfig

MIB = 1024 * 1024
TOTAL = 1000 * MIB


def test_out_of_space_ends_only_once_space_was_freed(tmp_path: Path) -> None:
    storage = StorageConfig(str(tmp_path / "journal"), str(tmp_path / "ledgers"))
    loop = asyncio.new_event_loop()
    bookie = Bookie(BookieConfig(storage), loop)
    free = {"bytes": 160 * MIB}  # 84 % used: under the 95 % threshold and low-water mark
    bookie.disk._usage = lambda path: (TOTAL, free["bytes"])
    bookie.start()
    try:
        bookie.check_disks()
        assert not bookie.read_only
        bookie.engine.journals[0].out_of_space = True  # a journal write hit ENOSPC
        bookie.check_disks()
        assert bookie.read_only  # full, though usage is only 84 %
        free["bytes"] += 10 * MIB  # a little freed: still read-only (it used to flip back here)
        bookie.check_disks()
        assert bookie.read_only and bookie.engine.out_of_space
        free["bytes"] += 45 * MIB  # 5.5 % of the disk freed since the failure
        bookie.check_disks()
        assert not bookie.read_only and not bookie.engine.out_of_space
        free["bytes"] = 20 * MIB  # 98 %: read-only by the threshold, whatever the history
        bookie.check_disks()
        assert bookie.read_only
    finally:
        bookie.close()
        loop.close()
