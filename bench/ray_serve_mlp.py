"""Ray Serve side of ``bench/serving.py``: the same TorchScript MLP behind ``@serve.batch``.

Runs in its own virtualenv (``.venv-bench-ray``: ray[serve], torch, numpy; see ``make bench-deps``), never
in dlcloud's. It starts a local Ray cluster and Serve's HTTP proxy on ``--port``, deploys one replica that
accepts the same KServe V2 JSON body dlcloud does (``{"inputs": [{"name", "shape", "datatype", "data"}]}``)
on ``--route``, and answers a V2-shaped JSON response.

Driven over stdin by the benchmark, one command per line; each is answered with one line on stdout:

    deploy <batch_wait_timeout_s>   ->  deployed <batch_wait_timeout_s>   (serve.run; a changed wait is a
                                        user_config update: reconfigure() on the running replica, no restart)
    quit                            ->  (serve.shutdown(), ray.shutdown(), exit 0)

EOF on stdin or SIGTERM also shut everything down.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np
import ray
import torch
from ray import serve
from ray.serve.config import HTTPOptions
from ray.serve.schema import LoggingConfig
from starlette.requests import Request
from starlette.responses import Response

MAX_BATCH_SIZE = 32
MAX_ONGOING_REQUESTS = 256  # >= the benchmark's 64 connections: Ray's default (5) would starve @serve.batch
QUIET = LoggingConfig(enable_access_log=False, log_level="WARNING")


@serve.deployment(
    num_replicas=1,
    max_ongoing_requests=MAX_ONGOING_REQUESTS,
    ray_actor_options={"num_cpus": 1},
    logging_config=QUIET,
)
class MLP:
    def __init__(self, path: str, threads: int) -> None:
        torch.set_num_threads(threads)
        self.model = torch.jit.load(path)
        self.model.eval()

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.predict.set_batch_wait_timeout_s(float(config["batch_wait_timeout_s"]))

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=0.0)
    async def predict(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        x = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        with torch.inference_mode():
            y = self.model(torch.from_numpy(x)).numpy()
        out, start = [], 0
        for a in arrays:
            out.append(y[start : start + a.shape[0]])
            start += a.shape[0]
        return out

    async def __call__(self, request: Request) -> Response:
        doc = json.loads(await request.body())
        tensor = doc["inputs"][0]
        x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        y = await self.predict(x)
        out = {"name": "output", "datatype": "FP32", "shape": list(y.shape), "data": y.ravel().tolist()}
        body = json.dumps({"model_name": "mlp", "outputs": [out]}, separators=(",", ":"))
        return Response(body, media_type="application/json")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="TorchScript file")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--route", default="/v2/models/mlp/infer")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads in the replica")
    args = ap.parse_args()

    def stop(*_: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        serve.start(http_options=HTTPOptions(host="127.0.0.1", port=args.port), logging_config=QUIET)
        for line in sys.stdin:
            command = line.split()
            if not command:
                continue
            if command[0] == "quit":
                break
            if command[0] == "deploy":
                wait = float(command[1])
                app = MLP.options(user_config={"batch_wait_timeout_s": wait}).bind(args.model, args.threads)
                serve.run(app, route_prefix=args.route, name="mlp")
                print(f"deployed {wait:g}", flush=True)
            else:
                print(f"unknown command {line.strip()!r}", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
