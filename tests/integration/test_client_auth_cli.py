"""The commands' clients against bookies that ask for the shared secret: without it a command
stops with one line saying what to pass; with ``bookkeeper --auth-secret-file``,
``$BOOKKEEPER_AUTH_SECRET_FILE`` or the bookie's own ``shell --conf`` it works; a secret file
that cannot serve is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookkeeper_py.testing.local_cluster import LocalCluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(secret_file: Path) -> Iterator[LocalCluster]:
    auth = ["--auth-provider", "shared-secret", "--auth-secret-file", str(secret_file)]
    with LocalCluster(3, bookie_args=auth) as local:
        yield local


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def test_without_the_secret_one_line_saying_what_to_pass(cluster: LocalCluster) -> None:
    done = run("shell", "simpletest", "-n", "10", "--metadata-uri", cluster.metadata_uri)
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "--auth-secret-file" in done.stderr, done.stderr


def test_with_the_option_the_environment_or_the_bookie_s_conf(
    cluster: LocalCluster, secret_file: Path, tmp_path: Path
) -> None:
    uri = cluster.metadata_uri
    done = run(
        "--auth-secret-file",
        str(secret_file),
        "shell",
        "simpletest",
        "-n",
        "20",
        "--metadata-uri",
        uri,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote 20 entries" in done.stdout and "read and verified them" in done.stdout
    env = {"BOOKKEEPER_AUTH_SECRET_FILE": str(secret_file), "BOOKKEEPER_METADATA_URI": uri}
    created = run("log", "create", "--namespace", "authed", "events", env=env)
    assert created.returncode == 0, created.stderr
    appended = subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", "log", "append", "--namespace", "authed", "events"],
        input="one\ntwo\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert appended.returncode == 0, appended.stderr
    read = run("log", "read", "--namespace", "authed", "events", env=env)
    assert read.returncode == 0, read.stderr
    assert [line.split("\t")[-1] for line in read.stdout.splitlines()] == ["one", "two"]
    conf = tmp_path / "bk_server.conf"
    conf.write_text(
        f"metadataServiceUri={uri}\n"
        "bookieAuthProviderFactoryClass=shared-secret\n"
        f"authSharedSecretFile={secret_file}\n"
    )
    done = run("shell", "--conf", str(conf), "simpletest", "-n", "5")
    assert done.returncode == 0, done.stderr
    assert "wrote 5 entries" in done.stdout


def test_a_secret_file_that_cannot_serve(cluster: LocalCluster, tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("too short\n")
    for path, said in ((short, "use at least 16 random bytes"), (tmp_path / "none", "cannot read")):
        done = run(
            "--auth-secret-file",
            str(path),
            "shell",
            "simpletest",
            "-n",
            "5",
            "--metadata-uri",
            cluster.metadata_uri,
        )
        assert done.returncode == 1 and said in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
