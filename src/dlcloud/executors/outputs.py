"""A job's outputs as they are saved into the object store when an attempt ends (``Executor.save_outputs``).

The regular files and directories of the outputs directory become a stored tree; what is neither (symbolic
links, FIFOs, sockets, devices) is never followed nor copied: it is left out, and named in a small record
beside the tree (``<key>.left-out``, JSON ``{path: "link" | "special" | "name"}``) so that registering a model from it
says what the path was instead of "no such file".

Outputs count in their tenant's storage quota: they are measured (apparent sizes, nothing followed) before any
byte is read, and the caller may refuse them then (``scan_outputs``'s ``admit``), so nothing of outputs over
the quota is ever copied.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from dlcloud.checksums import file_sha256
from dlcloud.errors import InvalidArchive, OutputsTooLarge
from dlcloud.storage.archives import check_tree_name
from dlcloud.storage.objects import Manifest, ObjectMissing, ObjectStore, TreeEntry, check_rel_path

LEFT_OUT_SUFFIX = ".left-out"
LINK, SPECIAL, BAD_NAME = "link", "special", "name"
MAX_DEPTH = 32  # as archives.MAX_PATH_DEPTH: deeper directories are left out, never walked


def scan_outputs(
    root: Path, max_files: int, max_bytes: int, admit: Callable[[int], None] | None = None
) -> tuple[Manifest, dict[str, str]]:
    """The manifest of the regular files and empty directories under ``root``, and what was left out: links
    and special files (never followed nor opened), names a stored tree cannot hold (``archives.check_tree_name``:
    not UTF-8, too long, too deep, reserved). Walks without recursion and without following links. Raises
    OutputsTooLarge past ``max_files`` entries or ``max_bytes`` (apparent size: a sparse file counts whole).

    The files are measured (``lstat``) before any is read: ``admit(total bytes)`` is called then, before a byte is
    hashed, and refuses them by raising (the storage quota: ``Executor.save_outputs``)."""
    sizes, empty, left_out = _walk(root, max_files, max_bytes)
    if admit is not None:
        admit(sum(size for _rel, size in sizes))
    entries = [TreeEntry(rel, size, file_sha256(root / rel)) for rel, size in sizes]
    return Manifest.of(entries, empty), left_out


def _walk(root: Path, max_files: int, max_bytes: int) -> tuple[list[tuple[str, int]], list[str], dict[str, str]]:
    """(path, apparent size) of each regular file kept, the empty directories, what was left out."""
    files: list[tuple[str, int]] = []
    empty: list[str] = []
    left_out: dict[str, str] = {}
    dirs: set[str] = set()
    total = 0
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        here = root / rel_dir if rel_dir else root
        try:
            names = sorted(os.listdir(here))
        except OSError:
            left_out[rel_dir or "."] = SPECIAL
            continue
        kept = 0
        for name in names:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if len(left_out) + len(files) + len(dirs) >= max_files:
                raise OutputsTooLarge(f"its outputs hold more than {max_files} files and directories (the limit)")
            try:
                check_tree_name(rel, set(), "output")
                check_rel_path(rel)
            except (InvalidArchive, ValueError):
                left_out[rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace")] = BAD_NAME
                continue
            try:
                st = os.lstat(here / name)
            except OSError:
                left_out[rel] = SPECIAL
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > max_bytes:
                    raise OutputsTooLarge(f"its outputs hold more than {max_bytes} bytes (the limit)")
                files.append((rel, st.st_size))
                kept += 1
            elif stat.S_ISDIR(st.st_mode):
                dirs.add(rel)
                kept += 1
                if rel.count("/") + 1 < MAX_DEPTH:
                    stack.append(rel)
                else:
                    left_out[rel] = BAD_NAME
            else:
                left_out[rel] = LINK if stat.S_ISLNK(st.st_mode) else SPECIAL
        if not kept and rel_dir:
            empty.append(rel_dir)
    return files, empty, left_out


def save_left_out(objects: ObjectStore, key: str, left_out: dict[str, str]) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(left_out, f, sort_keys=True)
    try:
        objects.put_file(key + LEFT_OUT_SUFFIX, Path(f.name))
    finally:
        os.unlink(f.name)


def load_left_out(objects: ObjectStore, key: str) -> dict[str, str]:
    """What the outputs saved at ``key`` left out ({} when nothing was)."""
    try:
        data = b"".join(objects.iter_bytes(key + LEFT_OUT_SUFFIX))
    except ObjectMissing:
        return {}
    value = json.loads(data)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
