"""A simulated disk: writes are volatile until a sync; a crash keeps a random prefix of the
unsynced writes (the last one possibly torn, so dropped as a bad record on replay, as a journal
drops a torn tail); a sync can fail; a disk can be lost whole (``wipe``)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class DiskFaults:
    sync_failure_probability: float = 0.0


@dataclass
class Disk:
    """Records in write order: ``durable`` survived a sync (or a crash), ``unsynced`` may not."""

    rng: random.Random
    faults: DiskFaults = field(default_factory=DiskFaults)
    durable: list[tuple[object, ...]] = field(default_factory=list)
    unsynced: list[tuple[object, ...]] = field(default_factory=list)
    durable_keys: set[tuple[object, ...]] = field(default_factory=set)  # record[:3] of each
    synced_records: int = 0
    lost_records: int = 0
    torn_records: int = 0
    wipes: int = 0

    def write(self, record: tuple[object, ...]) -> None:
        self.unsynced.append(record)

    def sync(self) -> bool:
        """True if every unsynced write is now durable; False: the sync failed and they stay
        volatile (a later crash may keep or lose them)."""
        if self.rng.random() < self.faults.sync_failure_probability:
            return False
        self._make_durable(self.unsynced)
        self.synced_records += len(self.unsynced)
        self.unsynced.clear()
        return True

    def _make_durable(self, records: list[tuple[object, ...]]) -> None:
        self.durable.extend(records)
        self.durable_keys.update(record[:3] for record in records)

    def crash(self) -> None:
        """Power loss: a prefix of the unsynced writes reached the platter, the rest did not; the
        last one that did may be torn, and a torn record is dropped on replay."""
        kept = self.rng.randint(0, len(self.unsynced))
        if kept and self.rng.random() < 0.5:
            kept -= 1
            self.torn_records += 1
        self.lost_records += len(self.unsynced) - kept
        self._make_durable(self.unsynced[:kept])
        self.unsynced.clear()

    def wipe(self) -> None:
        """The disk is lost (replaced by an empty one): every record, synced or not, is gone."""
        self.lost_records += len(self.durable) + len(self.unsynced)
        self.durable.clear()
        self.unsynced.clear()
        self.durable_keys.clear()
        self.wipes += 1
