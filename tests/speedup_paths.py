"""The C speedups' paths and the pure-Python ones under the same tests."""

from __future__ import annotations

from types import ModuleType

import pytest


def take_path(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str, path: str) -> None:
    """``path`` "python": ``module``'s C speedup ``name`` is set aside, so that its pure-Python
    path runs; "c": the speedup runs, and the test is skipped where it was not built."""
    if path == "python":
        monkeypatch.setattr(module, name, None)
    elif getattr(module, name) is None:
        pytest.skip("C speedups not built here")
