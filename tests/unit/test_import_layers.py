"""Importing a layer loads only that layer and the ones below it (DESIGN.md: imports only point
down). Each import runs in a fresh interpreter, so nothing an earlier test loaded can hide a
dependency."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Upper layers of the package, and the libraries only they may bring in.
NETWORK_AND_DRIVERS = (
    "asyncio",
    "ssl",
    "uvloop",
    "aiohttp",
    "kazoo",
    "sqlite3",
    "prometheus_client",
)
UPPER = (
    "bookkeeper_py.client",
    "bookkeeper_py.metadata",
    "bookkeeper_py.server",
    "bookkeeper_py.admin",
    "bookkeeper_py.testing",
    "bookkeeper_py.aio",
)

CASES = {
    # module: the package prefixes it must not load, beyond the network and the drivers
    "bookkeeper_py": (*UPPER, "bookkeeper_py.core", "bookkeeper_py.wire", "bookkeeper_py.storage"),
    "bookkeeper_py.errors": (*UPPER, "bookkeeper_py.core", "bookkeeper_py.storage"),
    "bookkeeper_py.wire.framing": (*UPPER, "bookkeeper_py.core", "bookkeeper_py.storage"),
    "bookkeeper_py.wire.v2": (*UPPER, "bookkeeper_py.core", "bookkeeper_py.storage"),
    "bookkeeper_py.wire.v3": (*UPPER, "bookkeeper_py.core", "bookkeeper_py.storage"),
    "bookkeeper_py.wire.digest": (*UPPER, "bookkeeper_py.core", "bookkeeper_py.storage"),
    "bookkeeper_py.core.writer": (*UPPER, "bookkeeper_py.storage"),
    "bookkeeper_py.core.reader": (*UPPER, "bookkeeper_py.storage"),
    "bookkeeper_py.core.recovery": (*UPPER, "bookkeeper_py.storage"),
    "bookkeeper_py.core.placement": (*UPPER, "bookkeeper_py.storage"),
    "bookkeeper_py.core.metadata": (*UPPER, "bookkeeper_py.storage"),
    "bookkeeper_py.metrics": (*UPPER, "bookkeeper_py.core", "bookkeeper_py.storage"),
    # stdlib only until a bar is drawn: storage (journal replay) reports to it too
    "bookkeeper_py.progress": (*UPPER, "bookkeeper_py.core", "bookkeeper_py.storage", "rich"),
    "bookkeeper_py.storage.engine": (*UPPER, "bookkeeper_py.core", "rich"),
    "bookkeeper_py.storage.inspect": (*UPPER, "bookkeeper_py.core"),
}


def loaded_after_import(module: str) -> list[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return list(json.loads(out.stdout))


@pytest.mark.parametrize("module", sorted(CASES))
def test_a_layer_loads_only_what_lies_below_it(module: str) -> None:
    loaded = loaded_after_import(module)
    forbidden = (*NETWORK_AND_DRIVERS, *CASES[module])
    wrong = [
        name for name in loaded if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]
    assert wrong == [], f"importing {module} loaded {wrong}"
    assert module in loaded


def test_the_top_level_names_still_load_on_first_use() -> None:
    code = (
        "import sys, bookkeeper_py; assert 'bookkeeper_py.client' not in sys.modules; "
        "from bookkeeper_py import BookKeeper, DigestType, ClientConfig, LedgerHandle; "
        "print(BookKeeper.__module__, DigestType.CRC32C.name, sorted(bookkeeper_py.__all__)[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["bookkeeper_py.client.facade", "CRC32C", "BookKeeper"]
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        import bookkeeper_py

        _ = bookkeeper_py.NoSuchName  # type: ignore[attr-defined]
