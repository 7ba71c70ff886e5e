"""Shared field types and parsers for quantities (memory, durations)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

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


Name = Annotated[str, Field(min_length=1, max_length=63), AfterValidator(_check_name)]


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


MemoryBytes = Annotated[int, BeforeValidator(parse_memory)]
DurationSeconds = Annotated[float, BeforeValidator(parse_duration)]


class Request(BaseModel):
    """Base of request models: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


class Response(BaseModel):
    model_config = ConfigDict(from_attributes=True)
