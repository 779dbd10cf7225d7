"""The optional C speedups (``_speedups.c``, issue 21): the per-entry CRC32C work of clients and
bookies in one C call each. ``pip install`` builds them where a C compiler and the Python headers
are at hand; ``native`` is the module, or None where it was not built, cannot load (a CPU
without SSE 4.2), was built from an older ``_speedups.c`` than this code (a name the code uses is
missing: a warning says how to rebuild it) or ``BOOKKEEPER_PY_PURE=1`` asks for the pure-Python
paths, which give the same bytes and the same errors."""

from __future__ import annotations

import logging
import os
from types import ModuleType

# Every name of the C module the Python code uses (``native.NAME`` across the package).
REQUIRED = (
    "JournalSyncer",
    "LatencyBuckets",
    "cache_add_new",
    "complete_adds",
    "crc32c_batch_entries",
    "crc32c_package",
    "crc32c_package_run",
    "crc32c_payload",
    "cut_plain_adds",
    "entry_log_frame",
    "entry_log_pick",
    "entry_log_record",
    "group_adds",
    "index_pairs",
    "journal_group",
    "pending_ack",
    "pending_done",
    "split_frames",
    "stripe_answers",
    "take_plain_adds",
    "take_plain_reads",
    "v2_answers",
    "v2_batch_answer",
    "v2_register",
    "v2_register_reads",
    "v2_take_answers",
)

log = logging.getLogger(__name__)


def _load() -> ModuleType | None:
    if os.environ.get("BOOKKEEPER_PY_PURE"):
        return None
    try:
        from bookkeeper_py import _speedups
    except ImportError:
        return None
    missing = [name for name in REQUIRED if not hasattr(_speedups, name)]
    if missing:
        log.warning(
            "the C speedups in %s were built from an older _speedups.c (no %s): the pure-Python "
            "paths are used; rebuild them with `pip install -e .` (or `python setup.py "
            "build_ext --inplace` in a source checkout)",
            getattr(_speedups, "__file__", "bookkeeper_py._speedups"),
            ", ".join(missing),
        )
        return None
    return _speedups


native = _load()
SPEEDUPS = native is not None  # whether the C paths are in use
