"""Negative control of R16 in a stale-read server mode: replicas started with the RSM's
``unsafe_local_linearizable_reads`` answer etcd's default (linearizable) Range from
their own applied state, without the leader's barrier. Reads on the followers right
after each acknowledged put must be reported non-linearizable by the same checker
that passes the store's real history (``test_kv_linearizable``)."""

from __future__ import annotations

import pytest
from kv_faults import FaultCluster, follower_read_history

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("collect_on_the_loop"), pytest.mark.timeout(600)]

RSM_CONFIG_EXTRA = {"unsafe_local_linearizable_reads": True}  # read by the fault_cluster fixture


async def test_stale_read_server_mode_is_caught(fault_cluster: FaultCluster) -> None:
    result = await follower_read_history(fault_cluster.kv, serializable=False)
    assert result.verdict == "illegal", "linearizable reads served locally by followers were not caught"
