"""Cookie format and the start-up decision (reference section 1.10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bookkeeper_py.storage.cookie import (
    Cookie,
    InvalidCookieError,
    read_local,
    verify_or_create,
    write_local,
)


class Store:
    def __init__(self) -> None:
        self.cookies: dict[str, Cookie] = {}

    def read(self, bookie_id: str) -> Cookie | None:
        return self.cookies.get(bookie_id)

    def create(self, cookie: Cookie) -> None:
        assert cookie.bookie_id not in self.cookies
        self.cookies[cookie.bookie_id] = cookie


def cookie(tmp_path: Path, **changes: object) -> Cookie:
    base: dict[str, object] = dict(
        bookie_id="127.0.0.1:3181",
        journal_dirs=(str(tmp_path / "journal"),),
        ledger_dirs=(str(tmp_path / "ledgers"),),
        instance_id="6a1b",
    )
    base.update(changes)
    return Cookie(**base)  # type: ignore[arg-type]


def test_text_format_as_bookkeeper_writes_it(tmp_path: Path) -> None:
    c = cookie(tmp_path, journal_dirs=("/j",), ledger_dirs=("/l1", "/l2"))
    assert c.encode() == (
        b'5\nbookieHost: "127.0.0.1:3181"\njournalDir: "/j"\nledgerDirs: "2\\t/l1\\t/l2"\ninstanceId: "6a1b"\n'
    )
    assert Cookie.decode(c.encode(), "x") == c
    with pytest.raises(InvalidCookieError, match="unreadable"):
        Cookie.decode(b"5\nbookieHost: 7", "x")


def test_new_bookie_gets_cookies_and_restarts_cleanly(tmp_path: Path) -> None:
    store = Store()
    expected = cookie(tmp_path)
    dirs = [expected.journal_dirs[0], expected.ledger_dirs[0]]
    assert verify_or_create(expected, dirs, store) is True
    assert (
        all(read_local(d) == expected for d in dirs)
        and store.cookies[expected.bookie_id] == expected
    )
    assert verify_or_create(expected, dirs, store) is False


def test_a_bookie_with_another_identity_finds_no_cookie_in_metadata(tmp_path: Path) -> None:
    store = Store()
    original = cookie(tmp_path)
    dirs = [original.journal_dirs[0], original.ledger_dirs[0]]
    verify_or_create(original, dirs, store)
    with pytest.raises(InvalidCookieError, match="metadata store has none"):
        verify_or_create(cookie(tmp_path, bookie_id="127.0.0.1:3182"), dirs, store)


def test_a_metadata_cookie_of_another_cluster_is_refused(tmp_path: Path) -> None:
    store = Store()
    original = cookie(tmp_path)
    dirs = [original.journal_dirs[0], original.ledger_dirs[0]]
    verify_or_create(original, dirs, store)
    store.cookies[original.bookie_id] = cookie(tmp_path, instance_id="other")
    with pytest.raises(InvalidCookieError, match="instance_id 'other' instead of '6a1b'"):
        verify_or_create(original, dirs, store)


def test_an_emptied_directory_is_refused(tmp_path: Path) -> None:
    store = Store()
    expected = cookie(tmp_path)
    dirs = [expected.journal_dirs[0], expected.ledger_dirs[0]]
    verify_or_create(expected, dirs, store)
    (tmp_path / "ledgers" / "current" / "VERSION").unlink()
    with pytest.raises(InvalidCookieError, match=r"has no cookie .* empty or was replaced"):
        verify_or_create(expected, dirs, store)


def test_a_directory_from_another_bookie_is_refused(tmp_path: Path) -> None:
    store = Store()
    expected = cookie(tmp_path)
    dirs = [expected.journal_dirs[0], expected.ledger_dirs[0]]
    verify_or_create(expected, dirs, store)
    write_local(dirs[0], cookie(tmp_path, bookie_id="127.0.0.1:9999"))
    with pytest.raises(InvalidCookieError, match=r"belongs elsewhere: bookie_id '127.0.0.1:9999'"):
        verify_or_create(expected, dirs, store)


def test_data_without_any_cookie_is_refused(tmp_path: Path) -> None:
    expected = cookie(tmp_path)
    (tmp_path / "journal").mkdir()
    (tmp_path / "journal" / "0000000000000000.txn").write_bytes(b"PBKJ")
    with pytest.raises(InvalidCookieError, match="hold bookie data but no cookie"):
        verify_or_create(expected, [expected.journal_dirs[0], expected.ledger_dirs[0]], Store())


def test_several_journal_directories_are_encoded_like_ledger_directories(tmp_path: Path) -> None:
    c = cookie(tmp_path, journal_dirs=("/j1", "/j2"))
    assert b'journalDir: "2\\t/j1\\t/j2"' in c.encode()
    assert Cookie.decode(c.encode(), "x") == c
