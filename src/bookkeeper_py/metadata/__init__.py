"""Metadata: one path-based store interface with ZooKeeper, SQLite and memory drivers, and the
BookKeeper layout (ledger paths, id generation, bookie registry, metadata format) built on it."""

from bookkeeper_py.metadata.driver import MetadataStore, open_store
from bookkeeper_py.metadata.manager import MetadataClient

__all__ = ["MetadataClient", "MetadataStore", "open_store"]
