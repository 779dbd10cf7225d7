"""Issue 18's acceptance over real processes, on SQLite and on a real ZooKeeper: a log writer
killed with SIGKILL in the middle of appends, a second writer taking over, a reader tailing
through both; a stopped writer's late appends failing with ``LogFencedError``; an idempotent
writer that restarts and re-sends without duplicating anything."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookkeeper_py import BookKeeper
from bookkeeper_py.log import DUPLICATE, LogConfig, LogRecord, Position
from bookkeeper_py.log.facade import LogNamespace
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.zookeeper import ZooKeeperServer

WRITER = os.path.join(os.path.dirname(__file__), "log_writer_process.py")
CONFIG = LogConfig(3, 2, 2, roll_records=3000)  # rolls while the writers run


@pytest.fixture(params=["sqlite", pytest.param("zookeeper", marks=pytest.mark.zookeeper)])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalCluster]:
    uri = None
    if request.param == "zookeeper":
        server: ZooKeeperServer = request.getfixturevalue("zookeeper")
        uri = server.metadata_uri(f"/logs-{tmp_path.name}")
    with LocalCluster(3, metadata_uri=uri, base_directory=str(tmp_path / "cluster")) as local:
        yield local


class WriterProcess:
    """``log_writer_process.py`` and the lines it prints, read by a thread."""

    def __init__(self, uri: str, log_name: str, tag: str, writer_id: str = "", start: int = 0):
        self.process = subprocess.Popen(
            [sys.executable, WRITER, uri, "t", log_name, tag, writer_id, str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.acked: dict[int, Position] = {}
        self.failure = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def wait_for(self, predicate: object, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            self._note(line)
            if predicate(line):  # type: ignore[operator]
                return line
        stderr = ""
        if self.process.poll() is not None and self.process.stderr is not None:
            stderr = self.process.stderr.read()[-2000:]
        raise AssertionError(f"the writer process did not print {what} in {timeout} s\n{stderr}")

    def _note(self, line: str) -> None:
        kind, _, rest = line.partition(" ")
        if kind == "acked":
            index, position = rest.split()
            self.acked[int(index)] = Position.parse(position)
        elif kind == "failed":
            self.failure = rest

    def drain(self) -> None:
        """Takes in what it printed so far (after it was killed or stopped)."""
        while True:
            try:
                self._note(self.lines.get(timeout=0.2))
            except queue.Empty:
                return

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        self._reader.join(timeout=30)  # it read up to the end of the pipe
        self.drain()
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


class Tailer:
    """A reader following the log from its first record, in a thread."""

    def __init__(self, logs: LogNamespace, log_name: str) -> None:
        self.reader = logs.open_reader(log_name, "earliest", poll_timeout_ms=500)
        self.records: list[LogRecord] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self.records += self.reader.read_batch(timeout=0.5)
                except TimeoutError:
                    continue
        except BaseException as error:  # reported by the test
            self.error = error

    def wait_for(self, data: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.error is None:
            if any(record.data == data for record in self.records[-2000:]):
                return
            time.sleep(0.05)
        raise AssertionError(f"the tailing reader did not get {data!r} ({self.error})")

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=30)
        self.reader.close()


@pytest.mark.slow
def test_a_killed_writer_a_new_writer_and_a_tailing_reader_lose_and_repeat_nothing(
    cluster: LocalCluster,
) -> None:
    with BookKeeper(cluster.metadata_uri) as bk:
        logs = LogNamespace(bk, "t")
        logs.create_log("takeover", CONFIG)
        tailer = Tailer(logs, "takeover")
        first = WriterProcess(cluster.metadata_uri, "takeover", "one")
        try:
            first.wait_for(lambda line: line.startswith("acked 7000 "), 120, "7,000 acks")
        finally:
            first.kill()  # SIGKILL in the middle of appends: hundreds in flight
        with logs.open_writer("takeover") as second:
            futures = [second.append(b"two-%d" % i) for i in range(2000)]
            positions = [future.result(timeout=60) for future in futures]
        assert positions == sorted(positions) and len(set(positions)) == 2000
        tailer.wait_for(b"two-1999", 120)
        tailer.stop()
        assert tailer.error is None

        records = tailer.records
        assert [r.position for r in records] == sorted(
            {r.position for r in records}
        )  # once, in order
        assert [r.sequence for r in records] == list(range(len(records)))
        ones = [int(r.data.split(b"-")[1]) for r in records if r.data.startswith(b"one-")]
        assert ones == list(range(len(ones)))  # a prefix of what the killed writer sent
        assert len(ones) > max(first.acked)  # every acknowledged record of it is there
        for index, position in first.acked.items():
            assert records[index].position == position and records[index].data == b"one-%d" % index
        twos = [r.data for r in records if r.data.startswith(b"two-")]
        assert twos == [b"two-%d" % i for i in range(2000)]
        segments = logs.describe("takeover").metadata.segments
        assert len(segments) >= 3 and all(not s.is_open for s in segments)  # rolled, closed


@pytest.mark.slow
def test_a_stopped_writer_that_comes_back_is_fenced(cluster: LocalCluster) -> None:
    with BookKeeper(cluster.metadata_uri) as bk:
        logs = LogNamespace(bk, "t")
        # No rolls: a writer stopped in the middle of a roll's metadata write would hold the
        # SQLite store's write lock, and the takeover would wait for it (docs/operations.md)
        logs.create_log("stopped", LogConfig(3, 2, 2))
        first = WriterProcess(cluster.metadata_uri, "stopped", "one")
        try:
            first.wait_for(lambda line: line.startswith("acked 2000 "), 120, "2,000 acks")
            first.process.send_signal(signal.SIGSTOP)
            first.drain()
            with logs.open_writer("stopped") as second:
                taken = second.write(b"two-0")
            first.process.send_signal(signal.SIGCONT)
            line = first.wait_for(lambda line: line.startswith("failed"), 60, "a failure")
        finally:
            first.kill()
        assert line.startswith("failed LogFencedError: log t/stopped: another writer took")
        reader = logs.open_reader("stopped", follow=False)
        records = list(reader)
        reader.close()
        ones = [r for r in records if r.data.startswith(b"one-")]
        assert [r.data for r in ones] == [b"one-%d" % i for i in range(len(ones))]
        assert all(r.position < taken for r in ones)  # nothing of it after the takeover
        assert records[-1].data == b"two-0"


@pytest.mark.slow
def test_an_idempotent_writer_that_restarts_and_resends_duplicates_nothing(
    cluster: LocalCluster,
) -> None:
    with BookKeeper(cluster.metadata_uri) as bk:
        logs = LogNamespace(bk, "t")
        logs.create_log("idempotent", CONFIG)
        first = WriterProcess(cluster.metadata_uri, "idempotent", "r", writer_id="app")
        try:
            first.wait_for(lambda line: line.startswith("acked 4000 "), 120, "4,000 acks")
        finally:
            first.kill()
        # The restarted application re-sends everything it has no acknowledgement for: from
        # the first record after its last acknowledged one (plus some it had, to be sure).
        resend_from = max(first.acked) - 100
        with logs.open_writer("idempotent", writer_id="app") as again:
            durable = again.last_writer_sequence
            assert durable >= max(first.acked)  # it learned where it stopped
            futures = [
                (i, again.append(b"r-%d" % i, sequence=i))
                for i in range(resend_from, durable + 500)
            ]
            answers = {i: future.result(timeout=60) for i, future in futures}
        assert all(answers[i] == DUPLICATE for i in range(resend_from, durable + 1))
        assert all(answers[i] != DUPLICATE for i in range(durable + 1, durable + 500))
        reader = logs.open_reader("idempotent", follow=False)
        data = [r.data for r in reader]
        reader.close()
        assert data == [b"r-%d" % i for i in range(durable + 500)]  # each once, in order
