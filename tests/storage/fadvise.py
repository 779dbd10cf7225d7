"""Records ``os.posix_fadvise`` calls (monkeypatched in) instead of making them."""

from __future__ import annotations


class FadviseRecorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []  # (offset, length, advice)

    def __call__(self, fd: int, offset: int, length: int, advice: int) -> None:
        self.calls.append((offset, length, advice))
