"""The optional C speedups (``_speedups.c``, issue 21): the per-entry CRC32C work of clients and
bookies in one C call each. ``pip install`` builds them where a C compiler and the Python headers
are at hand; ``native`` is the module, or None where it was not built, cannot load (a CPU
without SSE 4.2) or ``BOOKKEEPER_PY_PURE=1`` asks for the pure-Python paths, which give the same
bytes and the same errors."""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("BOOKKEEPER_PY_PURE"):
        return None
    try:
        from bookkeeper_py import _speedups
    except ImportError:
        return None
    return _speedups


native = _load()
SPEEDUPS = native is not None  # whether the C paths are in use
