"""The real Apache BookKeeper 4.14.8 (Java) of ``../shared/java-bookkeeper``, driven from tests.

- ``JavaKit``: where the kit is, its shell (``BookieShell``) and its class path.
- ``JavaBookie``: a Java bookie process on loopback, started and stopped by its PID.
- ``JavaClient``: ``java/InteropDriver.java`` (compiled once per session) as a long-lived process:
  requests as JSON lines, answered concurrently, so that a Java long poll can wait while another
  request adds entries.

Entries written through the driver with a prefix ``P`` hold ``f"{P}:{i}"``; ``entry_data`` makes
the same bytes on our side.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import itertools
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bookkeeper_py.metadata.manager import MetadataClient

REPOSITORY = Path(__file__).resolve().parents[2]
DRIVER_SOURCE = Path(__file__).resolve().parent / "java" / "InteropDriver.java"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
REQUEST_TIMEOUT_S = 90.0


class JavaKitMissingError(RuntimeError):
    """The kit or the OS packages it runs on are not installed."""


def entry_data(prefix: str, entry_id: int) -> bytes:
    """The bytes of entry ``entry_id`` written with ``prefix`` (by either side)."""
    return f"{prefix}:{entry_id}".encode()


class JavaKit:
    """Apache BookKeeper 4.14.8 (Java): ``$BOOKKEEPER_JAVA_KIT`` or ``../shared/java-bookkeeper``
    beside the repository."""

    def __init__(self) -> None:
        self.home = Path(
            os.environ.get("BOOKKEEPER_JAVA_KIT", REPOSITORY.parent / "shared" / "java-bookkeeper")
        )
        self.jar = self.home / "lib" / "bookkeeper-4.14.8.jar"
        if not self.jar.is_file():
            raise JavaKitMissingError(
                f"the Java BookKeeper kit is not at {self.home}; put ../shared beside the "
                "repository or set BOOKKEEPER_JAVA_KIT, then run scripts/test.sh"
            )
        if not Path("/usr/share/java/commons-configuration.jar").is_file():
            raise JavaKitMissingError(
                f"the Java libraries the kit runs on are missing; run: bash {self.home}/setup.sh"
            )

    def command(self, main_class: str, *args: str) -> list[str]:
        return [str(self.home / "bin" / "bkj"), main_class, *args]

    def shell(self, metadata_uri: str, *args: str, timeout: float = 120.0) -> str:
        """Runs ``BookieShell`` with ``metadataServiceUri``; returns its log (the shell prints
        its results through its logger). Its exit status is not reliable (``simpletest`` that
        failed exits 0), so callers check the output."""
        with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as conf:
            conf.write(f"metadataServiceUri={metadata_uri}\n")
        try:
            done = subprocess.run(
                self.command("org.apache.bookkeeper.bookie.BookieShell", "-conf", conf.name, *args),
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "BK_LOG_LEVEL": "INFO"},
            )
        finally:
            os.unlink(conf.name)
        return done.stdout + done.stderr

    def compile_driver(self, directory: str) -> str:
        """Compiles ``InteropDriver.java`` into ``directory``; returns the directory."""
        subprocess.run(
            [
                "javac",
                "-nowarn",
                "-d",
                directory,
                "-cp",
                f"{self.jar}:/usr/share/java/*",
                str(DRIVER_SOURCE),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        return directory


class JavaBookie:
    """A Java bookie (``bin/java-bookie``) on 127.0.0.1:``port``; a context manager."""

    def __init__(
        self, kit: JavaKit, metadata_uri: str, port: int, directory: str, storage: str = "sorted"
    ) -> None:
        self.kit = kit
        self.metadata_uri = metadata_uri
        self.port = port
        self.directory = directory
        self.storage = storage
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> str:
        return os.path.join(self.directory, "bookie.log")

    def start(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.kit.home / "bin" / "java-bookie"),
                    self.metadata_uri,
                    str(self.port),
                    self.directory,
                    self.storage,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_registered(self, metadata: MetadataClient) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.bookie_id in metadata.writable_bookies():
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"Java bookie {self.bookie_id} exited: {self.log_tail()}")
            time.sleep(0.1)
        raise RuntimeError(f"Java bookie {self.bookie_id} did not register: {self.log_tail()}")

    def log_tail(self, size: int = 3000) -> str:
        with open(self.log_file, "rb") as log:
            return log.read()[-size:].decode(errors="replace")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.running:
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited in time."""
        if not self.running:
            return
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()


class JavaError(Exception):
    """A request the Java client failed: ``kind`` is the exception class, ``code`` the
    BKException code (0 for other exceptions)."""

    def __init__(self, kind: str, code: int, message: str) -> None:
        super().__init__(f"{kind} ({code}): {message}")
        self.kind = kind
        self.code = code


class JavaClient:
    """Apache BookKeeper's Java client, through ``InteropDriver``; a context manager.

    ``call(op, **args)`` waits for the answer; ``submit(op, **args)`` returns a future.
    """

    def __init__(self, kit: JavaKit, classes: str, log_file: str) -> None:
        self._ids = itertools.count(1)
        self._handles = itertools.count()
        self._pending: dict[int, concurrent.futures.Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._ready: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        self._pending[0] = self._ready
        self._log = open(log_file, "ab")  # noqa: SIM115 (closed by close())
        self.process = subprocess.Popen(
            kit.command("InteropDriver"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, "BKJ_EXTRA_CLASSPATH": classes},
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read_answers, daemon=True)
        self._reader.start()
        self._ready.result(START_TIMEOUT_S)

    def _read_answers(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            answer = json.loads(line)
            with self._lock:
                future = self._pending.pop(int(answer["id"]), None)
            if future is not None:
                future.set_result(answer)
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(RuntimeError("the Java driver exited"))

    def submit(self, op: str, **args: Any) -> concurrent.futures.Future[dict[str, Any]]:
        request_id = next(self._ids)
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        with self._lock:
            self._pending[request_id] = future
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"id": request_id, "op": op, **args}).encode() + b"\n")
        self.process.stdin.flush()
        return future

    @staticmethod
    def result(
        future: concurrent.futures.Future[dict[str, Any]], timeout: float = REQUEST_TIMEOUT_S
    ) -> dict[str, Any]:
        answer = future.result(timeout)
        if "error" in answer:
            raise JavaError(answer["error"], int(answer["code"]), answer["message"])
        return answer

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        return self.result(self.submit(op, **args))

    def create_ledger(
        self,
        uri: str,
        *,
        digest: str,
        password: str,
        quorums: tuple[int, int, int] = (3, 2, 2),
        v3: bool = True,
        explicit_lac_ms: int = 0,
    ) -> tuple[str, int]:
        """A new ledger (``createLedger``): the driver's handle for it, and its id."""
        handle = f"h{next(self._handles)}"
        answer = self.call(
            "create",
            handle=handle,
            uri=uri,
            v3=v3,
            explicitLacMs=explicit_lac_ms,
            digest=digest,
            password=password,
            ensemble=quorums[0],
            writeQuorum=quorums[1],
            ackQuorum=quorums[2],
        )
        return handle, int(answer["ledgerId"])

    def open_ledger(
        self,
        uri: str,
        ledger_id: int,
        *,
        digest: str,
        password: str,
        recovery: bool = True,
        v3: bool = True,
    ) -> tuple[str, dict[str, Any]]:
        """``openLedger`` (fences and recovers) or ``openLedgerNoRecovery``: the driver's handle,
        and what the handle knows (``lac``, ``closed``, ``length``)."""
        handle = f"h{next(self._handles)}"
        answer = self.call(
            "open",
            handle=handle,
            uri=uri,
            v3=v3,
            digest=digest,
            password=password,
            ledgerId=ledger_id,
            recovery=recovery,
        )
        return handle, answer

    def read(self, handle: str, first: int, last: int) -> list[bytes]:
        answer = self.call("read", handle=handle, first=first, last=last)
        return [base64.b64decode(entry["data"]) for entry in answer["entries"]]

    def close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._reader.join(STOP_TIMEOUT_S)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()

    def __enter__(self) -> JavaClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
