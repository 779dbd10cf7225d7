"""What the ZooKeeper driver writes, read back with plain kazoo and decoded with a schema the test
builds itself from the reference's field numbers (section 1.7 and 4), not the project's .proto."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from bookkeeper_py.core.metadata import LedgerMetadata, LedgerState
from bookkeeper_py.errors import MetadataStoreError
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing.zookeeper import ZooKeeperServer
from bookkeeper_py.wire.digest import DigestType

pytestmark = pytest.mark.zookeeper

F = descriptor_pb2.FieldDescriptorProto


def reference_schema() -> type:
    """LedgerMetadataFormat, field by field as the reference lists it (proto2)."""
    file = descriptor_pb2.FileDescriptorProto(
        name=f"reference_{uuid.uuid4().hex}.proto", package="reference", syntax="proto2"
    )
    message = file.message_type.add(name="LedgerMetadataFormat")
    state = message.enum_type.add(name="State")
    for name, number in (("OPEN", 1), ("IN_RECOVERY", 2), ("CLOSED", 3)):
        state.value.add(name=name, number=number)
    digest = message.enum_type.add(name="DigestType")
    for name, number in (("CRC32", 1), ("HMAC", 2), ("CRC32C", 3), ("DUMMY", 4)):
        digest.value.add(name=name, number=number)
    segment = message.nested_type.add(name="Segment")
    segment.field.add(name="ensembleMember", number=1, label=F.LABEL_REPEATED, type=F.TYPE_STRING)
    segment.field.add(name="firstEntryId", number=2, label=F.LABEL_REQUIRED, type=F.TYPE_INT64)
    entry = message.nested_type.add(name="cMetadataMapEntry")
    entry.field.add(name="key", number=1, label=F.LABEL_OPTIONAL, type=F.TYPE_STRING)
    entry.field.add(name="value", number=2, label=F.LABEL_OPTIONAL, type=F.TYPE_BYTES)
    prefix = ".reference.LedgerMetadataFormat"
    for name, number, label, kind, type_name in (
        ("quorumSize", 1, F.LABEL_REQUIRED, F.TYPE_INT32, None),
        ("ensembleSize", 2, F.LABEL_REQUIRED, F.TYPE_INT32, None),
        ("length", 3, F.LABEL_REQUIRED, F.TYPE_INT64, None),
        ("lastEntryId", 4, F.LABEL_OPTIONAL, F.TYPE_INT64, None),
        ("state", 5, F.LABEL_REQUIRED, F.TYPE_ENUM, f"{prefix}.State"),
        ("segment", 6, F.LABEL_REPEATED, F.TYPE_MESSAGE, f"{prefix}.Segment"),
        ("digestType", 7, F.LABEL_OPTIONAL, F.TYPE_ENUM, f"{prefix}.DigestType"),
        ("password", 8, F.LABEL_OPTIONAL, F.TYPE_BYTES, None),
        ("ackQuorumSize", 9, F.LABEL_OPTIONAL, F.TYPE_INT32, None),
        ("ctime", 10, F.LABEL_OPTIONAL, F.TYPE_INT64, None),
        ("customMetadata", 11, F.LABEL_REPEATED, F.TYPE_MESSAGE, f"{prefix}.cMetadataMapEntry"),
        ("cToken", 12, F.LABEL_OPTIONAL, F.TYPE_INT64, None),
    ):
        field = message.field.add(name=name, number=number, label=label, type=kind)
        if type_name:
            field.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("reference.LedgerMetadataFormat")
    )


def varint(data: bytes, position: int) -> tuple[int, int]:
    """(value, position after it) of a protobuf base-128 varint."""
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position


def sample(ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum_size=3,
        ack_quorum_size=2,
        digest_type=DigestType.MAC,
        password=b"ledger password",
        ensembles=(
            (0, ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")),
            (500, ("10.0.0.1:3181", "10.0.0.4:3181", "10.0.0.3:3181")),
        ),
        state=LedgerState.CLOSED,
        last_entry_id=999,
        length=123_456,
        ctime_ms=1_700_000_000_123,
        custom_metadata={"application": b"pulsar", "component": b"\x00\x01"},
        c_token=987_654_321,
    )


def test_znodes_as_apache_bookkeeper_lays_them_out(zookeeper: ZooKeeperServer) -> None:
    root = f"/layout-{uuid.uuid4().hex[:8]}/ledgers"
    metadata = MetadataClient.connect(zookeeper.metadata_uri(root))
    small, large = 4_242, 2**31 + 5
    try:
        metadata.init_cluster()
        for ledger_id in (small, large):
            metadata.create_ledger_metadata(sample(ledger_id))
    finally:
        metadata.close()
    kazoo = KazooClient(hosts=zookeeper.connect_string)
    kazoo.start(timeout=30)
    try:
        layout, _ = kazoo.get(f"{root}/LAYOUT")
        assert layout == b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
        instance, _ = kazoo.get(f"{root}/INSTANCEID")
        assert str(uuid.UUID(instance.decode())) == instance.decode()
        assert {"available", "LAYOUT", "INSTANCEID"} <= set(kazoo.get_children(root))
        assert kazoo.get_children(f"{root}/available") == ["readonly"]
        schema = reference_schema()
        for path in (
            f"{root}/00/0000/L4242",  # 4242: 10 digits split 2-4-4
            f"{root}/000/0000/0021/4748/L3653",  # 2^31 + 5: 19 digits split 3-4-4-4-4
        ):
            data, _ = kazoo.get(path)
            header = b"BookieMetadataFormatVersion\t3\n"
            assert data.startswith(header)
            length, start = varint(data, len(header))
            assert start + length == len(data)
            decoded = schema()
            decoded.ParseFromString(data[start:])
            assert decoded.quorumSize == 3 and decoded.ensembleSize == 3
            assert decoded.ackQuorumSize == 2
            assert decoded.length == 123_456 and decoded.lastEntryId == 999
            assert decoded.state == 3  # CLOSED
            assert decoded.digestType == 2  # HMAC
            assert decoded.password == b"ledger password"
            assert decoded.ctime == 1_700_000_000_123 and decoded.cToken == 987_654_321
            assert [(s.firstEntryId, list(s.ensembleMember)) for s in decoded.segment] == [
                (0, ["10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"]),
                (500, ["10.0.0.1:3181", "10.0.0.4:3181", "10.0.0.3:3181"]),
            ]
            assert {e.key: e.value for e in decoded.customMetadata} == {
                "application": b"pulsar",
                "component": b"\x00\x01",
            }
    finally:
        kazoo.stop()
        kazoo.close()


def test_digest_acls_keep_ledger_passwords_from_other_sessions(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> None:
    digest = tmp_path / "zk.digest"
    digest.write_text("bookkeeper:s3cret\n")
    root = f"/acl-{uuid.uuid4().hex[:8]}/ledgers"
    uri = zookeeper.metadata_uri(root) + f"?digestAuthFile={digest}"
    metadata = MetadataClient.connect(uri)
    try:
        metadata.init_cluster()
        metadata.create_ledger_metadata(sample(7))
        assert metadata.read_ledger_metadata(7)[0].password == b"ledger password"
    finally:
        metadata.close()
    stranger = KazooClient(hosts=zookeeper.connect_string)
    stranger.start(timeout=30)
    try:
        with pytest.raises(NoAuthError):
            stranger.get(f"{root}/00/0000/L0007")
    finally:
        stranger.stop()
        stranger.close()
    outsider = MetadataClient.connect(zookeeper.metadata_uri(root))
    try:
        with pytest.raises(MetadataStoreError, match="not authorised"):
            outsider.read_ledger_metadata(7)
    finally:
        outsider.close()
    member = MetadataClient.connect(uri)  # another session with the same identity
    try:
        assert member.read_ledger_metadata(7)[0].custom_metadata["application"] == b"pulsar"
    finally:
        member.close()
