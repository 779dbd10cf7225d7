"""TLS (START_TLS and TLS from the first byte, hostname verification, mutual TLS) and the
authentication plugin, against bookie processes, with certificates made by the test."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from bookkeeper_py import errors
from bookkeeper_py.auth import (
    SHARED_SECRET_PLUGIN,
    AuthenticationError,
    SharedSecretClientAuthProvider,
)
from bookkeeper_py.client.connection import BookieConnection
from bookkeeper_py.client.facade import BookKeeper
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.raw import frame, recv_frame
from bookkeeper_py.tls import TlsConfig, TlsError

SECRET = b"a shared secret of more than 16 bytes"
KEY = bytes([0x44]) * 20
LEDGER = 9_100_000_001


class Pki:
    """A CA, a bookie certificate for ``names`` and a client certificate, as PEM files."""

    def __init__(self, directory: Path, *names: str) -> None:
        self.ca = trustme.CA()
        self.ca_path = str(directory / "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_path)
        bookie = self.ca.issue_cert(*names)
        self.bookie_cert = str(directory / "bookie.pem")
        self.bookie_key = str(directory / "bookie.key")
        bookie.cert_chain_pems[0].write_to_path(self.bookie_cert)
        bookie.private_key_pem.write_to_path(self.bookie_key)
        client = self.ca.issue_cert("client.example")
        self.client_cert = str(directory / "client.pem")
        self.client_key = str(directory / "client.key")
        client.cert_chain_pems[0].write_to_path(self.client_cert)
        client.private_key_pem.write_to_path(self.client_key)

    def bookie_args(self, *extra: str) -> list[str]:
        return ["--tls-certificate", self.bookie_cert, "--tls-key", self.bookie_key, *extra]

    def client(self, **changes: object) -> TlsConfig:
        settings: dict[str, object] = {"trust_path": self.ca_path}
        settings.update(changes)
        return TlsConfig(**settings)  # type: ignore[arg-type]


def write_read(cluster: LocalCluster, **client_options: object) -> None:
    """Creates a ledger on the one bookie, writes 20 entries, reads them back."""
    with BookKeeper(cluster.metadata_uri, **client_options) as client:  # type: ignore[arg-type]
        handle = client.create_ledger(1, 1, 1, password=b"pw")
        for index in range(20):
            handle.add_entry(b"entry-%d" % index)
        handle.close()
        with client.open_ledger(handle.ledger_id, password=b"pw") as reader:
            assert [e.data for e in reader.read_entries(0, 19)] == [
                b"entry-%d" % i for i in range(20)
            ]


def connect(cluster: LocalCluster, **options: object) -> None:
    """Opens (TLS, authentication) and closes one connection to the bookie."""
    host, port = cluster.bookie_ids[0].rsplit(":", 1)

    async def run() -> None:
        connection = await BookieConnection.connect(
            cluster.bookie_ids[0],
            host,
            int(port),
            use_v3=bool(options.pop("use_v3", False)),
            connect_timeout_s=10,
            request_timeout_s=10,
            **options,  # type: ignore[arg-type]
        )
        connection.close()

    asyncio.run(run())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"), "127.0.0.1", "localhost")


@pytest.fixture(scope="module")
def tls_cluster(pki: Pki) -> Iterator[LocalCluster]:
    with LocalCluster(1, bookie_args=pki.bookie_args()) as cluster:
        yield cluster


@pytest.mark.parametrize("use_v3", [False, True], ids=["v2", "v3"])
@pytest.mark.parametrize("start_tls", [True, False], ids=["start-tls", "tls-first"])
def test_a_good_certificate_works(
    tls_cluster: LocalCluster, pki: Pki, use_v3: bool, start_tls: bool
) -> None:
    write_read(tls_cluster, use_v3=use_v3, tls=pki.client(start_tls=start_tls))


def test_plain_clients_still_work_without_mutual_tls(tls_cluster: LocalCluster) -> None:
    write_read(tls_cluster)


def test_a_wrong_hostname_is_refused_by_default(tmp_path: Path) -> None:
    elsewhere = Pki(tmp_path, "bookie.example")  # the bookie listens on 127.0.0.1
    with LocalCluster(1, bookie_args=elsewhere.bookie_args()) as cluster:
        with pytest.raises(TlsError, match=r"(?i)hostname|ip address mismatch"):
            connect(cluster, tls=elsewhere.client())
        # the same certificate is accepted once hostname verification is turned off
        connect(cluster, tls=elsewhere.client(hostname_verification=False))
        # and an untrusted CA is refused whatever the host name
        (tmp_path / "other").mkdir()
        stranger = Pki(tmp_path / "other", "127.0.0.1")
        with pytest.raises(TlsError, match="certificate verify failed"):
            connect(cluster, tls=stranger.client(hostname_verification=False))


def test_mutual_tls_refuses_a_client_without_a_certificate(pki: Pki) -> None:
    args = pki.bookie_args("--tls-client-auth", "true", "--tls-trust", pki.ca_path)
    with LocalCluster(1, bookie_args=args) as cluster:
        write_read(
            cluster, tls=pki.client(certificate_path=pki.client_cert, key_path=pki.client_key)
        )
        with pytest.raises(errors.WriteError, match=r"(?i)certificate required"):
            write_read(cluster, tls=pki.client())
        # a plain connection has no certificate either: refused with EUA (102)
        host, port = cluster.bookie_ids[0].rsplit(":", 1)
        ledger = LEDGER.to_bytes(8, "big")
        with socket.create_connection((host, int(port)), timeout=10) as plain:
            plain.sendall(frame(bytes.fromhex("02020000") + ledger + bytes(8)))
            assert recv_frame(plain) == bytes.fromhex("0202000000000066") + ledger + bytes(8)


def test_start_tls_byte_by_byte_then_v2_inside_tls(tls_cluster: LocalCluster, pki: Pki) -> None:
    host, port = tls_cluster.bookie_ids[0].rsplit(":", 1)
    context = ssl.create_default_context(cafile=pki.ca_path)
    ledger = LEDGER.to_bytes(8, "big")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        # Request {header {VERSION_THREE, START_TLS (9), txnId 1}, startTLSRequest (field 106,
        # tag d206) {}}; the answer echoes the header, status EOK, an empty startTLSResponse.
        raw.sendall(frame(bytes.fromhex("0a06080310091801d20600")))
        assert recv_frame(raw) == bytes.fromhex("0a06080310091801" + "1000" + "d20600")
        with context.wrap_socket(raw, server_hostname=host) as secure:
            # now v2 inside TLS: an add, then its read
            entry = ledger + bytes(8) + b"over tls"
            secure.sendall(frame(bytes.fromhex("02010000") + KEY + entry))
            assert recv_frame(secure) == bytes.fromhex("0201000000000000") + ledger + bytes(8)
            secure.sendall(frame(bytes.fromhex("02020000") + ledger + bytes(8)))
            assert (
                recv_frame(secure) == bytes.fromhex("0202000000000000") + ledger + bytes(8) + entry
            )


def test_start_tls_without_tls_configured_is_ebadreq() -> None:
    with LocalCluster(1) as cluster:
        host, port = cluster.bookie_ids[0].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(frame(bytes.fromhex("0a06080310091802d20600")))
            # status EBADREQ (404 = varint 9403)
            assert recv_frame(raw) == bytes.fromhex("0a06080310091802109403")
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(b"\x16\x03\x01\x00\x05hello")  # a TLS record to a plain-only bookie
            assert raw.recv(1) == b""


# -- authentication ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    secret_file = tmp_path_factory.mktemp("auth") / "secret"
    secret_file.write_bytes(SECRET + b"\n")
    args = ["--auth-provider", "shared-secret", "--auth-secret-file", str(secret_file)]
    with LocalCluster(1, bookie_args=args) as cluster:
        yield cluster


@pytest.mark.parametrize("use_v3", [False, True], ids=["v2", "v3"])
def test_shared_secret_authentication(auth_cluster: LocalCluster, use_v3: bool) -> None:
    write_read(
        auth_cluster, use_v3=use_v3, auth=SharedSecretClientAuthProvider(SECRET, name="tester")
    )
    with pytest.raises(AuthenticationError, match="does not hold the same shared secret"):
        connect(
            auth_cluster,
            use_v3=use_v3,
            auth=SharedSecretClientAuthProvider(b"another secret, also long enough"),
        )


def test_requests_before_auth_get_eua_and_garbage_closes(auth_cluster: LocalCluster) -> None:
    host, port = auth_cluster.bookie_ids[0].rsplit(":", 1)
    ledger = LEDGER.to_bytes(8, "big")
    entry = ledger + bytes(8) + b"unauthenticated"
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(frame(bytes.fromhex("02010000") + KEY + entry))  # v2 add
        assert recv_frame(raw) == bytes.fromhex("0201000000000066") + ledger + bytes(8)
        raw.sendall(frame(bytes.fromhex("02020000") + ledger + bytes(8)))  # v2 read
        assert recv_frame(raw) == bytes.fromhex("0202000000000066") + ledger + bytes(8)
        raw.sendall(frame(b"\x02\x63garbage"))  # unknown opcode 99: closed
        assert raw.recv(1) == b""
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        # v3 READ_LAC (op 7, txn 5) before AUTH: Response {header, status EUA (502 = f603)}
        raw.sendall(frame(bytes.fromhex("0a06080310071805c20602") + bytes([0x08, 0x01])))
        assert recv_frame(raw) == bytes.fromhex("0a0608031007180510f603")
    # nothing was stored by the refused add: an authenticated reader finds no such ledger
    host_port = (host, int(port))
    with socket.create_connection(host_port, timeout=10) as raw:
        client_nonce = bytes(range(32))
        message = bytes([1]) + client_nonce + b"raw"
        auth = (
            bytes([0x0A, len(SHARED_SECRET_PLUGIN)])
            + SHARED_SECRET_PLUGIN.encode()
            + bytes([0x12, len(message)])
            + message
        )
        raw.sendall(frame(bytes.fromhex("02030000") + auth))  # v2 AUTH: header, AuthMessage
        answer = recv_frame(raw)
        head = bytes.fromhex("02030000") + bytes([0x0A, len(SHARED_SECRET_PLUGIN)])
        assert answer.startswith(head + SHARED_SECRET_PLUGIN.encode() + bytes([0x12, 64]))
        bookie_nonce, proof = answer[-64:-32], answer[-32:]
        expected = hmac.new(
            SECRET, b"bookie" + client_nonce + bookie_nonce + b"raw", hashlib.sha256
        ).digest()
        assert proof == expected
        client_proof = hmac.new(
            SECRET, b"client" + client_nonce + bookie_nonce + b"raw", hashlib.sha256
        ).digest()
        auth = (
            bytes([0x0A, len(SHARED_SECRET_PLUGIN)])
            + SHARED_SECRET_PLUGIN.encode()
            + bytes([0x12, 32])
            + client_proof
        )
        raw.sendall(frame(bytes.fromhex("02030000") + auth))
        final = recv_frame(raw)  # authenticated: an empty payload
        assert final == head + SHARED_SECRET_PLUGIN.encode() + bytes([0x12, 0])
        raw.sendall(frame(bytes.fromhex("02020000") + ledger + bytes(8)))
        assert recv_frame(raw) == bytes.fromhex("0202000000000001") + ledger + bytes(8)  # ENOLEDGER
        raw.sendall(frame(bytes.fromhex("02010000") + KEY + entry))
        assert recv_frame(raw) == bytes.fromhex("0201000000000000") + ledger + bytes(8)


def test_v3_auth_byte_by_byte(auth_cluster: LocalCluster) -> None:
    host, port = auth_cluster.bookie_ids[0].rsplit(":", 1)
    plugin = bytes([0x0A, len(SHARED_SECRET_PLUGIN)]) + SHARED_SECRET_PLUGIN.encode()
    client_nonce = bytes(range(100, 132))

    def auth_request(txn: int, payload: bytes) -> bytes:
        # Request {header {VERSION_THREE, AUTH (5), txn}, authRequest (field 102, tag b206)
        # {authPluginName, payload}}
        message = plugin + bytes([0x12, len(payload)]) + payload
        return frame(
            bytes.fromhex("0a060803100518")
            + bytes([txn])
            + bytes.fromhex("b206")
            + bytes([len(message)])
            + message
        )

    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(auth_request(1, bytes([1]) + client_nonce + b"v3"))
        answer = recv_frame(raw)
        head = bytes.fromhex("0a06080310051801" + "1000" + "b206")
        message_length = len(plugin) + 2 + 64
        assert answer[: len(head) + 1] == head + bytes([message_length])
        assert answer[len(head) + 1 : -64] == plugin + bytes([0x12, 64])
        bookie_nonce, proof = answer[-64:-32], answer[-32:]
        assert (
            proof
            == hmac.new(
                SECRET, b"bookie" + client_nonce + bookie_nonce + b"v3", hashlib.sha256
            ).digest()
        )
        client_proof = hmac.new(
            SECRET, b"client" + client_nonce + bookie_nonce + b"v3", hashlib.sha256
        ).digest()
        raw.sendall(auth_request(2, client_proof))
        final = plugin + bytes([0x12, 0])
        assert (
            recv_frame(raw)
            == bytes.fromhex("0a060803100518021000b206") + bytes([len(final)]) + final
        )
        # authenticated: READ_LAC (txn 3) of an unknown ledger is ENOLEDGER (402 = 9203), not EUA
        raw.sendall(frame(bytes.fromhex("0a06080310071803c20602") + bytes([0x08, 0x07])))
        assert recv_frame(raw) == bytes.fromhex("0a06080310071803109203c20605089203") + bytes(
            [0x10, 0x07]
        )
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(auth_request(1, bytes([1]) + client_nonce + b"v3"))
        recv_frame(raw)
        raw.sendall(auth_request(2, bytes(32)))  # a wrong proof: EUA (502 = f603), then closed
        assert recv_frame(raw) == bytes.fromhex("0a0608031005180210f603")
        assert raw.recv(1) == b""
