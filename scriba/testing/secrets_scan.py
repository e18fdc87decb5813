"""The R20 secrets scan: find a secret, in any usual encoding, in what a run left behind.

Theory of operation. A *secret* is a name and its bytes (a ledger password, a
credential); a private key is given as its PEM file, whose secret parts are the
base64 lines of its body (:func:`pem_secrets`: any one of them in a log is a leak, as
is the DER body in hex). :func:`secret_forms` spells a secret as it could leak: raw,
hex (either case), and base64 (standard and URL-safe) at each of the three byte
alignments it could have inside a longer base64 text (only the characters the secret
alone determines, so a leak inside someone else's base64 blob is still found).
:func:`scan` looks for every form of every secret in every *source* (a name and its
bytes: a log file, a ``/metrics`` body, a command's ``--json`` output, a data file)
and returns the :class:`Leak` of each hit, sorted; an empty list is a clean run.
:func:`read_sources` gathers files under directories by name pattern.

Forms shorter than ``FORM_BYTES_MIN`` are not searched (a short base64 core would match
by chance); secrets must therefore be at least a dozen bytes long.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from scriba.errors import ConfigError

FORM_BYTES_MIN: Final = 12
_PEM_LINE_MIN: Final = 16  # a PEM body line this long is the key's own (the last may be short)


@dataclass(frozen=True, order=True, slots=True)
class Leak:
    source: str
    secret: str
    form: str


def _b64_cores(value: bytes, alphabet: str) -> dict[str, bytes]:
    """The base64 characters that ``value`` alone determines, at each alignment."""
    encode = base64.urlsafe_b64encode if alphabet == "base64url" else base64.b64encode
    cores: dict[str, bytes] = {}
    for offset in range(3):
        text = encode(bytes(offset) + value)
        first = -(-8 * offset // 6)  # the first character no prefix bit reaches
        last = 8 * (offset + len(value)) // 6  # past the last character only value bits fill
        cores[f"{alphabet}@{offset}"] = text[first:last]
    return cores


def secret_forms(value: bytes) -> dict[str, bytes]:
    """How ``value`` could appear in text: form name -> the bytes to look for."""
    if len(value) < FORM_BYTES_MIN:
        raise ConfigError(f"a scanned secret must be at least {FORM_BYTES_MIN} bytes (got {len(value)})")
    forms = {"raw": value, "hex": value.hex().encode(), "HEX": value.hex().upper().encode()}
    forms.update(_b64_cores(value, "base64"))
    standard = set(forms.values())
    forms.update((k, v) for k, v in _b64_cores(value, "base64url").items() if v not in standard)  # differs by +/ only
    return {name: form for name, form in forms.items() if len(form) >= FORM_BYTES_MIN}


def pem_secrets(name: str, pem: bytes) -> dict[str, bytes]:
    """The secret parts of a PEM private key: each body line (a leak of any one is a leak
    of the key) and the DER body whole (found in its other forms by :func:`scan`)."""
    lines = [ln.strip() for ln in pem.splitlines()]
    body = [ln for ln in lines if ln and not ln.startswith(b"-----") and b":" not in ln]
    if not body:
        raise ConfigError(f"{name}: no PEM body")
    parts = {f"{name} line {i}": ln for i, ln in enumerate(body) if len(ln) >= _PEM_LINE_MIN}
    try:
        parts[f"{name} DER"] = base64.b64decode(b"".join(body), validate=True)
    except binascii.Error as exc:
        raise ConfigError(f"{name}: PEM body is not base64: {exc}") from None
    return parts


def scan(sources: Mapping[str, bytes], secrets: Mapping[str, bytes], *, raw_only: Iterable[str] = ()) -> list[Leak]:
    """Every (source, secret, form) where a form of a secret occurs (sorted; [] = clean).

    ``raw_only``: secrets searched only as given (PEM lines are base64 already: their
    own hex or base64 is not how a key leaks)."""
    plain = set(raw_only)
    needles = [
        (name, form, text)
        for name, value in secrets.items()
        for form, text in ({"raw": value} if name in plain else secret_forms(value)).items()
    ]
    leaks = {
        Leak(source, name, form)
        for source, data in sources.items()
        for name, form, text in needles
        if text in data
    }
    return sorted(leaks)


def read_sources(roots: Iterable[Path], patterns: Iterable[str]) -> dict[str, bytes]:
    """Every file under ``roots`` whose name matches one of ``patterns`` (``Path.rglob``
    patterns): its path -> its bytes."""
    found: dict[str, bytes] = {}
    for root in roots:
        for pattern in patterns:
            for path in sorted(root.rglob(pattern)):
                if path.is_file():
                    found[str(path)] = path.read_bytes()
    return found
