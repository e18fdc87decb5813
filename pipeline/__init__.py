"""Scriba on Spark: the ``scriba`` PySpark data source (``pip install scriba[spark]``).

    from scriba.pipeline import register, local_session
    spark = local_session()              # or your own SparkSession; then:
    register(spark)                      # short name "scriba"
    df = (spark.read.format("scriba").option("metadata", "etcd://127.0.0.1:2379/prod")
          .option("stream", "payments/orders").load())
    df.write.format("scriba").option("metadata", uri).option("stream", "ns/out").mode("append").save()
    q = (spark.readStream.format("scriba").option("metadata", uri).option("stream", "ns/s")
         .option("maxRecordsPerTrigger", 10_000).load()
         .writeStream.trigger(availableNow=True).option("checkpointLocation", dir)...)

Options: ``metadata`` (URI, required); one of ``stream`` ("ns/stream", or several
comma-separated), ``namespace`` (all its streams) or ``ledgers`` ("1,2,3": raw
entries, one row each); ``password``; ``startingPosition``/``endingPosition``
("earliest", "latest" or "SEG:ENTRY:SLOT"; streaming: ``startingPositions`` may be
JSON {"ns/s": position}); ``maxRecordsPerPartition`` (default 100000);
``maxRecordsPerTrigger`` (per stream, Spark >= 4.2); ``failOnDataLoss`` (default
true: a truncated position is an error; false skips to the truncation point);
``createStream`` (write); ``delivery`` (write and writeStream: ``at-least-once``, the
default, or ``exactly-once``: staged ledgers adopted by the job's, or micro-batch's,
commit in one CAS; see :mod:`scriba.pipeline.source`); ``stagingGraceS`` (exactly-once:
how old a dead job's staged ledgers must be before they are collected, default one day);
``sinkId`` (exactly-once writeStream; default: from ``checkpointLocation``);
``writerLockTimeoutS`` (how long a write task waits for the stream's writer lock: default
an hour, as at-least-once tasks queue on it). Schema:
:data:`~scriba.pipeline.plan.SCHEMA_DDL` (``origin`` is null until geo-replication fills it).

Jobs (``scriba pipeline export|audit|compact``, or :mod:`scriba.pipeline.jobs`): ``export``
streams to Parquet, resuming where the last run stopped; ``audit`` checks every replica
of every entry of a namespace's ledgers and the placement of every ensemble; ``compact``
builds an RSM group's snapshot from its command stream and checks it by restoring it.
``scriba pipeline gc-staged`` (no Spark) collects exactly-once jobs' staged ledgers left
by dead drivers.

Theory of operation: ``plan`` (I/O-free) turns segments into read tasks and
offsets into JSON; ``access`` is the blocking connection a driver or task opens;
``source`` holds Spark's classes. Partitions carry the metadata URI and exact
position bounds, so they run unchanged on any executor. Spark's Python Data
Source API has no column pruning: the payload is always read.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from scriba.pipeline.plan import SCHEMA_DDL

__all__ = ["SCHEMA_DDL", "local_session", "register", "stop_session"]


def register(spark: Any) -> None:
    """Register the data source on ``spark`` under the short name ``scriba``."""
    from scriba.pipeline.source import ScribaDataSource

    spark.dataSource.register(ScribaDataSource)


def local_session(master: str = "local[2]", app_name: str = "scriba", **conf: str) -> Any:
    """A SparkSession on this machine with the usual pitfalls handled: workers use this
    interpreter (``PYSPARK_PYTHON``), Spark binds loopback only, and ``scriba`` is registered."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def stop_session(spark: Any, timeout_s: float = 60.0) -> None:
    """Stop ``spark`` and the JVM pyspark launched for it.

    ``SparkSession.stop()`` leaves that JVM (the py4j gateway, a child of this process)
    running until the interpreter exits; a long-lived process (a test run, a notebook
    kernel) that stops its session keeps a JVM it no longer uses, and its ``Popen`` warns
    "subprocess ... is still running" at exit. The JVM exits at end of file on its stdin,
    so: stop the session, close the gateway's connections, close the JVM's stdin, wait
    for it (killed by PID after ``timeout_s``). A later :func:`local_session` launches a
    new JVM. A session on a gateway pyspark did not launch (``gateway.proc`` absent) keeps
    its JVM.
    """
    import subprocess

    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is None:
        return
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
