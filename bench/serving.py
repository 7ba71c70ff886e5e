"""Online prediction: one TorchScript MLP served by dlcloud, by Ray Serve and called in-process.

The model: a TorchScript MLP 256 -> 1024 -> 1024 -> 10 (ReLU), float32, on the CPU, written to a temporary
directory with a ``signature.json`` (input ``input`` FP32 [-1, 256], output ``output`` FP32 [-1, 10]).

Served three ways in one run, all measured by the same load generator (``wrk``, a compiled closed-loop
client: each connection sends its next request when the previous answer arrived) with the same body:

* dlcloud: ``dlcloud serve -m mlp=PATH --max-batch-size 64 --no-access-log`` (eager dynamic batching: a
  batch takes whatever is queued as soon as the model is free), a subprocess of this venv.
* Ray Serve: ``bench/ray_serve_mlp.py`` in its own virtualenv (``.venv-bench-ray``, created on first use;
  ``make bench-deps``): one replica, ``@serve.batch(max_batch_size=32)``, ``max_ongoing_requests=256``,
  access log off. Two ingress modes: the default (Serve's HTTP proxy actor) and the high-throughput mode of
  Ray >= 2.56 (``RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1``: HAProxy forwards straight to
  the replica's own HTTP server). Each mode with each ``batch_wait_timeout_s`` of ``--ray-waits`` is
  measured and the best of them is compared.
* ceiling: ``torch.jit.load`` of the same file in this process, batches of 1...128 rows back to back, with
  1 torch thread and with one per core; the best rows/s is the most any server could answer on this machine.

Measured (closed loop, ``--duration`` seconds each after a short warm-up run):

* concurrency 64 (``wrk -t 2 -c 64``), one row of 256 FP32 values per request in KServe V2 JSON (the online
  prediction case): rows/s, requests/s, p50, p99. Extra lines: dlcloud with the binary tensor extension
  (JSON header + 1 KiB of raw float32, binary output) and with 8 rows per JSON request.
* concurrency 1 (``wrk -t 1 -c 1``): dlcloud and Ray latency, the in-process single-row call, and a bare
  uvicorn app (uvloop + httptools, the stack dlcloud runs on) that reads the body and answers a fixed
  response: the cost of loopback HTTP itself (also measured at concurrency 64: what HTTP alone allows).

Targets: dlcloud >= 2x Ray Serve's requests/s at a p99 no worse, >= 70 % of the in-process ceiling (rows/s),
<= 1 ms added over the in-process call at concurrency 1 (p50).

Every server runs on the same cores as the load generator (``wrk`` uses some of the CPU it measures), so
the absolute numbers depend on the machine; the load average is printed before and after. Needs ``wrk``
(Debian/Ubuntu: ``apt-get install -y wrk``).

    .venv/bin/python bench/serving.py                  # 20 s per measurement (about 10 minutes in all)
    .venv/bin/python bench/serving.py --quick          # 5 s each: a smoke run
    .venv/bin/python bench/serving.py --skip-ray --torch-threads 2
    .venv/bin/python bench/serving.py --ray-modes high-throughput --ray-waits 0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from _common import (  # bench/ is on sys.path
    Process,
    free_port,
    load_average,
    machine,
    percentile,
    proc_stat,
    process_tree,
    tree_cpu_seconds,
)

ROOT = Path(__file__).resolve().parent.parent
RAY_SCRIPT = Path(__file__).resolve().parent / "ray_serve_mlp.py"
RAY_PINS = ("ray[serve]==2.60.0", "torch==2.13.0", "numpy")
# Ray Serve's ingress: its HTTP proxy actor (the default), or the high-throughput mode of Ray >= 2.56 (HAProxy
# in front, requests sent straight to the replica's own HTTP server, gRPC between Serve's components)
RAY_MODES = {
    "default": {},
    "high-throughput": {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
}
MODEL = "mlp"
ROUTE = f"/v2/models/{MODEL}/infer"
IN_FEATURES, HIDDEN, OUT_FEATURES = 256, 1024, 10
CEILING_BATCHES = (1, 8, 16, 32, 64, 128)
TARGET_VS_RAY = 2.0
TARGET_VS_CEILING = 0.70
TARGET_ADDED_MS = 1.0

WRK_LUA = r"""
local f = assert(io.open(os.getenv("WRK_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = os.getenv("WRK_CONTENT_TYPE")
local header_length = os.getenv("WRK_HEADER_LENGTH")
if header_length and header_length ~= "" then
  wrk.headers["Inference-Header-Content-Length"] = header_length
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_RESULT {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
"""

# The HTTP floor: the ASGI stack dlcloud runs on, doing nothing but read the body and answer.
ECHO_SERVER = r"""
import sys, uvicorn
RESPONSE = b'{"model_name":"mlp","model_version":"1","outputs":[{"name":"output","datatype":"FP32","shape":[1,10],' \
    b'"data":[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0]}]}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(RESPONSE)).encode())]
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": RESPONSE})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
            access_log=False, log_level="warning")
"""


# -- the model and the request bodies --------------------------------------------------------------


def write_model(folder: Path) -> Path:
    import torch

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, OUT_FEATURES),
    ).eval()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mlp.pt"
    torch.jit.script(mlp).save(str(path))
    signature = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, IN_FEATURES]}],
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, OUT_FEATURES]}],
    }
    (folder / "signature.json").write_text(json.dumps(signature))
    return path


@dataclass(frozen=True)
class Body:
    label: str
    path: Path
    content_type: str
    rows: int
    header_length: int | None = None  # Inference-Header-Content-Length, for the binary extension


def json_body(x: np.ndarray) -> bytes:
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": [float(v) for v in x.ravel()]}
    return json.dumps({"inputs": [tensor]}, separators=(",", ":")).encode()


def binary_body(x: np.ndarray) -> tuple[bytes, int]:
    raw = np.ascontiguousarray(x, dtype="<f4").tobytes()
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "parameters": {"binary_data_size": len(raw)}}
    header = json.dumps(
        {"inputs": [tensor], "parameters": {"binary_data_output": True}}, separators=(",", ":")
    ).encode()
    return header + raw, len(header)


def make_bodies(folder: Path) -> dict[str, Body]:
    rng = np.random.default_rng(1)
    # values rounded to 6 decimals, as a client serialising floats would send them; the same for every server
    one = np.round(rng.uniform(-1, 1, (1, IN_FEATURES)), 6).astype(np.float32)
    eight = np.round(rng.uniform(-1, 1, (8, IN_FEATURES)), 6).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    binary, header_length = binary_body(one)
    bodies = {
        "json1": (Body("V2 JSON, 1 row/request", folder / "json1.body", "application/json", 1), json_body(one)),
        "json8": (Body("V2 JSON, 8 rows/request", folder / "json8.body", "application/json", 8), json_body(eight)),
        "bin1": (
            Body(
                "V2 binary tensors, 1 row/request", folder / "bin1.body", "application/octet-stream", 1, header_length
            ),
            binary,
        ),
    }
    for body, data in bodies.values():
        body.path.write_bytes(data)
    return {key: body for key, (body, _) in bodies.items()}


def body_input(body: Body) -> np.ndarray:
    """The float32 rows a body carries (what the in-process reference is computed on)."""
    data = body.path.read_bytes()
    if body.header_length is None:
        tensor = json.loads(data)["inputs"][0]
        return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
    tensor = json.loads(data[: body.header_length])["inputs"][0]
    return np.frombuffer(data[body.header_length :], dtype="<f4").reshape(tensor["shape"])


def decode_response(content: bytes, headers: httpx.Headers) -> np.ndarray:
    length = headers.get("inference-header-content-length")
    if length is None:
        out = json.loads(content)["outputs"][0]
        return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    header = json.loads(content[: int(length)])
    out = header["outputs"][0]
    return np.frombuffer(content[int(length) :], dtype="<f4").reshape(out["shape"])


# -- in-process ------------------------------------------------------------------------------------


def ceiling(model_path: Path, seconds: float, threads: int) -> dict[int, float]:
    """Rows/s of back-to-back in-process calls per batch size."""
    import torch

    torch.set_num_threads(threads)
    module = torch.jit.load(str(model_path)).eval()
    rng = np.random.default_rng(2)
    rates: dict[int, float] = {}
    with torch.inference_mode():
        for batch in CEILING_BATCHES:
            x = torch.from_numpy(rng.standard_normal((batch, IN_FEATURES), dtype=np.float32))
            for _ in range(20):
                module(x)
            calls = 0
            t0 = time.perf_counter()
            deadline = t0 + seconds
            while True:
                module(x)
                calls += 1
                if calls % 8 == 0 and time.perf_counter() >= deadline:
                    break
            rates[batch] = calls * batch / (time.perf_counter() - t0)
    return rates


def in_process_latency(model_path: Path, x: np.ndarray, seconds: float, threads: int) -> list[float]:
    """Seconds per single call of the module on ``x``, one after the other."""
    import torch

    torch.set_num_threads(threads)
    module = torch.jit.load(str(model_path)).eval()
    samples: list[float] = []
    with torch.inference_mode():
        tensor = torch.from_numpy(np.array(x))
        for _ in range(200):
            module(tensor)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            module(tensor)
            samples.append(time.perf_counter() - t0)
    return samples


def reference(model_path: Path, x: np.ndarray) -> np.ndarray:
    import torch

    module = torch.jit.load(str(model_path)).eval()
    with torch.inference_mode():
        return module(torch.from_numpy(np.array(x))).numpy()


# -- the load generator ----------------------------------------------------------------------------


@dataclass
class Result:
    label: str
    rows_per_request: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    server_cpu: float | None = None  # cores the server's processes used on average
    wrk_cpu: float = 0.0
    batch_rows: float | None = None  # dlcloud: mean rows per executed batch
    note: str = ""

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def rows_s(self) -> float:
        return self.rps * self.rows_per_request


def wrk_path() -> str:
    path = shutil.which("wrk")
    if path is None:
        sys.exit(
            "bench/serving.py needs wrk, the HTTP load generator (one binary, compiled, so it leaves the CPU to\n"
            "the servers it measures). Install it:\n"
            "  Debian/Ubuntu: sudo apt-get install -y wrk\n"
            "  Fedora:        sudo dnf install wrk\n"
            "  macOS:         brew install wrk"
        )
    return path


def run_wrk(
    url: str, body: Body, lua: Path, *, connections: int, threads: int, seconds: float
) -> tuple[dict[str, Any], float]:
    """One wrk run; its summary (from the Lua ``done()``) and the CPU seconds wrk itself used."""
    env = {**os.environ, "WRK_BODY": str(body.path), "WRK_CONTENT_TYPE": body.content_type}
    if body.header_length is not None:
        env["WRK_HEADER_LENGTH"] = str(body.header_length)
    argv = [wrk_path(), "-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(seconds))}s"]
    argv += ["--timeout", "30s", "-s", str(lua), url]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    match = re.search(r"^WRK_RESULT (\{.*\})$", proc.stdout, re.MULTILINE)
    if proc.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(match.group(1)), cpu


def measure(
    label: str,
    url: str,
    body: Body,
    lua: Path,
    args: argparse.Namespace,
    load: tuple[int, int],
    pid: int | None = None,
    metrics_url: str | None = None,
) -> Result:
    """One line: ``load`` is (connections, wrk threads); ``pid`` the server (CPU), ``metrics_url`` dlcloud's."""
    connections, threads = load
    print(f"  {label} ...", file=sys.stderr, flush=True)
    run_wrk(url, body, lua, connections=connections, threads=threads, seconds=args.warmup)
    batches_before = dlcloud_batches(metrics_url) if metrics_url else None
    cpu_before = tree_cpu_seconds(pid) if pid else 0.0
    t0 = time.perf_counter()
    summary, wrk_cpu = run_wrk(url, body, lua, connections=connections, threads=threads, seconds=args.duration)
    wall = time.perf_counter() - t0
    server_cpu = (tree_cpu_seconds(pid) - cpu_before) / wall if pid else None
    batch_rows = None
    if metrics_url and batches_before is not None:
        after = dlcloud_batches(metrics_url)
        if after is not None and after[1] > batches_before[1]:
            batch_rows = (after[0] - batches_before[0]) / (after[1] - batches_before[1])
    errors = sum(summary[k] for k in ("connect", "read", "write", "status", "timeout"))
    return Result(
        label=label,
        rows_per_request=body.rows,
        requests=summary["requests"],
        seconds=summary["duration_us"] / 1e6,
        p50_ms=summary["p50_us"] / 1e3,
        p99_ms=summary["p99_us"] / 1e3,
        errors=errors,
        server_cpu=server_cpu,
        wrk_cpu=wrk_cpu / wall,
        batch_rows=batch_rows,
    )


def dlcloud_batches(metrics_url: str) -> tuple[float, float] | None:
    """(rows, batches) executed so far, from dlcloud's Prometheus batch-size histogram."""
    try:
        text = httpx.get(metrics_url, timeout=5).text
    except httpx.HTTPError:
        return None
    total = re.search(r'^dlcloud_serving_batch_size_sum\{model="mlp".*\} (\S+)$', text, re.MULTILINE)
    count = re.search(r'^dlcloud_serving_batch_size_count\{model="mlp".*\} (\S+)$', text, re.MULTILINE)
    if total is None or count is None:
        return None
    return float(total.group(1)), float(count.group(1))


# -- the servers -----------------------------------------------------------------------------------


class Server(Process):
    """A server subprocess in its own process group (so its CPU use and its children can be found)."""

    def __init__(self, root: Path, name: str, argv: list[str], ready_path: str, env: dict[str, str]) -> None:
        super().__init__(root, name)
        self.argv = [a.replace("{port}", str(self.port)) for a in argv]
        self.ready_path = ready_path
        self.extra_env = env

    def start(self) -> None:
        saved = {k: os.environ.get(k) for k in self.extra_env}
        os.environ.update(self.extra_env)
        try:
            self._spawn(self.argv, self.ready_path, timeout=120)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


class RayServe:
    """``bench/ray_serve_mlp.py`` in the Ray virtualenv, driven over stdin."""

    def __init__(self, root: Path, python: Path, model: Path, threads: int, mode: str) -> None:
        self.port = free_port()
        self.mode = mode
        self.env = RAY_MODES[mode]
        self.log_path = root / "ray.log"
        self.argv = [str(python), str(RAY_SCRIPT), "--model", str(model), "--port", str(self.port)]
        self.argv += ["--route", ROUTE, "--threads", str(threads)]
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{ROUTE}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DLCLOUD_", "OMP_", "VIRTUAL_ENV"))}
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        env.update(self.env)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )

    def deploy(self, wait: float, body: bytes, timeout: float = 240.0) -> None:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"deploy {wait!r}\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise RuntimeError(f"Ray Serve did not deploy (see {self.log_path}):\n{self.log_tail()}")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith("deployed"):
                    break
        while time.monotonic() < deadline:  # serve.run returned; wait until the route answers
            with contextlib.suppress(httpx.HTTPError):
                if httpx.post(self.url, content=body, timeout=5).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"Ray Serve does not answer on {self.url}:\n{self.log_tail()}")

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
        return ""

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        tree = process_tree(proc.pid)  # Ray's own processes are not all in our process group
        with contextlib.suppress(OSError, ValueError):
            assert proc.stdin is not None
            proc.stdin.write("quit\n")
            proc.stdin.close()
        try:
            proc.wait(timeout=60)  # serve.shutdown() + ray.shutdown() stop the cluster this process started
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # what that cluster left running (same pid and start time as before: not a reused pid) goes too
        for pid, started in tree.items():
            fields = proc_stat(pid)
            if fields is not None and fields[19] == started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


def ensure_ray_venv(venv: Path) -> Path:
    """The Ray virtualenv's python, creating the venv on first use (same steps as ``make bench-deps``)."""
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if marker.exists() and python.exists():
        return python
    print(f"creating {venv} for Ray Serve (one-off; pip install {' '.join(RAY_PINS)}) ...", file=sys.stderr)
    base = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
    if not python.exists():
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # the CPU build first, so nothing pulls CUDA packages
    subprocess.run([*pip, *RAY_PINS], check=True)
    marker.touch()
    return python


# -- the report ------------------------------------------------------------------------------------


def fmt_ms(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def print_table(title: str, results: list[Result], ceiling_row: tuple[str, float] | None = None) -> None:
    print(title)
    header = f"{'':<58}{'rows/s':>9}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
    header += f"{'errors':>8}{'cores':>7}{'cpu/req':>9}{'batch':>7}"
    print(header)
    print("-" * len(header))
    if ceiling_row is not None:
        print(f"{ceiling_row[0]:<58}{ceiling_row[1]:>9.0f}{'-':>9}{'-':>9}{'-':>9}{'-':>8}{'-':>7}{'-':>9}{'-':>7}")
    for r in results:
        cpu = f"{r.server_cpu:.2f}" if r.server_cpu is not None else "-"
        per_request = f"{r.server_cpu / r.rps * 1e6:.0f} us" if r.server_cpu is not None else "-"
        batch = f"{r.batch_rows:.1f}" if r.batch_rows is not None else "-"
        print(
            f"{r.label:<58}{r.rows_s:>9.0f}{r.rps:>9.0f}{fmt_ms(r.p50_ms):>9}{fmt_ms(r.p99_ms):>9}"
            f"{r.errors:>8}{cpu:>7}{per_request:>9}{batch:>7}"
        )


def median_result(results: list[Result]) -> Result:
    """Medians of requests/s, p50 and p99 over several runs of one configuration."""
    first = results[0]
    return Result(
        label=first.label,
        rows_per_request=first.rows_per_request,
        requests=round(statistics.median(r.rps for r in results)),
        seconds=1.0,
        p50_ms=statistics.median(r.p50_ms for r in results),
        p99_ms=statistics.median(r.p99_ms for r in results),
        errors=sum(r.errors for r in results),
    )


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


@contextlib.contextmanager
def workdir(keep: bool) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="dlcloud-bench-serving-"))
    try:
        yield root
    finally:
        if keep:
            print(f"work dir kept (server logs, model, bodies): {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per measurement (default 20)")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of unmeasured load before each (default 3)")
    ap.add_argument("--quick", action="store_true", help="5 s per measurement, 1 s warm-up: a smoke run")
    ap.add_argument("--connections", type=int, default=64, help="concurrent closed-loop clients (default 64)")
    ap.add_argument("--wrk-threads", type=int, default=2, help="wrk threads at --connections (default 2)")
    ap.add_argument("--max-batch-size", type=int, default=64, help="dlcloud --max-batch-size (default 64)")
    ap.add_argument("--max-queue-delay", default="0", help="dlcloud --max-queue-delay (default 0: eager)")
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads of the dlcloud server and the Ray replica (default 1: the other core is "
        "left to HTTP; the ceiling always uses every core)",
    )
    ap.add_argument("--ray-waits", default="0,0.002,0.01", help="Ray batch_wait_timeout_s values to try")
    ap.add_argument(
        "--ray-modes", default=",".join(RAY_MODES), help=f"Ray Serve ingress modes to try: {', '.join(RAY_MODES)}"
    )
    ap.add_argument("--ray-venv", type=Path, default=ROOT / ".venv-bench-ray", help="Ray Serve's virtualenv")
    ap.add_argument("--skip-ray", action="store_true", help="leave Ray Serve out")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="head-to-head: dlcloud and the best Ray configuration measured in turns, --duration/2 each (default 3)",
    )
    ap.add_argument("--skip-extras", action="store_true", help="leave out the binary and 8-row lines")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (server logs)")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.warmup = 5.0, 1.0
    wrk_path()
    ray_waits = [float(w) for w in args.ray_waits.split(",") if w.strip()]
    ray_modes = [m.strip() for m in args.ray_modes.split(",") if m.strip()]
    if unknown := [m for m in ray_modes if m not in RAY_MODES]:
        ap.error(f"unknown --ray-modes {', '.join(unknown)}; known: {', '.join(RAY_MODES)}")
    ray_python = None if args.skip_ray else ensure_ray_venv(args.ray_venv)
    cores = os.cpu_count() or 1
    load_before = load_average()

    with workdir(args.keep) as root:
        model_path = write_model(root / "model")
        bodies = make_bodies(root / "bodies")
        lua = root / "post.lua"
        lua.write_text(WRK_LUA)
        x1 = body_input(bodies["json1"])

        # -- in-process first: nothing else runs --------------------------------------------------
        print("in-process ceiling ...", file=sys.stderr, flush=True)
        rates = {t: ceiling(model_path, min(3.0, args.duration / 4), t) for t in sorted({1, cores})}
        single = in_process_latency(model_path, x1, min(5.0, args.duration / 2), args.torch_threads)

        c64: list[Result] = []
        extras: list[Result] = []
        c1: list[Result] = []
        ray_results: list[tuple[str, float, Result]] = []  # (mode, wait, result)
        ray_c1: list[Result] = []
        env = {"OMP_NUM_THREADS": str(args.torch_threads)}

        # -- dlcloud: up to the end, for the head-to-head with Ray ---------------------------------------
        dl_argv = [str(Path(sys.executable).parent / "dlcloud"), "serve", "-m", f"{MODEL}={model_path}"]
        dl_argv += ["--port", "{port}", "--max-batch-size", str(args.max_batch_size)]
        dl_argv += ["--max-queue-delay", args.max_queue_delay, "--no-access-log", "--log-level", "warning"]
        conc = (args.connections, args.wrk_threads)  # wrk -c, -t
        one = (1, 1)
        json1 = bodies["json1"]
        head_to_head: list[tuple[Result, Result]] = []
        with contextlib.ExitStack() as stack:
            dl = Server(root, "dlcloud", dl_argv, "/v2/health/ready", env)
            stack.callback(dl.stop)
            dl.start()
            url = dl.endpoint + ROUTE
            check(url, bodies, model_path, "dlcloud")
            metrics = dl.endpoint + "/metrics"
            print(f"dlcloud at concurrency {args.connections} ...", file=sys.stderr)
            c64.append(measure(f"dlcloud, {json1.label}", url, json1, lua, args, conc, dl.pid, metrics))
            if not args.skip_extras:
                for key in ("bin1", "json8"):
                    extras.append(
                        measure(f"dlcloud, {bodies[key].label}", url, bodies[key], lua, args, conc, dl.pid, metrics)
                    )
            print("dlcloud at concurrency 1 ...", file=sys.stderr)
            c1.append(measure(f"dlcloud, {json1.label}", url, json1, lua, args, one, dl.pid, metrics))
            if not args.skip_extras:
                c1.append(
                    measure(f"dlcloud, {bodies['bin1'].label}", url, bodies["bin1"], lua, args, one, dl.pid, metrics)
                )

            # -- the HTTP floor ---------------------------------------------------------------------
            echo = Server(root, "echo", [sys.executable, "-c", ECHO_SERVER, "{port}"], "/", {})
            try:
                echo.start()
                label = "HTTP floor: bare uvicorn app, no model, fixed answer"
                floor64 = measure(label, echo.endpoint + ROUTE, json1, lua, args, conc, pid=echo.pid)
                floor = measure(label, echo.endpoint + ROUTE, json1, lua, args, one, pid=echo.pid)
            finally:
                echo.stop()

            # -- Ray Serve: each mode a fresh cluster, each wait a user_config update of the deployment ----
            ray: RayServe | None = None
            for mode in ray_modes if ray_python is not None else []:
                assert ray_python is not None
                if ray is not None:
                    ray.stop()
                ray = RayServe(root, ray_python, model_path, args.torch_threads, mode)
                stack.callback(ray.stop)
                print(f"starting Ray Serve ({mode}) ...", file=sys.stderr, flush=True)
                ray.start()
                for wait in ray_waits:
                    ray.deploy(wait, json1.path.read_bytes())
                    if wait == ray_waits[0]:
                        check(ray.url, {"json1": json1}, model_path, f"Ray Serve ({mode})")
                    label = f"Ray Serve {mode}, wait {wait:g} s"
                    ray_results.append((mode, wait, measure(label, ray.url, json1, lua, args, conc, pid=ray.pid)))
                wait = min(ray_waits)
                ray.deploy(wait, json1.path.read_bytes())
                ray_c1.append(
                    measure(f"Ray Serve {mode}, wait {wait:g} s", ray.url, json1, lua, args, one, pid=ray.pid)
                )

            # -- head-to-head: dlcloud and the best Ray configuration, in turns, so both see the same machine --
            if ray_results and args.rounds and ray_python is not None and ray is not None:
                mode, wait, best = max(ray_results, key=lambda mwr: mwr[2].rps)
                if mode != ray.mode:
                    ray.stop()
                    ray = RayServe(root, ray_python, model_path, args.torch_threads, mode)
                    stack.callback(ray.stop)
                    print(f"starting Ray Serve ({mode}) again ...", file=sys.stderr, flush=True)
                    ray.start()
                ray.deploy(wait, json1.path.read_bytes())
                turn = argparse.Namespace(**{**vars(args), "duration": args.duration / 2, "warmup": 1.0})
                print(f"head-to-head, {args.rounds} rounds ...", file=sys.stderr, flush=True)
                for _ in range(args.rounds):
                    ours = measure(f"dlcloud, {json1.label}", url, json1, lua, turn, conc, dl.pid, metrics)
                    theirs = measure(best.label, ray.url, json1, lua, turn, conc, pid=ray.pid)
                    head_to_head.append((ours, theirs))

    load_after = load_average()
    report(
        args, rates, single, c64, extras, ray_results, head_to_head, c1, floor64, floor, ray_c1, load_before, load_after
    )


def check(url: str, bodies: dict[str, Body], model_path: Path, name: str) -> None:
    """The server answers what the model computes in-process, for every body."""
    for key, body in bodies.items():
        headers = {"Content-Type": body.content_type}
        if body.header_length is not None:
            headers["Inference-Header-Content-Length"] = str(body.header_length)
        response = httpx.post(url, content=body.path.read_bytes(), headers=headers, timeout=30)
        if response.status_code != 200:
            raise RuntimeError(f"{name} answered {response.status_code} to the {key} body: {response.text[:500]}")
        got = decode_response(response.content, response.headers)
        want = reference(model_path, body_input(body))
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-5):
            raise RuntimeError(f"{name} answered other numbers than the model in-process ({key}):\n{got}\n{want}")
    print(f"  {name} answers the in-process numbers ({', '.join(bodies)})", file=sys.stderr)


def report(
    args: argparse.Namespace,
    rates: dict[int, dict[int, float]],
    single: list[float],
    c64: list[Result],
    extras: list[Result],
    ray_results: list[tuple[str, float, Result]],
    head_to_head: list[tuple[Result, Result]],
    c1: list[Result],
    floor64: Result,
    floor: Result,
    ray_c1: list[Result],
    load_before: str,
    load_after: str,
) -> None:
    cores = os.cpu_count() or 1
    best_threads, best_batch = max(((t, b) for t in rates for b in rates[t]), key=lambda tb: rates[tb[0]][tb[1]])
    best_rows = rates[best_threads][best_batch]
    dl = c64[0]
    print()
    print(f"machine: {machine()}")
    print(f"load average (1, 5, 15 min): {load_before} before, {load_after} after")
    print(
        f"model: TorchScript MLP {IN_FEATURES}->{HIDDEN}->{HIDDEN}->{OUT_FEATURES} (ReLU), float32, CPU; "
        f"torch threads: {args.torch_threads} in dlcloud and the Ray replica, 1 and {cores} for the ceiling"
    )
    print(
        f"dlcloud: --max-batch-size {args.max_batch_size} --max-queue-delay {args.max_queue_delay} "
        f"(eager when 0), --no-access-log, one process"
    )
    if ray_results:
        print(
            "Ray Serve 2.60.0: 1 replica (num_cpus=1), @serve.batch(max_batch_size=32), max_ongoing_requests=256, "
            "access log off; ingress 'default': Serve's HTTP proxy actor, 'high-throughput': "
            "RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1 (HAProxy, straight to the replica)"
        )
    print(
        f"load: wrk, closed loop, {args.duration:g} s per line after {args.warmup:g} s of warm-up; 'cores' and "
        "'cpu/req': CPU the server's processes used (all of Ray's), 'batch': dlcloud's mean rows per model call"
    )
    print()
    for threads, by_batch in rates.items():
        per_batch = ", ".join(f"{b}: {r:,.0f}" for b, r in by_batch.items())
        print(f"in-process rows/s by batch size, {threads} torch thread(s): {per_batch}")
    print()
    ray_best = max((r for _, _, r in ray_results), key=lambda r: r.rps, default=None)
    h2h = [r for pair in head_to_head for r in pair]  # dlcloud, Ray, dlcloud, Ray...
    rows64 = [dl] + [r for _, _, r in ray_results]
    print_table(
        f"concurrency {args.connections} (wrk -t {args.wrk_threads} -c {args.connections}), 1 row of "
        f"{IN_FEATURES} FP32 per request",
        rows64,
        (f"in-process ceiling ({best_batch} rows/batch, {best_threads} torch threads)", best_rows),
    )
    print_table("reference: what loopback HTTP alone allows (same load, same body)", [floor64])
    if extras:
        print_table("extra lines, same load (not part of the comparison)", extras)
    print()
    vs_ceiling = dl.rows_s / best_rows
    print(
        f"dlcloud / in-process ceiling: {vs_ceiling:.0%} of the rows/s "
        f"(target >= {TARGET_VS_CEILING:.0%}: {verdict(vs_ceiling >= TARGET_VS_CEILING)})"
    )
    if ray_best is not None:
        # the head-to-head rounds saw the same machine; the lines above were measured minutes apart
        ours, theirs = dl, ray_best
        where = "from the lines above, measured minutes apart"
        if head_to_head:
            print()
            print_table(
                f"head-to-head: dlcloud and the best Ray configuration in turns, {len(head_to_head)} rounds of "
                f"{args.duration / 2:g} s each (same load as above)",
                h2h,
            )
            ours, theirs = median_result(h2h[0::2]), median_result(h2h[1::2])
            where = f"medians of the {len(head_to_head)} head-to-head rounds"
        ratio = ours.rps / theirs.rps
        p99_ok = ours.p99_ms <= theirs.p99_ms
        print(
            f"dlcloud / Ray Serve (best: {ray_best.label.removeprefix('Ray Serve ')}; {where}): {ratio:.2f}x the "
            f"requests/s (target >= {TARGET_VS_RAY:g}x: {verdict(ratio >= TARGET_VS_RAY)}), p99 {ours.p99_ms:.1f} ms "
            f"vs {theirs.p99_ms:.1f} ms (target: no worse: {verdict(p99_ok)}), p50 {ours.p50_ms:.1f} vs "
            f"{theirs.p50_ms:.1f} ms"
        )
    print()
    s50, s99 = percentile(single, 50) * 1e3, percentile(single, 99) * 1e3
    print("concurrency 1 (wrk -t 1 -c 1), 1 row per request: latency")
    header = f"{'':<58}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>9}{'- in-process p50':>18}"
    print(header)
    print("-" * len(header))
    label = f"in-process module(x), 1 row, {args.torch_threads} torch thread(s)"
    print(f"{label:<58}{s50:>9.3f}{s99:>9.3f}{'-':>9}")
    for r in [floor, *c1, *ray_c1]:
        added = "" if r is floor else f"{r.p50_ms - s50:>18.3f}"
        print(f"{r.label:<58}{r.p50_ms:>9.3f}{r.p99_ms:>9.3f}{r.rps:>9.0f}{added}")
    added_ms = c1[0].p50_ms - s50
    print()
    print(
        f"added latency, dlcloud p50 - in-process p50: {added_ms:.3f} ms (target <= {TARGET_ADDED_MS:g} ms: "
        f"{verdict(added_ms <= TARGET_ADDED_MS)}); of which loopback HTTP + uvicorn alone (the floor): "
        f"{floor.p50_ms:.3f} ms, dlcloud's own: {added_ms - floor.p50_ms:.3f} ms"
    )
    bad = [r for r in [*c64, *extras, *c1, floor64, floor, *(r for _, _, r in ray_results), *h2h] if r.errors]
    if bad:
        print("WARNING: errors (non-2xx, timeouts, socket errors) in: " + ", ".join(r.label for r in bad))


if __name__ == "__main__":
    main()
