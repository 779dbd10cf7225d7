"""A bookie on a small tmpfs that fills up: read-only, registered as read-only, nothing
acknowledged lost, writable again once garbage collection frees space. The scenario mounts the
tmpfs, so it runs as root or in a user+mount namespace."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "full_disk_scenario.py")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["threshold", "enospc", "journal"])
def test_full_disk_turns_the_bookie_read_only_and_back(tmp_path: Path, mode: str) -> None:
    """``threshold``: read-only (EREADONLY, recovery adds taken) well before the disk is full.
    ``enospc``: the disk really fills; the failed writes are answered EIO and never acknowledged,
    the bookie turns read-only, and every acknowledged entry is still there."""
    command = [sys.executable, SCENARIO, str(tmp_path), mode]
    if os.geteuid() != 0:
        unshare = shutil.which("unshare")
        assert unshare, "needs root or util-linux's unshare to mount a tmpfs for the bookie"
        command = [unshare, "--user", "--map-root-user", "--mount", *command]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0 and "SCENARIO PASSED" in result.stdout, (
        result.stdout + result.stderr[-3000:]
    )
