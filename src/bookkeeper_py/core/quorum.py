"""Quorum arithmetic of a round-robin striped ledger (reference section 3.1).

* The write set of entry ``e`` is the ensemble indices ``(e + i) mod E`` for i in [0, Qw).
* An entry is acknowledged once Qa members of its write set made it durable.
* Coverage (used for fencing and LAC reads): a bookie is *known* once it answered OK, no such
  entry or no such ledger. The ensemble is covered when every one of the E write sets has at least
  ``Qw - Qa + 1`` known members: then no write set can still gather Qa acks without a bookie that
  already answered us.
* During recovery an entry is absent only once ``Qw - Qa + 1`` members of its write set said so
  explicitly; errors and silence count for nothing ("absence is not evidence").
"""

from __future__ import annotations

from bookkeeper_py.errors import IncorrectParameterError


def check_quorum_sizes(ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> None:
    """Raises ``IncorrectParameterError`` unless E >= Qw >= Qa >= 1."""
    if not ensemble_size >= write_quorum_size >= ack_quorum_size >= 1:
        raise IncorrectParameterError(
            f"a ledger needs ensemble size >= write quorum >= ack quorum >= 1; got E={ensemble_size} "
            f"Qw={write_quorum_size} Qa={ack_quorum_size}"
        )


def write_set(entry_id: int, ensemble_size: int, write_quorum_size: int) -> list[int]:
    """Ensemble indices that store ``entry_id``, in the order BookKeeper lists them."""
    return [(entry_id + i) % ensemble_size for i in range(write_quorum_size)]


def negative_threshold(write_quorum_size: int, ack_quorum_size: int) -> int:
    """Explicit "no such entry" answers from a write set needed to declare an entry absent."""
    return write_quorum_size - ack_quorum_size + 1


class AckSet:
    """The acks one entry collected from its write set (ensemble indices as bits of two ints:
    one is made per entry added, so it allocates nothing more)."""

    __slots__ = ("_ack_quorum_size", "_acked", "_failed", "_write_quorum_size")

    def __init__(self, write_quorum_size: int, ack_quorum_size: int) -> None:
        self._write_quorum_size = write_quorum_size
        self._ack_quorum_size = ack_quorum_size
        self._acked = 0
        self._failed = 0

    def ack(self, bookie_index: int) -> bool:
        """Records a durable ack; True once Qa distinct bookies acked."""
        bit = 1 << bookie_index
        self._failed &= ~bit
        self._acked |= bit
        return self.complete

    def fail(self, bookie_index: int) -> None:
        """Records a failed write to one member of the write set."""
        bit = 1 << bookie_index
        if not self._acked & bit:
            self._failed |= bit

    def forget(self, bookie_index: int) -> None:
        """Drops what one member answered (it was replaced: its copy belongs to an old fragment)."""
        keep = ~(1 << bookie_index)
        self._acked &= keep
        self._failed &= keep

    def acked(self, bookie_index: int) -> bool:
        return bool(self._acked >> bookie_index & 1)

    @property
    def complete(self) -> bool:
        return self._acked.bit_count() >= self._ack_quorum_size

    @property
    def still_possible(self) -> bool:
        """Whether Qa acks can still be reached without the failed members."""
        return self._write_quorum_size - self._failed.bit_count() >= self._ack_quorum_size


class CoverageSet:
    """Which ensemble members answered a fence or LAC read, and whether that covers the ensemble."""

    __slots__ = ("_ack_quorum_size", "_ensemble_size", "_known", "_write_quorum_size")

    def __init__(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> None:
        self._ensemble_size = ensemble_size
        self._write_quorum_size = write_quorum_size
        self._ack_quorum_size = ack_quorum_size
        self._known: set[int] = set()

    def add_known(self, bookie_index: int) -> bool:
        """Records an answer that counts (OK, no such entry, no such ledger); True once covered."""
        self._known.add(bookie_index)
        return self.covered

    @property
    def covered(self) -> bool:
        needed = negative_threshold(self._write_quorum_size, self._ack_quorum_size)
        for first in range(self._ensemble_size):
            members = write_set(first, self._ensemble_size, self._write_quorum_size)
            if sum(1 for member in members if member in self._known) < needed:
                return False
        return True
