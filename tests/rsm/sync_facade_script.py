"""Drive one replica through ``SyncReplicatedStateMachine`` (memory:// store, in-process
bookies); prints ``OK <propose> <read> <role> <members>``."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent)]

from rsm_machines import Counter  # noqa: E402

import scriba.meta  # noqa: E402
from scriba.client import Client  # noqa: E402
from scriba.log import configure  # noqa: E402
from scriba.rsm import ReplicatedStateMachine, RsmConfig  # noqa: E402
from scriba.rsm.sync import SyncReplicatedStateMachine  # noqa: E402
from scriba.testing.sim.memory import StorageTransport, register_bookies  # noqa: E402
from scriba.testing.waiting import eventually  # noqa: E402

BOOKIES = [f"bk{i}" for i in range(3)]
CONFIG = RsmConfig(campaign_backoff_s=0.05, snapshot_every_commands=None, snapshot_every_bytes=None)


def main() -> None:
    configure(stream=sys.stderr)
    uri = f"memory://rsm-sync-{uuid.uuid4().hex[:8]}"
    facade = SyncReplicatedStateMachine(uri, namespace="apps", name="counter", state_machine=Counter(),
                                        replica_id="s1", config=CONFIG)

    async def setup() -> ReplicatedStateMachine:
        store = await scriba.meta.connect(uri)
        await register_bookies(store, BOOKIES)
        facade._client = await Client.connect(uri, store=store, transport=StorageTransport(BOOKIES))
        replica = await ReplicatedStateMachine(facade._client, namespace="apps", name="counter",
                                               state_machine=Counter(), replica_id="s1", config=CONFIG).start()
        await eventually(lambda: replica.is_leader, 10, what="the only replica leads")
        return replica

    facade.rsm = facade._call(setup())
    try:
        session = facade.open_session()
        proposed = facade.propose(b"incr", session=session).decode()
        read = facade.read(b"get").decode()
        members = ",".join(m.replica_id for m in facade.members())
        print(f"OK {proposed} {read} {facade.status()['role']} {members}")
    finally:
        facade.stop()


if __name__ == "__main__":
    main()
