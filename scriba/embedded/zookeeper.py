"""A real ZooKeeper (standalone or a 3-node ensemble) started by Scriba for the sandbox and tests.

Inputs: a base directory (one data dir, one conf dir and one log per member under
it) and a member count (1 or 3). :meth:`ZooKeeperEnsemble.start` writes each
member's ``zoo.cfg`` (free client/quorum/election ports on 127.0.0.1, short
``tickTime`` so 2 s sessions are allowed, no admin server, no metrics provider),
starts each member without systemd as

    java -cp <conf dir>:<jars> org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg

and returns once every member answers the ``srvr`` four-letter word with a
``Mode:`` line (``ruok`` answers before the server serves) and, for 3 nodes, one
of them is the leader. :meth:`stop` ends only the PIDs it started and waits for
each to exit.

The jars come from the Debian ``zookeeper`` package (/usr/share/java) or an
unpacked Apache tarball's ``lib`` directory.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import socket
import ssl
import time
import urllib.parse
from pathlib import Path
from types import TracebackType

from scriba.embedded.process import ServerProcess, ServerStartError, free_ports
from scriba.errors import ConfigError
from scriba.invariant import invariant
from scriba.tls import TlsConfig, as_client

TICK_TIME_MS = 500
MIN_SESSION_TIMEOUT_MS = 1000
MAX_SESSION_TIMEOUT_MS = 60_000
JUTE_MAXBUFFER_BYTES = 4 * 1024 * 1024  # > meta.store.VALUE_SIZE_MAX plus path and header
HEAP_MAX = "256m"
FOUR_LETTER_TIMEOUT_S = 0.5
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

_JAR_DIRS = ("/usr/share/zookeeper", "/usr/share/java")  # where Debian puts zookeeper.jar
_TARBALL_LIBS = ("/usr/share/zookeeper/lib",)  # an unpacked Apache release: lib/zookeeper-3.*.jar
# Jars the Debian zookeeper.jar names in its manifest's Class-Path are found through it;
# these add a logging binding so the server's log reaches the member's log file.
_LOG_JARS = ("slf4j-log4j12.jar", "log4j-1.2.jar")
_LOG_JARS_FALLBACK = ("slf4j-simple.jar",)

_INSTALL_HINT = (
    "`apt-get install zookeeper` (Debian; needs Java 17: `apt-get install default-jre-headless`)"
)


def find_java() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` on PATH, else ConfigError saying how to install."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and Path(java_home, "bin", "java").is_file():
        return str(Path(java_home, "bin", "java"))
    on_path = shutil.which("java")
    if on_path:
        return on_path
    raise ConfigError(f"no `java` found (JAVA_HOME or PATH): {_INSTALL_HINT}")


def _netty_jars() -> list[str]:
    """Netty's jars for the secure client port (Debian's ``libnetty-java``; ZooKeeper's own
    ``lib/`` already has them). Debian's netty-all.jar is only a manifest: take the parts."""
    jars = sorted(j for j in glob.glob("/usr/share/java/netty-*.jar") if not re.search(r"-\d+\.\d+", j))
    if not jars:
        raise ConfigError("ZooKeeper TLS needs Netty's jars: apt-get install libnetty-java")
    return jars


def find_zookeeper_classpath() -> str:
    """The ZooKeeper server jars (plus a logging binding) as a ``:``-joined classpath.

    ``$ZOOKEEPER_HOME/lib`` (an Apache release) first, then the Debian package's jars.
    """
    home = os.environ.get("ZOOKEEPER_HOME")
    for lib in ([str(Path(home, "lib"))] if home else []) + list(_TARBALL_LIBS):
        if glob.glob(str(Path(lib, "zookeeper-3*.jar"))):
            return ":".join(sorted(glob.glob(str(Path(lib, "*.jar")))))
    for directory in _JAR_DIRS:
        main_jar = Path(directory, "zookeeper.jar")
        if main_jar.is_file():
            break
    else:
        raise ConfigError(
            f"ZooKeeper jars not found (ZOOKEEPER_HOME/lib, {', '.join(_TARBALL_LIBS + _JAR_DIRS)}): "
            f"{_INSTALL_HINT}"
        )
    jars = [str(main_jar)]
    for extra in ("zookeeper-jute.jar",):
        if Path(main_jar.parent, extra).is_file():
            jars.append(str(Path(main_jar.parent, extra)))
    log_jars = [Path(main_jar.parent, name) for name in _LOG_JARS]
    if not all(p.is_file() for p in log_jars):
        log_jars = [Path(main_jar.parent, name) for name in _LOG_JARS_FALLBACK]
    jars.extend(str(p) for p in log_jars if p.is_file())
    return ":".join(jars)


def four_letter_word(
    host: str, port: int, word: str, timeout_s: float = FOUR_LETTER_TIMEOUT_S,
    context: ssl.SSLContext | None = None,
) -> str:
    """Send a four-letter word (``srvr``, ``ruok``, ``mntr``) and return the answer ('' on
    error); ``context``: over TLS (a secure client port)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                (context.wrap_socket(raw, server_hostname=host) if context is not None else raw) as sock:
            sock.sendall(word.encode())
            chunks: list[bytes] = []
            while True:
                data = sock.recv(4096)
                if not data:
                    break
                chunks.append(data)
    except OSError:
        return ""
    return b"".join(chunks).decode(errors="replace")


def server_mode(host: str, port: int, context: ssl.SSLContext | None = None) -> str | None:
    """``standalone`` / ``leader`` / ``follower`` once the server serves, else None."""
    for line in four_letter_word(host, port, "srvr", context=context).splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


_LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.Target=System.out
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] %m%n
"""

_SIMPLELOGGER_PROPERTIES = """\
org.slf4j.simpleLogger.defaultLogLevel=info
org.slf4j.simpleLogger.logFile=System.out
org.slf4j.simpleLogger.showDateTime=true
"""


class ZooKeeperEnsemble:
    """A standalone ZooKeeper or a 3-node ensemble on 127.0.0.1, each member with its own dirs and log."""

    def __init__(
        self, base_dir: Path, members: int = 1, *, host: str = "127.0.0.1", tls: TlsConfig | None = None
    ) -> None:
        """``tls``: each member also serves a secure client port (Netty, PEM stores; client
        certificates required when ``tls.require_client_cert``), which :meth:`uri` names;
        with a CA there is no plaintext client port (the readiness probe, ``srvr``, goes to
        the secure port with the members' certificate; without a CA the plaintext port
        stays on for it), and with 3 members the quorum and election ports are TLS too
        (``sslQuorum``: each member presents the certificate and verifies the others' with
        the CA)."""
        invariant(members in (1, 3), f"a ZooKeeper ensemble here has 1 or 3 members, got {members}")
        self.base_dir = Path(base_dir).absolute()  # children run in their own dirs: no relative paths
        self.host = host
        self.java = find_java()
        self.classpath = find_zookeeper_classpath()
        self.tls = tls.validate() if tls is not None else None
        if tls is not None:
            tls.load()  # a bad file: ConfigError now, not a member that never serves
            if "netty" not in self.classpath:
                self.classpath = ":".join([self.classpath, *_netty_jars()])
        ports = free_ports(4 * members, host)
        self.endpoints: list[tuple[str, int]] = [(host, ports[i]) for i in range(members)]
        self.quorum_ports = ports[members : 2 * members]
        self.election_ports = ports[2 * members : 3 * members]
        self.secure_ports = ports[3 * members :]
        # TLS with a CA: no plaintext client port; the readiness probe dials the secure one
        self._tls_only = self.tls is not None and self.tls.ca is not None and self.tls.cert is not None
        prober = as_client(self.tls) if self._tls_only else None  # the members' own certificate
        self._probe_context = prober.load().client_ssl_context() if prober is not None else None
        self.names = [f"zk{i + 1}" for i in range(members)]
        self.members: list[ServerProcess] = []
        for name in self.names:
            conf_dir = self.base_dir / name / "conf"
            argv = [
                self.java,
                f"-Xmx{HEAP_MAX}",
                "-Xss512k",
                "-XX:TieredStopAtLevel=1",
                "-XX:+UseSerialGC",
                "-Djava.awt.headless=true",
                "-Dzookeeper.admin.enableServer=false",
                f"-Djute.maxbuffer={JUTE_MAXBUFFER_BYTES}",
                "-Dzookeeper.jmx.log4j.disable=true",
                "-cp",
                f"{conf_dir}:{self.classpath}",
                MAIN_CLASS,
                str(conf_dir / "zoo.cfg"),
            ]
            self.members.append(
                ServerProcess(
                    f"zookeeper-{name}", argv, self.base_dir / f"{name}.log", cwd=self.base_dir
                )
            )

    # --- configuration -----------------------------------------------------------------

    def _write_config(self, index: int) -> None:
        name = self.names[index]
        member_dir = self.base_dir / name
        conf_dir = member_dir / "conf"
        data_dir = member_dir / "data"
        conf_dir.mkdir(parents=True, exist_ok=True)
        data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={TICK_TIME_MS}",
            "initLimit=20",
            "syncLimit=10",
            f"minSessionTimeout={MIN_SESSION_TIMEOUT_MS}",
            f"maxSessionTimeout={MAX_SESSION_TIMEOUT_MS}",
            f"dataDir={data_dir}",
            *([] if self._tls_only else [f"clientPort={self.endpoints[index][1]}",
                                         f"clientPortAddress={self.host}"]),
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=srvr,ruok,stat,mntr,cons",
            "preAllocSize=1024",
            "snapCount=10000",
            "autopurge.purgeInterval=0",
            f"jute.maxbuffer={JUTE_MAXBUFFER_BYTES}",
        ]
        if len(self.members) > 1:
            lines.append("standaloneEnabled=false")
            lines.append("reconfigEnabled=false")
            lines.append("cnxTimeout=1000")
            for j in range(len(self.members)):
                lines.append(
                    f"server.{j + 1}={self.host}:{self.quorum_ports[j]}:{self.election_ports[j]}"
                )
            (data_dir / "myid").write_text(f"{index + 1}\n")
        lines += self._tls_lines(index, conf_dir)
        (conf_dir / "zoo.cfg").write_text("\n".join(lines) + "\n")
        (conf_dir / "log4j.properties").write_text(_LOG4J_PROPERTIES)
        (conf_dir / "simplelogger.properties").write_text(_SIMPLELOGGER_PROPERTIES)

    def _tls_lines(self, index: int, conf_dir: Path) -> list[str]:
        tls = self.tls
        if tls is None or tls.cert is None or tls.key is None:
            return []
        key_store = conf_dir / "server.pem"  # ZooKeeper's PEM key store: key and chain in one file
        key_store.touch(mode=0o600)
        key_store.write_bytes(Path(tls.key).read_bytes() + Path(tls.cert).read_bytes())
        lines = [
            f"secureClientPort={self.secure_ports[index]}",
            f"secureClientPortAddress={self.host}",
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"ssl.keyStore.location={key_store}",
            "ssl.keyStore.type=PEM",
            f"ssl.clientAuth={'need' if tls.require_client_cert else 'none'}",
        ]
        if tls.ca is not None:
            lines += [f"ssl.trustStore.location={tls.ca}", "ssl.trustStore.type=PEM"]
            if len(self.members) > 1:  # the quorum and election ports too: members verify each other
                lines += ["sslQuorum=true", f"ssl.quorum.keyStore.location={key_store}",
                          "ssl.quorum.keyStore.type=PEM", f"ssl.quorum.trustStore.location={tls.ca}",
                          "ssl.quorum.trustStore.type=PEM"]
        return lines

    # --- lifecycle ---------------------------------------------------------------------

    def uri(self, prefix: str = "scriba", **options: str) -> str:
        """``zk://`` on the plaintext ports, or ``zk+tls://...?ca=...`` on the secure ones when
        serving TLS (``options``: more URI options: ``cert``, ``key``, ``digest_file``...)."""
        if self.tls is None:
            hosts = ",".join(f"{h}:{p}" for h, p in self.endpoints)
            query = urllib.parse.urlencode(options, safe="/")
            return f"zk://{hosts}/{prefix}" + (f"?{query}" if query else "")
        hosts = ",".join(f"{self.host}:{p}" for p in self.secure_ports)
        query = urllib.parse.urlencode({**({"ca": str(self.tls.ca)} if self.tls.ca else {}), **options}, safe="/")
        return f"zk+tls://{hosts}/{prefix}" + (f"?{query}" if query else "")

    def mode(self, index: int) -> str | None:
        if self._tls_only:
            return server_mode(self.host, self.secure_ports[index], self._probe_context)
        host, port = self.endpoints[index]
        return server_mode(host, port)

    def start(self, timeout_s: float = 30.0) -> None:
        """Start every member; return when each answers ``srvr`` with a Mode (and one leads)."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        started: list[ServerProcess] = []
        try:
            for i, member in enumerate(self.members):
                if not member.running:
                    self._write_config(i)
                    member.start()
                    started.append(member)
            deadline = time.monotonic() + timeout_s
            for i in range(len(self.members)):
                self._wait_mode(i, max(0.1, deadline - time.monotonic()))
            if len(self.members) > 1:
                self._wait_leader(max(0.1, deadline - time.monotonic()))
        except BaseException:
            for member in started:
                member.stop()
            raise

    def _wait_mode(self, index: int, timeout_s: float) -> None:
        self.members[index].wait_ready(lambda: self.mode(index) is not None, timeout_s)

    def _wait_leader(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            modes = [self.mode(i) if m.running else None for i, m in enumerate(self.members)]
            if modes.count("leader") == 1 and all(
                mode is not None for mode, m in zip(modes, self.members, strict=True) if m.running
            ):
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"ZooKeeper ensemble has no single leader within {timeout_s:.1f}s: modes {modes}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop every member this object started (SIGTERM, then SIGKILL), waiting for each exit."""
        for member in self.members:  # all at once, so the others do not re-elect one by one
            member.resume()
            member.signal(signal.SIGTERM)
        for member in self.members:
            member.stop()

    def kill_member(self, index: int) -> None:
        """SIGKILL one member and wait for its exit."""
        self.members[index].kill()

    def start_member(self, index: int, timeout_s: float = 30.0) -> None:
        """Restart a stopped or killed member with the same data dir and ports; wait until it serves."""
        member = self.members[index]
        if member.running:
            raise ServerStartError(f"{member.name} is still running (pid {member.pid})")
        member.wait_exit(10.0)
        self._write_config(index)
        member.start()
        self._wait_mode(index, timeout_s)

    def __enter__(self) -> ZooKeeperEnsemble:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
