"""The committed generated protocol code matches scriba/proto/*.proto."""

from __future__ import annotations

from scriba.proto import generate


def test_generated_code_is_fresh() -> None:
    assert generate.main(["--check"]) == 0, "run: python -m scriba.proto.generate"
