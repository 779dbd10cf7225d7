"""How the long-running processes run their event loop (a bookie, AutoRecovery, a benchmark's
client and its tailing reader): on uvloop where it is installed, else on asyncio's loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Runs ``coroutine`` to its end on a new loop and returns its result."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)
