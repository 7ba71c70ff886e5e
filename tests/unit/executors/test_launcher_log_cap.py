"""The launcher's log cap: output.log keeps its end within ``log_max_bytes``, rotating to output.log.1 with a
truncation marker; the launcher run the way LocalExecutor runs it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dlcloud.executors import base
from dlcloud.executors.local.launcher import Launcher
from tests.unit.executors.test_launcher import LINE, finish, start

CAP = 16 * 1024
MARKER = re.compile(r"^log truncated: (\d+) earlier bytes dropped \(cap 16 KiB\)$")


def _records(path: Path) -> list[tuple[str, str, str]]:
    out = []
    for raw in path.read_text().splitlines():
        m = LINE.match(raw)
        assert m, f"badly formatted log line: {raw!r}"
        out.append((m[1], m[2], m[3]))
    return out


def test_a_log_past_its_cap_keeps_its_end_and_says_what_was_dropped(tmp_path: Path):
    command = "python -c \"for i in range(5000): print(f'line {i:05d} ' + 'x' * 60)\""
    attempt_dir, proc = start(tmp_path, command, log_max_bytes=CAP)
    assert finish(attempt_dir, proc)["exit_code"] == 0

    log, older = attempt_dir / "output.log", attempt_dir / "output.log.1"
    assert log.stat().st_size + older.stat().st_size <= CAP
    assert older.stat().st_size > CAP // 2 - 200  # the older half is a full half
    old, new = _records(older), _records(log)
    # each file starts with the marker; output.log's counts output.log.1 as dropped (as it will be)
    (m_old, m_new) = (MARKER.match(old[0][2]), MARKER.match(new[0][2]))
    assert m_old and m_new and old[0][1] == new[0][1] == "system"
    assert int(m_new[1]) == int(m_old[1]) + older.stat().st_size
    # what is kept is the end, without a gap: the last lines the command wrote, then the launcher's own
    numbers = [int(t.split()[1]) for _, s, t in old[1:] + new[1:] if s == "stdout"]
    assert numbers == list(range(numbers[0], 5000))
    assert new[-1][1:] == ("system", "command exited with code 0")
    assert int(m_old[1]) > 5000 * 60 - CAP  # about everything before the kept end was dropped
    times = [t for t, _, _ in old + new]
    assert times == sorted(times)


def test_a_line_longer_than_half_the_cap_is_split_not_lost(tmp_path: Path):
    text = "é" * 20_000  # 40,000 bytes of UTF-8, two bytes a character
    command = f"python -c \"print('{text}')\""
    attempt_dir, proc = start(tmp_path, command, log_max_bytes=CAP)
    assert finish(attempt_dir, proc)["exit_code"] == 0
    records = []
    for path in (attempt_dir / "output.log.1", attempt_dir / "output.log"):
        if path.exists():
            records += _records(path)
    pieces = [t for _, s, t in records if s == "stdout"]
    assert len(pieces) > 1
    assert "".join(pieces).endswith("é" * 1000)  # each piece is whole characters, the end is there
    assert all(len(f"{t} stdout {p}\n".encode()) <= CAP // 2 for t, s, p in records if s == "stdout")


def test_the_default_cap_applies_without_log_max_bytes(tmp_path: Path):
    attempt_dir = tmp_path / "a"
    attempt_dir.mkdir()
    (attempt_dir / "workload.json").write_text(json.dumps({"command": "true"}))
    launcher = Launcher(str(attempt_dir))
    launcher.open_log()
    assert launcher.log_max_bytes == Launcher.DEFAULT_LOG_MAX_BYTES
    (attempt_dir / "workload.json").write_text(json.dumps({"log_max_bytes": 10}))
    launcher.open_log()
    assert launcher.log_max_bytes == Launcher.MIN_LOG_MAX_BYTES


def test_the_launcher_and_the_readers_agree_on_the_format():
    # the launcher may not import dlcloud: it repeats what executors/base.py says
    assert Launcher.ROTATED_LOG_SUFFIX == base.ROTATED_LOG_SUFFIX
    assert Launcher.LOG_TRUNCATED == base.LOG_TRUNCATED
    assert base.Workload.__dataclass_fields__["log_max_bytes"].default == Launcher.DEFAULT_LOG_MAX_BYTES
    assert base.log_segments(Path("/a/output.log")) == [Path("/a/output.log.1"), Path("/a/output.log")]


def test_split_utf8_never_cuts_a_character():
    data = "aé€😀".encode() * 10
    for size in range(1, len(data)):
        piece, rest = Launcher.split_utf8(data, size)
        assert piece + rest == data and 0 < len(piece) <= size
        piece.decode()  # whole characters only
