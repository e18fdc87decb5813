"""Running terraform from tests: a private copy of ``terraform/``, an offline CLI config.

Every test works on a copy of the repository's ``terraform/`` tree in its tmp dir, so
``init`` never writes ``.terraform`` dirs, lock files or state into the repository. The
CLI config is written per test: no providers at all for the provider-free modules, and
a ``filesystem_mirror`` of ``hashicorp/aws`` for the AWS module (the machine image
carries one: ``$SCRIBA_TF_AWS_MIRROR``, else the first of :data:`AWS_MIRROR_CANDIDATES`
that holds it). Nothing here reaches the network.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TERRAFORM_SRC = REPO / "terraform"
TERRAFORM = shutil.which("terraform")
AWS_MIRROR_CANDIDATES = ("/opt/tf-plugins", "/usr/share/terraform/plugins", "/usr/local/share/terraform/plugins",
                         str(Path.home() / ".terraform.d" / "plugins"))
_AWS_PROVIDER = "registry.terraform.io/hashicorp/aws"
COMMAND_TIMEOUT_S = 240.0
PORT_ATTEMPTS_MAX = 200
PORT_RANGE = (10000, 32000)  # [low, high): below Linux's ephemeral ports (32768-60999)

requires_terraform = pytest.mark.skipif(TERRAFORM is None, reason="terraform is not installed (not on PATH)")


def aws_mirror() -> Path | None:
    """A filesystem mirror holding hashicorp/aws, or None."""
    env = os.environ.get("SCRIBA_TF_AWS_MIRROR")
    for candidate in ([env] if env else []) + list(AWS_MIRROR_CANDIDATES):
        if (Path(candidate) / _AWS_PROVIDER).is_dir():
            return Path(candidate)
    return None


def requires_aws_mirror() -> None:
    if aws_mirror() is None:
        pytest.skip(f"no filesystem mirror of hashicorp/aws (set SCRIBA_TF_AWS_MIRROR; looked in "
                    f"{', '.join(AWS_MIRROR_CANDIDATES)})")


def port_free(port: int) -> bool:
    """A server could listen on the port now (SO_REUSEADDR, as etcd and gRPC set it: closed
    connections' TIME_WAIT does not count, a listener or an open connection does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_range(count: int, taken: set[int]) -> int:
    """The first of ``count`` consecutive ports on 127.0.0.1 free now and not in ``taken``
    (which it extends), for modules that compute their ports from a base.

    The range lies below the kernel's ephemeral ports, so that no other process's
    ``bind(0)`` or outgoing connection takes one between this check and its use."""
    low, high = PORT_RANGE
    first = random.Random().randrange(low, high - count)
    for attempt in range(PORT_ATTEMPTS_MAX):
        base = low + (first - low + 97 * attempt) % (high - count - low)
        ports = range(base, base + count)
        if not taken.intersection(ports) and all(port_free(p) for p in ports):
            taken.update(ports)
            return base
    raise AssertionError(f"no {count} consecutive free ports found")


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class TerraformTree:
    """A copy of ``terraform/`` and a CLI config, with a ``run`` that uses both."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "terraform"
        shutil.copytree(TERRAFORM_SRC, self.root,
                        ignore=shutil.ignore_patterns(".terraform", "*.tfstate*", ".terraform.lock.hcl"))
        self.cli_config = tmp_path / "terraform.tfrc"
        mirror = aws_mirror()
        if mirror is None:
            self.cli_config.write_text("# no providers: the provider-free modules need none\n")
        else:
            self.cli_config.write_text(
                "provider_installation {\n"
                f'  filesystem_mirror {{\n    path    = "{mirror}"\n    include = ["{_AWS_PROVIDER}"]\n  }}\n'
                "}\n"
            )
        self.env = {
            **os.environ,
            "TF_CLI_CONFIG_FILE": str(self.cli_config),
            "TF_IN_AUTOMATION": "1",
            "TF_INPUT": "0",
            "CHECKPOINT_DISABLE": "1",
        }

    def path(self, relative: str) -> Path:
        return self.root / relative

    def run(self, relative: str, *args: str, check: bool = True, timeout_s: float = COMMAND_TIMEOUT_S) -> Result:
        assert TERRAFORM is not None
        proc = subprocess.run(
            [TERRAFORM, f"-chdir={self.path(relative)}", *args],
            capture_output=True, text=True, env=self.env, timeout=timeout_s, stdin=subprocess.DEVNULL,
        )
        result = Result(proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise AssertionError(f"terraform {' '.join(args)} in {relative} failed ({proc.returncode}):\n"
                                 f"{result.output[-6000:]}")
        return result

    def init(self, relative: str, *, backend: bool = False) -> Result:
        return self.run(relative, "init", "-no-color", *([] if backend else ["-backend=false"]))
