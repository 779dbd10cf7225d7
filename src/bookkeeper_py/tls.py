"""TLS for bookie connections: settings, SSL contexts, and a sans-IO TLS session.

Both ends run TLS through ``TlsSession`` (an ``ssl.SSLObject`` over memory buffers) inside their
own asyncio protocol instead of swapping transports. That lets the bookie serve, on one port,
plain connections, connections upgraded by ``START_TLS`` (BookKeeper's way) and connections that
start with a TLS ClientHello (its first byte, 0x16, would announce a frame of more than 350 MiB,
so it cannot be confused with a frame).

Certificates and keys are PEM files (BookKeeper's ``tlsKeyStoreType=PEM``).
"""

from __future__ import annotations

import os
import ssl
import tempfile
from dataclasses import dataclass

from bookkeeper_py.errors import BKError

TLS_HANDSHAKE_RECORD = 0x16  # first byte of a ClientHello
_READ_CHUNK = 256 * 1024


class TlsConfigError(BKError):
    """A TLS certificate, key or trust file cannot be used; the message names the file."""


class TlsError(BKError):
    """A TLS handshake or record failed (bad certificate, wrong host name, garbage); the
    connection is closed."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS settings of a bookie or a client (BookKeeper's key names in the comments)."""

    certificate_path: str | None = None
    """tlsCertificatePath: this side's certificate chain (PEM). Required on a bookie; on a
    client only for mutual TLS."""
    key_path: str | None = None
    """tlsKeyStore (with tlsKeyStoreType=PEM): the private key of ``certificate_path``."""
    trust_path: str | None = None
    """tlsTrustStore (PEM): CA certificates trusted to sign the peer's certificate. A client
    without one trusts the system's CAs; a bookie needs one to check client certificates."""
    client_authentication: bool = False
    """tlsClientAuthentication: the bookie refuses clients without a trusted certificate."""
    hostname_verification: bool = True
    """tlsHostnameVerificationEnabled: the client checks that the bookie's certificate names the
    host it connected to, and closes the connection otherwise."""
    start_tls: bool = True
    """Client: upgrade with the v3 START_TLS exchange (BookKeeper's way) instead of sending the
    TLS handshake as the first bytes."""

    def server_context(self) -> ssl.SSLContext:
        if not self.certificate_path or not self.key_path:
            raise TlsConfigError(
                "a bookie with TLS needs tlsCertificatePath and tlsKeyStore (PEM certificate and key)"
            )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load_chain(context)
        if self.client_authentication:
            if not self.trust_path:
                raise TlsConfigError(
                    "tlsClientAuthentication needs tlsTrustStore: the CAs that sign client certificates"
                )
            self._load_trust(context)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = self.hostname_verification
        context.verify_mode = ssl.CERT_REQUIRED
        if self.trust_path:
            self._load_trust(context)
        else:
            context.load_default_certs()
        if self.certificate_path:
            if not self.key_path:
                raise TlsConfigError(
                    f"client certificate {self.certificate_path} needs its key (tlsKeyStore)"
                )
            self._load_chain(context)
        return context

    def _load_chain(self, context: ssl.SSLContext) -> None:
        assert self.certificate_path is not None and self.key_path is not None
        try:
            context.load_cert_chain(self.certificate_path, self.key_path)
        except (OSError, ssl.SSLError) as error:
            raise TlsConfigError(
                f"cannot load certificate {self.certificate_path} with key {self.key_path}: {error}"
            ) from error

    def _load_trust(self, context: ssl.SSLContext) -> None:
        try:
            context.load_verify_locations(cafile=self.trust_path)
        except (OSError, ssl.SSLError) as error:
            raise TlsConfigError(
                f"cannot load trusted CA certificates from {self.trust_path}: {error}"
            ) from error


class TlsSession:
    """One TLS connection as bytes in, bytes out: feed what the socket received to
    ``receive`` (returns the plaintext), give plaintext to ``send``, and write whatever
    ``take_outgoing`` returns to the socket after either call."""

    def __init__(
        self, context: ssl.SSLContext, *, server_side: bool, server_hostname: str | None = None
    ) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._incoming,
            self._outgoing,
            server_side=server_side,
            server_hostname=None if server_side else server_hostname,
        )
        self.handshake_done = False
        self._pending_plaintext: list[bytes] = []

    def start(self) -> None:
        """Begins the handshake (the client's ClientHello lands in the outgoing bytes)."""
        self._step_handshake()

    def _step_handshake(self) -> None:
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            return
        except ssl.SSLError as error:
            raise TlsError(f"TLS handshake failed: {error}") from error
        self.handshake_done = True
        for plaintext in self._pending_plaintext:
            self._write(plaintext)
        self._pending_plaintext.clear()

    def receive(self, data: bytes) -> bytes:
        """The plaintext carried by ``data`` (empty during the handshake)."""
        if data:
            self._incoming.write(data)
        if not self.handshake_done:
            self._step_handshake()
            if not self.handshake_done:
                return b""
        chunks = []
        while True:
            try:
                chunk = self._tls.read(_READ_CHUNK)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                break
            except ssl.SSLError as error:
                raise TlsError(f"TLS record failed: {error}") from error
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def send(self, plaintext: bytes) -> None:
        """Encrypts ``plaintext`` (kept until the handshake is done)."""
        if not self.handshake_done:
            self._pending_plaintext.append(plaintext)
            return
        self._write(plaintext)

    def _write(self, plaintext: bytes) -> None:
        try:
            self._tls.write(plaintext)
        except ssl.SSLError as error:
            raise TlsError(f"TLS write failed: {error}") from error

    def wrap(self, plaintext: bytes) -> bytes:
        """The bytes to write to the socket to send ``plaintext``."""
        self.send(plaintext)
        return self.take_outgoing()

    def unwrap(self, data: bytes) -> tuple[bytes, bytes]:
        """(plaintext carried by ``data``, bytes to write back: handshake records, alerts)."""
        plaintext = self.receive(data)
        return plaintext, self.take_outgoing()

    def take_outgoing(self) -> bytes:
        """Bytes to write to the socket now."""
        return self._outgoing.read()

    def peer_certificate(self) -> dict[str, object] | None:
        """The peer's verified certificate, when it presented one."""
        if not self.handshake_done:
            return None
        return self._tls.getpeercert() or None  # type: ignore[return-value]


def _keystore(
    path: str, password: str | None, what: str
) -> tuple[bytes, bytes | None, list[bytes]]:
    """(PEM certificate chain, PEM private key or None, PEM extra certificates) of a keystore
    file: PKCS#12 (what Java's keytool writes by default since Java 9) or PEM. A JKS file is
    refused with the one-line conversion that makes it PKCS#12."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise TlsConfigError(f"cannot read the {what} {path}: {error.strerror}") from None
    if data[:4] == b"\xfe\xed\xfe\xed":
        raise TlsConfigError(
            f"the {what} {path} is a JKS keystore: convert it once to PKCS#12 with "
            f"keytool -importkeystore -srckeystore {path} -destkeystore {path}.p12 "
            "-deststoretype PKCS12, and name that file"
        )
    if b"-----BEGIN" in data:
        return data, data if b"PRIVATE KEY-----" in data else None, []
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        pkcs12,
    )

    try:
        key, certificate, extra = pkcs12.load_key_and_certificates(
            data, password.encode() if password else None
        )
    except ValueError as error:
        raise TlsConfigError(
            f"cannot open the {what} {path} as PKCS#12 or PEM ({error}); check the file and its "
            "password"
        ) from None
    chain = b"".join(
        cert.public_bytes(Encoding.PEM)
        for cert in ([certificate] if certificate else []) + list(extra)
    )
    key_pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()) if key else None
    return chain, key_pem, [cert.public_bytes(Encoding.PEM) for cert in extra]


def http_server_context(
    keystore_path: str,
    keystore_password: str | None,
    truststore_path: str,
    truststore_password: str | None,
) -> ssl.SSLContext:
    """The TLS context of a bookie's HTTP endpoint (``httpServerTlsEnable``): its certificate
    and key from the keystore, clients required to show a certificate signed by a CA of the
    truststore, as BookKeeper's Vert.x server requires (``ClientAuth.REQUIRED``)."""
    chain, key, _ = _keystore(keystore_path, keystore_password, "HTTP keystore")
    if key is None:
        raise TlsConfigError(
            f"the HTTP keystore {keystore_path} holds no private key: it needs the server's "
            "certificate and key"
        )
    trusted, _, extra = _keystore(truststore_path, truststore_password, "HTTP truststore")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="bk-http-tls-") as directory:
        chain_path, key_path = (
            os.path.join(directory, "chain.pem"),
            os.path.join(directory, "key.pem"),
        )
        for path, data in ((chain_path, chain), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        try:
            context.load_cert_chain(chain_path, key_path)
        except ssl.SSLError as error:
            raise TlsConfigError(
                f"the HTTP keystore {keystore_path}: its certificate and key do not load ({error})"
            ) from None
    try:
        context.load_verify_locations(cadata=(trusted + b"".join(extra)).decode("ascii"))
    except (ssl.SSLError, ValueError) as error:
        raise TlsConfigError(
            f"the HTTP truststore {truststore_path} holds no usable CA certificate ({error})"
        ) from None
    context.verify_mode = ssl.CERT_REQUIRED
    return context
