"""The C speedups of CRC32C entries (``_speedups.c``) against the pure-Python path: the
same bytes packaged, the same payloads accepted, the same entries refused (with the pure path's
error). Where a C compiler and an x86-64 CPU are at hand (CI), the speedups must have been built
by the install, so that the suite runs on them."""

from __future__ import annotations

import platform
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper_py import errors, speedups
from bookkeeper_py.wire import digest
from bookkeeper_py.wire.digest import DigestManager, DigestType

needs_speedups = pytest.mark.skipif(not speedups.SPEEDUPS, reason="C speedups not built here")


def pure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digest, "_c_payload", None)
    monkeypatch.setattr(digest, "_c_package", None)


@pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("cc") is None,
    reason="no C compiler or not x86-64: the pure path is the one in use",
)
def test_the_install_built_the_speedups_where_it_can() -> None:
    assert speedups.SPEEDUPS


@needs_speedups
@given(
    ledger_id=st.integers(0, 2**63 - 1),
    entry_id=st.integers(0, 2**63 - 1),
    lac=st.integers(-1, 2**63 - 1),
    length=st.integers(0, 2**63 - 1),
    payload=st.binary(max_size=3000),
)
def test_c_and_python_package_and_check_entries_alike(
    ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes
) -> None:
    manager = DigestManager(ledger_id, DigestType.CRC32C, b"pw")
    packaged = manager.package(entry_id, lac, length, payload)
    with pytest.MonkeyPatch.context() as patch:
        pure(patch)
        assert manager.package(entry_id, lac, length, payload) == packaged
        assert manager.payload(packaged, entry_id) == payload
    assert manager.payload(packaged, entry_id) == payload
    assert manager.verify(packaged, entry_id).payload == payload


@needs_speedups
@pytest.mark.parametrize(
    "damage",
    ["payload bit", "digest bit", "header bit", "other entry", "other ledger", "too short"],
)
def test_c_and_python_refuse_the_same_entries_with_the_same_error(damage: str) -> None:
    manager = DigestManager(7, DigestType.CRC32C, b"pw")
    good = manager.package(3, 2, 100, b"x" * 100)
    bad, entry_id = bytearray(good), 3
    if damage == "payload bit":
        bad[-1] ^= 1
    elif damage == "digest bit":
        bad[33] ^= 1
    elif damage == "header bit":
        bad[20] ^= 1
    elif damage == "other entry":
        entry_id = 4
    elif damage == "other ledger":
        bad = bytearray(DigestManager(8, DigestType.CRC32C, b"pw").package(3, 2, 100, b"x" * 100))
    else:
        bad = bad[:30]
    with pytest.raises(errors.DigestMismatchError) as c_error:
        manager.payload(bytes(bad), entry_id)
    with pytest.MonkeyPatch.context() as patch:
        pure(patch)
        with pytest.raises(errors.DigestMismatchError) as python_error:
            manager.payload(bytes(bad), entry_id)
    assert str(c_error.value) == str(python_error.value)


@needs_speedups
def test_the_speedups_take_any_buffer_and_leave_other_digests_to_python() -> None:
    manager = DigestManager(7, DigestType.CRC32C, b"pw")
    packaged = manager.package(1, 0, 5, b"hello")
    assert manager.payload(memoryview(bytearray(packaged)), 1) == b"hello"  # type: ignore[arg-type]
    for kind in (DigestType.CRC32, DigestType.MAC, DigestType.DUMMY):
        other = DigestManager(7, kind, b"pw")
        assert other.payload(other.package(1, 0, 5, b"hello"), 1) == b"hello"
