"""Type-check the library as it is installed: ``python -m scriba.testing.typecheck``.

The layers live in top-level folders (``client/``, ``rsm/``, ...) that install as
``scriba.client``, ``scriba.rsm``, ... (pyproject's package-dir). An editable install
maps them with an import hook that mypy cannot follow, so ``mypy client rsm`` sees every
import of another layer as a missing module -- ``Any`` -- and a caller that no longer
matches its callee's signature passes unnoticed. This lays the tree out as the installed
package (symlinks, as the mutation gate does) and runs mypy on ``-p scriba`` there, with
the repository's mypy settings, so calls across layers are checked too.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from scriba.testing.mutation import package_view


def main(argv: Sequence[str] | None = None) -> int:
    repo = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="scriba-typecheck-") as tmp:
        view = Path(tmp)
        package_view(repo, view)
        command = [sys.executable, "-m", "mypy", "--config-file", str(repo / "pyproject.toml"),
                   "--cache-dir", str(repo / ".mypy_cache" / "package-view"), "-p", "scriba", *(argv or [])]
        return subprocess.run(command, cwd=view, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
