"""The metadata store a test's LocalCluster runs on: its own embedded SQLite file, or a real
ZooKeeper (the session's server, a fresh nested root for each test or module, so that tests share
nothing and a hard-coded ``/ledgers`` shows up as a failure)."""

from __future__ import annotations

import secrets
import uuid
from pathlib import Path

import pytest

from bookkeeper_py.testing.zookeeper import ZooKeeperServer

# The ZooKeeper parameter carries the marker, so ``-m "not zookeeper"`` leaves it out.
METADATA_STORES = ["sqlite", pytest.param("zookeeper", marks=pytest.mark.zookeeper)]


def store_uri(request: pytest.FixtureRequest) -> str | None:
    """None for "sqlite" (LocalCluster makes its own store); for "zookeeper", a new root under
    a new parent on the session's server, named after the test's module."""
    if request.param == "sqlite":
        return None
    zookeeper: ZooKeeperServer = request.getfixturevalue("zookeeper")
    module = request.module.__name__.rpartition(".")[2].replace("_", "-")
    return zookeeper.metadata_uri(f"/{module}-{uuid.uuid4().hex[:12]}/ledgers")


@pytest.fixture(params=METADATA_STORES)
def metadata_uri(request: pytest.FixtureRequest) -> str | None:
    """The cluster's metadata store, for ``LocalCluster(n, metadata_uri=metadata_uri)``."""
    return store_uri(request)


@pytest.fixture(scope="module", params=METADATA_STORES)
def module_metadata_uri(request: pytest.FixtureRequest) -> str | None:
    """The same for a cluster that the tests of a module share (a module-scoped fixture): the
    module's tests run once over each store, one cluster each."""
    return store_uri(request)


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shared secret (``authSharedSecretFile``) for the bookies and clients of a module."""
    path = tmp_path_factory.mktemp("secret") / "secret"
    path.write_text(secrets.token_hex(24) + "\n")
    return path
