"""Disk usage of a bookie's directories against its thresholds (reference section 1.13).

* usage >= ``diskUsageWarnThreshold`` (0.90): warn.
* usage >= ``diskUsageThreshold`` (0.95): full; the bookie turns read-only (adds get EREADONLY,
  recovery adds still go through while space lasts) and registers as read-only.
* back to writable once usage falls below ``diskUsageLwmThreshold`` (the threshold by default).

Usage is (total - available) / total of the file system holding each directory; the worst one
counts (``readOnlyModeOnAnyDiskFullEnabled``).
"""

from __future__ import annotations

import enum
import errno
import fcntl
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bookkeeper_py.errors import BKError

DiskUsage = Callable[[str], tuple[int, int]]  # path -> (total bytes, available bytes)


class DataDirectoryError(BKError):
    """A journal or ledger directory cannot be used: not creatable, not a directory, or not
    writable. Raised before anything in it is read or written."""


def prepare_directory(path: str, role: str) -> None:
    """Makes ``path`` (the bookie's ``role``, e.g. "journal directory (journalDirectories)")
    if it is missing and checks that it is a directory this process can write, by creating and
    removing a temporary file in it. Raises ``DataDirectoryError`` saying which and what to do."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise DataDirectoryError(
            f"the {role} {path} is a file, not a directory; move the file away or name another "
            "directory"
        ) from None
    except OSError as error:
        raise _directory_error(path, role, "cannot create", error) from None
    if not os.path.isdir(path):
        raise DataDirectoryError(
            f"the {role} {path} is not a directory; move it away or name another directory"
        )
    try:
        with tempfile.TemporaryFile(dir=path, prefix=".write-probe-"):
            pass
    except OSError as error:
        raise _directory_error(path, role, "cannot write to", error) from None


def _directory_error(path: str, role: str, doing: str, error: OSError) -> DataDirectoryError:
    reason = error.strerror or str(error)
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        advice = "name a directory on a writable file system that this user may write"
    elif error.errno in (errno.ENOTDIR, errno.ENOENT):
        advice = "a part of the path is a file or cannot hold directories: name another path"
    elif error.errno == errno.ENOSPC:
        advice = "free some space on that disk or name another directory"
    else:
        advice = "name another directory"
    shown = error.filename and os.path.dirname(error.filename) != path  # not the probe's name
    where = f" ({error.filename})" if shown and error.filename != path else ""
    return DataDirectoryError(f"{doing} the {role} {path}: {reason}{where}; {advice}")


def statvfs_usage(path: str) -> tuple[int, int]:
    stats = os.statvfs(path)
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize


class DiskState(enum.Enum):
    OK = "ok"
    WARN = "warn"
    FULL = "full"


@dataclass(frozen=True, slots=True)
class DiskThresholds:
    usage_threshold: float = 0.95  # diskUsageThreshold
    warn_threshold: float = 0.90  # diskUsageWarnThreshold
    lwm_threshold: float | None = None  # diskUsageLwmThreshold (default: usage_threshold)

    def __post_init__(self) -> None:
        lwm = self.usage_threshold if self.lwm_threshold is None else self.lwm_threshold
        if (
            not 0 < self.warn_threshold <= self.usage_threshold <= 1
            or not 0 < lwm <= self.usage_threshold
        ):
            raise ValueError(
                "disk thresholds need 0 < diskUsageWarnThreshold <= diskUsageThreshold <= 1 and "
                f"0 < diskUsageLwmThreshold <= diskUsageThreshold; got warn={self.warn_threshold} "
                f"threshold={self.usage_threshold} lwm={lwm}"
            )

    @property
    def lwm(self) -> float:
        return self.usage_threshold if self.lwm_threshold is None else self.lwm_threshold


@dataclass(frozen=True, slots=True)
class DiskReport:
    usage: float  # worst usage over the directories
    path: str  # the directory with that usage
    state: DiskState
    total_bytes: int
    free_bytes: int


class DiskChecker:
    """Decides, from the directories' usage, whether the bookie should be read-only."""

    def __init__(
        self,
        directories: Iterable[str],
        thresholds: DiskThresholds,
        usage: DiskUsage = statvfs_usage,
    ) -> None:
        self.directories = list(directories)
        self.thresholds = thresholds
        self._usage = usage
        self.full = False
        self.usages: dict[str, float] = {}  # each directory's usage at the last check

    def check(self) -> DiskReport:
        worst: tuple[float, str, int, int] = (-1.0, "", 0, 0)
        for directory in self.directories:
            total, free = self._usage(directory)
            used = (total - free) / total if total else 1.0
            self.usages[directory] = used
            if used > worst[0]:
                worst = (used, directory, total, free)
        used, path, total, free = worst
        if self.full:
            self.full = used >= self.thresholds.lwm
        else:
            self.full = used >= self.thresholds.usage_threshold
        if self.full:
            state = DiskState.FULL
        elif used >= self.thresholds.warn_threshold:
            state = DiskState.WARN
        else:
            state = DiskState.OK
        return DiskReport(used, path, state, total, free)


def total_and_free(path: str) -> tuple[int, int]:
    """(total, free) bytes of the file system holding ``path`` (for GET_BOOKIE_INFO)."""
    usage = shutil.disk_usage(path)
    return usage.total, usage.free


LOCK_FILE = "bookie.lock"


class DirectoryInUseError(DataDirectoryError):
    """Another live process holds the lock of a journal or ledger directory."""


class DirectoryLocks:
    """Exclusive locks (``flock``) on a bookie's directories, held while it runs.

    Each directory gets a ``bookie.lock`` file, locked before anything else in the directory is
    read, and holding one JSON line that names the holder (pid, bookie id, address and a random
    incarnation token). The kernel drops the lock when the process dies, however it dies, so a
    crashed bookie never blocks its successor; the line it left says which incarnation it was,
    which lets the successor replace that incarnation's lingering registration at once (when
    that process ran on this host and is gone; otherwise the registration is waited on).
    """

    def __init__(self, owner: dict[str, object]) -> None:
        self.incarnation = os.urandom(8).hex()
        self._owner = {
            **owner,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "incarnation": self.incarnation,
        }
        self._files: list[int] = []
        self._paths: set[str] = set()  # one lock per directory, however often it is named
        self.predecessors: set[str] = set()  # incarnation tokens left by earlier holders

    def acquire(self, path: str, role: str) -> None:
        """Locks ``path`` (made and checked by ``prepare_directory`` first); raises
        ``DirectoryInUseError`` naming the holder when another process has it."""
        prepare_directory(path, role)
        lock_path = os.path.join(path, LOCK_FILE)
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise _directory_error(path, role, "cannot lock", error) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(_read_owner(fd))
            os.close(fd)
            raise DirectoryInUseError(
                f"the {role} {path} is in use by {holder}; two bookies on one directory destroy "
                "each other's data: stop that process first, or give this bookie directories of "
                "its own"
            ) from None
        except OSError as error:
            os.close(fd)
            raise _directory_error(path, role, "cannot lock", error) from None
        previous = _read_owner(fd)
        if isinstance(previous.get("incarnation"), str) and _known_dead(previous):
            self.predecessors.add(str(previous["incarnation"]))
        line = (json.dumps(self._owner, sort_keys=True) + "\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, line, 0)
        self._files.append(fd)
        self._paths.add(os.path.realpath(path))

    def acquire_all(self, directories: Iterable[tuple[str, str]]) -> None:
        """Locks each (path, role) in turn; on a failure, releases what it had locked."""
        try:
            for path, role in directories:
                if os.path.realpath(path) not in self._paths:
                    self.acquire(path, role)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Unlocks every directory (the lock files stay, naming the last holder)."""
        files, self._files = self._files, []
        self._paths.clear()
        for fd in files:
            os.close(fd)  # closing the only descriptor drops the flock


def _read_owner(fd: int) -> dict[str, object]:
    try:
        data = os.pread(fd, 4096, 0)
        owner = json.loads(data.decode() or "{}")
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _known_dead(owner: dict[str, object]) -> bool:
    """Whether the process a lock file names is surely gone: it ran on this host and no process
    has its pid. A copied directory (its holder elsewhere, or alive here) proves nothing."""
    pid = owner.get("pid")
    if owner.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # it exists (another user's): alive as far as we can tell
    return False


def _describe_holder(owner: dict[str, object]) -> str:
    if not owner.get("pid"):
        return "another process (it has not written its name yet)"
    parts = [f"pid {owner['pid']}"]
    if owner.get("bookie_id"):
        parts.append(f"bookie {owner['bookie_id']}")
    if owner.get("address"):
        parts.append(f"listening on {owner['address']}")
    return "another bookie process (" + ", ".join(parts) + ")"
