"""The shared core: errors map one-to-one to wire statuses; entries round-trip and verify."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from scriba import entry as en
from scriba import errors
from scriba.proto import scriba_pb2


def test_every_wire_status_has_the_same_number_in_the_error_tree() -> None:
    for name, number in scriba_pb2.Status.items():
        assert errors.Status[name].value == number


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (errors.Status.FENCED, errors.LedgerFencedError),
        (errors.Status.NO_SUCH_LEDGER, errors.NoSuchLedgerError),
        (errors.Status.READ_ONLY, errors.BookieReadOnlyError),
        (errors.Status.BAD_VERSION, errors.BadVersionError),
    ],
)
def test_status_maps_to_one_exception(status: errors.Status, cls: type[errors.ScribaError]) -> None:
    exc = errors.error_for_status(status, "why")
    assert type(exc) is cls and str(exc) == "why"


def test_retriable_follows_the_error() -> None:
    assert errors.BookieReadOnlyError.retriable and errors.MetadataUnavailableError.retriable
    assert not errors.LedgerFencedError.retriable and not errors.UnauthorizedError.retriable


@pytest.mark.parametrize("digest", [en.Crc32cDigest(), en.HmacSha256Digest(b"pw")])
def test_entry_round_trips_and_detects_a_flipped_bit(digest: en.Digest) -> None:
    packed = en.pack_entry(digest, 7, 3, 2, 100, b"payload")
    e = en.unpack_entry(digest, packed)
    assert (e.ledger_id, e.entry_id, e.last_add_confirmed, e.length, e.payload) == (7, 3, 2, 100, b"payload")
    for i in range(len(packed)):
        flipped = bytearray(packed)
        flipped[i] ^= 0x01
        with pytest.raises(errors.DigestMismatchError):
            en.unpack_entry(digest, bytes(flipped))


def test_hmac_digest_depends_on_the_password() -> None:
    packed = en.pack_entry(en.HmacSha256Digest(b"right"), 1, 0, -1, 1, b"x")
    with pytest.raises(errors.DigestMismatchError):
        en.unpack_entry(en.HmacSha256Digest(b"wrong"), packed)


def test_password_is_never_the_key_or_the_hash() -> None:
    assert en.master_key(b"pw") != en.password_hash(b"pw")
    assert b"pw" not in en.master_key(b"pw")


def test_grpc_defaults_apply_unless_the_environment_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    from scriba.grpc_runtime import GRPC_EXPERIMENTS_DEFAULT, apply_defaults

    monkeypatch.delenv("GRPC_EXPERIMENTS", raising=False)
    apply_defaults()
    assert os.environ["GRPC_EXPERIMENTS"] == GRPC_EXPERIMENTS_DEFAULT
    monkeypatch.setenv("GRPC_EXPERIMENTS", "")
    apply_defaults()
    assert os.environ["GRPC_EXPERIMENTS"] == ""


def test_the_scriba_command_starts_grpc_with_the_defaults() -> None:
    code = (
        "import os, sys\n"
        "from scriba.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
        "print(os.environ.get('GRPC_EXPERIMENTS'), 'grpc' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    from scriba.grpc_runtime import GRPC_EXPERIMENTS_DEFAULT

    assert out.stdout.split()[-2:] == [GRPC_EXPERIMENTS_DEFAULT, "False"], out.stderr


def test_the_deadline_error_does_not_shadow_the_builtin_and_keeps_its_old_name() -> None:
    import builtins

    from scriba import errors

    assert errors.DeadlineExceededError is not builtins.TimeoutError
    assert not issubclass(errors.DeadlineExceededError, builtins.TimeoutError)
    assert errors.TimeoutError is errors.DeadlineExceededError  # programs that import the old name
    err = errors.error_for_status(errors.Status.TIMEOUT, "late")
    assert type(err) is errors.DeadlineExceededError and err.retriable
