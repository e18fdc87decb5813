"""The ledger client: quorum writes, fencing and recovery, reads and tailing.

    from scriba.client import Client
    async with Client.connect("etcd://127.0.0.1:2379/scriba") as client:
        writer = await client.create_ledger(3, 3, 2, password=b"secret")
        await writer.append(b"payload")

``SyncClient`` (``scriba.client.sync``) is the blocking facade for scripts and
Spark executors.
"""

from scriba.client.client import Client, ClientConfig
from scriba.client.reader import LedgerReader
from scriba.client.sync import SyncClient
from scriba.client.writer import LedgerWriter

__all__ = ["Client", "ClientConfig", "LedgerReader", "LedgerWriter", "SyncClient"]
