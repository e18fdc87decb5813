"""Autorecovery: an elected auditor marks under-replicated ledgers, workers re-replicate them.

    from scriba.autorecovery import Auditor, ReplicationWorker, AutorecoveryConfig
    async with Client.connect(uri) as client:
        worker = ReplicationWorker(client, AutorecoveryConfig(passwords=(b"secret",)))
        await worker.run(stop)

The rules live in I/O-free modules (``fragments``, ``marks``, ``plan``, ``throttle``,
``records``); ``auditor``, ``worker`` and ``copier`` carry them out over the metadata
store and the ledger client's transport. ``scriba autorecovery run`` runs both in a
process; the shell verbs are in ``scriba.autorecovery.shell``.
"""

from scriba.autorecovery.config import AutorecoveryConfig
from scriba.autorecovery.records import Mark, Reason, UnderReplicated
from scriba.autorecovery.worker import ReplicationWorker

__all__ = ["AutorecoveryConfig", "Mark", "Reason", "ReplicationWorker", "UnderReplicated"]
