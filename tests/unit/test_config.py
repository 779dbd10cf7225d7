"""bk_server.conf handling: BookKeeper's keys and units, precedence, warnings, errors naming the key."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bookkeeper_py.server import config
from bookkeeper_py.testing.local_cluster import free_port


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(list(argv))


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bk_server.conf"
    path.write_text(text)
    return str(path)


def test_properties_syntax(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "# a comment\n! another\nbookiePort=3182\njournalDirectories : /a, \\\n   /b\nbookieId bk-1\n\n",
    )
    assert config.read_properties(path) == {
        "bookiePort": "3182",
        "journalDirectories": "/a, /b",
        "bookieId": "bk-1",
    }


def test_defaults_then_file_then_command_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "journalDirectories=/data/j1,/data/j2\nlogSizeLimit=2097152\nflushInterval=500\n"
        "journalSyncData=false\ndiskUsageThreshold=0.9\ndiskUsageWarnThreshold=0.8\nbookiePort=4000\n",
    )
    values = config.resolve(parse("--conf", path, "--port", "4001"))
    built = config.build(values)
    assert built.port == 4001  # the command line wins
    assert built.storage.journal_directories == ("/data/j1", "/data/j2")
    assert built.storage.ledger_directory == "/data/ledgers"
    assert built.storage.log_size_limit == 2 * 1024 * 1024  # bytes in the file
    assert built.storage.flush_interval_s == 0.5
    assert built.storage.journal_sync_data is False
    assert built.disk.usage_threshold == 0.9
    assert built.gc.minor_compaction_threshold == 0.2  # BookKeeper's default
    assert built.max_frame_size == 5 * 1024 * 1024


def test_unknown_and_unsupported_keys_are_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(
        tmp_path, "journalDirectory=/j\njournalMaxSizeMb=10\nledgerStorageClass=x.DbLedgerStorage\n"
    )
    with caplog.at_level(logging.WARNING):
        values = config.resolve(parse("--conf", path))
    assert values["journalDirectories"] == ["/j"]  # journalDirectory is the single-directory form
    assert "unknown key journalMaxSizeMb" in caplog.text  # a typo of journalMaxSizeMB
    assert "ledgerStorageClass is not supported by this bookie; ignored" in caplog.text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("journalMaxSizeMB=lots", "journalMaxSizeMB='lots' is invalid"),
        ("journalSyncData=maybe", "journalSyncData='maybe' is invalid: not a boolean"),
        ("flushInterval=0", "flushInterval must be positive"),
        ("ledgerDirectories=/l1,/l2", "ledgerDirectories lists 2 directories"),
        ("logSizeLimit=4294967296", "logSizeLimit must stay below 4 GiB"),
        ("diskUsageWarnThreshold=0.99", "diskUsageWarnThreshold <= diskUsageThreshold"),
        ("bookiePort=70000", "bookiePort must be 1-65535"),
        ("checkpointPace=1.5", "checkpointPace is a fraction of flushInterval"),
        ("tlsCertificatePath=/c.pem", "tlsCertificatePath is set but tlsKeyStore"),
        ("tlsKeyStoreType=JKS", "tlsKeyStoreType='JKS': this bookie reads PEM files only"),
        ("tlsClientAuthentication=true", "tlsClientAuthentication needs TLS"),
        (
            "tlsCertificatePath=/c.pem\ntlsKeyStore=/k.pem\ntlsClientAuthentication=true",
            "tlsClientAuthentication needs tlsTrustStore",
        ),
    ],
)
def test_invalid_values_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, f"journalDirectories=/j\n{text}\n")
    with pytest.raises(config.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config.build(config.resolve(parse("--conf", path)))


def test_legacy_zookeeper_keys_make_a_metadata_uri(tmp_path: Path) -> None:
    path = write(
        tmp_path, "journalDirectories=/j\nzkServers=zk1:2181,zk2:2181\nzkLedgersRootPath=/bk\n"
    )
    assert (
        config.resolve(parse("--conf", path))["metadataServiceUri"]
        == "zk+hierarchical://zk1:2181;zk2:2181/bk"
    )


def test_missing_journal_directory_is_an_error() -> None:
    with pytest.raises(config.ConfigError, match="journalDirectories is required"):
        config.build(config.resolve(parse()))


@pytest.mark.timeout(120)
def test_a_bookie_runs_from_a_configuration_file(tmp_path: Path) -> None:
    port = free_port()
    ready = tmp_path / "ready"
    path = write(
        tmp_path,
        f"bookiePort={port}\nadvertisedAddress=127.0.0.1\njournalDirectories={tmp_path / 'j'}\n"
        f"ledgerDirectories={tmp_path / 'l'}\nflushInterval=1000\n",
    )
    bookie = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bookkeeper_py",
            "bookie",
            "--conf",
            path,
            "--ready-file",
            str(ready),
            "--standalone",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(600):
            if ready.exists() or bookie.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.read_text().strip() == f"127.0.0.1:{port}"
        assert os.path.exists(
            tmp_path / "l" / "current" / "VERSION"
        )  # cookies in the configured dirs
    finally:
        bookie.send_signal(signal.SIGTERM)
        _, stderr = bookie.communicate(timeout=60)
    assert bookie.returncode == 0, stderr.decode()[-2000:]


def test_client_options_are_checked_by_name_and_value() -> None:
    from bookkeeper_py import ClientConfig, errors

    assert ClientConfig.of({"throttle": 7}).throttle == 7
    with pytest.raises(errors.IncorrectParameterError, match=r"unknown client option.*thrtotle"):
        ClientConfig.of({"thrtotle": 7})
    with pytest.raises(errors.IncorrectParameterError, match="placement policy 'racks'"):
        ClientConfig(placement="racks")
