"""Makes ``format("bookkeeper")`` known to PySpark without a ``register`` call: Spark looks
for a ``DefaultSource`` in the ``pyspark_*`` modules it can import (SPARK-45917) when a format
name is not known to it."""

from bookkeeper_py.spark.source import BookKeeperDataSource as DefaultSource

__all__ = ["DefaultSource"]
