"""``ZooKeeperServer``: a real standalone ZooKeeper process on a free loopback port, for tests.

It runs ``org.apache.zookeeper.server.ZooKeeperServerMain`` from the jars of the operating
system's ZooKeeper package (Debian: ``apt-get install zookeeper``), or from the class path in
$ZOOKEEPER_CLASSPATH. It can be stopped and started again on the same port and data, and is
killed by its PID only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import TYPE_CHECKING

from bookkeeper_py.testing.local_cluster import free_port

if TYPE_CHECKING:
    from bookkeeper_py.metadata.zookeeper import ZooKeeperStore

DEFAULT_CLASSPATH = "/usr/share/java/zookeeper.jar:/etc/zookeeper/conf"
START_TIMEOUT_S = 60.0


class ZooKeeperNotInstalledError(RuntimeError):
    """No Java or no ZooKeeper jars on this machine."""


def zookeeper_classpath() -> str:
    classpath = os.environ.get("ZOOKEEPER_CLASSPATH", DEFAULT_CLASSPATH)
    jars = [part for part in classpath.split(":") if part.endswith(".jar")]
    if shutil.which("java") is None or not jars or not all(os.path.exists(jar) for jar in jars):
        raise ZooKeeperNotInstalledError(
            "a real ZooKeeper server is needed: install Java and ZooKeeper "
            "(apt-get install default-jre-headless zookeeper) or set ZOOKEEPER_CLASSPATH"
        )
    return classpath


class ZooKeeperServer:
    """A standalone ZooKeeper on 127.0.0.1; a context manager."""

    def __init__(self, directory: str | None = None, port: int | None = None) -> None:
        self._classpath = zookeeper_classpath()
        self._owns_directory = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="bk-zookeeper-")
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def connect_string(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metadata_uri(self, root: str = "/ledgers") -> str:
        return f"zk+hierarchical://{self.connect_string}{root}"

    def __enter__(self) -> ZooKeeperServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        data = os.path.join(self.directory, "data")
        os.makedirs(data, exist_ok=True)
        config = os.path.join(self.directory, "zoo.cfg")
        with open(config, "w") as handle:
            handle.write(
                f"tickTime=500\ndataDir={data}\nclientPort={self.port}\nclientPortAddress=127.0.0.1\n"
                "admin.enableServer=false\nmaxClientCnxns=0\nminSessionTimeout=1000\nmaxSessionTimeout=30000\n"
            )
        log_path = os.path.join(self.directory, "zookeeper.log")
        with open(log_path, "ab") as log_handle:
            self._process = subprocess.Popen(
                [
                    "java",
                    "-Xmx256m",
                    "-cp",
                    self._classpath,
                    f"-Dzookeeper.log.dir={self.directory}",
                    "org.apache.zookeeper.server.ZooKeeperServerMain",
                    config,
                ],
                stdout=log_handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                with open(log_path, errors="replace") as handle:
                    raise RuntimeError(f"ZooKeeper exited at start:\n{handle.read()[-3000:]}")
            if self._answers():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"ZooKeeper did not answer on port {self.port} within {START_TIMEOUT_S:.0f} s"
        )

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as connection:
                connection.sendall(b"srvr")
                return b"Zookeeper version" in connection.recv(4096)
        except OSError:
            return False

    def stop(self) -> None:
        """Kills the server (its data stays for a restart)."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._process.pid, signal.SIGKILL)
            self._process.wait()
        self._process = None

    def close(self) -> None:
        self.stop()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)


def expire_session(store: ZooKeeperStore) -> None:
    """Expires the ZooKeeper session of a ``ZooKeeperStore`` from the server's side, as a long
    pause or partition would: a second connection takes over the session id and closes it."""
    from kazoo.client import KazooClient

    twin = KazooClient(hosts=store.hosts, client_id=store.session)
    twin.start(timeout=10)
    twin.stop()
    twin.close()
