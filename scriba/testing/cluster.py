"""Cluster launcher for tests and demos: a metadata server plus N bookie processes.

Every child has its own dir, ports, log file and PID; teardown ends only the PIDs this
launcher started and waits for them. A run that failed keeps logs and data dirs and
:meth:`BookieCluster.describe` says where they are.

    with LocalCluster(tmp_path) as cluster:          # etcd (or metadata="zk")
        bookies = cluster.bookies.start_bookies(3, zones=["z1", "z2", "z3"])
        ... cluster.uri ...
        cluster.bookies.kill(0); cluster.bookies.restart(0)
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from scriba.embedded.bookie import BookieProcess
from scriba.errors import ConfigError
from scriba.meta.records import DEFAULT_RACK, DEFAULT_REGION, DEFAULT_ZONE
from scriba.tls import TlsConfig

BOOKIES_MAX = 64


def _pick(values: Sequence[str] | None, index: int, default: str) -> str:
    return values[index % len(values)] if values else default


class BookieCluster:
    """Bookie processes sharing one metadata URI."""

    def __init__(
        self,
        base_dir: Path,
        metadata_uri: str,
        *,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        tls: TlsConfig | None = None,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.metadata_uri = metadata_uri
        self.env = dict(env or {})
        self.extra_args = list(extra_args)
        self.tls = tls  # every bookie serves it (None: plaintext)
        self.bookies: list[BookieProcess] = []

    def __len__(self) -> int:
        return len(self.bookies)

    def __getitem__(self, index: int) -> BookieProcess:
        return self.bookies[index]

    def add_bookie(
        self,
        *,
        bookie_id: str | None = None,
        region: str = DEFAULT_REGION,
        zone: str = DEFAULT_ZONE,
        rack: str = DEFAULT_RACK,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        start: bool = True,
        timeout_s: float = 30.0,
    ) -> BookieProcess:
        if len(self.bookies) >= BOOKIES_MAX:
            raise ConfigError(f"bookie cluster: at most {BOOKIES_MAX} bookies")
        index = len(self.bookies)
        bookie = BookieProcess(
            self.base_dir / f"bookie-{index}",
            self.metadata_uri,
            bookie_id=bookie_id or f"bookie-{index}",
            region=region,
            zone=zone,
            rack=rack,
            env={**self.env, **(env or {})},
            extra_args=[*self.extra_args, *extra_args],
            tls=self.tls,
        )
        self.bookies.append(bookie)
        if start:
            bookie.start(timeout_s)
        return bookie

    def start_bookies(
        self,
        n: int,
        *,
        regions: Sequence[str] | None = None,
        zones: Sequence[str] | None = None,
        racks: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        timeout_s: float = 60.0,
    ) -> list[BookieProcess]:
        """Start ``n`` more bookies (locations assigned round-robin) and wait for all."""
        first = len(self.bookies)
        new = [
            self.add_bookie(
                region=_pick(regions, first + i, DEFAULT_REGION),
                zone=_pick(zones, first + i, DEFAULT_ZONE),
                rack=_pick(racks, first + i, DEFAULT_RACK),
                env=env,
                extra_args=extra_args,
                start=False,
            )
            for i in range(n)
        ]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(n, 8))) as pool:
            for future in [pool.submit(b.start, timeout_s) for b in new]:
                future.result()
        return new

    def kill(self, index: int) -> None:
        self.bookies[index].kill()

    def stop(self, index: int) -> None:
        self.bookies[index].stop()

    def pause(self, index: int) -> None:
        self.bookies[index].pause()

    def resume(self, index: int) -> None:
        self.bookies[index].resume()

    def restart(self, index: int, timeout_s: float = 30.0) -> None:
        self.bookies[index].restart(timeout_s)

    def wipe(self, index: int) -> None:
        self.bookies[index].wipe()

    def addresses(self) -> dict[str, str]:
        return {b.bookie_id: b.address for b in self.bookies}

    def stop_all(self) -> None:
        """SIGTERM every running bookie this cluster started (SIGKILL on timeout), and wait."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(self.bookies), 8))) as pool:
            list(pool.map(lambda b: b.stop(), [b for b in self.bookies if b.running]))

    def describe(self) -> str:
        lines = [f"bookie cluster under {self.base_dir} (metadata {self.metadata_uri}):"]
        for b in self.bookies:
            state = "running" if b.running else f"exited {b.returncode}"
            lines.append(f"  {b.bookie_id} {b.address} pid {b.pid} {state}: log {b.log_path}, data {b.data_dir}")
        return "\n".join(lines)


class LocalCluster:
    """A metadata server (etcd by default, or ZooKeeper) and a :class:`BookieCluster` on it."""

    def __init__(
        self,
        base_dir: Path,
        *,
        metadata: str = "etcd",
        members: int = 1,
        prefix: str = "scriba",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.metadata = metadata
        self.prefix = prefix
        self.server: Any
        if metadata == "etcd":
            from scriba.embedded.etcd import EtcdCluster

            self.server = EtcdCluster(self.base_dir / "etcd", members)
        elif metadata == "zk":
            from scriba.embedded.zookeeper import ZooKeeperEnsemble

            self.server = ZooKeeperEnsemble(self.base_dir / "zk", members)
        else:
            raise ConfigError(f"metadata {metadata!r}: etcd or zk")
        self._env = env
        self._bookies: BookieCluster | None = None

    @property
    def uri(self) -> str:
        return str(self.server.uri(self.prefix))

    @property
    def bookies(self) -> BookieCluster:
        if self._bookies is None:
            self._bookies = BookieCluster(self.base_dir / "bookies", self.uri, env=self._env)
        return self._bookies

    def start(self, timeout_s: float = 30.0) -> LocalCluster:
        self.server.start(timeout_s)
        return self

    def stop(self) -> None:
        try:
            if self._bookies is not None:
                self._bookies.stop_all()
        finally:
            self.server.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if exc_type is not None and self._bookies is not None:
            print(f"cluster kept for inspection:\n{self._bookies.describe()}")
