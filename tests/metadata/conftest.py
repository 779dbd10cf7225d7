"""Metadata stores for the tests of this directory: every driver, or those shared by processes."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bookkeeper_py.testing.zookeeper import ZooKeeperServer


def _uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex}"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'metadata.db'}"
    server: ZooKeeperServer = request.getfixturevalue("zookeeper")
    return server.metadata_uri(f"/test-{uuid.uuid4().hex[:12]}/ledgers")  # a nested root


ZOOKEEPER = pytest.param("zookeeper", marks=pytest.mark.zookeeper)


@pytest.fixture(params=["memory", "sqlite", ZOOKEEPER])
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return _uri(request, tmp_path)


@pytest.fixture(params=["sqlite", ZOOKEEPER])
def shared_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store that several processes can share."""
    return _uri(request, tmp_path)
