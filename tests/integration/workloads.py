"""Deterministic payloads shared by the integration tests and the writer subprocess."""

from __future__ import annotations

import hashlib
import random

MIB = 1024 * 1024


def mixed_sizes(count: int, seed: int) -> list[int]:
    """Entry sizes from 0 B to 1 MiB: mostly small, some medium, a few up to 1 MiB, and both ends."""
    rng = random.Random(seed)
    sizes = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.80:
            sizes.append(rng.randint(0, 1024))
        elif roll < 0.995:
            sizes.append(rng.randint(1025, 64 * 1024))
        else:
            sizes.append(rng.randint(256 * 1024, MIB))
    sizes[0] = 0
    sizes[min(1, count - 1)] = MIB
    return sizes


def payload(entry_id: int, size: int, seed: int = 0) -> bytes:
    """Bytes that depend on the entry id, so a misplaced entry cannot pass for the right one."""
    block = hashlib.sha256(f"{seed}:{entry_id}".encode()).digest()
    return (block * (size // len(block) + 1))[:size]
