"""A job's outputs as they are saved into the object store when an attempt ends (``Executor.save_outputs``).

The regular files and directories of the outputs directory become a stored tree; what is neither (symbolic
links, FIFOs, sockets, devices) is never followed nor copied: it is left out, and named in a small record
beside the tree (``<key>.left-out``, JSON ``{path: "link" | "special"}``) so that registering a model from it
says what the path was instead of "no such file".
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

from dlcloud.checksums import file_sha256
from dlcloud.storage.objects import Manifest, ObjectMissing, ObjectStore, TreeEntry, check_rel_path

LEFT_OUT_SUFFIX = ".left-out"
LINK, SPECIAL = "link", "special"


def scan_outputs(root: Path) -> tuple[Manifest, dict[str, str]]:
    """The manifest of the regular files and empty directories under ``root``, and what was left out."""
    entries: list[TreeEntry] = []
    empty: list[str] = []
    left_out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):  # os.walk does not follow links to directories
        dirnames.sort()
        here = Path(dirpath)
        names = sorted([*dirnames, *filenames])
        kept = 0
        for name in names:
            full = here / name
            rel = full.relative_to(root).as_posix()
            try:
                check_rel_path(rel)
            except ValueError:
                left_out[rel] = SPECIAL
                continue
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode):
                entries.append(TreeEntry(rel, st.st_size, file_sha256(full)))
                kept += 1
            elif stat.S_ISDIR(st.st_mode):
                kept += 1
            else:
                left_out[rel] = LINK if stat.S_ISLNK(st.st_mode) else SPECIAL
        if not kept and here != root:
            empty.append(here.relative_to(root).as_posix())
    return Manifest.of(entries, empty), left_out


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
