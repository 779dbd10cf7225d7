"""Authentication plugins for bookie connections (BookKeeper's ``AUTH`` operation).

A client and a bookie run the same plugin, named by ``authPluginName`` in every
``AuthMessage{authPluginName, payload}``. The client speaks first; each message of one side
answers the other's, until the bookie's session says the peer is authenticated. Until then the
bookie answers every request other than ``AUTH`` and ``START_TLS`` with ``EUA``. A bookie
without a provider (the default) treats every connection as authenticated, as BookKeeper's null
provider does; a client without one sends no ``AUTH``.

Plugins implement ``BookieAuthProvider`` / ``ClientAuthProvider``; sessions are plain objects,
bytes in, bytes out, with no I/O. A bookie's configuration names its provider with
``bookieAuthProviderFactoryClass``: a built-in name (``shared-secret``) or
``package.module:factory``, a callable taking the settings dict and returning the provider. A
client is given its provider object (``BookKeeper(..., auth=...)``).

The built-in **shared-secret** provider is a mutual HMAC-SHA256 challenge-response over a
secret both sides read from a file (``authSharedSecretFile``); the secret never crosses the wire:

1. client -> bookie: version 1, client nonce (32 bytes), client name (UTF-8)
2. bookie -> client: bookie nonce (32 bytes), HMAC(secret, "bookie" | client nonce | bookie nonce | name)
3. client -> bookie: HMAC(secret, "client" | client nonce | bookie nonce | name), sent only once
   the bookie proved it knows the secret
4. bookie -> client: empty payload: authenticated, as the client name.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

from bookkeeper_py.errors import BKError

MAX_AUTH_ROUNDS = 8  # AUTH exchanges a client makes before giving up


class AuthenticationError(BKError):
    """Authentication with a bookie failed: a wrong secret or credentials, a different plugin on
    the other side, or a peer that does not follow the plugin's exchange."""


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """What the bookie knows of a connecting client before it authenticates."""

    address: str
    certificate: dict[str, object] | None = None  # the verified TLS client certificate


@dataclass(frozen=True, slots=True)
class AuthStep:
    """A bookie session's answer to one client message."""

    reply: bytes  # payload of the AUTH answer
    principal: str | None = None  # set once the client is authenticated


class BookieAuthSession(Protocol):
    def process(self, payload: bytes) -> AuthStep:
        """The answer to the client's next payload; raises ``AuthenticationError`` to refuse."""
        ...


class BookieAuthProvider(Protocol):
    plugin_name: str

    def new_session(self, peer: PeerInfo) -> BookieAuthSession: ...


class ClientAuthSession(Protocol):
    def initial(self) -> bytes:
        """The payload of the first AUTH request."""
        ...

    def process(self, payload: bytes) -> bytes | None:
        """The next payload to send after the bookie's ``payload``, or None once authenticated;
        raises ``AuthenticationError`` when the bookie's answer is wrong."""
        ...


class ClientAuthProvider(Protocol):
    plugin_name: str

    def new_session(self) -> ClientAuthSession: ...


# -- shared secret -----------------------------------------------------------------------------

SHARED_SECRET_PLUGIN = "pybookkeeper-shared-secret"
_VERSION = 1
_NONCE = 32
_MAC = hashlib.sha256().digest_size


def read_secret(path: str) -> bytes:
    """The secret in ``path`` (surrounding whitespace removed); refuses an empty or short one."""
    try:
        with open(path, "rb") as handle:
            secret = handle.read().strip()
    except OSError as error:
        raise AuthenticationError(f"cannot read the shared secret file {path}: {error}") from error
    if len(secret) < 16:
        raise AuthenticationError(
            f"the shared secret in {path} has {len(secret)} bytes; use at least 16 random bytes"
        )
    return secret


def _proof(
    secret: bytes, role: bytes, client_nonce: bytes, bookie_nonce: bytes, name: bytes
) -> bytes:
    return hmac.new(secret, role + client_nonce + bookie_nonce + name, hashlib.sha256).digest()


class _SharedSecretBookieSession:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._challenge: tuple[bytes, bytes, bytes] | None = None  # client nonce, ours, name
        self._done = False

    def process(self, payload: bytes) -> AuthStep:
        if self._done:
            raise AuthenticationError("the client sent AUTH again after authenticating")
        if self._challenge is None:
            if len(payload) < 1 + _NONCE or payload[0] != _VERSION:
                raise AuthenticationError(
                    "the client's first shared-secret message is malformed (version or nonce)"
                )
            client_nonce, name = payload[1 : 1 + _NONCE], payload[1 + _NONCE :]
            try:
                name.decode("utf-8")
            except UnicodeDecodeError as error:
                raise AuthenticationError("the client's name is not UTF-8") from error
            bookie_nonce = secrets.token_bytes(_NONCE)
            self._challenge = (client_nonce, bookie_nonce, name)
            proof = _proof(self._secret, b"bookie", client_nonce, bookie_nonce, name)
            return AuthStep(bookie_nonce + proof)
        client_nonce, bookie_nonce, name = self._challenge
        expected = _proof(self._secret, b"client", client_nonce, bookie_nonce, name)
        if not hmac.compare_digest(payload, expected):
            raise AuthenticationError(
                "the client's proof does not match: it does not hold the same shared secret"
            )
        self._done = True
        return AuthStep(b"", principal=name.decode("utf-8") or "anonymous")


class SharedSecretBookieAuthProvider:
    """Bookie side of the shared-secret plugin."""

    plugin_name = SHARED_SECRET_PLUGIN

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def new_session(self, peer: PeerInfo) -> BookieAuthSession:
        return _SharedSecretBookieSession(self._secret)


class _SharedSecretClientSession:
    def __init__(self, secret: bytes, name: bytes) -> None:
        self._secret = secret
        self._name = name
        self._client_nonce = secrets.token_bytes(_NONCE)
        self._stage = 0

    def initial(self) -> bytes:
        self._stage = 1
        return bytes([_VERSION]) + self._client_nonce + self._name

    def process(self, payload: bytes) -> bytes | None:
        if self._stage == 1:
            if len(payload) != _NONCE + _MAC:
                raise AuthenticationError("the bookie's shared-secret challenge is malformed")
            bookie_nonce, proof = payload[:_NONCE], payload[_NONCE:]
            expected = _proof(self._secret, b"bookie", self._client_nonce, bookie_nonce, self._name)
            if not hmac.compare_digest(proof, expected):
                raise AuthenticationError(
                    "the bookie's proof does not match: it does not hold the same shared secret"
                )
            self._stage = 2
            return _proof(self._secret, b"client", self._client_nonce, bookie_nonce, self._name)
        if self._stage == 2 and payload == b"":
            self._stage = 3
            return None
        raise AuthenticationError("the bookie's shared-secret answer came out of turn")


class SharedSecretClientAuthProvider:
    """Client side of the shared-secret plugin; ``name`` is the principal the bookie logs."""

    plugin_name = SHARED_SECRET_PLUGIN

    def __init__(self, secret: bytes, name: str = "") -> None:
        self._secret = secret
        self._name = name.encode("utf-8")

    def new_session(self) -> ClientAuthSession:
        return _SharedSecretClientSession(self._secret, self._name)


# -- loading from configuration ----------------------------------------------------------------


def _factory(name: str, key: str) -> Any:
    module_name, _, attribute = name.partition(":")
    if not attribute:
        raise AuthenticationError(
            f"{key}={name!r}: not a known provider; use 'shared-secret' or 'package.module:factory'"
        )
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise AuthenticationError(f"{key}={name!r} cannot be loaded: {error}") from error


def bookie_provider(name: str | None, settings: dict[str, Any]) -> BookieAuthProvider | None:
    """The provider named by ``bookieAuthProviderFactoryClass`` (None: no authentication)."""
    if not name:
        return None
    if name == "shared-secret":
        path = settings.get("authSharedSecretFile")
        if not path:
            raise AuthenticationError(
                "bookieAuthProviderFactoryClass=shared-secret needs authSharedSecretFile"
            )
        return SharedSecretBookieAuthProvider(read_secret(path))
    provider: BookieAuthProvider = _factory(name, "bookieAuthProviderFactoryClass")(settings)
    return provider
