"""Reading JSON request bodies: ``msgspec`` where it can, ``json`` for the rest; the result is the same.

``json.loads`` spends most of an infer request's decoding time making Python floats out of the numbers;
``msgspec`` reads the same body about 7x faster and gives the same objects: the same floats (correctly rounded),
integers of any size kept exact, duplicate keys resolved the same way (the last wins). It is stricter, so
what it refuses goes to ``json``, which accepts it as before (``NaN``, ``Infinity``, numbers past the float
range, lone surrogates, UTF-16/32 bodies, a UTF-8 BOM) or refuses it with the message it always gave.
"""

from __future__ import annotations

import json
from typing import Any

try:
    import msgspec

    _decode: Any = msgspec.json.Decoder().decode
except ImportError:  # pragma: no cover - msgspec is a dependency; this keeps a partial install working
    _decode = None


def loads(body: bytes | str) -> Any:
    """``json.loads(body)``, faster."""
    if _decode is not None:
        try:
            return _decode(body)
        except (ValueError, RecursionError):  # msgspec.DecodeError and UnicodeDecodeError are ValueErrors
            pass
    return json.loads(body)
