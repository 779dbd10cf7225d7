"""Apache BookKeeper's stock ``bk_server.conf`` (4.18.0, ``tests/data``), unchanged, starts a
bookie that serves, and the only warnings printed name a real reason (issue 22). The file names
fixed places (ZooKeeper at localhost:2181, port 3181, ``/tmp/bk-txn``), so the scenario runs in
namespaces of its own: a loopback and a ``/tmp`` no other process sees."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIO = os.path.join(HERE, "stock_conf_scenario.py")
STOCK = os.path.join(HERE, "..", "data", "bk_server-4.18.0.conf")


@pytest.mark.slow
def test_the_stock_configuration_unchanged_starts_a_bookie_with_reasoned_warnings() -> None:
    unshare = shutil.which("unshare")
    assert unshare, "needs util-linux's unshare (user, network and mount namespaces)"
    result = subprocess.run(
        [unshare, "--user", "--map-root-user", "--net", "--mount", sys.executable, SCENARIO, STOCK],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "SCENARIO PASSED" in result.stdout, output[-4000:]
    log = result.stdout.split("--- bookie log ---", 1)[1]
    warnings = [line for line in log.splitlines() if re.search(r" (WARNING|ERROR|CRITICAL) ", line)]
    assert warnings  # the stream storage keys: ignored, with the reason
    for warning in warnings:
        assert " ignored: " in warning and re.search(r"ignored: \w+", warning), warning
        assert "typo" not in warning and "unknown" not in warning, warning
