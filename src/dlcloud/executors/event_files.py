"""Reading an attempt's TensorBoard event files, from the control plane's side (``Executor.read_event_files``).

Event files are written by the tenant's code: attacker-controlled bytes in a directory the job controls. This
process (often root) only lists that directory, bounded and without following links; the files themselves are
parsed by ``tensorboard_reader.py`` in a one-off process run under the executor's ``reader_prefix`` (a sandbox
that runs as the tenant's jobs do, reads only that directory and writes nothing), with a CPU, memory, wall-time
and output cap, and what it prints is checked here before anyone uses it.

Vocabulary: the *top* is the job's TensorBoard directory; a *run* is a directory below it whose path becomes the
prefix of the metric names read from its files (``validation/events.out.tfevents...`` -> ``validation/<tag>``);
in a gang attempt the first directory named after one of its replicas is that replica's (its
DLCLOUD_TENSORBOARD_DIR), not a run. A *cursor* is where the reading of one attempt stands: per file its offset
(the end of the last complete record read), the scalar tags seen in it and whether it is read no more.

Invariants:
- Each pass reads only what was appended since the cursor, never more than ``MAX_BYTES_PER_PASS`` bytes,
  ``MAX_POINTS_PER_PASS`` points and ``MAX_FILES_PER_PASS`` files, nor for longer than ``READ_SECONDS`` once its
  reader started, of at most ``MAX_FILES`` event files found in at most ``MAX_WALK_ENTRIES`` entries
  ``MAX_DEPTH`` directories deep; ``EventRead.more`` says data is left. A pass is one turn of the ingester's fair
  pool (``control/fair_pool.py``): these bounds are the turn's budget.
- The reader runs under the executor's ``charge`` (the local executor: a cgroup with the job's CPU quota), so
  the CPU a job's event files cost is the job's, not everyone's.
- A record still being written stops the file at the last complete record: it is read once the file grows. A
  file with bytes no writer makes (a bad checksum, a record longer than ``MAX_RECORD_BYTES``), or on which the
  reader failed ``MAX_FAILURES`` times, is read no more; the other files go on.
- A file last modified before the attempt started belongs to an earlier attempt and is not read (``since``);
  the reader also leaves out records written before it (a file two attempts appended to), and, for an attempt
  that ended, after ``until`` (its end: the next attempt's records are that attempt's).
- The cursor lives in memory: a new one reads every file from its start again (storing is an upsert).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

log = logging.getLogger(__name__)

READER_PATH = Path(__file__).resolve().with_name("tensorboard_reader.py")
EVENT_FILE_MARK = "tfevents"  # TensorBoard's own test for an event file: the name contains it
MAX_FILES = 1000  # event files followed per attempt
MAX_WALK_ENTRIES = 10_000  # directory entries looked at per pass
MAX_DEPTH = 8  # directories below the top
MAX_PATH_CHARS = 1024
MAX_FILES_PER_PASS = 200
MAX_BYTES_PER_PASS = 16 * 1024 * 1024  # a turn's byte budget
MAX_RECORD_BYTES = 4 * 1024 * 1024  # a record claiming more is corrupt (summaries are small; images stay far below)
MAX_POINTS_PER_PASS = 10_000
MAX_TAGS = 1000  # scalar tags followed per attempt, all files together
MAX_FAILURES = 3  # reader failures (crash, timeout, unreadable) on one file before it is read no more
READ_SECONDS = 2.0  # a turn's time budget: the reader stops taking new records this long after it started
WALL_SECONDS = 20.0  # then it is killed
CPU_SECONDS = 15
MEMORY_BYTES = 1024**3
OUTPUT_BYTES = 8 * 1024 * 1024
MAX_STEP = 2**62
READER_ENV_PASSED = ("PATH", "LANG", "LC_ALL", "TZ")


@dataclass
class FileCursor:
    """Where the reading of one event file stands."""

    offset: int = 0
    identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino): a file replaced under the same name starts again
    tags: tuple[str, ...] = ()  # scalar tags seen in it (a TF1 writer gives a tag's metadata once per file)
    failures: int = 0
    dead: str = ""  # why it is read no more


@dataclass
class EventCursor:
    """Where the reading of one attempt's event files stands; opaque above the executor, kept in memory."""

    files: dict[str, FileCursor] = field(default_factory=dict)


@dataclass(frozen=True)
class EventScalar:
    """One scalar read from an event file: ``metric`` is the run's path and the tag as written (``validation/
    accuracy``), to be checked as a metric name by whoever stores it."""

    replica: str
    metric: str
    step: int
    value: float
    wall_time: float


@dataclass
class EventRead:
    """What a pass read: new scalars, whether data is left for the next pass, and what went wrong (for logs)."""

    scalars: list[EventScalar] = field(default_factory=list)
    more: bool = False
    problems: list[str] = field(default_factory=list)
    files_read: int = 0


@dataclass(frozen=True)
class _Found:
    size: int
    mtime: float
    identity: tuple[int, int]


def scan(top: Path) -> tuple[dict[str, _Found], list[str]]:
    """The event files below ``top`` by relative path, links neither followed nor listed; bounded."""
    found: dict[str, _Found] = {}
    problems: list[str] = []
    seen = 0
    base = len(os.fspath(top).rstrip("/")) + 1
    walk = cast(Generator[tuple[str, list[str], list[str], int]], os.fwalk(os.fspath(top), follow_symlinks=False))
    try:
        for dirpath, dirnames, filenames, dirfd in walk:
            rel_dir = dirpath[base:] if len(dirpath) >= base else ""
            depth = rel_dir.count("/") + 1 if rel_dir else 0
            seen += len(dirnames) + len(filenames)
            if seen > MAX_WALK_ENTRIES:
                problems.append(f"more than {MAX_WALK_ENTRIES} entries in the directory: the rest is left out")
                break
            if depth >= MAX_DEPTH:
                dirnames.clear()
            for name in sorted(filenames):
                if EVENT_FILE_MARK not in name:
                    continue
                rel = f"{rel_dir}/{name}" if rel_dir else name
                if len(rel) > MAX_PATH_CHARS or not _utf8(rel):
                    continue
                try:
                    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if len(found) >= MAX_FILES:
                    problems.append(f"more than {MAX_FILES} event files: the rest is left out")
                    return found, problems
                found[rel] = _Found(st.st_size, st.st_mtime, (st.st_dev, st.st_ino))
    except OSError as exc:
        problems.append(f"the TensorBoard directory cannot be listed: {exc.strerror or exc}")
    finally:
        walk.close()  # its open directories
    return found, problems


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a name that is not UTF-8 (surrogate escapes)
        return False
    return True


def read(
    top: Path,
    cursor: EventCursor,
    *,
    since: float,
    until: float | None = None,
    replicas: Sequence[str] = (),
    prefix: Callable[[], list[str] | None] = lambda: None,
    charge: Callable[[], contextlib.AbstractContextManager[list[str]]] | None = None,
) -> EventRead:
    """The scalars appended to the event files below ``top`` since ``cursor``, which it advances. Files last
    modified before ``since`` (a Unix time: when the attempt started) are left alone, and so are records written
    after ``until`` (an ended attempt's end; None: it runs). ``prefix`` gives the argv prefix that sandboxes the
    reader (None: it runs unsandboxed, with the same limits); ``charge`` the argv prefix that charges its CPU to
    the job, for the time of one run (the executor's; None: nothing)."""
    found, problems = scan(top)
    result = EventRead(problems=problems)
    for rel in [r for r in cursor.files if r not in found]:  # gone
        del cursor.files[rel]
    todo: list[str] = []
    for rel, f in found.items():
        fc = cursor.files.get(rel)
        if fc is None:
            if f.mtime < since or f.size == 0:
                continue  # an earlier attempt's, or nothing yet: looked at again at the next pass
            fc = cursor.files[rel] = FileCursor(identity=f.identity)
        elif fc.identity != f.identity or f.size < fc.offset:  # replaced or truncated: from the start
            cursor.files[rel] = fc = FileCursor(identity=f.identity)
        if not fc.dead and f.size > fc.offset:
            todo.append(rel)
    if not todo:
        return result
    todo.sort(key=lambda r: (cursor.files[r].offset > 0, r))  # files never read first, then the rest
    batch = todo[:MAX_FILES_PER_PASS]
    known_tags = sum(len(fc.tags) for fc in cursor.files.values())
    request = {
        "top": os.fspath(top),
        "since": since,
        "until": until,
        "files": [{"path": r, "offset": cursor.files[r].offset, "tags": list(cursor.files[r].tags)} for r in batch],
        "limits": {
            "cpu_seconds": CPU_SECONDS,
            "memory_bytes": MEMORY_BYTES,
            "output_bytes": OUTPUT_BYTES,
            "max_bytes": MAX_BYTES_PER_PASS,
            "max_points": MAX_POINTS_PER_PASS,
            "max_new_tags": max(0, MAX_TAGS - known_tags),
            "max_record_bytes": MAX_RECORD_BYTES,
            "max_seconds": READ_SECONDS,
        },
    }
    with charge() if charge is not None else contextlib.nullcontext([]) as charged:
        sandbox = prefix()
        lines, failure = run_reader([*charged, *(sandbox or [])] or None, request)
    answered: set[str] = set()
    points_left, tags_left = MAX_POINTS_PER_PASS, max(0, MAX_TAGS - known_tags)
    for line in lines:
        path = line.get("path")
        if not isinstance(path, str) or path not in batch or path in answered:
            continue
        answered.add(path)
        taken, tags_left = _apply(path, cursor.files[path], line, replicas, points_left, tags_left, result)
        points_left -= taken
    if failure is not None:
        # the file it was reading when it failed is the first one asked for that it did not answer
        culprit = next((r for r in batch if r not in answered), None)
        if culprit is not None:
            _failed(cursor.files[culprit], culprit, failure, result)
        else:
            result.problems.append(f"the event-file reader {failure}")
    result.files_read = len(answered)
    result.more = any(not fc.dead and found[rel].size > fc.offset for rel, fc in cursor.files.items() if rel in found)
    return result


def _failed(fc: FileCursor, rel: str, why: str, result: EventRead) -> None:
    fc.failures += 1
    if fc.failures >= MAX_FAILURES:
        fc.dead = f"the reader failed on it {fc.failures} times ({why})"
        result.problems.append(f"{rel}: read no more: {fc.dead}")
    else:
        result.problems.append(f"{rel}: the event-file reader {why}")


def _apply(
    rel: str,
    fc: FileCursor,
    line: dict[str, Any],
    replicas: Sequence[str],
    points_left: int,
    tags_left: int,
    result: EventRead,
) -> tuple[int, int]:
    """Check one answer of the reader and take it into ``fc`` and ``result``: (points taken, tags left)."""
    offset, state, why = line.get("offset"), line.get("state"), line.get("why")
    tags, points = line.get("tags"), line.get("points")
    if (
        type(offset) is not int
        or not fc.offset <= offset <= MAX_STEP
        or not isinstance(tags, list)
        or not isinstance(points, list)
        or state not in ("eof", "truncated", "budget", "corrupt", "unreadable")
    ):
        _failed(fc, rel, "gave an answer that does not hold together", result)
        return 0, tags_left
    new_tags = [t for t in tags if isinstance(t, str) and 0 < len(t) <= 128 and t not in fc.tags][:tags_left]
    fc.tags = (*fc.tags, *new_tags)
    tags_left -= len(new_tags)
    replica, run = _replica_and_run(rel, replicas)
    taken = 0
    for p in points[:points_left]:
        if not (isinstance(p, list) and len(p) == 4):
            continue
        tag, step, wall, value = p
        if not isinstance(tag, str) or tag not in fc.tags or type(step) is not int or not 0 <= step <= MAX_STEP:
            continue
        if not _number(value) or not _number(wall):
            continue
        result.scalars.append(EventScalar(replica, f"{run}/{tag}" if run else tag, step, float(value), float(wall)))
        taken += 1
    fc.offset = offset
    if state == "corrupt":
        fc.dead = str(why)[:200] if why else "its bytes are not an event file"
        result.problems.append(f"{rel}: read no more: {fc.dead}")
    elif state == "unreadable":
        _failed(fc, rel, str(why)[:200] if why else "could not open it", result)
    else:
        fc.failures = 0
    return taken, tags_left


def _number(x: object) -> bool:
    return type(x) in (int, float) and math.isfinite(x)  # type: ignore[arg-type]


def _replica_and_run(rel: str, replicas: Sequence[str]) -> tuple[str, str]:
    """(replica, run) of an event file: a gang replica's files are below its own directory."""
    dirs = rel.split("/")[:-1]
    if dirs and dirs[0] in replicas:
        return dirs[0], "/".join(dirs[1:])
    return "", "/".join(dirs)


def run_reader(prefix: list[str] | None, request: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """Run the reader on ``request``: the JSON objects of its complete lines, and why it failed (None: it
    finished). Its environment is an allow-list; it runs in a session of its own, killed whole at the end."""
    argv = [sys.executable, "-I", "-B", os.fspath(READER_PATH)]
    if prefix:
        argv = [*prefix, *argv]
    env = {k: os.environ[k] for k in READER_ENV_PASSED if k in os.environ}
    env.setdefault("PATH", os.defpath)
    env.update(HOME="/tmp", TMPDIR="/tmp", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        stdin.write(json.dumps(request).encode())
        stdin.seek(0)
        try:
            proc = subprocess.Popen(
                argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd="/", start_new_session=True
            )
        except OSError as exc:
            return [], f"could not start: {exc}"
        try:
            code: int | None = proc.wait(timeout=WALL_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        stdout.seek(0)
        data = stdout.read(OUTPUT_BYTES)
        if code != 0:
            stderr.seek(0)
            tail = stderr.read(64 * 1024).decode("utf-8", "replace").strip().splitlines()[-3:]
            log.info("event-file reader exited %s: %s", code, " | ".join(tail))
    lines: list[dict[str, Any]] = []
    ended = False
    for raw in data.split(b"\n")[:-1]:  # the part after the last newline is no complete line
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):  # what a reader that was made to misbehave might print
            continue
        if isinstance(obj, dict):
            if obj.get("end") is True:
                ended = True
            else:
                lines.append(obj)
    if code is None:
        return lines, f"was killed after {WALL_SECONDS:.0f} s"
    if code != 0 or not ended:
        return lines, f"exited with code {code}" if code != 0 else "ended without finishing"
    return lines, None
