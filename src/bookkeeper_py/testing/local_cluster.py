"""``LocalCluster``: a metadata store and N bookie processes on free loopback ports.

Each bookie is a real ``python -m bookkeeper_py bookie`` process with its own journal directory.
The cluster can stop (SIGTERM), kill (SIGKILL), pause (SIGSTOP), resume (SIGCONT) and restart
each bookie, by its PID only; a restarted bookie keeps its port, id and data. ``close()`` stops
everything and removes the directory the cluster made.

Given a ``base_directory``, the cluster keeps its layout there (``localcluster.json``: the
metadata URI and each bookie's ports, so its id) and starts again on it with the same ids and
data; a lock file held while it runs refuses a second cluster on the same directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
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
from typing import IO

from bookkeeper_py.errors import BKError
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.storage.disk import prepare_directory
from bookkeeper_py.storage.files import write_atomically

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
LAYOUT_FILE = "localcluster.json"
LAYOUT_VERSION = 1
LOCK_FILE = "localcluster.lock"


class LocalClusterError(BKError, RuntimeError):
    """A local cluster cannot start: its directory is in use or holds something else, or a
    bookie exited while starting (``log_tail`` holds the end of its log)."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


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


# A local cluster's bookies share the machine's CPUs with each other and with their clients: they
# run under SCHED_BATCH (cpuSchedulingPolicy), where Linux has it, so that a request does not
# take its sender's CPU to wake its bookie (see ``server.main.apply_scheduling_policy``).
_SHARED_CPUS = ["--cpu-scheduling-policy", "batch"] if hasattr(os, "SCHED_BATCH") else []


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
        prepare_directory(self.base_directory, "cluster directory (--data-dir)")
        self._lock = self._take_lock()
        try:
            recorded = self._read_layout()
            self.metadata_uri = (
                recorded[0]
                if recorded
                else metadata_uri or f"sqlite:///{os.path.join(self.base_directory, 'metadata.db')}"
            )
            if recorded and metadata_uri and metadata_uri != self.metadata_uri:
                raise LocalClusterError(
                    f"{self.base_directory} holds a cluster on {self.metadata_uri}, not "
                    f"{metadata_uri}; use another directory"
                )
            self._bookie_args = list(bookie_args or [])
            known = recorded[1] if recorded else []
            if len(known) > num_bookies:
                raise LocalClusterError(
                    f"{self.base_directory} holds a cluster of {len(known)} bookies; start it "
                    f"with {len(known)} or more (or use another directory)"
                )
            # A bookie port and an HTTP port for each new bookie, all distinct.
            ports = free_ports(2 * (num_bookies - len(known)))
            known += [(ports[i], ports[i + 1]) for i in range(0, len(ports), 2)]
            self.bookies = [
                BookieProcess(i, port, os.path.join(self.base_directory, f"bookie-{i}"), http)
                for i, (port, http) in enumerate(known)
            ]
            if not self._owns_directory:
                self._write_layout()
        except BaseException:
            self._lock.close()
            raise

    def _take_lock(self) -> IO[str]:
        """Holds ``LOCK_FILE`` of the directory (flock) for the cluster's life."""
        path = os.path.join(self.base_directory, LOCK_FILE)
        handle = open(path, "a+")  # noqa: SIM115 (held until close())
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise LocalClusterError(
                f"{self.base_directory} is in use by another local cluster ({holder}); stop it "
                "or use another directory"
            ) from None
        handle.truncate(0)
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        return handle

    def _read_layout(self) -> tuple[str, list[tuple[int, int]]] | None:
        """The metadata URI and (port, HTTP port) of each bookie recorded in the directory."""
        path = os.path.join(self.base_directory, LAYOUT_FILE)
        try:
            with open(path, encoding="utf-8") as handle:
                layout = json.load(handle)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            raise LocalClusterError(
                f"cannot read {path}: {error}; restore it or use another directory"
            ) from None
        try:
            if layout["version"] != LAYOUT_VERSION:
                raise LocalClusterError(
                    f"{path} is of layout version {layout['version']}, this program reads "
                    f"{LAYOUT_VERSION}; use another directory"
                )
            bookies = [(int(b["port"]), int(b["http_port"])) for b in layout["bookies"]]
            return str(layout["metadata_uri"]), bookies
        except (KeyError, TypeError, ValueError) as error:
            raise LocalClusterError(
                f"{path} is damaged ({type(error).__name__}: {error}); restore it or use another "
                "directory"
            ) from None

    def _write_layout(self) -> None:
        layout = {
            "version": LAYOUT_VERSION,
            "metadata_uri": self.metadata_uri,
            "bookies": [
                {
                    "index": b.index,
                    "bookie_id": b.bookie_id,
                    "port": b.port,
                    "http_port": b.http_port,
                }
                for b in self.bookies
            ],
        }
        data = (json.dumps(layout, indent=2) + "\n").encode()
        write_atomically(os.path.join(self.base_directory, LAYOUT_FILE), data)

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
            # stopped by ``stop`` as a rule; stopped anyway if this process dies without it
            "--stop-with-pid",
            str(os.getpid()),
            *_SHARED_CPUS,
            *self._bookie_args,  # (after the defaults above: the last of an option wins)
        ]
        with open(bookie.log_file, "ab") as log_handle:
            # A session of its own: Ctrl-C at a terminal signals the program that runs the
            # cluster, which stops its bookies in order, not every bookie at once.
            bookie.process = subprocess.Popen(
                command,
                stdout=log_handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _wait_ready(self, bookie: BookieProcess) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if os.path.exists(bookie.ready_file):
                return
            if not bookie.running:
                tail = self._log_tail(bookie)
                raise LocalClusterError(
                    f"bookie {bookie.bookie_id} exited while starting: {_reason(tail)} "
                    f"(its log: {bookie.log_file})",
                    tail,
                )
            time.sleep(0.05)
        raise LocalClusterError(
            f"bookie {bookie.bookie_id} did not start within {START_TIMEOUT_S:.0f} s; "
            f"see its log: {bookie.log_file}",
            self._log_tail(bookie),
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
        self._lock.close()


def _reason(log_tail: str) -> str:
    """The bookie's own one-line error from the end of its log (else its last line)."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error: "):
            return line[len("error: ") :]
    return lines[-1] if lines else "no output"
