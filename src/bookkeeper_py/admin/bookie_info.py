"""Every bookie's disk space, asked of the bookies themselves (GET_BOOKIE_INFO, protocol v3), as
BookKeeper's ``shell bookieinfo`` and ``/api/v1/bookie/list_bookie_info`` give it."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from decimal import ROUND_DOWN, Decimal

from bookkeeper_py.client.client import BookKeeper
from bookkeeper_py.errors import BKError

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 10.0  # how long a bookie may take to answer before it is left out
_UNITS = ("", "KB", "MB", "GB", "TB")


@dataclass(frozen=True)
class DiskSpace:
    total: int
    free: int


async def disk_space(client: BookKeeper) -> dict[str, DiskSpace]:
    """Each registered bookie's (writable or read-only) disk space, in bookie id order; those
    that do not answer are left out (and logged)."""
    writable, read_only = await client.metadata_port.bookies_now()
    bookies = sorted({*writable, *read_only})

    async def ask(bookie_id: str) -> DiskSpace | None:
        try:
            total, free = await asyncio.wait_for(
                client.bookie_client.bookie_info(bookie_id), ASK_TIMEOUT_S
            )
        except (BKError, TimeoutError) as error:
            log.warning("bookie %s did not give its disk space: %s", bookie_id, error)
            return None
        return DiskSpace(total, free)

    answers = await asyncio.gather(*(ask(bookie_id) for bookie_id in bookies))
    return {bookie_id: found for bookie_id, found in zip(bookies, answers, strict=True) if found}


def readable(value: int) -> str:
    """BookKeeper's rendering of a byte count next to it: in powers of 1,000 with up to three
    decimals cut (not rounded), in parentheses; "" below 1,000 (1234567 -> "(1.234MB)")."""
    number, unit = Decimal(value), 0
    while number >= 1000 and unit < len(_UNITS) - 1:
        number /= 1000
        unit += 1
    if unit == 0:
        return ""
    shown = number.quantize(Decimal("0.001"), rounding=ROUND_DOWN).normalize()
    return f"({shown:f}{_UNITS[unit]})"
