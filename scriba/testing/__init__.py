"""Scriba's shipped test kit: test your own state machines against real faults.

- ``scriba.testing.cluster``: launch real etcd / ZooKeeper and bookie processes
  (own ports, data dirs, logs and PIDs; kill, pause, restart, wipe one member).
- ``scriba.testing.fixtures``: the same as pytest fixtures (``pytest_plugins``).
- ``scriba.testing.faults``: a Toxiproxy-API-compatible TCP fault proxy, driven
  by the unmodified ``toxiproxy-python`` client (``scriba faults-proxy``).
- ``scriba.testing.netns``: partitions between hosts in network namespaces (root).
- ``scriba.testing.tmpfs``: a size-capped tmpfs for a real ENOSPC (root).
- ``scriba.testing.diskfaults``: a fault-injecting file layer for bookies
  (lost unfsynced bytes, torn writes, EIO, ENOSPC, bit flips at rest).
- ``scriba.testing.history``: invoke / ok / fail / info histories as JSON lines.
- ``scriba.testing.checkers``: acked set, log, linearizability, RSM convergence.
- ``scriba.testing.waiting``: ``eventually(condition, timeout_s)`` -- waiting on a condition
  with a deadline, never a guessed sleep.
- ``scriba.testing.sim``: a seeded simulation of bookies, network, metadata store and
  clock for I/O-free cores (seeds, replay commands), and the in-memory bookie
  transport for the asyncio client.
"""
