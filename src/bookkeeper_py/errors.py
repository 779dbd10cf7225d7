"""Errors raised by bookkeeper-py, named after Apache BookKeeper's ``BKException`` codes.

Every error says what happened and, where there is one, what to do about it. Errors that come
from a bookie's answer keep the wire status code and the bookie that sent it as evidence.
"""

from __future__ import annotations

import builtins


class BKError(Exception):
    """Base class of every error bookkeeper-py raises on purpose."""


class IncorrectParameterError(BKError, ValueError):
    """The caller passed arguments that BookKeeper cannot accept (e.g. not E >= Qw >= Qa >= 1)."""


class NotEnoughBookiesError(BKError):
    """Fewer writable bookies are registered than the ensemble needs."""


class NoSuchLedgerError(BKError):
    """The ledger does not exist (in the metadata store, or on the bookie that answered)."""


class NoSuchEntryError(BKError):
    """The entry does not exist on the bookie that answered, or lies beyond what may be read."""


class LedgerExistsError(BKError):
    """A ledger with this id already exists."""


class DuplicateEntryIdError(BKError):
    """An entry id chosen by the caller (``create_ledger_adv``) was added already."""


class LedgerFencedError(BKError):
    """The ledger was fenced by a recovering reader: this writer may add nothing more.

    An add that fails with this error may or may not have been stored; treat it like a timeout
    and learn the outcome by opening the ledger once it is closed.
    """


class LedgerClosedError(BKError):
    """The ledger is closed; it takes no more entries."""


class UnauthorizedAccessError(BKError):
    """The password (master key) does not match the ledger's, or the client is not authenticated."""


# What a bookie's EUA means: a bookie says it for both, and the answer does not tell which.
EUA_MEANING = (
    "the password does not match the one the ledger was created with, or the bookie requires "
    "authentication this client did not give (the bookies' shared secret: "
    "BookKeeper(..., auth=...), bookkeeper --auth-secret-file FILE)"
)


class DigestMismatchError(BKError):
    """An entry read from a bookie failed its digest check, or is not the entry that was asked for."""


class TimeoutError(BKError, builtins.TimeoutError):
    """An operation did not finish in its time limit; its outcome may be unknown."""


class BookieHandleNotAvailableError(BKError):
    """A bookie could not be reached (connection refused, reset or closed)."""


class BookieIOError(BKError):
    """A bookie answered that it hit an I/O error or corrupt data (EIO): the answer is unknown,
    not a "no such entry"."""


class TooManyRequestsError(BKError):
    """A bookie refused the request because its queues are full; retry later."""


class WriteOnReadOnlyBookieError(BKError):
    """A bookie is read-only (disks full or set so by an operator) and refused the add."""


class UnknownLedgerStateError(BKError):
    """A bookie cannot say whether it holds the ledger (EUNKNOWNLEDGERSTATE)."""


class ProtocolError(BKError):
    """A peer sent bytes that do not form a valid BookKeeper message, or broke the protocol."""


class ReadError(BKError):
    """An entry could not be read from any replica of its write set."""


class WriteError(BKError):
    """An entry could not be written to enough bookies of its write set."""


class LedgerRecoveryError(BKError):
    """Recovery of an unclosed ledger failed; the ledger stays IN_RECOVERY and may be retried."""


class ReplicationError(BKError):
    """A ledger's missing copies could not be made again now (no replica of an entry answered,
    no bookie to copy to, the target refused); the ledger stays marked under-replicated."""


class BookieIdInUseError(BKError):
    """Another live process is registered under this bookie id."""


class MetadataVersionError(BKError):
    """The ledger metadata changed under us in a way that conflicts with this operation."""


class MetadataStoreError(BKError):
    """The metadata store failed an operation."""


class MetadataUnavailableError(MetadataStoreError):
    """The metadata store could not be reached in time; check that it runs and the URI is right."""


class LedgerIdOverflowError(MetadataStoreError):
    """Every 31-bit ledger id of a flat layout is used; a hierarchical layout goes on with
    63-bit ids (``zk+hierarchical://``)."""


class ClientClosedError(BKError):
    """The client (or handle) was closed; create a new one."""
