"""Shared field types and parsers for quantities (memory, durations)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    WithJsonSchema,
    model_validator,
)

M = TypeVar("M", bound=BaseModel)
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MAX_MEMORY_BYTES = 16 * 1024**4  # 16 TiB: anything more is a typo
MAX_TIMEOUT_SECONDS = 30 * 24 * 3600

_MEM_UNITS = {
    "": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}
_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]i?)?[bB]?\s*$")
_DUR_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_DUR_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _check_name(value: str) -> str:
    if not NAME_RE.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: use 1-63 lower-case letters, digits and '-', "
            "starting and ending with a letter or digit (a DNS-1123 label)"
        )
    return value


# the pattern is checked by ``_check_name`` (for its message) and published in the JSON schema for clients
Name = Annotated[
    str, Field(min_length=1, max_length=63, json_schema_extra={"pattern": NAME_RE.pattern}), AfterValidator(_check_name)
]


def parse_memory(value: Any) -> int:
    """'4Gi' -> 4294967296, '512M' -> 512000000, 1024 -> 1024 (bytes)."""
    if isinstance(value, bool):
        raise ValueError("memory must be a quantity such as 4Gi or 512Mi")
    if isinstance(value, int | float):
        n = int(value)
    elif isinstance(value, str):
        m = _MEM_RE.match(value)
        if not m:
            raise ValueError(f"memory {value!r} is not a quantity; use e.g. 512Mi, 4Gi, 2G or a byte count")
        n = int(float(m.group(1)) * _MEM_UNITS[(m.group(2) or "").lower()])
    else:
        raise ValueError("memory must be a quantity such as 4Gi or 512Mi")
    if n < 0:
        raise ValueError(f"memory must not be negative, got {value!r}")
    if n > MAX_MEMORY_BYTES:
        raise ValueError(f"memory must be at most 16Ti, got {value!r}")
    return n


def parse_duration(value: Any) -> float:
    """'2h' / '1h30m' / '90s' / 5400 -> seconds."""
    if isinstance(value, bool):
        raise ValueError("duration must be like 90s, 30m, 2h or a number of seconds")
    if isinstance(value, int | float):
        secs = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(\.\d+)?", text):
            secs = float(text)
        else:
            pos, secs = 0, 0.0
            for m in _DUR_RE.finditer(text):
                if m.start() != pos:
                    break
                secs += float(m.group(1)) * _DUR_UNITS[m.group(2)]
                pos = m.end()
            if pos != len(text) or not text:
                raise ValueError(f"duration {value!r} is not understood; use e.g. 90s, 30m, 2h, 1h30m")
    else:
        raise ValueError("duration must be like 90s, 30m, 2h or a number of seconds")
    if not math.isfinite(secs):  # NaN passes every comparison below, and breaks every deadline computed from it
        raise ValueError(f"duration must be a finite number of seconds, got {value!r}")
    if secs <= 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    if secs > MAX_TIMEOUT_SECONDS:
        raise ValueError(f"duration must be at most 30d, got {value!r}")
    return secs


def format_memory(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    for unit, size in (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _json_number(value: Any) -> Any:
    # pydantic's lax mode reads true as 1 and "2" as 2; JSON Schema's integer and number are neither
    if isinstance(value, bool | str):
        raise ValueError(f"must be a number, got {value!r}")
    return value


# put last in ``Annotated[int | float, Field(...), JSON_NUMBER]``: an integer / a number as JSON Schema means
# it, 2 and 2.0 but never true or "2" (last, so that the bounds still reach the JSON schema)
JSON_NUMBER = BeforeValidator(_json_number)
# what a request may send (the parsers accept a little more: spaces, upper-case units); responses are numbers
_MEMORY_JSON = {
    "anyOf": [
        {"type": "integer", "minimum": 0, "maximum": MAX_MEMORY_BYTES},
        {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?([kmgtKMGT]i?)?[bB]?$", "examples": ["4Gi", "512Mi"]},
    ]
}
_UNIT = r"[0-9]+(\.[0-9]+)?(ms|s|m|h|d)"
_DURATION_JSON = {
    "anyOf": [
        {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_SECONDS},
        {"type": "string", "pattern": rf"^([0-9]+(\.[0-9]+)?|({_UNIT})+)$", "examples": ["90s", "2h", "1h30m"]},
    ]
}
MemoryBytes = Annotated[int, BeforeValidator(parse_memory), WithJsonSchema(_MEMORY_JSON, mode="validation")]
DurationSeconds = Annotated[float, BeforeValidator(parse_duration), WithJsonSchema(_DURATION_JSON, mode="validation")]

_ISO_DATE_RE = re.compile(r"^\s*[0-9]{4}-[0-9]{2}-[0-9]{2}")


def _iso_time(value: Any) -> Any:
    # pydantic reads "0" and 1795218536 as Unix times; the API takes ISO 8601 times only
    if isinstance(value, datetime) or (isinstance(value, str) and _ISO_DATE_RE.match(value)):
        return value
    raise ValueError(f"must be an ISO 8601 time such as 2026-11-01T00:00:00Z, got {value!r}")


def _utc(value: datetime) -> datetime:
    """An aware time in UTC (a time without an offset is UTC)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59-01:00 is past year 9999 in UTC
        raise ValueError(f"{value.isoformat()} is out of range") from None


# an ISO 8601 time (the date alone means midnight), returned in UTC; never a number
IsoTime = Annotated[datetime, BeforeValidator(_iso_time), AfterValidator(_utc)]


NUL_MESSAGE = "text must not contain NUL characters (\\u0000)"


def no_nul(value: str) -> str:
    # PostgreSQL cannot store or even compare a NUL in text: it would be a 500 there, not a "not found"
    if "\x00" in value:
        raise ValueError(NUL_MESSAGE)
    return value


def _nul_at(value: Any, where: str = "") -> str | None:
    """Where in ``value`` (a JSON document) a string holds a NUL: ``env.KEY``, ``args.2``, "" for the top."""
    if isinstance(value, str):
        return where if "\x00" in value else None
    items: Any = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        here = f"{where}.{key}" if where else str(key)
        if isinstance(key, str) and "\x00" in key:
            return f"{here} (the key)"
        found = _nul_at(item, here)
        if found is not None:
            return found
    return None


# a path or query parameter that is free text (names get their pattern in api/params.py)
Text = Annotated[str, AfterValidator(no_nul)]


class Request(BaseModel):
    """Base of request models: unknown fields are an error, and so is a NUL anywhere in the body."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        where = _nul_at(data)
        if where is not None:
            raise ValueError(f"{where}: {NUL_MESSAGE}" if where else NUL_MESSAGE)
        return data


def exactly_one_of(**fields: str) -> ConfigDict:
    """``model_config`` of a request model that needs exactly one of ``fields`` (name=JSON type), for the JSON
    schema (clients validating with it); the model's own validator enforces it."""
    one_of: list[JsonValue] = [
        {"required": [name], "properties": {name: {"type": kind}}} for name, kind in fields.items()
    ]
    return ConfigDict(json_schema_extra={"oneOf": one_of})


def require_one(model: M, first: str, second: str, message: str) -> M:
    """``model`` when exactly one of its fields ``first`` and ``second`` is given (not None); ValueError
    ``message`` otherwise (for a request model's own validator)."""
    if (getattr(model, first) is None) == (getattr(model, second) is None):
        raise ValueError(message)
    return model


class Response(BaseModel):
    model_config = ConfigDict(from_attributes=True)
