"""A bookie's AutoRecovery (``autoRecoveryDaemonEnabled=true``) in a child process: the
``bookkeeper autorecovery`` process, named after the bookie, started and watched by it.

Why a process: copying a lost bookie's data is CPU work (reading the copies' answers, checking
their digests, sending them on), and in the bookie's own event loop (or a thread of it, under
the GIL) it delays the bookie's answers to its live writers; the bookie's own part of the copies
is background work already (``Bookie.in_background``). Java's bookies run AutoRecovery on
threads of their own; Python's equivalent that the operating system can schedule apart is a
process.

* The child dies with the bookie (``--parent-pid``: ``PR_SET_PDEATHSIG`` on Linux, set by the
  child itself): a killed bookie leaves no AutoRecovery behind, and its vote (named after the
  bookie, whose address now refuses connections) is withdrawn by the other candidates at once.
* A child that exits while the bookie runs is started again, after a pause that doubles up to a
  minute; a stopping bookie stops it (SIGTERM: it releases its locks and vote) before it stops
  serving.
* Its metrics (``auditor_*``, ``replication_worker_*``) are served on a Unix socket of its own
  and appended to the bookie's ``/metrics``, where BookKeeper's dashboards read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import sys
import tempfile

import aiohttp

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 15.0
RESTART_PAUSE_S = 1.0
MAX_RESTART_PAUSE_S = 60.0
METRICS_TIMEOUT_S = 2.0
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """In the child: SIGKILL when ``parent_pid`` ends (Linux's ``PR_SET_PDEATHSIG``); exits at
    once if it already has (the child was reparented before it could ask)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # elsewhere: the child outlives a killed bookie until its session ends
    if os.getppid() != parent_pid:
        raise SystemExit(f"autorecovery: the bookie that started it (pid {parent_pid}) is gone")


class AutoRecoveryChild:
    """Runs ``bookkeeper autorecovery --name NAME ARGUMENTS`` while started."""

    def __init__(self, name: str, arguments: list[str]) -> None:
        self.name = name
        self.arguments = arguments
        self._directory = tempfile.mkdtemp(prefix="bk-autorecovery-")
        self.metrics_socket = os.path.join(self._directory, "metrics.sock")
        self._process: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.starts = 0

    async def start(self) -> None:
        self._task = asyncio.ensure_future(self._supervise())

    async def _spawn(self) -> asyncio.subprocess.Process:
        self.starts += 1
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bookkeeper_py",
            "autorecovery",
            "--name",
            self.name,
            "--metrics-socket",
            self.metrics_socket,
            "--parent-pid",
            str(os.getpid()),
            *self.arguments,
            stdin=asyncio.subprocess.DEVNULL,
        )

    async def _supervise(self) -> None:
        pause = RESTART_PAUSE_S
        while not self._stopping:
            self._process = await self._spawn()
            log.info("autorecovery %s: started as process %d", self.name, self._process.pid)
            code = await self._process.wait()
            if self._stopping:
                return
            log.warning(
                "autorecovery %s: its process %d exited with %d; starting it again in %.0f s",
                self.name,
                self._process.pid,
                code,
                pause,
            )
            await asyncio.sleep(pause)
            pause = min(pause * 2, MAX_RESTART_PAUSE_S)

    async def stop(self) -> None:
        """Stops the child (SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``) for good."""
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("autorecovery %s: did not stop in time; killed", self.name)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        shutil.rmtree(self._directory, ignore_errors=True)

    async def metrics(self) -> bytes:
        """The child's metrics in Prometheus' text format; empty while it cannot answer."""
        try:
            connector = aiohttp.UnixConnector(path=self.metrics_socket)
            timeout = aiohttp.ClientTimeout(total=METRICS_TIMEOUT_S)
            async with (
                aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
                session.get("http://autorecovery/metrics") as response,
            ):
                if response.status != 200:
                    return b""
                return await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            log.debug("autorecovery %s: no metrics (%s)", self.name, error)
            return b""
