"""API throughput: signed ``GET /api/v1/jobs/{id}`` under 32 concurrent clients, next to a bare FastAPI peer,
with 1 and N API processes (``dlcloud up --api-workers``).

For each worker count K (``--api-workers``, default ``1`` and the machine's cores) it starts ``dlcloud up
--api-workers K`` on a free port with a temporary data dir, submits one job and uses its id. Then the same load
generator drives, one after the other:

* dlcloud: ``GET /api/v1/jobs/{id}``, every request freshly signed (``dlcloud.signing.sign_request``,
  unique nonce), so each one pays for the full authentication including the nonce insert;
* peer: an unauthenticated ``@app.get("/ping") def ping(): return {"ok": True}`` served by uvicorn with
  the settings ``dlcloud up`` uses and K worker processes (same host, same loop/http auto-detection).

The load generator runs in separate processes (default 2 processes x 16 connections, HTTP/1.1
keep-alive, one request in flight per connection). It competes with the server for the CPU, which is why
the peer is measured by the same generator in the same run: the ratio is the figure to compare. Only
requests that complete inside the measured window (after the warm-up) count. Server CPU per request is
read from /proc/<pid>/stat of the server and its processes (the API workers, and dlcloud's control process,
idle but for its loop) and does not depend on the generator.

Example:

    .venv/bin/python bench/api_throughput.py --duration 10 --warmup 2 --api-workers 1,2
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from array import array
from dataclasses import dataclass
from pathlib import Path

from _common import (  # bench/ is on sys.path when run as a script
    DlcloudServer,
    Process,
    machine,
    percentile,
    tree_cpu_seconds,
)

from dlcloud.signing import sign_request

TARGET_RATIO = 0.5  # dlcloud's signed reads per second over the bare peer's, at every worker count
# one key sends the whole load: rate limits it never reaches, so their check is in what is measured but no
# request is refused (the defaults, 50 requests/s per key, would answer most of the load 429)
UNREACHED_RATE_LIMITS = {"DLCLOUD_API_RATE_LIMIT_PER_KEY": "1000000", "DLCLOUD_API_RATE_LIMIT_PER_TENANT": "1000000"}
PEER_APP = """
import sys
import uvicorn
from fastapi import FastAPI


app = FastAPI()


@app.get("/ping")
def ping():
    return {"ok": True}


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[3])
    uvicorn.run("peer_app:app", host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False,
                lifespan="on", timeout_graceful_shutdown=5, workers=int(sys.argv[2]))
"""


# -- machine and numbers ---------------------------------------------------------------------------


def uvicorn_stack() -> str:
    found = []
    for mod in ("uvloop", "httptools"):
        try:
            __import__(mod)
            found.append(mod)
        except ImportError:
            pass
    loop = "uvloop" if "uvloop" in found else "asyncio"
    http = "httptools" if "httptools" in found else "h11"
    return f"uvicorn loop={loop} http={http}"


# -- servers ---------------------------------------------------------------------------------------
class PeerServer(Process):
    def start(self, workers: int = 1) -> None:
        app_dir = self.root / f"{self.name}-app"
        app_dir.mkdir(exist_ok=True)
        (app_dir / "peer_app.py").write_text(PEER_APP)
        self._spawn([sys.executable, str(app_dir / "peer_app.py"), str(self.port), str(workers), str(app_dir)], "/ping")


# -- the load generator ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Load:
    port: int
    path: str
    access_key: str | None  # None: unsigned
    secret_key: str | None
    connections: int
    start_at: float  # wall clock: connections open before, requests start then
    measure_from: float
    measure_to: float


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = None
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if length is not None:
        await reader.readexactly(length)
    elif chunked:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status


async def _connection(load: Load, latencies: array, counts: dict[str, int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", load.port)
    host = f"Host: 127.0.0.1:{load.port}\r\n"
    await asyncio.sleep(max(0.0, load.start_at - time.time()))
    try:
        while True:
            head = f"GET {load.path} HTTP/1.1\r\n{host}"
            if load.access_key is not None and load.secret_key is not None:
                signed = sign_request(load.access_key, load.secret_key, "GET", load.path)
                head += "".join(f"{k}: {v}\r\n" for k, v in signed.headers.items())
            t0 = time.time()
            if t0 >= load.measure_to:
                break
            writer.write((head + "\r\n").encode())
            status = await _read_response(reader)
            t1 = time.time()
            if t0 >= load.measure_from and t1 <= load.measure_to:
                latencies.append(t1 - t0)
                counts["ok" if status == 200 else "errors"] += 1
            elif status != 200:
                counts["warmup_errors"] += 1
    finally:
        writer.close()


async def _worker_main(load: Load) -> tuple[bytes, dict[str, int]]:
    latencies = array("d")
    counts = {"ok": 0, "errors": 0, "warmup_errors": 0}
    await asyncio.gather(*(_connection(load, latencies, counts) for _ in range(load.connections)))
    return latencies.tobytes(), counts


def _worker(load: Load, out: mp.Queue) -> None:
    out.put(asyncio.run(_worker_main(load)))


@dataclass
class Result:
    name: str
    requests: int
    errors: int
    seconds: float
    latencies: list[float]
    server_cpu: float  # CPU seconds of the server process in the measured window
    generator_cpu: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies, 50) * 1e3

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies, 99) * 1e3


def drive(
    name: str, port: int, path: str, keys: tuple[str, str] | None, server_pid: int, args: argparse.Namespace
) -> Result:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    per_proc = [args.clients // args.procs + (1 if i < args.clients % args.procs else 0) for i in range(args.procs)]
    start_at = time.time() + 1.5  # time to spawn the workers and open the connections
    measure_from = start_at + args.warmup
    measure_to = measure_from + args.duration
    workers = [
        ctx.Process(
            target=_worker,
            args=(
                Load(
                    port,
                    path,
                    keys[0] if keys else None,
                    keys[1] if keys else None,
                    n,
                    start_at,
                    measure_from,
                    measure_to,
                ),
                out,
            ),
            daemon=True,
        )
        for n in per_proc
    ]
    for w in workers:
        w.start()
    time.sleep(max(0.0, measure_from - time.time()))
    cpu0 = tree_cpu_seconds(server_pid)
    gen0 = sum(tree_cpu_seconds(w.pid) for w in workers if w.pid)
    time.sleep(max(0.0, measure_to - time.time()))
    cpu1 = tree_cpu_seconds(server_pid)
    gen1 = sum(tree_cpu_seconds(w.pid) for w in workers if w.pid)
    latencies: list[float] = []
    ok = errors = 0
    for _ in workers:
        raw, counts = out.get(timeout=60 + args.duration)
        lat = array("d")
        lat.frombytes(raw)
        latencies.extend(lat)
        ok += counts["ok"]
        errors += counts["errors"] + counts["warmup_errors"]
    for w in workers:
        w.join(timeout=10)
    return Result(name, ok, errors, args.duration, latencies, cpu1 - cpu0, gen1 - gen0)


# -- report ----------------------------------------------------------------------------------------
def print_report(args: argparse.Namespace, results: list[tuple[int, Result, Result]]) -> None:
    print()
    print(f"machine: {machine()}")
    print(
        f"load: {args.clients} concurrent clients ({args.procs} processes x asyncio, keep-alive), "
        f"{args.warmup:g} s warm-up, {args.duration:g} s measured; servers: {uvicorn_stack()}"
    )
    print()
    header = f"{'':<46}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}{'srv CPU':>9}{'CPU us/req':>11}"
    print(header)
    print("-" * len(header))
    met = True
    for workers, dl, peer in results:
        for r in (dl, peer):
            label = "dlcloud GET /api/v1/jobs/{id} signed" if r is dl else "peer FastAPI GET /ping, no auth"
            us = r.server_cpu / r.requests * 1e6 if r.requests else float("nan")
            print(
                f"{label + f', {workers} proc':<46}{r.rps:>9.0f}{r.p50_ms:>9.1f}{r.p99_ms:>9.1f}{r.errors:>8}"
                f"{r.server_cpu / r.seconds * 100:>8.0f}%{us:>11.0f}"
            )
        ratio = dl.rps / peer.rps
        met = met and ratio >= TARGET_RATIO
        print(
            f"{f'ratio dlcloud / peer, {workers} proc':<46}{ratio:>9.2f}{dl.p50_ms / peer.p50_ms:>9.2f}"
            f"{dl.p99_ms / peer.p99_ms:>9.2f}"
        )
    print(f"target: dlcloud / peer >= {TARGET_RATIO} at every worker count ({'met' if met else 'MISSED'})")
    gen = ", ".join(
        f"{r.name} {w} proc {r.generator_cpu / r.seconds * 100:.0f}%" for w, dl, peer in results for r in (dl, peer)
    )
    print(f"(srv CPU: the server's processes over the window, 100% = one core; load generator CPU: {gen})")


def measure(workers: int, root: Path, args: argparse.Namespace) -> tuple[Result, Result]:
    """dlcloud with ``workers`` API processes, then the peer with as many."""
    dl_server = DlcloudServer(root, f"dlcloud-{workers}")
    peer_server = PeerServer(root, f"peer-{workers}")
    try:
        ak, sk = dl_server.start(
            args.log_level, extra_args=["--api-workers", str(workers)], extra_env=UNREACHED_RATE_LIMITS
        )
        from dlcloud.client import Client, Credentials

        with Client(Credentials(dl_server.endpoint, ak, sk)) as client:
            job = client.jobs.submit({"name": "bench-api", "command": "true", "resources": {"memory": "64Mi"}})
            client.jobs.get(job.id)  # the path works before the clock starts
        assert dl_server.proc is not None
        dl = drive("dlcloud", dl_server.port, f"/api/v1/jobs/{job.id}", (ak, sk), dl_server.proc.pid, args)
        dl_server.stop()
        peer_server.start(workers)
        assert peer_server.proc is not None
        peer = drive("peer", peer_server.port, "/ping", None, peer_server.proc.pid, args)
    finally:
        peer_server.stop()
        dl_server.stop()
    return dl, peer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per server (default 10)")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before (default 2)")
    ap.add_argument("--clients", type=int, default=32, help="concurrent connections (default 32)")
    ap.add_argument("--procs", type=int, default=2, help="load generator processes (default 2)")
    ap.add_argument(
        "--api-workers",
        default=f"1,{os.cpu_count() or 1}",
        help="comma-separated API process counts, each measured against the peer with as many (default 1,cores)",
    )
    ap.add_argument("--log-level", default="warning", help="dlcloud server log level (default warning)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary dir (server logs)")
    args = ap.parse_args()
    if args.clients < args.procs or args.procs < 1:
        ap.error("need --procs >= 1 and --clients >= --procs")
    try:
        counts = sorted({int(n) for n in args.api_workers.split(",")})
    except ValueError:
        ap.error(f"--api-workers: comma-separated numbers, got {args.api_workers!r}")
    if not counts or counts[0] < 1:
        ap.error("--api-workers: each count at least 1")

    root = Path(tempfile.mkdtemp(prefix="dlcloud-bench-api-"))
    results = []
    try:
        for workers in counts:
            results.append((workers, *measure(workers, root, args)))
    finally:
        if args.keep:
            print(f"kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print_report(args, results)


if __name__ == "__main__":
    main()
