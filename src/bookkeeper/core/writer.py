"""Pending adds of a ledger writer: acks in, in-order completions out (reference section 1.6).

An entry completes once Qa bookies of its write set acked it *and* every lower entry completed.
The caller (the asyncio runtime or the simulator) sends the requests and feeds back the answers;
this object only decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from bookkeeper.core.quorum import AckSet, write_set


@dataclass(slots=True)
class PendingAdd:
    """An entry sent to its write set and not yet acknowledged to the caller."""

    entry_id: int
    write_set: list[int]
    acks: AckSet
    payload_length: int


class PendingAdds:
    """The window of sent, unacknowledged entries of one writer."""

    def __init__(
        self,
        ensemble_size: int,
        write_quorum_size: int,
        ack_quorum_size: int,
        last_add_confirmed: int = -1,
    ) -> None:
        self._ensemble_size = ensemble_size
        self._write_quorum_size = write_quorum_size
        self._ack_quorum_size = ack_quorum_size
        self.last_add_confirmed = last_add_confirmed
        self.last_add_pushed = last_add_confirmed
        self._pending: dict[int, PendingAdd] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def push(self, payload_length: int) -> PendingAdd:
        """Assigns the next entry id and returns the add with its write set."""
        entry_id = self.last_add_pushed + 1
        self.last_add_pushed = entry_id
        add = PendingAdd(
            entry_id,
            write_set(entry_id, self._ensemble_size, self._write_quorum_size),
            AckSet(self._write_quorum_size, self._ack_quorum_size),
            payload_length,
        )
        self._pending[entry_id] = add
        return add

    def on_ack(self, entry_id: int, bookie_index: int) -> list[PendingAdd]:
        """Records a durable ack; returns the adds that are now complete, in entry-id order."""
        add = self._pending.get(entry_id)
        if add is None or bookie_index not in add.write_set:
            return []  # a late or duplicate answer for an entry already acknowledged
        add.acks.ack(bookie_index)
        completed: list[PendingAdd] = []
        while True:
            head = self._pending.get(self.last_add_confirmed + 1)
            if head is None or not head.acks.complete:
                break
            del self._pending[head.entry_id]
            self.last_add_confirmed = head.entry_id
            completed.append(head)
        return completed

    def on_failure(self, entry_id: int, bookie_index: int) -> bool:
        """Records a failed write; returns whether the entry can still reach Qa acks."""
        add = self._pending.get(entry_id)
        if add is None:
            return True
        add.acks.fail(bookie_index)
        return add.acks.still_possible

    def drain(self) -> list[PendingAdd]:
        """Removes and returns every pending add (to fail them), lowest entry first."""
        adds = [self._pending[entry_id] for entry_id in sorted(self._pending)]
        self._pending.clear()
        return adds
