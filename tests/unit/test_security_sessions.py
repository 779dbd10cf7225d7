"""The shared-secret authentication plugin and the sans-IO TLS session, both ends in memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from bookkeeper_py.auth import (
    AuthenticationError,
    PeerInfo,
    SharedSecretBookieAuthProvider,
    SharedSecretClientAuthProvider,
    bookie_provider,
    read_secret,
)
from bookkeeper_py.tls import TlsConfig, TlsConfigError, TlsError, TlsSession

SECRET = b"0123456789abcdef-secret"


def run_exchange(client_secret: bytes, bookie_secret: bytes) -> str | None:
    """Runs the plugin to its end; the principal the bookie settled on."""
    client = SharedSecretClientAuthProvider(client_secret, name="alice").new_session()
    bookie = SharedSecretBookieAuthProvider(bookie_secret).new_session(PeerInfo("test"))
    payload: bytes | None = client.initial()
    for _ in range(4):
        assert payload is not None
        step = bookie.process(payload)
        payload = client.process(step.reply)
        if payload is None:
            return step.principal
    raise AssertionError("the exchange did not end")


def test_same_secret_authenticates_as_the_client_name() -> None:
    assert run_exchange(SECRET, SECRET) == "alice"


def test_a_bookie_without_the_secret_is_caught_by_the_client() -> None:
    # the bookie answers first with its proof: a client never gives its own proof to an impostor
    with pytest.raises(AuthenticationError, match="bookie's proof does not match"):
        run_exchange(SECRET, b"another secret entirely")


def test_replayed_or_out_of_turn_messages_are_refused() -> None:
    client = SharedSecretClientAuthProvider(SECRET).new_session()
    bookie = SharedSecretBookieAuthProvider(SECRET).new_session(PeerInfo("test"))
    first = client.initial()
    challenge = bookie.process(first)
    with pytest.raises(AuthenticationError, match="client's proof does not match"):
        bookie.process(first)  # the first message again instead of a proof
    with pytest.raises(AuthenticationError, match="malformed"):
        SharedSecretBookieAuthProvider(SECRET).new_session(PeerInfo("t")).process(
            b"\x02" + first[1:]
        )
    proof = client.process(challenge.reply)
    assert proof is not None
    with pytest.raises(AuthenticationError, match="out of turn"):
        client.process(b"unexpected")


def test_secret_files_and_provider_names(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_bytes(b"tiny\n")
    with pytest.raises(AuthenticationError, match="at least 16"):
        read_secret(str(short))
    with pytest.raises(AuthenticationError, match="cannot read"):
        read_secret(str(tmp_path / "absent"))
    assert bookie_provider(None, {}) is None
    with pytest.raises(AuthenticationError, match="needs authSharedSecretFile"):
        bookie_provider("shared-secret", {})
    with pytest.raises(AuthenticationError, match="not a known provider"):
        bookie_provider("org.apache.bookkeeper.sasl.SASLBookieAuthProviderFactory", {})
    with pytest.raises(AuthenticationError, match="cannot be loaded"):
        bookie_provider("no_such_module:factory", {})


def handshake(client: TlsSession, server: TlsSession) -> bytes:
    """Joins the two sessions until both finished the handshake; what the server received."""
    client.start()
    to_server = client.take_outgoing()
    received = b""
    for _ in range(10):
        plaintext, to_client = server.unwrap(to_server)
        received += plaintext
        _, to_server = client.unwrap(to_client)  # the server's last records: session tickets
        if client.handshake_done and server.handshake_done:
            return received
    raise AssertionError("handshake did not finish")


def test_tls_sessions_carry_bytes_both_ways_and_refuse_garbage(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca_path, cert_path, key_path = (str(tmp_path / n) for n in ("ca", "cert", "key"))
    ca.cert_pem.write_to_path(ca_path)
    cert.cert_chain_pems[0].write_to_path(cert_path)
    cert.private_key_pem.write_to_path(key_path)
    server_config = TlsConfig(certificate_path=cert_path, key_path=key_path)
    client_config = TlsConfig(trust_path=ca_path)
    server = TlsSession(server_config.server_context(), server_side=True)
    client = TlsSession(
        client_config.client_context(), server_side=False, server_hostname="127.0.0.1"
    )
    early = client.wrap(b"queued before the handshake")
    assert early == b""
    assert handshake(client, server) == b"queued before the handshake"
    plaintext, _ = client.unwrap(server.wrap(b"x" * 1_000_000))
    assert plaintext == b"x" * 1_000_000
    with pytest.raises(TlsError):
        server.unwrap(b"\x17\x03\x03\x00\x10" + b"not a real record")
    with pytest.raises(TlsConfigError, match="needs tlsCertificatePath"):
        TlsConfig().server_context()
    with pytest.raises(TlsConfigError, match="cannot load certificate"):
        TlsConfig(certificate_path=ca_path, key_path=str(tmp_path / "absent")).server_context()
