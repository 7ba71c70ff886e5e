"""Opaque random identifiers: a prefix of one or two letters and '-' (``j-`` jobs, ``m-`` models, ``c-`` code,
...) then 16 lower-case letters and digits.

Names that users choose may not take this shape (``looks_like_id``): a route that accepts "a name or an id"
must never find one object by the other's key.
"""

from __future__ import annotations

import re
import secrets

_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
ID_LENGTH = 16
_ID_RE = re.compile(rf"^([a-z]{{1,2}}-)[a-z0-9]{{{ID_LENGTH}}}$")


def new_id(prefix: str, length: int = ID_LENGTH) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def looks_like_id(value: str, prefix: str | None = None) -> bool:
    """Whether ``value`` has the shape of an id from ``new_id`` (with ``prefix``, e.g. ``"j-"``, or any)."""
    match = _ID_RE.match(value)
    return match is not None and (prefix is None or match.group(1) == prefix)


def reserved_name_message(kind: str, name: str) -> str:
    """The message refusing a ``kind`` name (job, model) that looks like an id."""
    return (
        f"{kind} name {name!r} has the shape of an id (one or two letters, '-', 16 letters or digits), which "
        f"names may not have: ids and names must never be mistaken for each other; choose another {kind} name"
    )
