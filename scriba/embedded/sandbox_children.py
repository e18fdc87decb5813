"""The sandbox's helper processes: the web console and the autorecovery process.

Each starts as ``python -P -m scriba.cli ...`` in the sandbox's data dir (its stderr to
``DIR/NAME.log``) and counts as started once it prints its ready line on stdout: the
console its URL, autorecovery a JSON line with its id. Stopping is SIGTERM, then
SIGKILL after :data:`STOP_TIMEOUT_S`, always waiting for the exit.
"""

from __future__ import annotations

import json
import select
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from scriba.embedded.process import ServerStartError, python_module_argv

START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 30.0


def start_console(metadata_uri: str, listen: str, data_dir: Path, tls_args: Sequence[str] = (),
                  *, allow_actions: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    """``scriba console`` as a child process (log ``DIR/console.log``); its URL once it listens.
    ``allow_actions``: started with ``--allow-actions`` (decommission, audit, leadership transfer)."""
    argv = python_module_argv("scriba.cli", "console", "--metadata", metadata_uri, "--listen", listen, *tls_args,
                              *(["--allow-actions"] if allow_actions else []))
    return start_child(argv, data_dir, "console", lambda line: line.removeprefix("console: ")
                        if line.startswith("console: ") else None)


def start_autorecovery(metadata_uri: str, delay_s: float, data_dir: Path,
                       tls_args: Sequence[str] = ()) -> tuple[subprocess.Popen[bytes], str]:
    """``scriba autorecovery run`` (auditor + one worker) as a child process (log
    ``DIR/autorecovery.log``); its id once it runs. Ledgers keep their passwords in their
    metadata (``ClientConfig.store_password_in_metadata``), so it needs none given."""
    argv = python_module_argv("scriba.cli", "autorecovery", "--metadata", metadata_uri, "run",
                              "--id", "sandbox-autorecovery", "--delay-s", f"{delay_s:g}", *tls_args)

    def ready(line: str) -> str | None:
        try:
            doc = json.loads(line)
        except ValueError:
            return None
        return doc.get("autorecovery") if isinstance(doc, dict) else None

    return start_child(argv, data_dir, "autorecovery", ready)


def start_child(
    argv: list[str], data_dir: Path, name: str, ready: Callable[[str], str | None]
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``argv`` in ``data_dir`` (stderr to ``DIR/NAME.log``); wait for the stdout line
    ``ready`` accepts and return the process with what ``ready`` made of that line."""
    with open(data_dir / f"{name}.log", "ab") as log_file:
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log_file, stdin=subprocess.DEVNULL,
                                 cwd=data_dir)
    pipe = child.stdout
    if pipe is None:  # cannot happen with stdout=PIPE; keeps the type checker sure of it
        raise ServerStartError(f"the {name}'s stdout is not a pipe")
    deadline = time.monotonic() + START_TIMEOUT_S
    while (left := deadline - time.monotonic()) > 0 and child.poll() is None:
        if select.select([pipe], [], [], left)[0]:
            found = ready(pipe.readline().decode(errors="replace").strip())
            if found is not None:
                return child, found
    stop_child(child)
    raise ServerStartError(f"the {name} did not start (log {data_dir / f'{name}.log'})")


def stop_child(child: subprocess.Popen[bytes]) -> None:
    child.terminate()
    try:
        child.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    if child.stdout is not None:
        child.stdout.close()
