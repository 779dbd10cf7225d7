"""The bookie's HTTP endpoint over TLS (``httpServerTlsEnable``): its certificate and key from a
PKCS#12 or PEM keystore, clients required to show a certificate signed by a CA of the
truststore, as BookKeeper's. A JKS keystore, a missing truststore or a wrong password are
one-line errors that say what to do."""

from __future__ import annotations

import argparse
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from bookkeeper_py.server.config import ConfigError, build, resolve
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.tls import TlsConfigError, http_server_context


def files(tmp_path: Path) -> dict[str, str]:
    """A CA (PEM truststore), the endpoint's keystore as PEM and as PKCS#12 (password
    "secret"), and a client certificate and key."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("operator.example")
    paths = {
        name: str(tmp_path / name) for name in ("ca.pem", "server.pem", "server.p12", "client.pem")
    }
    ca.cert_pem.write_to_path(paths["ca.pem"])
    with open(paths["server.pem"], "wb") as handle:
        handle.write(
            server.private_key_pem.bytes() + b"".join(c.bytes() for c in server.cert_chain_pems)
        )
    key = serialization.load_pem_private_key(server.private_key_pem.bytes(), None)
    certificate = x509.load_pem_x509_certificate(server.cert_chain_pems[0].bytes())
    with open(paths["server.p12"], "wb") as handle:
        handle.write(
            pkcs12.serialize_key_and_certificates(
                b"bookie",
                key,  # type: ignore[arg-type]
                certificate,
                None,
                serialization.BestAvailableEncryption(b"secret"),
            )
        )
    with open(paths["client.pem"], "wb") as handle:
        handle.write(client.private_key_pem.bytes() + client.cert_chain_pems[0].bytes())
    return paths


def get(url: str, context: ssl.SSLContext | None) -> str:
    with urllib.request.urlopen(url, timeout=20, context=context) as answer:
        return str(answer.read().decode())


@pytest.mark.parametrize("keystore", ["server.pem", "server.p12"])
def test_https_with_client_certificates(tmp_path: Path, keystore: str) -> None:
    paths = files(tmp_path)
    args = [
        "--http-tls",
        "true",
        "--http-keystore",
        paths[keystore],
        "--http-truststore",
        paths["ca.pem"],
    ]
    if keystore.endswith(".p12"):
        args += ["--http-keystore-password", "secret"]
    with LocalCluster(1, bookie_args=args) as local:
        port = local.bookies[0].http_port
        operator = ssl.create_default_context(cafile=paths["ca.pem"])
        operator.load_cert_chain(paths["client.pem"])
        assert get(f"https://127.0.0.1:{port}/heartbeat", operator).strip() == "OK"
        anonymous = ssl.create_default_context(cafile=paths["ca.pem"])
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            get(f"https://127.0.0.1:{port}/heartbeat", anonymous)
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            get(f"http://127.0.0.1:{port}/heartbeat", None)


def test_bad_keystores_and_settings_are_one_line_errors(tmp_path: Path) -> None:
    paths = files(tmp_path)
    jks = tmp_path / "server.jks"
    jks.write_bytes(b"\xfe\xed\xfe\xed" + bytes(60))
    with pytest.raises(
        TlsConfigError, match="JKS keystore: convert it once to PKCS#12 with keytool"
    ):
        http_server_context(str(jks), "secret", paths["ca.pem"], None)
    with pytest.raises(TlsConfigError, match="check the file and its password"):
        http_server_context(paths["server.p12"], "wrong", paths["ca.pem"], None)
    with pytest.raises(TlsConfigError, match="holds no private key"):
        http_server_context(paths["ca.pem"], None, paths["ca.pem"], None)
    with pytest.raises(TlsConfigError, match="cannot read the HTTP truststore"):
        http_server_context(paths["server.pem"], None, str(tmp_path / "missing.pem"), None)
    namespace = argparse.Namespace(
        conf=None,
        no_journal_sync=False,
        journal_dir=[str(tmp_path / "j")],
        http_tls=True,
        http_keystore=paths["server.pem"],
    )
    with pytest.raises(ConfigError, match="httpServerTlsEnable needs httpServerKeyStorePath"):
        build(resolve(namespace))
