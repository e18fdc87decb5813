"""Jobs built on the ``scriba`` data source (``scriba pipeline ...`` and importable functions).

- :func:`~scriba.pipeline.jobs.export.export`: streams to Parquet (partitioned by
  namespace/stream/date, positions kept), resuming where the last run stopped.
- :func:`~scriba.pipeline.jobs.audit.audit`: every replica of every entry of a
  namespace's (or every) ledger checked on every bookie of its write set, and the
  placement of every ensemble; problems as a DataFrame plus a summary.
- :func:`~scriba.pipeline.jobs.compact.compact`: an RSM group's snapshot built from its
  command stream (from its last snapshot on), stored where the replicas restore from,
  and proved by restoring it (the restored state's digest = the replayed state's).

Each job returns a frozen report whose ``line()`` is the one-line summary the CLI
prints (``--json``: ``to_json()``).
"""
