"""Datasets on the S3 backend: a first use (fetch into this host's dataset cache) next to a plain boto3
``download_file`` loop of the same objects, and a cache hit next to nothing.

Starts a real SeaweedFS (tests/s3server.py) on free loopback ports, makes a dataset of ``--files`` files of
random bytes, ``--size-mib`` in all (default 1,000 files, 1 GiB; sizes log-normal around a median of a few
hundred KiB, a few files of tens of MiB, in a few directories), and stores it with ``put_tree`` under a
``datasets/...`` prefix as the platform stores a dataset version. Then:

* first use, in turns, ``--reps`` times each (the order alternates per round):
  - dlcloud: what the executor does for a job's dataset on a host that has not cached it: read the
    version's manifest (``tree_manifest``), then ``TreeCache.acquire`` into an empty cache: fetch, verify
    every file's SHA-256, flush to disk, rename into the cache;
  - peer: a boto3 client on the same endpoint (path style, same credentials) calling ``download_file`` for
    each object in turn into an empty directory. Nothing verified, nothing flushed.
  - reference (no target): the same ``download_file`` calls from ``--threads`` threads.
  Throughput = dataset bytes / wall time; the ratio is ours / peer (target >= 0.9).
* cache hit, ``--hits`` times: the same ``acquire`` again (a pin on a cached entry; released after each,
  untimed), and the executor's whole path for a cached dataset (manifest read + checksum check +
  acquire). Next to nothing: the time is what a cached dataset adds (target <= 50 ms).
* job start (skip with ``--no-jobs``): one ``dlcloud up`` storing in the same SeaweedFS
  (``--storage-url s3://...``, ``--sandbox auto`` by default), a dataset of ``--files`` files and
  ``--job-size-mib`` pushed through the API (a cache hit costs the same whatever the bytes: an entry is not
  verified again), a first job that fetches it (not measured), then trivial jobs in turns without and with it
  (``datasets: [NAME]``): submit -> first line of user code, as bench/job_latency.py measures it, with the
  same breakdown by stage.

Example:

    .venv/bin/python bench/datasets.py                       # 1 GiB, 1,000 files
    .venv/bin/python bench/datasets.py --size-mib 64 --files 100 --reps 2 --jobs 5
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import DlcloudServer, load_average, machine, percentile  # bench/ is on sys.path as a script
from job_latency import USER_CODE, run_job

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.s3server

from dlcloud.client import Client, Credentials
from dlcloud.storage.local import remove_tree
from dlcloud.storage.objects import Manifest, ObjectDamaged
from dlcloud.storage.s3 import S3ObjectStore
from dlcloud.storage.tree_cache import TreeCache
from tests.s3server import S3Server

MiB = 1024 * 1024
TARGET_RATIO = 0.9
TARGET_HIT_MS = 50.0
PREFIX = "datasets/t-bench/d-bench/1"


# -- the dataset -----------------------------------------------------------------------------------
def file_sizes(total: int, count: int, seed: int = 1) -> list[int]:
    """``count`` sizes adding up to ``total``: log-normal (sigma 1.2, as files of a real dataset spread from a
    few KiB to tens of MiB), scaled to the total, at least 1 byte each."""
    rng = random.Random(seed)
    raw = [rng.lognormvariate(0.0, 1.2) for _ in range(count)]
    scale = total / sum(raw)
    sizes = [max(1, int(r * scale)) for r in raw]
    sizes[sizes.index(max(sizes))] += total - sum(sizes)  # exact total
    return sizes


def make_dataset(root: Path, total: int, count: int) -> None:
    """Random bytes (incompressible) in ``count`` files under a few directories of ``root``."""
    dirs = max(1, int(math.sqrt(count) / 3))
    for i, size in enumerate(file_sizes(total, count)):
        path = root / ("train" if i % 10 else "val") / f"shard-{i % dirs:02d}" / f"part-{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            left = size
            while left:
                n = min(left, 8 * MiB)
                f.write(os.urandom(n))
                left -= n


# -- one sample of each ----------------------------------------------------------------------------
def first_use_ours(store: S3ObjectStore, root: Path, expected_sha: str) -> float:
    """Seconds for the control loop's path on an empty cache: manifest, check, acquire (fetch + verify)."""
    cache = TreeCache(root, store, max_bytes=1 << 62)
    t0 = time.perf_counter()
    manifest = store.tree_manifest(PREFIX)
    if manifest.artifact_sha256() != expected_sha:
        raise ObjectDamaged(PREFIX, "does not hold the version the job was given")
    path = cache.acquire(PREFIX, manifest, "bench-first")
    elapsed = time.perf_counter() - t0
    if not (path / manifest.entries[0].path).is_file():
        raise RuntimeError(f"the cache entry {path} lacks {manifest.entries[0].path}")
    cache.release("bench-first")
    remove_tree(root)
    return elapsed


def first_use_peer(client: Any, store: S3ObjectStore, manifest: Manifest, root: Path) -> float:
    """Seconds for a plain boto3 loop: ``download_file`` of each object of the tree in turn."""
    root.mkdir()
    t0 = time.perf_counter()
    for e in manifest.entries:
        target = root / e.path
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(store.bucket, f"{store.prefix}/{PREFIX}/{e.path}", str(target))
    elapsed = time.perf_counter() - t0
    shutil.rmtree(root)
    return elapsed


def first_use_threads(client: Any, store: S3ObjectStore, manifest: Manifest, root: Path, threads: int) -> float:
    """Seconds for the same ``download_file`` calls from ``threads`` threads (for reference: no target)."""
    root.mkdir()
    t0 = time.perf_counter()

    def one(path: str) -> None:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(store.bucket, f"{store.prefix}/{PREFIX}/{path}", str(target))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, [e.path for e in manifest.entries]))
    elapsed = time.perf_counter() - t0
    shutil.rmtree(root)
    return elapsed


def cache_hits(store: S3ObjectStore, root: Path, expected_sha: str, hits: int) -> tuple[list[float], list[float]]:
    """(acquire alone, manifest + check + acquire) in ms, ``hits`` times each, on a warm cache."""
    cache = TreeCache(root, store, max_bytes=1 << 62)
    manifest = store.tree_manifest(PREFIX)
    cache.acquire(PREFIX, manifest, "bench-warm")  # the fetch: not measured
    alone: list[float] = []
    path: list[float] = []
    for i in range(hits):
        t0 = time.perf_counter()
        cache.acquire(PREFIX, manifest, f"hit-{i}")
        alone.append((time.perf_counter() - t0) * 1e3)
        cache.release(f"hit-{i}")
        t0 = time.perf_counter()
        m = store.tree_manifest(PREFIX)
        if m.artifact_sha256() != expected_sha:
            raise ObjectDamaged(PREFIX, "does not hold the version the job was given")
        cache.acquire(PREFIX, m, f"path-{i}")
        path.append((time.perf_counter() - t0) * 1e3)
        cache.release(f"path-{i}")
    cache.release("bench-warm")
    remove_tree(root)
    return alone, path


# -- job start -------------------------------------------------------------------------------------
DATASET = "bench-data"
# the job with the dataset also checks that it sees the dataset's directory (after the timestamp)
COMMAND_WITH_DATA = (
    f"python -c \"{USER_CODE}; import os; assert os.path.isdir(os.environ['DLCLOUD_DATASET_BENCH_DATA'])\""
)


def job_starts(server: S3Server, root: Path, args: argparse.Namespace) -> tuple[dict[str, list[dict[str, float]]], str]:
    """Submit -> first line of user code (ms) of trivial jobs without and with a cached dataset, in turns, on
    one ``dlcloud up`` storing in the same SeaweedFS; and the sandbox line it printed."""
    platform = DlcloudServer(root, "dlcloud")
    env = {
        "DLCLOUD_S3_ENDPOINT_URL": server.endpoint_url,
        "DLCLOUD_S3_REGION": server.region,
        "DLCLOUD_S3_ACCESS_KEY_ID": server.access_key,
        "DLCLOUD_S3_SECRET_ACCESS_KEY": server.secret_key,
        "DLCLOUD_S3_ADDRESSING_STYLE": "path",
    }
    storage = ["--storage-url", f"s3://{server.bucket}/platform"]
    samples: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
    try:
        creds = Credentials(platform.endpoint, *platform.start("warning", args.sandbox, storage, env))
        with Client(creds) as client:
            src = root / "job-data"
            make_dataset(src, args.job_size_mib * MiB, args.files)
            client.datasets.push(DATASET, path=src)
            shutil.rmtree(src)
            run = {
                "without": lambda name: run_job(client, name, args.poll, 60.0),
                "with": lambda name: run_job(client, name, args.poll, 60.0, COMMAND_WITH_DATA, [DATASET]),
            }
            run["with"]("first-use")  # fetches the dataset into the host's cache: not measured
            for i in range(args.warmup + args.jobs):
                order = ["without", "with"] if i % 2 == 0 else ["with", "without"]
                for mode in order:
                    sample = run[mode](f"{mode}-{i}")
                    if i >= args.warmup:
                        samples[mode].append(sample)
                print(f"\r{i + 1}/{args.warmup + args.jobs} job rounds", end="", file=sys.stderr, flush=True)
            print(file=sys.stderr)
    finally:
        platform.stop()
    return samples, platform.isolation


# -- report ----------------------------------------------------------------------------------------
STAGES = [
    ("submit HTTP round trip", "submit_rtt"),
    ("submit -> scheduled (STARTING)", "to_placed"),
    ("scheduled -> launcher running", "to_launcher"),
    ("launcher -> command spawned", "to_command"),
    ("command -> first user line", "to_user_code"),
]


def mib_s(size: int, seconds: float) -> float:
    return size / MiB / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024, help="dataset size in MiB (default 1024)")
    ap.add_argument("--files", type=int, default=1000, help="files in the dataset (default 1000)")
    ap.add_argument("--reps", type=int, default=3, help="first uses of each, in turns (default 3)")
    ap.add_argument("--threads", type=int, default=8, help="threads of the reference loop (default 8)")
    ap.add_argument("--hits", type=int, default=50, help="cache hits measured (default 50)")
    ap.add_argument("--jobs", type=int, default=20, help="job rounds (one of each) measured (default 20)")
    ap.add_argument("--warmup", type=int, default=2, help="job rounds run first and not measured (default 2)")
    ap.add_argument("--job-size-mib", type=int, default=64, help="the jobs' dataset size, --files files (default 64)")
    ap.add_argument("--sandbox", choices=["auto", "off"], default="auto", help="the server's --sandbox (default auto)")
    ap.add_argument("--poll", type=float, default=0.05, help="seconds between state checks while a job runs")
    ap.add_argument("--no-jobs", action="store_true", help="measure the storage layer only, start no server")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    if args.files < 1 or args.size_mib < 1 or args.reps < 1 or args.hits < 1:
        ap.error("--files, --size-mib, --reps and --hits must be at least 1")
    total = args.size_mib * MiB
    if total < args.files:
        ap.error("--size-mib is too small for that many files")

    root = Path(tempfile.mkdtemp(prefix="dlcloud-bench-datasets-"))
    server = S3Server()
    first: dict[str, list[float]] = {"ours": [], "peer": [], "threads": []}
    try:
        print("starting SeaweedFS ...", file=sys.stderr)
        server.start()
        store = server.new_store("bench")
        peer_client = server.client(config=_peer_config())
        src = root / "src"
        print(f"making {args.files} files, {args.size_mib} MiB ...", file=sys.stderr)
        make_dataset(src, total, args.files)
        t0 = time.perf_counter()
        manifest = store.put_tree(PREFIX, src)
        put_s = time.perf_counter() - t0
        print(f"put_tree: {put_s:.1f} s ({mib_s(total, put_s):.0f} MiB/s)", file=sys.stderr)
        shutil.rmtree(src)
        sha = manifest.artifact_sha256()
        runners: dict[str, Callable[[Path], float]] = {
            "ours": lambda where: first_use_ours(store, where, sha),
            "peer": lambda where: first_use_peer(peer_client, store, manifest, where),
            "threads": lambda where: first_use_threads(peer_client, store, manifest, where, args.threads),
        }
        for i in range(args.reps):
            order = list(runners) if i % 2 == 0 else list(reversed(runners))
            for who in order:
                first[who].append(runners[who](root / f"{who}-{i}"))
                print(f"  round {i + 1} {who}: {mib_s(total, first[who][-1]):.0f} MiB/s", file=sys.stderr)
        alone, path = cache_hits(store, root / "cache-hits", sha, args.hits)
        jobs, isolation = ({}, "") if args.no_jobs else job_starts(server, root, args)
    finally:
        server.stop()
        if args.keep:
            print(f"kept: {root}", file=sys.stderr)
        else:
            remove_tree(root)

    print()
    print(f"machine: {machine()}; load average {load_average()}")
    print(f"dataset: {args.files} files, {args.size_mib} MiB, on SeaweedFS (S3 API on loopback)")
    print()
    print(f"first use ({args.reps} each, in turns)")
    header = f"{'':<44}{'median MiB/s':>14}{'best':>9}{'worst':>9}"
    print(header)
    print("-" * len(header))
    labels = {
        "ours": "dlcloud: manifest + TreeCache.acquire",
        "peer": "peer: boto3 download_file loop",
        "threads": f"boto3 download_file, {args.threads} threads (reference)",
    }
    median = {}
    for who, label in labels.items():
        rates = sorted(mib_s(total, s) for s in first[who])
        median[who] = percentile(rates, 50)
        print(f"{label:<44}{median[who]:>14.0f}{rates[-1]:>9.0f}{rates[0]:>9.0f}")
    ratio = median["ours"] / median["peer"]
    print(f"{'ratio (dlcloud / peer), medians':<44}{ratio:>14.2f}")
    print(f"{'ratio (dlcloud / threads), medians':<44}{median['ours'] / median['threads']:>14.2f}")
    print(f"target: >= {TARGET_RATIO} x the boto3 loop ({'met' if ratio >= TARGET_RATIO else 'MISSED'})")
    print()
    print(f"cache hit ({args.hits} each; next to nothing: the time is what it adds), ms")
    header = f"{'':<44}{'p50':>9}{'p95':>9}{'max':>9}"
    print(header)
    print("-" * len(header))
    for label, xs in (("TreeCache.acquire (warm)", alone), ("manifest + check + acquire (control loop)", path)):
        print(f"{label:<44}{percentile(xs, 50):>9.2f}{percentile(xs, 95):>9.2f}{max(xs):>9.2f}")
    worst = max(percentile(alone, 95), percentile(path, 95))
    if jobs:
        print()
        print(
            f"job start: submit -> first line of user code, {args.jobs} jobs of each in turns, ms "
            f"(dataset: {args.files} files, {args.job_size_mib} MiB, cached; sandbox: {isolation})"
        )
        header = f"{'':<44}{'p50':>9}{'p95':>9}{'max':>9}"
        print(header)
        print("-" * len(header))
        rows = {"without": "job without a dataset", "with": "job with the cached dataset"}
        totals = {mode: [s["total"] for s in rows_] for mode, rows_ in jobs.items()}
        for mode, label in rows.items():
            xs = totals[mode]
            print(f"{label:<44}{percentile(xs, 50):>9.1f}{percentile(xs, 95):>9.1f}{max(xs):>9.1f}")
        added = [percentile(totals["with"], q) - percentile(totals["without"], q) for q in (50, 95)]
        print(f"{'added by the dataset (with - without)':<44}{added[0]:>9.1f}{added[1]:>9.1f}")
        worst = max(worst, added[0])
        print()
        print("breakdown, p50 per stage (ms)")
        header = f"{'':<44}{'without':>9}{'with':>9}{'added':>9}"
        print(header)
        print("-" * len(header))
        for label, key in STAGES:
            a, b = (percentile([s[key] for s in jobs[mode]], 50) for mode in ("without", "with"))
            print(f"{label:<44}{a:>9.1f}{b:>9.1f}{b - a:>9.1f}")
    ok = "met" if worst <= TARGET_HIT_MS else "MISSED"
    over = "the cache hit p95s and the jobs' p50 difference" if jobs else "the cache hit p95s"
    print(f"target: a cached dataset adds <= {TARGET_HIT_MS:.0f} ms to job start ({ok}: the worst of {over})")


def _peer_config() -> Any:
    from botocore.config import Config

    return Config(s3={"addressing_style": "path"})


if __name__ == "__main__":
    main()
