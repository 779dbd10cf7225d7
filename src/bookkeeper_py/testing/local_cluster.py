"""``LocalCluster``: a metadata store and N bookie processes on free loopback ports.

Each bookie is a real ``python -m bookkeeper_py bookie`` process with its own journal directory.
The cluster can stop (SIGTERM), kill (SIGKILL), pause (SIGSTOP), resume (SIGCONT) and restart
each bookie, by its PID only; a restarted bookie keeps its port, id and data. ``close()`` stops
everything and removes the directory the cluster made.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from bookkeeper_py.metadata.manager import MetadataClient

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports that were free on ``host`` a moment ago: held open together
    while they are picked, so that the system cannot hand out one of them twice (two ports probed
    one after the other can be the same)."""
    with contextlib.ExitStack() as stack:
        probes = [
            stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            for _ in range(count)
        ]
        for probe in probes:
            probe.bind((host, 0))
        return [int(probe.getsockname()[1]) for probe in probes]


@dataclass
class BookieProcess:
    """One bookie of the cluster."""

    index: int
    port: int
    directory: str
    http_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def journal_directory(self) -> str:
        return os.path.join(self.directory, "journal")

    @property
    def ready_file(self) -> str:
        return os.path.join(self.directory, "ready")

    @property
    def log_file(self) -> str:
        return os.path.join(self.directory, "bookie.log")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class LocalCluster:
    """Metadata + ``num_bookies`` bookie processes on loopback; a context manager."""

    def __init__(
        self,
        num_bookies: int = 3,
        *,
        metadata_uri: str | None = None,
        base_directory: str | None = None,
        bookie_args: list[str] | None = None,
    ) -> None:
        self._owns_directory = base_directory is None
        self.base_directory = os.path.abspath(
            base_directory or tempfile.mkdtemp(prefix="bk-cluster-")
        )
        os.makedirs(self.base_directory, exist_ok=True)
        self.metadata_uri = (
            metadata_uri or f"sqlite:///{os.path.join(self.base_directory, 'metadata.db')}"
        )
        self._bookie_args = list(bookie_args or [])
        ports = free_ports(2 * num_bookies)  # a bookie port and an HTTP port each, all distinct
        self.bookies = [
            BookieProcess(
                i,
                ports[2 * i],
                os.path.join(self.base_directory, f"bookie-{i}"),
                ports[2 * i + 1],
            )
            for i in range(num_bookies)
        ]

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def bookie_ids(self) -> list[str]:
        return [bookie.bookie_id for bookie in self.bookies]

    def start(self) -> None:
        """Creates the metadata store and starts every bookie; returns once all are registered."""
        metadata = MetadataClient.connect(self.metadata_uri, create=True)
        try:
            metadata.init_cluster()
        finally:
            metadata.close()
        try:
            for bookie in self.bookies:
                self._spawn(bookie)
            for bookie in self.bookies:
                self._wait_ready(bookie)
        except BaseException:
            self.close()
            raise

    def _spawn(self, bookie: BookieProcess) -> None:
        os.makedirs(bookie.journal_directory, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bookie.ready_file)
        command = [
            sys.executable,
            "-m",
            "bookkeeper_py",
            "bookie",
            "--metadata-uri",
            self.metadata_uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(bookie.port),
            "--journal-dir",
            bookie.journal_directory,
            "--ready-file",
            bookie.ready_file,
            "--http-port",
            str(bookie.http_port),
            *self._bookie_args,
        ]
        with open(bookie.log_file, "ab") as log_handle:
            bookie.process = subprocess.Popen(
                command, stdout=log_handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def _wait_ready(self, bookie: BookieProcess) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if os.path.exists(bookie.ready_file):
                return
            if not bookie.running:
                raise RuntimeError(
                    f"bookie {bookie.bookie_id} exited while starting; its log:\n{self._log_tail(bookie)}"
                )
            time.sleep(0.05)
        raise RuntimeError(
            f"bookie {bookie.bookie_id} did not start within {START_TIMEOUT_S:.0f} s; "
            f"its log:\n{self._log_tail(bookie)}"
        )

    @staticmethod
    def _log_tail(bookie: BookieProcess, lines: int = 30) -> str:
        try:
            with open(bookie.log_file, encoding="utf-8", errors="replace") as handle:
                return "".join(handle.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def _signal(self, index: int, signum: int) -> BookieProcess:
        bookie = self.bookies[index]
        if not bookie.running:
            raise RuntimeError(f"bookie {bookie.bookie_id} is not running")
        assert bookie.process is not None
        os.kill(bookie.process.pid, signum)
        return bookie

    def stop_bookie(self, index: int) -> None:
        """Stops a bookie gracefully (SIGTERM), killing it if it does not exit in time."""
        bookie = self.bookies[index]
        if not bookie.running:
            return
        assert bookie.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(bookie.process.pid, signal.SIGCONT)  # a paused bookie cannot handle SIGTERM
        self._signal(index, signal.SIGTERM)
        try:
            bookie.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning(
                "bookie %s ignored SIGTERM for %.0f s; killing it", bookie.bookie_id, STOP_TIMEOUT_S
            )
            bookie.process.kill()
            bookie.process.wait()

    def kill_bookie(self, index: int) -> None:
        """Kills a bookie with SIGKILL: no shutdown code runs."""
        bookie = self._signal(index, signal.SIGKILL)
        assert bookie.process is not None
        bookie.process.wait()

    def pause_bookie(self, index: int) -> None:
        """Freezes a bookie (SIGSTOP); its connections stay open but it answers nothing."""
        self._signal(index, signal.SIGSTOP)

    def resume_bookie(self, index: int) -> None:
        self._signal(index, signal.SIGCONT)

    def start_bookie(self, index: int) -> None:
        """Starts a stopped bookie again with the same port, id and data."""
        bookie = self.bookies[index]
        if bookie.running:
            raise RuntimeError(f"bookie {bookie.bookie_id} is already running")
        self._spawn(bookie)
        self._wait_ready(bookie)

    def restart_bookie(self, index: int, *, kill: bool = False) -> None:
        (self.kill_bookie if kill else self.stop_bookie)(index)
        self.start_bookie(index)

    def close(self) -> None:
        """Stops every bookie and removes the cluster's directory if the cluster made it."""
        for bookie in self.bookies:
            try:
                self.stop_bookie(bookie.index)
            except (RuntimeError, ProcessLookupError):
                pass
        if self._owns_directory:
            shutil.rmtree(self.base_directory, ignore_errors=True)
