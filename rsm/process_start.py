"""A replica process's client (the KV and NameNode servers' ``__main__``), connected with
the start-up retry every Scriba process uses (``meta/startup.py``): a metadata store that
does not answer yet, or a session lost while a loaded machine starved the start, is
"not now", tried again within ``RsmConfig.start_timeout_s``; then the start fails with
``MetadataUnavailableError`` naming the replica and the last cause. The replica's own
``start()`` retries its metadata steps the same way."""

from __future__ import annotations

from scriba.client import Client, ClientConfig
from scriba.meta.startup import retry_start_step
from scriba.rsm.config import RsmConfig


async def connect_replica_client(uri: str, client_config: ClientConfig, config: RsmConfig, *, owner: str,
                                 replica_id: str) -> Client:
    """``Client.connect(uri, config=client_config)``, retried as the module docstring says."""
    return await retry_start_step(
        "connect", lambda: Client.connect(uri, config=client_config), owner=owner,
        timeout_s=config.start_timeout_s, log_event="rsm_start_retry", log_fields={"replica": replica_id},
    )
