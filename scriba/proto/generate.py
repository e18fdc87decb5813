"""Regenerate ``scriba/proto/*_pb2*.py`` from the ``.proto`` files.

    python -m scriba.proto.generate            # rewrite the generated files
    python -m scriba.proto.generate --check    # exit 1 if they are stale

The generated code is committed (so installs need no grpcio-tools);
``tests/test_proto.py`` fails when it is stale. Protos live at
``<root>/scriba/proto/x.proto`` and compile with ``-I<root>``, which gives
package-relative imports.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
ROOT = PROTO_DIR.parent.parent


def generate(out_root: Path) -> list[Path]:
    from grpc_tools import protoc  # test extra only

    protos = sorted(PROTO_DIR.glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    for proto in protos:
        args = [
            "protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(proto.relative_to(ROOT)),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {proto}")
    return sorted((out_root / "scriba" / "proto").glob("*_pb2*.py*"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if stale")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(Path(tmp))
        stale = [g.name for g in generated if not (PROTO_DIR / g.name).exists()
                 or not filecmp.cmp(g, PROTO_DIR / g.name, shallow=False)]
        if args.check:
            if stale:
                print("stale generated protocol code: " + ", ".join(stale), file=sys.stderr)
                print("run: python -m scriba.proto.generate", file=sys.stderr)
                return 1
            return 0
        for g in generated:
            (PROTO_DIR / g.name).write_bytes(g.read_bytes())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
