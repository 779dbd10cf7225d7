"""``server.main.watch_process``: a bookie started with --stop-with-pid learns that process's
exit (a pidfd where the system has them, else a look now and then), at once if it is gone."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys

import pytest

from bookkeeper_py.server import config, main


def _exit_seen(pid_of: subprocess.Popen[bytes] | None) -> bool:
    """Watches ``pid_of`` (or a process that no longer exists), ends it; whether the exit was
    reported within 10 s."""

    if pid_of is None:
        gone = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        pid = int(gone.stdout)  # reaped: the pid names no process now (reuse aside)
    else:
        pid = pid_of.pid

    async def scenario() -> bool:
        seen = asyncio.Event()
        stop = main.watch_process(pid, seen.set)
        try:
            await asyncio.sleep(0.2)
            assert not seen.is_set() or pid_of is None  # a live process is not reported
            if pid_of is not None:
                pid_of.kill()
                await asyncio.to_thread(pid_of.wait, 30)
            await asyncio.wait_for(seen.wait(), 10)
            return True
        except TimeoutError:
            return False
        finally:
            stop()
            stop()  # twice is harmless

    return asyncio.run(scenario())


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_the_exit_of_the_watched_process_is_reported() -> None:
    with _sleeper() as child:
        assert _exit_seen(child)


def test_a_process_already_gone_is_reported_at_once() -> None:
    assert _exit_seen(None)


def test_without_pidfds_the_process_is_looked_at_now_and_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if hasattr(os, "pidfd_open"):
        monkeypatch.delattr(os, "pidfd_open")
    monkeypatch.setattr(main, "PARENT_CHECK_S", 0.05)
    with _sleeper() as child:
        assert _exit_seen(child)
    assert _exit_seen(None)


def test_a_wrong_pid_is_refused_with_one_line(tmp_path: object) -> None:
    parser = argparse.ArgumentParser()
    main.add_arguments(parser)
    args = parser.parse_args(
        ["--standalone", "--journal-dir", str(tmp_path), "--stop-with-pid", "0"]
    )
    with pytest.raises(config.ConfigError) as refused:
        main.main(args)
    assert str(refused.value) == "--stop-with-pid must be a process id (above 0), got 0"
