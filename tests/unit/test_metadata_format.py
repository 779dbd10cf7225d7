"""Ledger metadata format v3 and the znode layout, against bytes and paths written out by hand
from reference sections 1.7-1.9."""

from __future__ import annotations

import pytest

from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.errors import MetadataStoreError
from bookkeeper_py.metadata import format as metadata_format
from bookkeeper_py.metadata.driver import parse_uri
from bookkeeper_py.metadata.layout import iter_ledger_ids, ledger_path
from bookkeeper_py.wire.digest import DigestType

HEADER = b"BookieMetadataFormatVersion\t3\n"
SEGMENT = (
    bytes.fromhex("0a03")
    + b"a:1"
    + bytes.fromhex("0a03")
    + b"b:2"
    + bytes.fromhex("0a03")
    + b"c:3"
    + bytes.fromhex("1000")
)


def metadata(**changes: object) -> LedgerMetadata:
    base: dict[str, object] = dict(
        ledger_id=1,
        ensemble_size=3,
        write_quorum_size=2,
        ack_quorum_size=2,
        digest_type=DigestType.CRC32C,
        password=b"pw",
        ensembles=((0, ("a:1", "b:2", "c:3")),),
    )
    base.update(changes)
    return LedgerMetadata(**base)  # type: ignore[arg-type]


def test_open_ledger_v3_bytes() -> None:
    body = (
        bytes.fromhex("08021003180028013211")
        + SEGMENT
        + bytes.fromhex("38034202")
        + b"pw"
        + bytes.fromhex("4802")
    )
    assert len(body) == 0x23
    expected = HEADER + b"\x23" + body
    assert metadata_format.serialize(metadata()) == expected
    assert metadata_format.deserialize(1, expected) == metadata()


CLOSED_WITH_EXTRAS: dict[str, object] = dict(
    state=LedgerState.CLOSED, last_entry_id=9, length=300, ctime_ms=5, custom_metadata={"k": b"v"}
)


def test_closed_ledger_v3_bytes_with_custom_metadata_ctime_and_token() -> None:
    md = metadata(**CLOSED_WITH_EXTRAS, c_token=7)
    body = (
        bytes.fromhex("0802100318ac02200928033211")
        + SEGMENT
        + bytes.fromhex("38034202")
        + b"pw"
        + bytes.fromhex("480250055a060a01")
        + b"k"
        + bytes.fromhex("1201")
        + b"v"
        + bytes.fromhex("6007")
    )
    expected = HEADER + bytes([len(body)]) + body
    assert metadata_format.serialize(md) == expected
    assert metadata_format.deserialize(1, expected) == md


V2_OPEN = (
    b"BookieMetadataFormatVersion\t2\n"
    b"quorumSize: 2\nensembleSize: 3\nlength: 0\nstate: OPEN\n"
    b'segment { ensembleMember: "a:1" ensembleMember: "b:2" ensembleMember: "c:3" firstEntryId: 0 }\n'
)


def test_v2_text_format_is_readable() -> None:
    text = V2_OPEN + b'digestType: CRC32C\npassword: "pw"\nackQuorumSize: 2\n'
    parsed = metadata_format.deserialize(1, text)
    assert parsed.ensembles == metadata().ensembles
    assert parsed.format_version == 2


V1_CLOSED = (
    b"BookieMetadataFormatVersion\t1\n2\n3\n300\n0\ta:1\tb:2\tc:3\n5\ta:1\tb:2\td:4\n9\tCLOSED"
)


def test_v1_closed_ledger_is_read_and_written_back_byte_for_byte() -> None:
    parsed = metadata_format.deserialize(7, V1_CLOSED)
    assert (parsed.write_quorum_size, parsed.ack_quorum_size, parsed.ensemble_size) == (2, 2, 3)
    assert parsed.ensembles == ((0, ("a:1", "b:2", "c:3")), (5, ("a:1", "b:2", "d:4")))
    assert (parsed.state, parsed.last_entry_id, parsed.length) == (LedgerState.CLOSED, 9, 300)
    assert (parsed.format_version, parsed.stores_password) == (1, False)
    assert metadata_format.serialize(parsed) == V1_CLOSED


def test_v1_open_in_recovery_and_headerless() -> None:
    open_v1 = b"BookieMetadataFormatVersion\t1\n2\n3\n0\n0\ta:1\tb:2\tc:3\n"
    parsed = metadata_format.deserialize(7, open_v1)
    assert (parsed.state, parsed.last_entry_id) == (LedgerState.OPEN, -1)
    assert metadata_format.serialize(parsed) == open_v1
    recovering = metadata_format.serialize(parsed.with_state(LedgerState.IN_RECOVERY))
    assert recovering == open_v1 + b"-102\tCLOSED"
    assert metadata_format.deserialize(7, recovering).state == LedgerState.IN_RECOVERY
    # The very first clients wrote no header line at all.
    headerless = metadata_format.deserialize(7, b"2\r\n3\r\n0\r\n0\ta:1\tb:2\tc:3\r\n")
    assert headerless.ensembles == parsed.ensembles and headerless.format_version == 1


def test_v2_is_written_back_as_v2_and_keeps_every_field() -> None:
    md = metadata(**CLOSED_WITH_EXTRAS, format_version=2)
    data = metadata_format.serialize(md)
    assert data.startswith(b"BookieMetadataFormatVersion\t2\nquorumSize: 2\n")
    assert b'password: "pw"' in data and b"lastEntryId: 9" in data
    assert metadata_format.deserialize(1, data) == md


def test_metadata_without_a_password_keeps_none() -> None:
    text = V2_OPEN + b"digestType: HMAC\n"
    parsed = metadata_format.deserialize(1, text)
    # As BookKeeper: a digest type without a password is ignored; the opener names both.
    assert (parsed.stores_password, parsed.digest_type) == (False, DigestType.CRC32)
    again = metadata_format.deserialize(1, metadata_format.serialize(parsed))
    assert again.stores_password is False


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"garbage",
        HEADER + b"\x40" + b"\x08\x02",
        b"BookieMetadataFormatVersion\t4\n",
        b"BookieMetadataFormatVersion\tx\n",
        b"BookieMetadataFormatVersion\t1\n2\n3\n",
        b"BookieMetadataFormatVersion\t1\n2\n3\n0\n0 a:1 b:2 c:3\n",
        b"BookieMetadataFormatVersion\t1\n2\n3\n0\n0\ta:1\n",
        b"BookieMetadataFormatVersion\t1\n2\n3\n0\n\xff\ta:1\n",
    ],
)
def test_corrupt_metadata_is_a_clear_error(data: bytes) -> None:
    with pytest.raises(MetadataStoreError, match="ledger 1"):
        metadata_format.deserialize(1, data)


@pytest.mark.parametrize(
    ("layout", "ledger_id", "path"),
    [
        ("hierarchical", 1, "/ledgers/00/0000/L0001"),
        ("hierarchical", 1234567890, "/ledgers/12/3456/L7890"),
        ("hierarchical", 2**31 - 2, "/ledgers/21/4748/L3646"),
        ("hierarchical", 2**31 - 1, "/ledgers/000/0000/0021/4748/L3647"),
        ("hierarchical", 2**63 - 1, "/ledgers/922/3372/0368/5477/L5807"),
        ("longhierarchical", 1, "/ledgers/000/0000/0000/0000/L0001"),
        ("flat", 42, "/ledgers/L0000000042"),
    ],
)
def test_ledger_paths(layout: str, ledger_id: int, path: str) -> None:
    assert ledger_path("/ledgers", layout, ledger_id) == path


def test_listing_walks_both_hierarchical_forms() -> None:
    ids = [3, 70_000, 2**31 - 2, 2**31 + 5, 2**40]
    tree: dict[str, list[str]] = {}
    for ledger_id in ids:
        parts = ledger_path("/ledgers", "hierarchical", ledger_id).split("/")
        for depth in range(2, len(parts)):
            parent = "/".join(parts[:depth])
            tree.setdefault(parent, [])
            if parts[depth] not in tree[parent]:
                tree[parent].append(parts[depth])
    tree["/ledgers"] += ["available", "LAYOUT", "idgen"]
    assert list(iter_ledger_ids("/ledgers", "hierarchical", lambda p: tree.get(p, []))) == ids


def test_uri_parsing() -> None:
    zk = parse_uri("zk+hierarchical://127.0.0.1:2181;127.0.0.2:2181/ledgers")
    assert (zk.scheme, zk.layout, zk.location, zk.root) == (
        "zk",
        "hierarchical",
        "127.0.0.1:2181,127.0.0.2:2181",
        "/ledgers",
    )
    assert parse_uri("zk://h:1/bk").root == "/bk"
    assert parse_uri("sqlite:///tmp/x.db").location == "/tmp/x.db"
    assert parse_uri("memory://t").location == "t"
    # Every malformed URI is a ValueError that names the accepted schemes.
    for malformed in (
        "etcd://h:1/x",
        "localhost:2181",
        "",
        "zk:///ledgers",
        "zk+tree://h:1/x",
        "sqlite://relative.db",
        "memory://",
        "zk://h:1/x?foo=1",
    ):
        with pytest.raises(ValueError, match=r"zk\+hierarchical://.*sqlite:///.*memory://"):
            parse_uri(malformed)
    with pytest.raises(ValueError, match="unsupported scheme 'etcd'"):
        parse_uri("etcd://h:1/x")


def test_metadata_uris() -> None:
    from bookkeeper_py.errors import IncorrectParameterError
    from bookkeeper_py.metadata.driver import parse_uri

    address = parse_uri("zk+hierarchical://zk1:2181;zk2:2181/bk/ledgers?digestAuthFile=/etc/d")
    assert (address.location, address.root, address.digest_auth_file) == (
        "zk1:2181,zk2:2181",
        "/bk/ledgers",
        "/etc/d",
    )
    assert parse_uri("zk://zk1:2181").digest_auth_file is None
    with pytest.raises(IncorrectParameterError, match="unknown option"):
        parse_uri("zk://zk1:2181/ledgers?digest=x")
