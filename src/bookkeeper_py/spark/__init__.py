"""The Spark connector and pipeline jobs (the ``spark`` extra: PySpark and pyarrow).

``format("bookkeeper")`` is ``bookkeeper_py.spark.source.BookKeeperDataSource``; it is found
without registration once the package is installed (``pyspark_bookkeeper``). ``options``,
``planning`` and ``arrow`` hold what the data source does without Spark itself; ``tasks``
runs in Spark's Python workers; ``session.spark_session`` makes a session set up for it.
The user guide is docs/spark.md.
"""
