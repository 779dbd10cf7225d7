"""A SparkSession set up the way the connector needs, for the pipeline jobs, the tests and the
benchmarks: Python workers run this interpreter (``PYSPARK_PYTHON``: a worker started from the
system's ``python3`` has no pyarrow and dies with "Python worker exited unexpectedly"), the
driver binds to loopback, and the ``bookkeeper`` data source is registered."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"


def require_pyspark() -> None:
    """Raises a one-line error naming the extra when PySpark or pyarrow is missing."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as error:
        raise SystemExit(
            f"the Spark pipeline needs PySpark and pyarrow ({error}): "
            "pip install 'bookkeeper-py[spark]' (and a Java 17+ runtime)"
        ) from None


def spark_session(
    master: str = DEFAULT_MASTER, app_name: str = "bookkeeper-py", **conf: Any
) -> SparkSession:
    """``SparkSession.builder...getOrCreate()`` with the data source registered; ``conf``
    entries are Spark settings (``spark.driver.memory="2g"``: pass them as a dict's items)."""
    require_pyspark()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
    )
    if master.startswith("local"):
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    register(session)
    return session


def register(session: SparkSession) -> None:
    """Registers ``format("bookkeeper")`` in ``session`` (also found without this once the
    package is installed, through the ``pyspark_bookkeeper`` module)."""
    from bookkeeper_py.spark.source import BookKeeperDataSource

    session.dataSource.register(BookKeeperDataSource)
