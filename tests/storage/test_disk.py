"""Disk thresholds: warn, read-only when full, writable again below the low-water mark."""

from __future__ import annotations

import pytest

from bookkeeper_py.storage.disk import DiskChecker, DiskState, DiskThresholds


class Disks:
    def __init__(self) -> None:
        self.used = {"/journal": 0.10, "/ledgers": 0.10}

    def __call__(self, path: str) -> tuple[int, int]:
        total = 1_000_000
        return total, int(total * (1 - self.used[path]))


def test_states_follow_the_worst_directory_with_hysteresis() -> None:
    disks = Disks()
    checker = DiskChecker(["/journal", "/ledgers"], DiskThresholds(0.95, 0.90, 0.85), disks)
    assert checker.check().state == DiskState.OK
    disks.used["/ledgers"] = 0.91
    report = checker.check()
    assert (report.state, report.path) == (DiskState.WARN, "/ledgers")
    disks.used["/journal"] = 0.96
    assert checker.check().state == DiskState.FULL
    disks.used["/journal"] = 0.90  # below the threshold, above the low-water mark: still full
    assert checker.check().state == DiskState.FULL
    disks.used["/journal"] = 0.50
    disks.used["/ledgers"] = 0.84
    assert checker.check().state == DiskState.OK


@pytest.mark.parametrize(
    ("threshold", "warn", "lwm"), [(0.9, 0.95, None), (1.2, 0.9, None), (0.9, 0.8, 0.95)]
)
def test_inconsistent_thresholds_are_refused(
    threshold: float, warn: float, lwm: float | None
) -> None:
    with pytest.raises(ValueError, match="diskUsageThreshold"):
        DiskThresholds(threshold, warn, lwm)
