"""The TensorBoard event-file reader: a one-off process that the control plane runs sandboxed for each pass over
an attempt's event files (``executors/event_files.py``). Never imported by the control plane: event files are
written by the tenant's code, so their bytes are parsed only here, in a process that runs as the tenant's jobs
do, sees only the job's TensorBoard directory (read-only) and can write nothing.

Run by path, ``python -I -B tensorboard_reader.py``: it imports only the standard library and the
``tensorboard`` package (its record reader, ``data_compat`` and ``tensor_util``, with TensorBoard's own
stand-in for TensorFlow: importing TensorFlow would cost seconds and gigabytes per pass).

Input (stdin, JSON, from the control plane): ``{"top": dir, "since": unix time, "until": unix time or null,
"files": [{"path": relative
path, "offset": int, "tags": [scalar tags seen earlier in that file]}], "limits": {...}}``.

Output (stdout): one JSON line per file it read, ``{"path", "offset", "tags", "points", "state", "why"}``:
``offset`` where the next pass starts (always the end of a complete record), ``tags`` the scalar tags first
seen in this pass, ``points`` ``[tag, step, wall time, value]`` lists, ``state`` one of ``eof`` (all read),
``truncated`` (a record still being written: read again once the file grows), ``budget`` (a limit of this pass
was reached), ``corrupt`` (bytes no writer makes: read no more) or ``unreadable``; then ``{"end": true}``.

Invariants:
- Limits first: CPU time, address space, the size of what it writes and open files are capped before any
  file is opened; the pass stops at its byte, point and time budgets, between records, and writes no line that
  would overrun its output budget (that file is read again at the next pass).
- A record is handed to TensorBoard's reader only once its header's checksum holds, its length is at most
  ``max_record_bytes`` and all of it is in the file: a header claiming a huge length never makes it allocate.
- Files are opened without following links, one path component at a time, and must be regular files.
- A scalar is a value of the ``scalars`` plugin (TF1 ``simple_value`` summaries are migrated to it by
  ``data_compat``, as TensorBoard does) with exactly one finite number; a tag's plugin is known from its first
  value with metadata (TF1 writers leave it out of later ones): the tags seen so far come in with each file.
"""

from __future__ import annotations

import json
import math
import os
import resource
import stat
import struct
import sys
import time
import types
from typing import Any

HEADER = 12  # uint64 length, masked CRC-32C of the length
FOOTER = 4  # masked CRC-32C of the data
MAX_TAG_CHARS = 128  # a longer tag can never be a metric name


def _limit(limits: dict[str, int]) -> None:
    cpu, memory, output = int(limits["cpu_seconds"]), int(limits["memory_bytes"]), int(limits["output_bytes"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (output, output))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def _tensorboard() -> types.SimpleNamespace:
    # ``tensorboard.compat.notf`` present: TensorBoard uses its own TensorFlow stand-in, never TensorFlow
    sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
    from tensorboard import data_compat  # tensorboard is heavy: loaded only in the reader process
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
    from tensorboard.util import tensor_util

    return types.SimpleNamespace(
        data_compat=data_compat,
        Event=event_pb2.Event,
        errors=errors,
        RecordReader=pywrap_tensorflow.PyRecordReader_New,
        masked_crc32c=pywrap_tensorflow.masked_crc32c,
        make_ndarray=tensor_util.make_ndarray,
    )


class _Window:
    """The file object TensorBoard's record reader reads through: from ``offset``, never past ``end`` (the size
    the file had when it was opened), so no read asks for more than the file holds."""

    def __init__(self, fd: int, offset: int, end: int) -> None:
        self.fd, self.pos, self.end = fd, offset, end

    def read(self, n: int | None = None) -> bytes:
        n = self.end - self.pos if n is None else max(0, min(n, self.end - self.pos))
        data = os.pread(self.fd, n, self.pos) if n else b""
        self.pos += len(data)
        return data


def _open(top: str, path: str) -> int:
    """A read-only fd of ``top/path``, no component followed if it is a link; a regular file only."""
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts):
        raise OSError(f"not a relative path: {path!r}")
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(f).st_mode):
        os.close(f)
        raise OSError("not a regular file")
    return f


def _scalar(tb: types.SimpleNamespace, tensor: Any) -> float | None:
    """The one finite number a scalar summary's tensor holds, or None."""
    if any(d.size != 1 for d in tensor.tensor_shape.dim):  # checked before anything is allocated for it
        return None
    try:
        array = tb.make_ndarray(tensor)
    except Exception:  # any dtype or content TensorBoard cannot turn into an array is not a scalar
        return None
    if array.size != 1 or array.dtype.kind not in "fiu":
        return None
    value = float(array.reshape(()).item())
    return value if math.isfinite(value) else None


class _Budget:
    def __init__(self, limits: dict[str, Any]) -> None:
        self.bytes = int(limits["max_bytes"])
        self.points = self.max_points = int(limits["max_points"])
        self.tags = int(limits["max_new_tags"])
        self.deadline = time.monotonic() + float(limits["max_seconds"])

    def spent(self) -> bool:
        return self.bytes <= 0 or self.points <= 0 or time.monotonic() > self.deadline


def _read_file(
    tb: types.SimpleNamespace,
    top: str,
    entry: dict[str, Any],
    span: tuple[float, float],
    limits: dict[str, Any],
    budget: _Budget,
) -> dict[str, Any]:
    path, offset = str(entry["path"]), int(entry["offset"])
    known = set(entry.get("tags") or ())
    out: dict[str, Any] = {"path": path, "offset": offset, "tags": [], "points": [], "state": "eof", "why": ""}
    try:
        fd = _open(top, path)
    except OSError as exc:
        out.update(state="unreadable", why=f"cannot be opened: {exc.strerror or exc}")
        return out
    try:
        size = os.fstat(fd).st_size
        window = _Window(fd, offset, size)
        # the file name only appears in the reader's messages: its reads go through the window
        reader = tb.RecordReader(top.encode())
        reader.file_handle = window
        pos, max_record = offset, int(limits["max_record_bytes"])
        while True:
            if budget.spent():
                out["state"] = "budget"
                break
            head = os.pread(fd, HEADER, pos)
            if not head:
                break
            if len(head) < HEADER:
                out["state"] = "truncated"
                break
            (length,) = struct.unpack("<Q", head[:8])
            if tb.masked_crc32c(head[:8]) != struct.unpack("<I", head[8:])[0]:
                out.update(state="corrupt", why=f"the record at byte {pos} has a bad header checksum")
                break
            if length > max_record:
                out.update(state="corrupt", why=f"the record at byte {pos} claims {length} bytes (limit {max_record})")
                break
            if pos + HEADER + length + FOOTER > size:
                out["state"] = "truncated"  # still being written
                break
            try:
                reader.GetNext()
            except tb.errors.DataLossError:
                if os.fstat(fd).st_size < pos + HEADER + length + FOOTER:  # cut short under it: read again later
                    out["state"] = "truncated"
                else:
                    out.update(state="corrupt", why=f"the record at byte {pos} fails its checksum")
                break
            except tb.errors.OutOfRangeError:
                out["state"] = "truncated"
                break
            record = reader.record()
            taken = _scalars(tb, record, span, known, out, budget)
            if taken is None:  # its values would overrun the points left: the next pass starts with it
                out["state"] = "budget"
                break
            pos += HEADER + length + FOOTER
            budget.bytes -= HEADER + length + FOOTER
            out["offset"] = pos
    finally:
        os.close(fd)
    return out


def _scalars(
    tb: types.SimpleNamespace,
    record: bytes,
    span: tuple[float, float],
    known: set[str],
    out: dict[str, Any],
    budget: _Budget,
) -> int | None:
    """Add the record's scalars to ``out`` (an event written in ``span``, (since, until), only); their number,
    or None to leave the record for the next pass."""
    try:
        event = tb.Event.FromString(record)
    except Exception:  # a record that is no Event (protobuf's DecodeError and its kin): skipped
        return 0
    since, until = span
    if not event.HasField("summary") or not math.isfinite(event.wall_time) or not since <= event.wall_time <= until:
        return 0
    found = []
    for value in event.summary.value:
        tag = value.tag
        if not tag or len(tag) > MAX_TAG_CHARS:
            continue
        try:
            value = tb.data_compat.migrate_value(value)
        except Exception:  # whatever TensorBoard cannot migrate is not a scalar
            continue
        plugin = value.metadata.plugin_data.plugin_name if value.HasField("metadata") else ""
        if plugin and plugin != "scalars":
            continue
        if plugin and tag not in known:
            if budget.tags <= 0:
                continue
            known.add(tag)
            out["tags"].append(tag)
            budget.tags -= 1
        if tag not in known or not value.HasField("tensor"):
            continue
        number = _scalar(tb, value.tensor)
        if number is not None:
            found.append([tag, int(event.step), float(event.wall_time), number])
    if len(found) > budget.points:
        if budget.points < budget.max_points:  # this pass took points already: the next one starts with it
            return None
        found = found[: budget.points]  # one record holding more than a whole pass may take: the rest is dropped
    out["points"].extend(found)
    budget.points -= len(found)
    return len(found)


def main() -> int:
    request = json.loads(sys.stdin.buffer.read())
    limits = request["limits"]
    _limit(limits)
    tb = _tensorboard()
    budget = _Budget(limits)
    until = request.get("until")
    top, span = str(request["top"]), (float(request["since"]), math.inf if until is None else float(until))
    room = int(limits["output_bytes"]) - 64  # the end marker always fits
    for entry in request["files"]:
        if budget.spent():
            break
        line = json.dumps(_read_file(tb, top, entry, span, limits, budget), ensure_ascii=True, allow_nan=False)
        if len(line) + 1 > room:  # not written: the file is read again from where it was at the next pass
            break
        room -= len(line) + 1
        sys.stdout.write(line + "\n")
    sys.stdout.write(json.dumps({"end": True}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
