"""Status codes of the bookie protocols (reference section 2.2 and 2.3).

v3 uses the protobuf ``StatusCode`` values (402, 403, 501...); v2 uses small integers (1, 2, 101...).
We keep one enum with the v3 values and translate at the v2 edge.
"""

from __future__ import annotations

import enum


class StatusCode(enum.IntEnum):
    """A bookie's answer to a request, with the v3 protocol's numbers."""

    EOK = 0
    ENOLEDGER = 402
    ENOENTRY = 403
    EBADREQ = 404
    EIO = 501
    EUA = 502
    EBADVERSION = 503
    EFENCED = 504
    EREADONLY = 505
    ETOOMANYREQUESTS = 506
    EUNKNOWNLEDGERSTATE = 507


_V2_BY_STATUS: dict[StatusCode, int] = {
    StatusCode.EOK: 0,
    StatusCode.ENOLEDGER: 1,
    StatusCode.ENOENTRY: 2,
    StatusCode.EBADREQ: 100,
    StatusCode.EIO: 101,
    StatusCode.EUA: 102,
    StatusCode.EBADVERSION: 103,
    StatusCode.EFENCED: 104,
    StatusCode.EREADONLY: 105,
    StatusCode.ETOOMANYREQUESTS: 106,
    StatusCode.EUNKNOWNLEDGERSTATE: 107,
}
_STATUS_BY_V2: dict[int, StatusCode] = {v: k for k, v in _V2_BY_STATUS.items()}


def to_v2(status: StatusCode) -> int:
    """The v2 return code for ``status``."""
    return _V2_BY_STATUS[status]


def from_v2(rc: int) -> StatusCode:
    """The status for a v2 return code; an unknown code is a bad answer, read as EIO (unknown)."""
    return _STATUS_BY_V2.get(rc, StatusCode.EIO)
