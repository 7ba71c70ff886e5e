"""Moving an installation's object store from its data dir to another store (an S3 bucket): every object and every
tree the platform keeps — code, models, datasets, job outputs and archived logs (docs/storage.md, "Migration").

``python -m dlcloud.storage.copy --data-dir ~/.dlcloud --to s3://BUCKET/PREFIX`` (the server stopped), then
``dlcloud up --storage-url s3://BUCKET/PREFIX`` on the same data dir and database.

Invariants:
- Everything under ``STORE_PREFIXES`` is copied, through the stores' own API: an object keeps its key and its
  SHA-256 (checked against what the source recorded: a damaged object stops the copy, naming its key); a tree
  keeps its prefix and its manifest (each file checked against it while it is sent), or, registered in place
  (a manifest naming its source), only its manifest. A tree is visible in the target only once whole.
- A model version stored before manifests existed gets its manifest from its files first, as a read would.
- Running it again copies only what the target lacks or holds differently: an object with the same SHA-256
  and a tree with the same manifest are left as they are.
- Uploads waiting for a ``register`` (``uploads/``) are not copied: they expire within a day anyway.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlcloud.errors import DlcloudError, InvalidArgument
from dlcloud.settings import Settings
from dlcloud.storage.local import INTERNAL, MANIFEST_NAME, LocalObjectStore
from dlcloud.storage.objects import ObjectMissing, ObjectStore
from dlcloud.storage.stores import open_object_store

# what the platform keeps in its store (docs/storage.md, "Layout"), in the order they are copied
STORE_PREFIXES = ("code", "datasets", "jobs", "models")
# model versions are trees at models/<tenant>/<model>/<version>, with or without a manifest (older data dirs)
MODEL_VERSION_DEPTH = 4


@dataclass
class CopyReport:
    objects: int = 0  # single objects copied
    trees: int = 0  # trees copied (files and manifest)
    bytes: int = 0
    unchanged: int = 0  # objects and trees the target already held


def _trees(src: LocalObjectStore, top: str) -> list[str]:
    """The prefixes of the trees under ``top``: directories holding a manifest, and every model version."""
    base = src.root / top
    found = {p.parent.relative_to(src.root).as_posix() for p in base.rglob(MANIFEST_NAME)}
    if top == "models":
        found |= {
            p.relative_to(src.root).as_posix()
            for p in base.glob("/".join(["*"] * (MODEL_VERSION_DEPTH - 1)))
            if p.is_dir() and not any(part.startswith(INTERNAL) for part in p.relative_to(src.root).parts)
        }
    return sorted(found)


def _copy_tree(src: LocalObjectStore, dst: ObjectStore, prefix: str, report: CopyReport) -> None:
    manifest = src.tree_manifest(prefix)  # an older model version's is computed from its files here
    try:
        if dst.tree_manifest(prefix) == manifest:
            report.unchanged += 1
            return
    except ObjectMissing:
        pass
    if manifest.source is not None:
        dst.put_tree_manifest(prefix, manifest)
    else:
        tree = src.tree_local_path(prefix)
        assert tree is not None  # a local store keeps every tree on disk
        dst.put_tree(prefix, tree, manifest)
        report.bytes += manifest.size
    report.trees += 1


def _copy_objects(src: LocalObjectStore, dst: ObjectStore, top: str, trees: list[str], report: CopyReport) -> None:
    inside = tuple(t + "/" for t in trees)
    for info in src.list(top):
        if info.key.startswith(inside):
            continue
        held = dst.head(info.key)
        if held is not None and info.sha256 is not None and held.sha256 == info.sha256:
            report.unchanged += 1
            continue
        path = src.local_path(info.key)
        assert path is not None  # a local store keeps every object on disk
        dst.put_file(info.key, path, sha256=info.sha256)
        report.objects += 1
        report.bytes += info.size


def copy_store(src: LocalObjectStore, dst: ObjectStore, progress: Callable[[str], None] = lambda _: None) -> CopyReport:
    """Copy every object and tree of the platform's prefixes from ``src`` to ``dst``; what was copied."""
    report = CopyReport()
    for top in STORE_PREFIXES:
        if not (src.root / top).is_dir():
            continue
        trees = _trees(src, top)
        for prefix in trees:
            progress(prefix)
            _copy_tree(src, dst, prefix, report)
        _copy_objects(src, dst, top, trees, report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dlcloud.storage.copy",
        description="Copy a data dir's object store (code, models, datasets, job outputs and logs) to another "
        "store, e.g. an S3 bucket; the S3 endpoint and credentials are read as dlcloud up reads them. Stop the "
        "server first; then start it with --storage-url TARGET.",
    )
    parser.add_argument("--data-dir", type=Path, required=True, help="the data dir whose store to copy")
    parser.add_argument("--to", required=True, help="the target store: s3://BUCKET/PREFIX or file:///PATH")
    args = parser.parse_args(argv)
    source = LocalObjectStore(args.data_dir)
    try:
        target = open_object_store(Settings(data_dir=source.root, storage_url=args.to))
        if target.url == source.url:
            raise InvalidArgument(f"the target {args.to} is the data dir itself")
        target.check()
        report = copy_store(source, target, progress=lambda prefix: print(f"tree {prefix}", file=sys.stderr))
    except DlcloudError as exc:
        print(f"error ({exc.code}): {exc.message}", file=sys.stderr)
        return 1
    print(
        f"copied {report.objects} objects and {report.trees} trees ({report.bytes} bytes) from {source.url} to "
        f"{target.url}; {report.unchanged} already there"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
