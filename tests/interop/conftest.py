"""Three clusters on one real ZooKeeper, made once for the interop tests:

| name     | bookies                                   | layout             | initialised by    |
|----------|-------------------------------------------|--------------------|-------------------|
| `java`   | 3 Java (sorted, sorted, interleaved)      | `zk+flat`          | the Java shell    |
| `python` | 3 of ours                                 | `zk+longhierarchical` | the Java shell |
| `mixed`  | 2 Java (sorted, interleaved) + 2 of ours  | `zk+hierarchical`  | our shell         |

so that our client meets Java bookies only (`java`), the Java client meets ours only (`python`),
ensembles mix both kinds (`mixed`: any 3 of its 4 bookies hold both), each layout has both
kinds of client allocating ids, and each side's bookies run in a cluster the other side's shell
made. The Java client is one ``InteropDriver`` process for the whole session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from kazoo.client import KazooClient

from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing.local_cluster import LocalCluster, free_ports
from bookkeeper_py.testing.zookeeper import ZooKeeperServer
from tests.interop.javakit import JavaBookie, JavaClient, JavaKit, JavaKitMissingError

CLUSTERS = ("java", "python", "mixed")
PASSWORD = "interop-pw"  # of the ledgers the interop tests write


@dataclass
class InteropCluster:
    name: str
    metadata_uri: str
    java_bookies: list[JavaBookie] = field(default_factory=list)
    python: LocalCluster | None = None

    @property
    def bookie_ids(self) -> list[str]:
        ours = self.python.bookie_ids if self.python is not None else []
        return [bookie.bookie_id for bookie in self.java_bookies] + ours

    @property
    def java_bookie_ids(self) -> set[str]:
        return {bookie.bookie_id for bookie in self.java_bookies}

    def close(self) -> None:
        for bookie in self.java_bookies:
            bookie.stop()
        if self.python is not None:
            self.python.close()


@pytest.fixture(scope="session")
def java_kit() -> JavaKit:
    """Its absence is a failure, not a skip: the README's test command installs it."""
    try:
        return JavaKit()
    except JavaKitMissingError as error:
        pytest.fail(str(error))


@pytest.fixture(scope="session")
def java_client(java_kit: JavaKit) -> Iterator[JavaClient]:
    directory = tempfile.mkdtemp(prefix="bk-interop-driver-")
    classes = java_kit.compile_driver(os.path.join(directory, "classes"))
    with JavaClient(java_kit, classes, os.path.join(directory, "driver.log")) as client:
        yield client


def init_with_java_shell(kit: JavaKit, zookeeper: ZooKeeperServer, uri: str, root: str) -> None:
    # Java's initnewcluster creates the ledgers root but not its parent (ours creates both).
    zk = KazooClient(hosts=zookeeper.connect_string)
    zk.start(timeout=30)
    try:
        zk.ensure_path(root.rsplit("/", 1)[0])
    finally:
        zk.stop()
        zk.close()
    output = kit.shell(uri, "initnewcluster")
    assert "Successfully initiated cluster" in output, output[-3000:]


def init_with_our_shell(uri: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", "shell", "initnewcluster", "--metadata-uri", uri],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "new cluster at" in done.stdout, done.stdout + done.stderr


@pytest.fixture(scope="session")
def interop_clusters(
    java_kit: JavaKit, zookeeper: ZooKeeperServer
) -> Iterator[dict[str, InteropCluster]]:
    base = tempfile.mkdtemp(prefix="bk-interop-")
    zk = zookeeper.connect_string
    clusters = {
        "java": InteropCluster("java", f"zk+flat://{zk}/interop-java/ledgers"),
        "python": InteropCluster("python", f"zk+longhierarchical://{zk}/interop-python/ledgers"),
        "mixed": InteropCluster("mixed", f"zk+hierarchical://{zk}/interop-mixed/ledgers"),
    }
    try:
        init_with_java_shell(
            java_kit, zookeeper, clusters["java"].metadata_uri, "/interop-java/ledgers"
        )
        init_with_java_shell(
            java_kit, zookeeper, clusters["python"].metadata_uri, "/interop-python/ledgers"
        )
        init_with_our_shell(clusters["mixed"].metadata_uri)
        ports = iter(free_ports(5))
        for name, storages in (
            ("java", ("sorted", "sorted", "interleaved")),
            ("mixed", ("sorted", "interleaved")),
        ):
            for storage in storages:
                port = next(ports)
                bookie = JavaBookie(
                    java_kit,
                    clusters[name].metadata_uri,
                    port,
                    os.path.join(base, f"{name}-java-{port}"),
                    storage,
                )
                bookie.start()
                clusters[name].java_bookies.append(bookie)
        for name, count in (("python", 3), ("mixed", 2)):
            clusters[name].python = LocalCluster(
                count,
                metadata_uri=clusters[name].metadata_uri,
                base_directory=os.path.join(base, f"{name}-python"),
            )
            clusters[name].python.start()
        for cluster in clusters.values():
            with MetadataClient.connect(cluster.metadata_uri) as metadata:
                for bookie in cluster.java_bookies:
                    bookie.wait_registered(metadata)
        yield clusters
    finally:
        for cluster in clusters.values():
            cluster.close()
        subprocess.run(["rm", "-rf", base], check=False)


@pytest.fixture(params=CLUSTERS)
def cluster(
    request: pytest.FixtureRequest, interop_clusters: dict[str, InteropCluster]
) -> InteropCluster:
    return interop_clusters[request.param]
