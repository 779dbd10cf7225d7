"""Shared fixtures: a real ZooKeeper server per test session, started and stopped by the tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from bookkeeper_py.testing.zookeeper import ZooKeeperNotInstalledError, ZooKeeperServer

settings.register_profile("ci", deadline=None, max_examples=200)
settings.load_profile("ci")


@pytest.fixture(scope="session")
def zookeeper() -> Iterator[ZooKeeperServer]:
    """A standalone ZooKeeper on loopback. Its absence is a failure, not a skip: the README's
    test command installs it."""
    try:
        server = ZooKeeperServer()
    except ZooKeeperNotInstalledError as error:
        pytest.fail(str(error))
    with server:
        yield server
