"""Opaque random identifiers."""

from __future__ import annotations

import secrets

_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def new_id(prefix: str, length: int = 16) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))
