"""Tools to test code against BookKeeper: a local cluster of real bookie processes."""

from bookkeeper_py.testing.local_cluster import LocalCluster

__all__ = ["LocalCluster"]
