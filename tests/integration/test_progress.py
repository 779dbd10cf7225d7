"""Progress of long shell commands as a person and a script see it (issue 23): on a terminal a
bar with the count of the total, the rate and the time (elapsed, ETA) shows on stderr; with
stdout and stderr piped nothing but the result is printed; ``--quiet`` draws no bar on a
terminal. The terminal is a pseudo-terminal read until the command ends (bounded by a deadline);
nothing here depends on how fast the machine is."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import selectors
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator

import pytest

from bookkeeper_py import BookKeeper
from bookkeeper_py.testing import LocalCluster

pytestmark = pytest.mark.slow

SIMPLETEST_ENTRIES = 3000
LEDGER_ENTRIES = 4000
DEADLINE_S = 120.0

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
# What only a progress display prints: its escape sequences, bar cells, rate and times.
PROGRESS_MARKS = (b"\x1b[", "━".encode(), b"/s", b"ETA", b"elapsed")


def command_env() -> dict[str, str]:
    """The environment of a command on a terminal of 120 columns, whatever CI sets."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS")
    }
    env.update(TERM="xterm-256color", PYTHONIOENCODING="utf-8")
    return env


def shell(*args: str) -> list[str]:
    return [sys.executable, "-m", "bookkeeper_py", "shell", *args]


def run_on_terminal(argv: list[str], *, stdout_too: bool) -> tuple[int, bytes, bytes]:
    """Runs ``argv`` with stderr (and stdout if ``stdout_too``) on a pseudo-terminal, else
    stdout on a pipe; (exit status, what stdout got, what the terminal got)."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=terminal if stdout_too else subprocess.PIPE,
        stderr=terminal,
        env=command_env(),
    )
    os.close(terminal)
    on_terminal, on_stdout = bytearray(), bytearray()
    selector = selectors.DefaultSelector()
    selector.register(controller, selectors.EVENT_READ, on_terminal)
    if process.stdout is not None:
        selector.register(process.stdout.fileno(), selectors.EVENT_READ, on_stdout)
    deadline = time.monotonic() + DEADLINE_S
    try:
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                process.kill()
                pytest.fail(f"{argv} still running after {DEADLINE_S} s: {bytes(on_terminal)!r}")
            for key, _ in selector.select(min(left, 1.0)):
                try:
                    chunk = os.read(key.fd, 65536)
                except OSError:  # EIO: the terminal's last writer closed it
                    chunk = b""
                if chunk:
                    key.data.extend(chunk)
                else:
                    selector.unregister(key.fd)
        status = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        selector.close()
        os.close(controller)
        if process.stdout is not None:
            process.stdout.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    return status, bytes(on_stdout), bytes(on_terminal)


def run_piped(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        argv,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=DEADLINE_S,
        env=command_env(),
        check=False,
    )


def plain(drawn: bytes) -> str:
    """The terminal's text without escape sequences and carriage returns."""
    return ANSI.sub(b"", drawn).decode("utf-8", errors="replace")


def assert_progress_shown(drawn: bytes, description: str, total: int, unit: str) -> None:
    text = plain(drawn)
    assert description in text, text
    assert re.search(rf"\d[\d,]*/{total:,} {unit}", text), text  # count of the total
    assert f"{total:,}/{total:,} {unit}" in text, text  # and the end reached
    assert re.search(rf"\d[\d,.]* {unit}/s", text), text  # the rate
    assert re.search(r"(elapsed|ETA) \d+:\d\d:\d\d", text), text  # the time


def assert_no_progress(output: bytes) -> None:
    for mark in PROGRESS_MARKS:
        assert mark not in output, output


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, int]]:
    """A 3-bookie cluster and a closed ledger of LEDGER_ENTRIES entries on it."""
    with LocalCluster(3) as local, BookKeeper(local.metadata_uri) as client:
        handle = client.create_ledger(3, 2, 2, password=b"progress")
        futures = [handle.add_entry_async(b"e%05d" % i) for i in range(LEDGER_ENTRIES)]
        assert [future.result(timeout=60) for future in futures][-1] == LEDGER_ENTRIES - 1
        handle.close()
        yield local.metadata_uri, handle.ledger_id


SIMPLETEST_RESULT = re.compile(
    rb"ledger \d+: wrote 3000 entries \(3,072,000 bytes\) in \d+\.\d\d s, "
    rb"read and verified them in \d+\.\d\d s\n"
)


def test_simpletest_shows_its_progress_on_a_terminal(cluster: tuple[str, int]) -> None:
    uri, _ = cluster
    argv = shell("simpletest", "--metadata-uri", uri, "-n", str(SIMPLETEST_ENTRIES))
    status, _, drawn = run_on_terminal(argv, stdout_too=True)
    assert status == 0, drawn
    assert_progress_shown(drawn, "writing entries", SIMPLETEST_ENTRIES, "entries")
    assert_progress_shown(drawn, "reading entries", SIMPLETEST_ENTRIES, "entries")
    assert SIMPLETEST_RESULT.search(ANSI.sub(b"", drawn).replace(b"\r\n", b"\n"))


def test_simpletest_piped_prints_the_result_alone(cluster: tuple[str, int]) -> None:
    uri, _ = cluster
    done = run_piped(shell("simpletest", "--metadata-uri", uri, "-n", str(SIMPLETEST_ENTRIES)))
    assert done.returncode == 0, done.stderr
    assert SIMPLETEST_RESULT.fullmatch(done.stdout), done.stdout
    assert_no_progress(done.stderr)


def test_simpletest_quiet_draws_no_bar_on_a_terminal(cluster: tuple[str, int]) -> None:
    uri, _ = cluster
    argv = shell("simpletest", "--metadata-uri", uri, "-n", str(SIMPLETEST_ENTRIES), "--quiet")
    status, _, drawn = run_on_terminal(argv, stdout_too=True)
    assert status == 0, drawn
    text = ANSI.sub(b"", drawn).replace(b"\r\n", b"\n")
    assert SIMPLETEST_RESULT.fullmatch(text), drawn
    assert_no_progress(drawn)


def expected_listing(ledger_id: int) -> bytes:
    return b"".join(
        b"--------- Lid=%d, Eid=%d, EntrySize=6 ---------\n" % (ledger_id, entry_id)
        for entry_id in range(LEDGER_ENTRIES)
    )


def test_readledger_to_a_file_shows_its_progress_on_the_terminal(
    cluster: tuple[str, int],
) -> None:
    uri, ledger_id = cluster
    argv = shell("readledger", "--metadata-uri", uri, "-l", str(ledger_id))
    status, listing, drawn = run_on_terminal(argv, stdout_too=False)
    assert status == 0, drawn
    assert listing == expected_listing(ledger_id)
    assert_progress_shown(drawn, f"reading ledger {ledger_id}", LEDGER_ENTRIES, "entries")


def test_readledger_piped_prints_the_entries_alone(cluster: tuple[str, int]) -> None:
    uri, ledger_id = cluster
    done = run_piped(shell("readledger", "--metadata-uri", uri, "-l", str(ledger_id)))
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected_listing(ledger_id)
    assert_no_progress(done.stderr)
    raw = run_piped(shell("readledger", "--metadata-uri", uri, "-l", str(ledger_id), "-ef", "raw"))
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout == b"".join(b"e%05d" % i for i in range(LEDGER_ENTRIES))
    assert_no_progress(raw.stderr)


def test_readledger_on_the_terminal_draws_no_bar_between_its_lines(
    cluster: tuple[str, int],
) -> None:
    uri, ledger_id = cluster
    argv = shell("readledger", "--metadata-uri", uri, "-l", str(ledger_id), "-le", "99")
    status, _, drawn = run_on_terminal(argv, stdout_too=True)
    assert status == 0, drawn
    assert plain(drawn).count("EntrySize=6") == 100
    assert_no_progress(drawn)
