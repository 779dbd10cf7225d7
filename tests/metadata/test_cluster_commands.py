"""The cluster administration shell commands, on every driver."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bookkeeper_py.admin import cli
from bookkeeper_py.admin.service import BookieStatus, ClusterAdmin
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.storage.cookie import Cookie

from .samples import sample


def shell(capsys: pytest.CaptureFixture[str], uri: str, *argv: str) -> str:
    capsys.readouterr()
    command, *rest = argv
    cli.main(["shell", command, "--metadata-uri", uri, *rest])
    return capsys.readouterr().out


def refused(capsys: pytest.CaptureFixture[str], uri: str, *argv: str) -> str:
    """The one-line error of a refused command (exit status 1)."""
    capsys.readouterr()
    command, *rest = argv
    with pytest.raises(SystemExit) as stopped:
        cli.main(["shell", command, "--metadata-uri", uri, *rest])
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def make_ledger(uri: str) -> int:
    metadata = MetadataClient.connect(uri)
    try:
        ledger_id = metadata.generate_ledger_id()
        metadata.create_ledger_metadata(sample(ledger_id))
        return ledger_id
    finally:
        metadata.close()


def test_cluster_lifecycle_commands(capsys: pytest.CaptureFixture[str], uri: str) -> None:
    before = refused(capsys, uri, "whatisinstanceid")
    assert "no cluster" in before or "no metadata store" in before  # SQLite: no file yet
    out = shell(capsys, uri, "initnewcluster")
    instance = shell(capsys, uri, "whatisinstanceid").strip()
    assert instance in out and len(instance) == 36
    assert "already exists" in refused(capsys, uri, "initnewcluster")
    assert shell(capsys, uri, "whatisinstanceid").strip() == instance  # the same cluster
    ledger_id = make_ledger(uri)
    assert shell(capsys, uri, "listledgers").split() == [str(ledger_id)]
    assert f"ledger {ledger_id}" in shell(capsys, uri, "ledgermetadata", "-l", str(ledger_id))
    assert "holds metadata" in refused(capsys, uri, "metaformat")
    assert shell(capsys, uri, "listledgers").split() == [str(ledger_id)]  # nothing deleted
    assert shell(capsys, uri, "whatisinstanceid").strip() == instance
    shell(capsys, uri, "metaformat", "-n", "-f")
    formatted = shell(capsys, uri, "whatisinstanceid").strip()
    assert formatted != instance
    assert shell(capsys, uri, "listledgers").split() == []
    assert "instance id" in refused(capsys, uri, "nukeexistingcluster", "-i", instance)
    assert "-i INSTANCEID" in refused(capsys, uri, "nukeexistingcluster")
    shell(capsys, uri, "nukeexistingcluster", "-i", formatted)
    assert "no cluster" in refused(capsys, uri, "whatisinstanceid")


def test_cookie_commands(capsys: pytest.CaptureFixture[str], uri: str, tmp_path: Path) -> None:
    shell(capsys, uri, "initnewcluster")
    bookie = "127.0.0.1:3181"
    cookie = Cookie(bookie_id=bookie, journal_dirs=("/j",), ledger_dirs=("/l",), instance_id="x")
    cookie_file = tmp_path / "cookie"
    cookie_file.write_bytes(cookie.encode())
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x00not a cookie\n{{{")
    bad_body = tmp_path / "bad_body"  # a layout version, then no cookie's text format
    bad_body.write_bytes(b'4\nbookieHost: "127.0.0.1:3181\nnonsense {{{\n')
    missing = tmp_path / "missing"
    unreadable = (
        (str(garbage), "is unreadable"),
        (str(bad_body), "is unreadable"),
        (str(missing), "cannot read cookie file"),
        (str(tmp_path), "cannot read cookie file"),  # a directory
    )
    assert "no cookie" in refused(capsys, uri, "cookie_get", bookie)
    # Refused while the bookie has no cookie: none is made.
    assert "has no cookie; use cookie_create" in refused(
        capsys, uri, "cookie_update", bookie, "-cf", str(cookie_file)
    )
    for path, wanted in unreadable:
        assert wanted in refused(capsys, uri, "cookie_create", bookie, "-cf", path), path
        assert wanted in refused(capsys, uri, "cookie_update", bookie, "-cf", path), path
    assert "no cookie" in refused(capsys, uri, "cookie_get", bookie)

    shell(capsys, uri, "cookie_create", bookie, "-cf", str(cookie_file))
    created = shell(capsys, uri, "cookie_get", bookie)
    assert "/j" in created and "(version 0)" in created
    assert "already has a cookie" in refused(
        capsys, uri, "cookie_create", bookie, "-cf", str(cookie_file)
    )
    for path, wanted in unreadable:
        assert wanted in refused(capsys, uri, "cookie_create", bookie, "-cf", path), path
        assert wanted in refused(capsys, uri, "cookie_update", bookie, "-cf", path), path
    assert shell(capsys, uri, "cookie_get", bookie) == created  # unchanged, version too

    moved = Cookie(bookie_id=bookie, journal_dirs=("/j2",), ledger_dirs=("/l",), instance_id="x")
    cookie_file.write_bytes(moved.encode())
    assert "version 1" in shell(capsys, uri, "cookie_update", bookie, "-cf", str(cookie_file))
    updated = shell(capsys, uri, "cookie_get", bookie)
    assert "/j2" in updated
    assert "not 10.0.0.1:1" in refused(
        capsys, uri, "cookie_update", "10.0.0.1:1", "-cf", str(cookie_file)
    )
    assert shell(capsys, uri, "cookie_get", bookie) == updated
    assert "no cookie" in refused(capsys, uri, "cookie_get", "10.0.0.1:1")
    shell(capsys, uri, "cookie_delete", bookie)
    assert "no cookie" in refused(capsys, uri, "cookie_delete", bookie)


def test_cookie_generate_writes_a_cookie_the_other_commands_take(
    capsys: pytest.CaptureFixture[str], uri: str, tmp_path: Path
) -> None:
    shell(capsys, uri, "initnewcluster")
    instance = shell(capsys, uri, "whatisinstanceid").split()[-1]
    bookie = "127.0.0.1:3181"
    generated = tmp_path / "cookie"
    said = shell(
        capsys, uri, "cookie_generate", bookie, "-j", "/j1,/j2", "-l", "/l", "-o", str(generated)
    )
    assert str(generated) in said
    cookie = Cookie.decode(generated.read_bytes(), str(generated))
    assert cookie == Cookie(bookie, ("/j1", "/j2"), ("/l",), instance)
    shell(capsys, uri, "cookie_create", bookie, "-cf", str(generated))  # taken as it is
    assert "/j1" in shell(capsys, uri, "cookie_get", bookie)
    given = tmp_path / "given"
    shell(
        capsys,
        uri,
        "cookie_generate",
        bookie,
        "-j",
        "/j",
        "-l",
        "/l",
        "-i",
        "other",
        "-o",
        str(given),
    )
    assert Cookie.decode(given.read_bytes(), str(given)).instance_id == "other"
    kept = generated.read_bytes()
    assert "exists; not overwriting" in refused(
        capsys, uri, "cookie_generate", bookie, "-j", "/j", "-l", "/l", "-o", str(generated)
    )
    assert generated.read_bytes() == kept
    assert "is not host:port" in refused(
        capsys, uri, "cookie_generate", "nohost", "-j", "/j", "-l", "/l", "-o", str(tmp_path / "x")
    )
    assert not (tmp_path / "x").exists()


def test_update_bookie_in_ledger_replaces_a_stopped_bookie_everywhere(
    capsys: pytest.CaptureFixture[str], uri: str
) -> None:
    shell(capsys, uri, "initnewcluster")
    with MetadataClient.connect(uri) as metadata:
        holding = [metadata.generate_ledger_id() for _ in range(3)]
        for ledger_id in holding:  # h:2 in two fragments of each
            metadata.create_ledger_metadata(
                replace(
                    sample(ledger_id),
                    ensembles=((0, ("h:1", "h:2", "h:3")), (5, ("h:4", "h:2", "h:3"))),
                )
            )
        other = metadata.generate_ledger_id()
        metadata.create_ledger_metadata(
            replace(sample(other), ensembles=((0, ("h:1", "h:3", "h:4")),))
        )
        clashing = metadata.generate_ledger_id()  # h:9 is there already: not updated
        metadata.create_ledger_metadata(
            replace(sample(clashing), ensembles=((0, ("h:2", "h:9", "h:3")),))
        )
        metadata.register_bookie("h:2", "h", 2)
        assert "is registered (running)" in refused(
            capsys, uri, "updateBookieInLedger", "-sb", "h:2", "-db", "h:9"
        )
        metadata.unregister_bookie("h:2")
    assert "not host:port" in refused(
        capsys, uri, "updateBookieInLedger", "-sb", "h2", "-db", "h:9"
    )

    limited = shell(
        capsys, uri, "updateBookieInLedger", "-sb", "h:2", "-db", "h:9", "-l", "1", "-s", "1000"
    )
    assert limited.strip().endswith("1 of 1 ledgers holding h:2 now hold h:9 instead")
    with pytest.raises(SystemExit) as stopped:
        cli.main(
            [
                "shell",
                "updateBookieInLedger",
                "--metadata-uri",
                uri,
                "-sb",
                "h:2",
                "-db",
                "h:9",
                "-s",
                "1000",
            ]
        )
    assert stopped.value.code == 1  # the clashing ledger is left as it was, and said
    out = capsys.readouterr().out
    assert f"ledger {clashing}: not updated: its fragment from entry 0 already holds h:9" in out
    assert out.strip().endswith("2 of 3 ledgers holding h:2 now hold h:9 instead")
    with MetadataClient.connect(uri) as metadata:
        for ledger_id in holding:
            ensembles = metadata.read_ledger_metadata(ledger_id)[0].ensembles
            assert ensembles == ((0, ("h:1", "h:9", "h:3")), (5, ("h:4", "h:9", "h:3")))
        assert metadata.read_ledger_metadata(other)[0].ensembles == ((0, ("h:1", "h:3", "h:4")),)
        assert metadata.read_ledger_metadata(clashing)[0].ensembles == ((0, ("h:2", "h:9", "h:3")),)


def test_forceauditchecks_and_queryautorecoverystatus(
    capsys: pytest.CaptureFixture[str], uri: str
) -> None:
    from bookkeeper_py.metadata.port import MetadataPort, run_blocking
    from bookkeeper_py.metadata.underreplication import (
        CHECK_ALL_LEDGERS,
        PLACEMENT_POLICY_CHECK,
        REPLICAS_CHECK,
        UnderReplication,
    )
    from bookkeeper_py.wire.proto import data_formats_pb2 as formats

    shell(capsys, uri, "initnewcluster")
    assert "name the checks" in refused(capsys, uri, "forceauditchecks")
    said = shell(capsys, uri, "forceauditchecks", "-calc", "-rc")
    assert "checkallledgersctime, replicascheckctime set to 0" in said
    with MetadataClient.connect(uri) as metadata:
        root = metadata.root

        async def check(port: MetadataPort) -> None:
            markers = await UnderReplication(port).ensure_layout()
            assert await markers.check_ctime(CHECK_ALL_LEDGERS) == 0
            assert await markers.check_ctime(REPLICAS_CHECK) == 0
            assert await markers.check_ctime(PLACEMENT_POLICY_CHECK) is None  # not asked
            data, _ = await port.get_node(f"{root}/underreplication/checkallledgersctime")
            parsed = formats.CheckAllLedgersFormat.FromString(data)  # BookKeeper's binary form
            assert parsed.HasField("checkAllLedgersCTime") and parsed.checkAllLedgersCTime == 0
            await markers.mark(7, ["h:1"])
            await markers.mark(8, ["h:2"])
            assert await markers.acquire(7, "worker-a:3181")

        assert shell(capsys, uri, "queryautorecoverystatus").splitlines() == [
            "CurrentRecoverLedgerInfo:",
            "No Ledger is being recovered",
        ]
        metadata.create_ledger_metadata(sample(7))
        run_blocking(metadata, check)  # the lock lasts as long as this session
        assert shell(capsys, uri, "queryautorecoverystatus", "-v").splitlines() == [
            "CurrentRecoverLedgerInfo:",
            "LedgerId: 7, BookieId: worker-a:3181, LedgerSize: 0",
        ]


def test_ledgers_are_shown_and_deleted_through_the_admin_service(
    capsys: pytest.CaptureFixture[str], uri: str
) -> None:
    shell(capsys, uri, "initnewcluster")
    ledger_id = make_ledger(uri)
    with MetadataClient.connect(uri) as metadata:
        admin = ClusterAdmin(metadata)
        metadata.register_bookie("127.0.0.1:3181", "127.0.0.1", 3181)
        metadata.register_bookie("127.0.0.1:3182", "127.0.0.1", 3182, readonly=True)
        assert admin.bookies() == [
            BookieStatus("127.0.0.1:3181", False),
            BookieStatus("127.0.0.1:3182", True),
        ]
        assert admin.bookies(read_only=False) == [BookieStatus("127.0.0.1:3181", False)]
        assert admin.ledgers() == [ledger_id]
        ledger, version = admin.ledger(ledger_id)
        assert ledger.ledger_id == ledger_id and version == 0
        # (registrations are ephemeral: listed while this session holds them)
        assert shell(capsys, uri, "listbookies").split("\n")[:2] == [
            "127.0.0.1:3181",
            "127.0.0.1:3182 (read-only)",
        ]
    assert "needs -f" in refused(capsys, uri, "deleteledger", "-l", str(ledger_id))
    assert "deleted" in shell(capsys, uri, "deleteledger", "-l", str(ledger_id), "-f")
    assert shell(capsys, uri, "listledgers").split() == []
    assert "no ledger" in refused(capsys, uri, "deleteledger", "-l", str(ledger_id), "-f")
    assert "no ledger" in refused(capsys, uri, "ledgermetadata", "-l", str(ledger_id))


def test_bookierack(capsys: pytest.CaptureFixture[str], uri: str) -> None:
    """Racks kept as Pulsar keeps them (``bookies`` beside the ledgers' root), read back by the
    shell and by a rack-aware client; bad input refused with nothing changed."""
    import asyncio
    import json
    import posixpath

    from bookkeeper_py.client.client import BookKeeper
    from bookkeeper_py.client.config import ClientConfig
    from bookkeeper_py.metadata import racks

    shell(capsys, uri, "initnewcluster")
    assert "no bookie has a rack" in shell(capsys, uri, "bookierack", "list")
    out = shell(capsys, uri, "bookierack", "set", "10.0.0.1:3181", "/eu/rack-1", "--hostname", "b1")
    assert "10.0.0.1:3181: rack /eu/rack-1" in out
    shell(capsys, uri, "bookierack", "set", "10.0.0.2:3181", "/rack-2", "--group", "tenant-a")
    shell(capsys, uri, "bookierack", "set", "10.0.0.3:3181", "/rack-3")
    assert shell(capsys, uri, "bookierack", "get", "10.0.0.1:3181").split() == [
        "10.0.0.1:3181",
        "/eu/rack-1",
        "default",
    ]
    listed = [line.split("\t") for line in shell(capsys, uri, "bookierack", "list").splitlines()]
    assert [row[:3] for row in listed] == [
        ["10.0.0.1:3181", "/eu/rack-1", "default (b1)"],
        ["10.0.0.3:3181", "/rack-3", "default"],
        ["10.0.0.2:3181", "/rack-2", "tenant-a"],
    ]
    # moved to another group: in one group only
    shell(capsys, uri, "bookierack", "set", "10.0.0.3:3181", "/rack-4", "--group", "tenant-a")
    metadata = MetadataClient.connect(uri)
    node = posixpath.join(posixpath.dirname(metadata.root), "bookies")  # /bookies for /ledgers
    try:
        data, _ = metadata.store.get(node)
        stored = json.loads(data)
    finally:
        metadata.close()
    assert stored == {
        "default": {"10.0.0.1:3181": {"rack": "/eu/rack-1", "hostname": "b1"}},
        "tenant-a": {"10.0.0.2:3181": {"rack": "/rack-2"}, "10.0.0.3:3181": {"rack": "/rack-4"}},
    }
    for argv, said in (
        (("set", "10.0.0.1:3181", "rack-without-slash"), "/rack or /region/rack"),
        (("set", "10.0.0.1:3181", "/a/b/c"), "/rack or /region/rack"),
        (("set", "not a bookie", "/r"), "nothing was changed"),
        (("set", "10.0.0.1:3181"), "needs a rack"),
        (("get", "10.0.0.9:3181"), "has no rack"),
        (("delete", "10.0.0.9:3181"), "no rack to delete"),
        (("get",), "needs a bookie id"),
        (("list", "x", "/r"), "takes no rack"),
    ):
        assert said in refused(capsys, uri, "bookierack", *argv), argv
    assert shell(capsys, uri, "bookierack", "get", "10.0.0.1:3181").split()[1] == "/eu/rack-1"

    async def placed() -> tuple[str, str]:
        async with BookKeeper(uri, ClientConfig(placement="rackaware")) as client:
            await client.list_ledgers()  # any operation connects and reads the racks
            topology = client.placement.topology  # type: ignore[attr-defined]
            return topology.rack("10.0.0.1:3181"), topology.rack("10.0.0.5:3181")

    assert asyncio.run(placed()) == (("eu", "rack-1"), ("default-region", "default-rack"))

    async def random_reads_nothing() -> bool:
        async with BookKeeper(uri) as client:  # random placement: no racks node read
            await client.list_ledgers()
            return client._racks_loading is None

    assert asyncio.run(random_reads_nothing())
    assert "rack deleted" in shell(capsys, uri, "bookierack", "delete", "10.0.0.1:3181")
    assert "10.0.0.1" not in shell(capsys, uri, "bookierack", "list")
    # a malformed node: one line naming it, for the shell; a client places as if in one rack
    metadata = MetadataClient.connect(uri)
    try:
        _, version = metadata.store.get(node)
        metadata.store.set(node, b"[1, 2]", version)
    finally:
        metadata.close()
    assert f"racks node {node} is not" in refused(capsys, uri, "bookierack", "list")
    assert racks.DEFAULT_GROUP == "default"
