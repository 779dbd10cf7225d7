"""A short fault campaign (issue 15): bookies killed, frozen and damaged and the writer killed
under a steady load, then every acknowledged entry checked through two clients and on the
replicas. ``python -m bookkeeper_py.testing.chaos --cycles 1000`` runs a long one."""

from __future__ import annotations

from pathlib import Path

import pytest

from bookkeeper_py.testing.chaos import run_campaign


@pytest.mark.slow
def test_a_short_campaign_loses_nothing_and_hangs_nothing(tmp_path: Path) -> None:
    report = run_campaign(cycles=25, seed=15, directory=str(tmp_path))
    assert report.violations == [] and report.hung == 0
    assert report.cycles == 25 and sum(report.faults.values()) == 25
    assert report.acknowledged > 1000 and report.ledgers > 5
    assert report.verified_entries >= 2 * report.acknowledged  # two clients read each one
    assert report.replica_copies_checked >= report.acknowledged
