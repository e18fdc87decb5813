"""Checkers for histories of real runs; each returns a result with ``.ok`` and ``.explain()``.

- :mod:`.acked_set` — lost = acknowledged - read, unexpected = read - attempted;
- :mod:`.log` — one value per position, contiguous prefix, readers agree, nothing
  confirmed beyond a closed ledger's last entry;
- :mod:`.linearizability` — Wing-Gong/Porcupine search for a register and a per-key
  KV model, with a step budget whose exhaustion fails;
- :mod:`.rsm` — equal state digests at equal positions, each command applied at most once.
"""

from scriba.testing.checkers.acked_set import (
    AckedSetResult,
    check_acked_set,
    check_acked_set_history,
)
from scriba.testing.checkers.linearizability import (
    UNKNOWN,
    KVModel,
    LinearizabilityResult,
    Operation,
    RegisterModel,
    check_kv,
    check_linearizable,
    check_register,
    operations_from_history,
)
from scriba.testing.checkers.log import LogRead, LogResult, check_log
from scriba.testing.checkers.rsm import Applied, ReplicaTrace, RsmResult, check_rsm

__all__ = [
    "UNKNOWN",
    "AckedSetResult",
    "Applied",
    "KVModel",
    "LinearizabilityResult",
    "LogRead",
    "LogResult",
    "Operation",
    "RegisterModel",
    "ReplicaTrace",
    "RsmResult",
    "check_acked_set",
    "check_acked_set_history",
    "check_kv",
    "check_linearizable",
    "check_log",
    "check_register",
    "check_rsm",
    "operations_from_history",
]
