"""Autorecovery: an elected auditor marks under-replicated ledgers, workers re-replicate them.

The rules live in I/O-free modules (``fragments``, ``marks``, ``plan``, ``throttle``,
``records``).
"""
