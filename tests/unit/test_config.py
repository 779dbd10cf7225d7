"""bk_server.conf handling: BookKeeper's keys and units, precedence, warnings, errors naming the key."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
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
        tmp_path,
        "journalDirectory=/j\njournalMaxSizeMb=10\nledgerStorageClass=x.DbLedgerStorage\n"
        "pageSize=4096\nnoSuchSetting=1\nhttpServerClass=org.apache.bookkeeper.http.vertx."
        "VertxHttpServer\nallowStorageExpansion=true\n",
    )
    with caplog.at_level(logging.DEBUG):
        values = config.resolve(parse("--conf", path))
    assert values["journalDirectories"] == ["/j"]  # journalDirectory is the single-directory form
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        f"{path}: unknown key journalMaxSizeMb; ignored: did you mean journalMaxSizeMB?" in warnings
    )
    assert any(
        "unknown key noSuchSetting; ignored: it is no key of BookKeeper's bk_server.conf" in w
        for w in warnings
    )
    # keys that share a reason are warned about together, with the reason
    [storage] = [w for w in warnings if "ledgerStorageClass" in w]
    assert storage.startswith(f"{path}: ledgerStorageClass, pageSize ignored: settings of Sorted")
    [expansion] = [w for w in warnings if "allowStorageExpansion" in w]
    assert "a directory added would move every ledger" in expansion
    # BookKeeper's own default asks for nothing: not a warning
    assert not any("httpServerClass" in w for w in warnings)
    assert (
        "httpServerClass=org.apache.bookkeeper.http.vertx.VertxHttpServer is not used"
        in caplog.text
    )
    assert len(warnings) == 4


def test_properties_escapes_as_java_reads_them(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "bookieId=bk\\=1\nkey\\=with\\:separators = v\nadvertisedAddress=\\u0031"
        "27.0.0.1 \nledgerDirectories=C:\\\\data\njournalDirectories=/a,\\\n    /b\n",
    )
    assert config.read_properties(path) == {
        "bookieId": "bk=1",
        "key=with:separators": "v",
        "advertisedAddress": "127.0.0.1",
        "ledgerDirectories": "C:\\data",
        "journalDirectories": "/a,/b",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bookiePort=1\n\nbookieId=\\u00zz\n", r":3: Invalid \\u escape sequence: \\u00zz"),
        ("bookiePort=1\n=value\n", r":2: a line without a key: '=value'"),
    ],
)
def test_a_broken_line_is_an_error_naming_it(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(config.ConfigError, match=message) as raised:
        config.read_properties(path)
    assert str(raised.value).startswith(path)


STOCK = Path(__file__).parent.parent / "data" / "bk_server-4.18.0.conf"


def stock_keys() -> set[str]:
    """Every key of the stock file, the commented ones too (``# key=value`` lines)."""
    keys = set()
    for line in STOCK.read_text().splitlines():
        text = line.lstrip("#").strip()
        key, equals, _ = text.partition("=")
        if equals and key and " " not in key and key[0].isalpha():
            keys.add(key)
    return keys


def test_every_key_of_bookkeepers_stock_configuration_is_known() -> None:
    from bookkeeper_py.server.config_keys import NOT_USED

    keys = stock_keys()
    assert len(keys) == 216
    taken = {setting.key for setting in config.SETTINGS} | set(config._ALIASES)
    legacy = {"zkServers", "zkLedgersRootPath"}  # folded into metadataServiceUri
    assert keys - taken - legacy - set(NOT_USED) == set()
    assert taken & set(NOT_USED) == set()  # a key is taken or not used, not both
    assert all(reason and not reason.endswith(".") for reason in NOT_USED.values())


def test_bookkeepers_stock_configuration_loads_with_a_reason_for_every_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG):
        values = config.resolve(parse("--conf", str(STOCK)))
    assert values["metadataServiceUri"] == "zk+hierarchical://localhost:2181/ledgers"
    assert values["journalDirectories"] == ["/tmp/bk-txn"]
    assert values["bookiePort"] == 3181 and values["zkTimeout"] == 10000
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings  # the stream storage keys, extraServerComponents...
    for warning in warnings:
        assert warning.startswith(f"{STOCK}: ") and " ignored: " in warning, warning
        assert "unknown" not in warning and "typo" not in warning, warning
    # zkServers says what metadataServiceUri says: no warning about the legacy key
    assert not any("zkServers" in w for w in warnings)


def test_the_metadata_uri_wins_over_legacy_keys_that_disagree(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(
        tmp_path,
        "metadataServiceUri=zk+hierarchical://zk1:2181;zk2:2181/ledgers\n"
        "zkServers=zk9:2181\nzkLedgersRootPath=/ledgers\n",
    )
    with caplog.at_level(logging.WARNING):
        values = config.resolve(parse("--conf", path))
    assert values["metadataServiceUri"] == "zk+hierarchical://zk1:2181;zk2:2181/ledgers"
    assert caplog.messages == [
        f"{path}: zkServers=zk9:2181 ignored: metadataServiceUri=zk+hierarchical://zk1:2181;"
        "zk2:2181/ledgers is given and wins, as in BookKeeper; remove the legacy key"
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("journalMaxSizeMB=lots", "journalMaxSizeMB='lots' is invalid"),
        ("journalSyncData=maybe", "journalSyncData='maybe' is invalid: not a boolean"),
        ("flushInterval=0", "flushInterval must be positive"),
        ("ledgerDirectories=/l1,/l2,/l1", "ledgerDirectories names a directory twice"),
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


def test_the_cpu_scheduling_policy_is_normal_or_batch(tmp_path: Path) -> None:
    """cpuSchedulingPolicy: normal by default, batch taken, anything else refused naming the
    key; batch puts the thread that applies it (and the threads it starts) under SCHED_BATCH,
    normal leaves it as it is."""
    from bookkeeper_py.server.main import apply_scheduling_policy

    assert config.scheduling_policy(config.resolve(parse())) == "normal"
    path = write(tmp_path, "cpuSchedulingPolicy=batch\n")
    assert config.scheduling_policy(config.resolve(parse("--conf", path))) == "batch"
    bad = config.resolve(parse("--cpu-scheduling-policy", "idle"))
    with pytest.raises(config.ConfigError, match="cpuSchedulingPolicy must be normal or batch"):
        config.scheduling_policy(bad)
    if not hasattr(os, "SCHED_BATCH"):
        return
    seen: dict[str, int] = {}

    def in_a_thread(policy: str) -> None:
        apply_scheduling_policy(policy)
        inner = threading.Thread(target=lambda: seen.update(child=os.sched_getscheduler(0)))
        inner.start()
        inner.join()
        seen[policy] = os.sched_getscheduler(0)

    for policy in ("normal", "batch"):
        thread = threading.Thread(target=in_a_thread, args=(policy,))
        thread.start()
        thread.join()
    assert seen == {"normal": os.SCHED_OTHER, "batch": os.SCHED_BATCH, "child": os.SCHED_BATCH}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the test's own thread: untouched


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


def run_bookie(tmp_path: Path, *options: str) -> tuple[str, str]:
    """Starts ``bookkeeper bookie OPTIONS`` until it is ready, stops it with SIGTERM; (what its
    ready file said, its stderr). Fails if it did not stop cleanly."""
    ready = tmp_path / "ready"
    bookie = subprocess.Popen(
        [sys.executable, "-m", "bookkeeper_py", "bookie", *options, "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(600):
            if ready.exists() or bookie.poll() is not None:
                break
            time.sleep(0.05)
        said = ready.read_text().strip() if ready.exists() else ""
    finally:
        bookie.send_signal(signal.SIGTERM)
        _, stderr = bookie.communicate(timeout=60)
    assert bookie.returncode == 0, stderr.decode()[-2000:]
    return said, stderr.decode()


@pytest.mark.timeout(120)
def test_a_bookie_starts_from_bookkeepers_stock_configuration(tmp_path: Path) -> None:
    # the stock file unchanged; the command line gives what must differ on a test machine
    # (its port, directories and metadata store: an embedded one instead of a ZooKeeper)
    port = free_port()
    uri = f"sqlite://{tmp_path / 'metadata.db'}"
    subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", "shell", "initnewcluster", "--metadata-uri", uri],
        check=True,
        capture_output=True,
    )
    said, stderr = run_bookie(
        tmp_path,
        "--conf",
        str(STOCK),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--journal-dir",
        str(tmp_path / "j"),
        "--ledger-dir",
        str(tmp_path / "l"),
        "--metadata-uri",
        uri,
    )
    assert said == f"127.0.0.1:{port}"
    warnings = [line for line in stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 1 and "stream storage" in warnings[0], warnings
    assert "storageserver.grpc.port, dlog.bkcEnsembleSize" in warnings[0]


@pytest.mark.timeout(120)
def test_a_bookie_runs_from_a_configuration_file(tmp_path: Path) -> None:
    port = free_port()
    path = write(
        tmp_path,
        f"bookiePort={port}\nadvertisedAddress=127.0.0.1\njournalDirectories={tmp_path / 'j'}\n"
        f"ledgerDirectories={tmp_path / 'l'}\nflushInterval=1000\n",
    )
    said, _ = run_bookie(tmp_path, "--conf", path, "--standalone")
    assert said == f"127.0.0.1:{port}"
    assert os.path.exists(tmp_path / "l" / "current" / "VERSION")  # cookies in the configured dirs


def test_client_options_are_checked_by_name_and_value() -> None:
    from bookkeeper_py import ClientConfig, errors

    assert ClientConfig.of({"throttle": 7}).throttle == 7
    with pytest.raises(errors.IncorrectParameterError, match=r"unknown client option.*thrtotle"):
        ClientConfig.of({"thrtotle": 7})
    with pytest.raises(errors.IncorrectParameterError, match="placement policy 'racks'"):
        ClientConfig(placement="racks")


def test_the_operations_guide_lists_every_key_with_the_codes_status() -> None:
    from bookkeeper_py.server.config_keys import NOT_USED

    guide = (Path(__file__).parent.parent.parent / "docs" / "operations.md").read_text()
    rows = [line for line in guide.splitlines() if line.startswith("| `")]
    for key in stock_keys() | set(NOT_USED):
        [row] = [row for row in rows if f"`{key}`" in row[2:].split(" | ")[0].split(", ")]
        if key in NOT_USED:
            assert row.endswith(f" | not used: {NOT_USED[key]} |"), key
        else:
            assert "**taken**" in row, key


@pytest.mark.timeout(120)
def test_full_disks_stop_a_bookie_whose_read_only_mode_is_disabled(tmp_path: Path) -> None:
    # every disk here is fuller than 0.01 %: "full" at once
    thresholds = ["--disk-usage-warn-threshold", "0.00005", "--disk-usage-threshold", "0.0001"]
    common = ["--port", str(free_port()), "--journal-dir", str(tmp_path / "j"), "--standalone"]
    disabled = ["--read-only-mode-enabled", "false"]
    stopped = subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", "bookie", *common, *thresholds, *disabled],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert stopped.returncode != 0
    [error] = [line for line in stopped.stderr.splitlines() if line.startswith("error: ")]
    assert "its disks are full" in error and "readOnlyModeEnabled=false" in error
    assert "set readOnlyModeEnabled=true" in error
    # the same disks with read-only mode (the default): the bookie starts, read-only
    said, stderr = run_bookie(tmp_path, *common, *thresholds)
    assert said.endswith(common[1]) and "bookie is now read-only" in stderr
