"""Helpers for the store's process tests: etcdctl as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from typing import Any


@dataclass
class Ctl:
    """Debian's etcdctl (v3.4), unmodified, against the given endpoints."""

    endpoints: str

    def run(self, *args: str, stdin: str | None = None, endpoints: str | None = None,
            timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["etcdctl", "--endpoints", endpoints or self.endpoints, "--command-timeout=10s",
                               *args], capture_output=True, text=True, input=stdin, timeout=timeout_s,
                              env={**os.environ, "ETCDCTL_API": "3"})

    def ok(self, *args: str, **kw: Any) -> str:
        p = self.run(*args, **kw)
        assert p.returncode == 0, f"etcdctl {' '.join(args)}: {p.stderr}"
        return p.stdout

    def json(self, *args: str, **kw: Any) -> Any:
        return json.loads(self.ok(*args, "-w", "json", **kw))

    def fails(self, *args: str, **kw: Any) -> str:
        p = self.run(*args, **kw)
        assert p.returncode != 0, f"etcdctl {' '.join(args)} succeeded: {p.stdout}"
        return p.stderr
