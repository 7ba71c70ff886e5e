"""The model server's lifecycle under load: batching, back-pressure, swaps, policies, warm-up, pipelines, drains.

Every test runs the real server (``create_serving_app`` under uvicorn in a background thread, on a free port)
and talks to it over HTTP: ``tritonclient.http`` for V2 where one client is natural, ``httpx.AsyncClient``
for many concurrent clients, plain ``httpx`` for TF Serving and the repository endpoints.

Most tests serve ``Probe``, a Python predictor written into each version directory: ``y = 2 * x + offset``
row by row (exact in float32 whatever the batch), ``version = offset`` per row so responses say which
version computed them. It appends one line per ``predict`` call to a log (rows, first value), and blocks
while a *gate* file exists: a test that closes the gate holds the first batch inside ``predict`` and decides
what queues behind it, so which requests share a batch, fill the queue or wait in it never depends on timing.
Nothing here sleeps for a fixed time: conditions are polled with generous timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dlcloud.serving.config import ConfigError, ServerConfig, build_config
from tests.integration.serving.conftest import run_serving_server
from tests.serving_models import make_sklearn_classifier, make_torchscript_mlp, make_xgboost_model

Arrays = dict[str, np.ndarray]

WAIT = 60.0  # the longest any polled condition may take
WIDTH = 4  # Probe's input width

# --- the Probe predictor ----------------------------------------------------------------------------------

PROBE = '''
import json
import time
from pathlib import Path

import numpy as np


class Probe:
    """y = 2 * x + offset per row; logs every predict call; blocks while the gate file exists."""

    def __init__(self, model_dir):
        self.model_dir = Path(model_dir)

    def load(self):
        settings = json.loads((self.model_dir / "probe.json").read_text())
        self.offset = np.float32(settings["offset"])
        self.gate = Path(settings["gate"]) if settings.get("gate") else None
        self.log = Path(settings["log"]) if settings.get("log") else None
        self.poison = settings.get("poison")
        self.fail_unload = settings.get("fail_unload", False)
        self.delay = settings.get("delay", 0)
        width = settings["width"]
        self.signature = {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, width]}],
            "outputs": [
                {"name": "y", "datatype": "FP32", "shape": [-1, width]},
                {"name": "version", "datatype": "FP32", "shape": [-1]},
            ],
        }

    def predict(self, batch):
        x = batch["x"]
        if self.log is not None:
            with self.log.open("a") as f:
                f.write(json.dumps({"rows": len(x), "first": float(x[0, 0])}) + "\\n")
        if self.poison is not None and (x == self.poison).any():
            raise ValueError(f"poisoned input {self.poison}")
        time.sleep(self.delay)
        deadline = time.monotonic() + 120  # a test that forgets to open its gate must not hang the server
        while self.gate is not None and self.gate.exists() and time.monotonic() < deadline:
            time.sleep(0.002)
        return {"y": x * np.float32(2) + self.offset, "version": np.full(len(x), self.offset, dtype=np.float32)}

    def unload(self):
        if self.fail_unload:
            raise RuntimeError("unload failed on purpose")
'''


def write_probe(
    directory: Path,
    offset: float,
    *,
    gate: Path | None = None,
    log: Path | None = None,
    poison: float | None = None,
    fail_unload: bool = False,
    delay: float = 0.0,
    warmup: list[dict[str, Any]] | None = None,
) -> Path:
    """A Probe version directory (``predictor.py`` + ``probe.json``, optionally ``warmup.json``)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "predictor.py").write_text(textwrap.dedent(PROBE))
    settings = {
        "offset": offset,
        "width": WIDTH,
        "gate": str(gate) if gate else None,
        "log": str(log) if log else None,
        "poison": poison,
        "fail_unload": fail_unload,
        "delay": delay,
    }
    (directory / "probe.json").write_text(json.dumps(settings))
    if warmup is not None:
        (directory / "warmup.json").write_text(json.dumps(warmup))
    return directory


def publish_version(model_dir: Path, version: int, build: Callable[[Path], object]) -> Path:
    """Build a version in a staging directory beside the model, then rename it into ``model_dir/<version>``.

    The rename is atomic, so the directory watcher never sees a half-written version; a staging name that is
    not a number is never taken for a version.
    """
    staging = model_dir / f".staging-{version}"
    build(staging)
    target = model_dir / str(version)
    os.rename(staging, target)
    return target


def probe_reference(x: np.ndarray, offset: float) -> Arrays:
    return {"y": x * np.float32(2) + np.float32(offset), "version": np.full(len(x), offset, dtype=np.float32)}


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@dataclass
class Gate:
    """While the file exists, Probe's ``predict`` blocks. Opened again when the test ends, whatever happens."""

    path: Path

    def close(self) -> None:
        self.path.touch()

    def open(self) -> None:
        self.path.unlink(missing_ok=True)


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Gate]:
    g = Gate(tmp_path / "gate")
    yield g
    g.open()


def rows(seed: int, n: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, WIDTH)).astype(np.float32)


# --- the server -------------------------------------------------------------------------------------------


def probe_model(name: str, path: Path, **options: Any) -> dict[str, Any]:
    """A ``models`` entry that serves the Probe predictor(s) under ``path``."""
    return {"name": name, "path": str(path), "format": "python", **options}


def server_config(tmp_path: Path, **data: Any) -> ServerConfig:
    data.setdefault("watch_interval", 0)
    return ServerConfig.model_validate({"access_log": False, "base_dir": str(tmp_path), **data})


async def until(condition: Callable[[], Awaitable[Any] | Any], timeout: float = WAIT, what: str = "a condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.02)


# --- wire helpers -----------------------------------------------------------------------------------------


def v2_body(x: np.ndarray, name: str = "x") -> dict[str, Any]:
    return {"inputs": [{"name": name, "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}


def v2_outputs(doc: dict[str, Any]) -> Arrays:
    """JSON V2 outputs as arrays (FP32 values round-trip exactly through JSON numbers)."""
    return {
        o["name"]: np.asarray(o["data"], dtype=np.float32 if o["datatype"] == "FP32" else None).reshape(o["shape"])
        for o in doc["outputs"]
    }


def metric_samples(text: str, name: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(name)
    ]


def metric(url: str, name: str, **labels: str) -> float:
    """One sample of the server's /metrics (0 when absent)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(v for n, ls, v in metric_samples(text, name) if n == name and labels.items() <= ls.items())


def batches_larger_than_one(url: str, model: str) -> float:
    """Batches of ``model`` with more than one row, from the ``dlcloud_serving_batch_size`` histogram."""
    text = httpx.get(url + "/metrics", timeout=10).text
    count = le_1 = 0.0
    for name, labels, value in metric_samples(text, "dlcloud_serving_batch_size"):
        if labels.get("model") != model:
            continue
        if name == "dlcloud_serving_batch_size_count":
            count += value
        elif name == "dlcloud_serving_batch_size_bucket" and labels["le"] == "1.0":
            le_1 += value
    return count - le_1


def queue_depth(url: str, model: str) -> float:
    return metric(url, "dlcloud_serving_queue_depth", model=model)


def infer_task(client: httpx.AsyncClient, model: str, seed: int) -> asyncio.Task[httpx.Response]:
    """``rows(seed)`` sent to ``model``'s V2 infer endpoint, in a task."""
    return asyncio.create_task(client.post(f"/v2/models/{model}/infer", json=v2_body(rows(seed))))


async def hold(client: httpx.AsyncClient, model: str, log: Path, seed: int = 1) -> asyncio.Task[httpx.Response]:
    """With the gate closed: send ``rows(seed)`` to ``model`` and wait until it is inside ``predict`` (and blocks)."""
    before = len(read_log(log))
    task = infer_task(client, model, seed)
    await until(lambda: len(read_log(log)) > before, what=f"a request to enter the predict of model {model}")
    return task


async def assert_probe_answers(tasks: list[asyncio.Task[httpx.Response]], seeds: list[int], offset: float) -> None:
    """Each task answered 200 with Probe's result for ``rows(seed)``."""
    for seed, task in zip(seeds, tasks, strict=True):
        response = await task
        assert response.status_code == 200, response.text
        np.testing.assert_array_equal(v2_outputs(response.json())["y"], probe_reference(rows(seed), offset)["y"])


def index(url: str, token: str | None = None) -> list[dict[str, str]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.post(url + "/v2/repository/index", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    rows: list[dict[str, str]] = response.json()
    return rows


def index_rows(url: str, model: str) -> dict[str, dict[str, str]]:
    return {row["version"]: row for row in index(url) if row["name"] == model and "version" in row}


# --- 1. batching under 64 concurrent clients ---------------------------------------------------------------

CLIENTS = 64
PER_CLIENT = 4


async def run_clients(
    url: str, model: str, make_input: Callable[[int, int], np.ndarray], input_name: str
) -> dict[tuple[int, int], tuple[np.ndarray, httpx.Response]]:
    """64 concurrent clients, each sending PER_CLIENT requests one after another."""
    results: dict[tuple[int, int], tuple[np.ndarray, httpx.Response]] = {}
    limits = httpx.Limits(max_connections=CLIENTS + 8, max_keepalive_connections=CLIENTS + 8)
    async with httpx.AsyncClient(base_url=url, timeout=WAIT, limits=limits) as client:

        async def one_client(c: int) -> None:
            for j in range(PER_CLIENT):
                x = make_input(c, j)
                results[c, j] = x, await client.post(f"/v2/models/{model}/infer", json=v2_body(x, input_name))

        await asyncio.gather(*(one_client(c) for c in range(CLIENTS)))
    return results


@pytest.mark.parametrize("delay", ["0", "5ms"])
async def test_64_concurrent_clients_are_batched_and_each_gets_its_own_rows(
    tmp_path: Path, gate: Gate, delay: str
) -> None:
    model_dir = write_probe(tmp_path / "probe", 0.5, gate=gate.path, log=tmp_path / "calls.log")
    config = server_config(
        tmp_path,
        models=[probe_model("probe", model_dir, batching={"max_batch_size": 32, "max_queue_delay": delay})],
    )

    def make_input(c: int, j: int) -> np.ndarray:
        x = rows(1000 * c + j, n=1 + (c + j) % 3)  # 1-3 rows: results are sliced back per request
        x[:, 0] = c * 100 + j  # distinct first values: a swapped row would show
        return x

    with run_serving_server(config) as server:
        gate.close()  # the first batch blocks inside predict; the other clients' requests queue behind it
        clients = asyncio.create_task(run_clients(server.url, "probe", make_input, "x"))
        await until(
            lambda: clients.done() or queue_depth(server.url, "probe") >= 32,
            what="32 requests queued behind the held batch",
        )
        gate.open()
        results = await clients
        assert batches_larger_than_one(server.url, "probe") > 0

    assert len(results) == CLIENTS * PER_CLIENT
    for (c, j), (x, response) in results.items():
        assert response.status_code == 200, (c, j, response.text)
        doc = response.json()
        assert doc["model_name"] == "probe" and doc["model_version"] == "1"
        got, expected = v2_outputs(doc), probe_reference(x, 0.5)  # the unbatched computation, in-process
        np.testing.assert_array_equal(got["y"], expected["y"])
        np.testing.assert_array_equal(got["version"], expected["version"])
    # the log shows the same: a batch of several requests' rows ran in one predict call
    logged = read_log(tmp_path / "calls.log")
    assert max(entry["rows"] for entry in logged) > 3


async def test_64_concurrent_clients_on_torchscript_match_the_module_row_by_row(tmp_path: Path) -> None:
    """TorchScript under 64 clients with a 5 ms queue delay: each response equals the module run on that
    request alone, within rtol 1e-6 / atol 1e-6 (a batched matmul may round differently from an unbatched one,
    so this is the one comparison that is not exact)."""
    built = make_torchscript_mlp(tmp_path / "mlp", signature=True)
    config = server_config(
        tmp_path,
        models=[
            {
                "name": "mlp",
                "path": str(built.path),
                "batching": {"max_batch_size": 32, "max_queue_delay": "5ms"},
            }
        ],
    )
    with run_serving_server(config) as server:
        results = await run_clients(
            server.url, "mlp", lambda c, j: rows(7000 * c + j, n=1 + (c + j) % 2)[:, :1].repeat(16, axis=1), "input"
        )
    for (c, j), (x, response) in results.items():
        assert response.status_code == 200, (c, j, response.text)
        got = v2_outputs(response.json())["output"]
        np.testing.assert_allclose(got, built.reference({"input": x})["output"], rtol=1e-6, atol=1e-6)


# --- 2. back-pressure and queue timeouts -------------------------------------------------------------------


async def test_full_queue_answers_429_with_retry_after_and_recovers(tmp_path: Path, gate: Gate) -> None:
    log = tmp_path / "calls.log"
    model_dir = write_probe(tmp_path / "probe", 1.0, gate=gate.path, log=log)
    config = server_config(tmp_path, models=[probe_model("probe", model_dir, batching={"max_queue_size": 2})])
    with run_serving_server(config) as server:
        gate.close()
        async with httpx.AsyncClient(base_url=server.url, timeout=WAIT) as client:
            held = await hold(client, "probe", log)
            queued = [infer_task(client, "probe", 2), infer_task(client, "probe", 3)]
            await until(lambda: queue_depth(server.url, "probe") == 2, what="two requests queued")
            refused = await client.post("/v2/models/probe/infer", json=v2_body(rows(4)))
            assert refused.status_code == 429
            assert int(refused.headers["Retry-After"]) >= 1
            assert "queue of model probe/1 is full" in refused.json()["error"]

            gate.open()
            await assert_probe_answers([held, *queued], [1, 2, 3], 1.0)
            recovered = await client.post("/v2/models/probe/infer", json=v2_body(rows(5)))
            assert recovered.status_code == 200, recovered.text
        assert metric(server.url, "dlcloud_serving_request_errors_total", model="probe", code="429") == 1


async def test_queued_bytes_are_bounded_429_and_a_request_too_large_for_the_queue_is_413(
    tmp_path: Path, gate: Gate
) -> None:
    log = tmp_path / "calls.log"
    model_dir = write_probe(tmp_path / "probe", 1.0, gate=gate.path, log=log)
    batching = {"max_queue_bytes": "1Ki", "max_queue_size": 100}  # 64 rows of 4 FP32 values
    config = server_config(tmp_path, models=[probe_model("probe", model_dir, batching=batching)])
    with run_serving_server(config) as server:
        gate.close()
        async with httpx.AsyncClient(base_url=server.url, timeout=WAIT) as client:
            held = await hold(client, "probe", log)
            queued = asyncio.create_task(client.post("/v2/models/probe/infer", json=v2_body(rows(2, n=40))))
            await until(lambda: queue_depth(server.url, "probe") == 1, what="a request queued")
            refused = await client.post("/v2/models/probe/infer", json=v2_body(rows(3, n=40)))  # 640 + 640 bytes
            assert refused.status_code == 429, refused.text
            assert int(refused.headers["Retry-After"]) >= 1
            assert "holding 640 bytes waiting, at most 1024 bytes" in refused.json()["error"]
            too_large = await client.post("/v2/models/probe/infer", json=v2_body(rows(4, n=65)))
            assert too_large.status_code == 413, too_large.text
            assert "takes at most 1024 bytes" in too_large.json()["error"]

            gate.open()
            await assert_probe_answers([held], [1], 1.0)
            answered = await queued
            assert answered.status_code == 200, answered.text
            np.testing.assert_array_equal(v2_outputs(answered.json())["y"], probe_reference(rows(2, n=40), 1.0)["y"])
            recovered = await client.post("/v2/models/probe/infer", json=v2_body(rows(5, n=40)))
            assert recovered.status_code == 200, recovered.text
        assert not any(e["first"] in (rows(3)[0, 0], rows(4)[0, 0]) for e in read_log(log))
        assert metric(server.url, "dlcloud_serving_request_errors_total", model="probe", code="429") == 1


async def test_request_that_waits_longer_than_the_timeout_gets_504(tmp_path: Path, gate: Gate) -> None:
    log = tmp_path / "calls.log"
    model_dir = write_probe(tmp_path / "probe", 1.0, gate=gate.path, log=log)
    # 2 s: the request after the gate opens must not reach it on a loaded machine (300 ms could); the late one waits
    config = server_config(tmp_path, models=[probe_model("probe", model_dir, batching={"timeout": "2s"})])
    with run_serving_server(config) as server:
        warmed = len(read_log(log))
        gate.close()
        async with httpx.AsyncClient(base_url=server.url, timeout=WAIT) as client:
            held = await hold(client, "probe", log)
            late = await client.post("/v2/models/probe/infer", json=v2_body(rows(2)))
            assert late.status_code == 504
            assert late.json()["error"] == "request waited more than 2 s in the queue of model probe/1"
            gate.open()
            assert (await held).status_code == 200  # a started request runs to completion
            assert (await client.post("/v2/models/probe/infer", json=v2_body(rows(3)))).status_code == 200
    # the timed-out request never reached the model
    assert [entry["first"] for entry in read_log(log)[warmed:]] == [rows(1)[0, 0], rows(3)[0, 0]]


# --- 3. swapping versions under load ----------------------------------------------------------------------


@dataclass
class Outcome:
    x: np.ndarray
    status: int
    version: str | None = None
    outputs: Arrays = field(default_factory=dict)
    error: str | None = None


class Load:
    """``clients`` tasks sending V2 requests in a loop (1-3 random rows each) until ``stop()``."""

    def __init__(self, url: str, model: str, clients: int = 16) -> None:
        self.url = url
        self.model = model
        self.outcomes: list[list[Outcome]] = [[] for _ in range(clients)]
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._client = httpx.AsyncClient(base_url=url, timeout=WAIT)

    @property
    def total(self) -> int:
        return sum(len(o) for o in self.outcomes)

    def all(self) -> list[Outcome]:
        return [o for per_client in self.outcomes for o in per_client]

    def saw_version(self, version: str) -> bool:
        return any(o.version == version for per_client in self.outcomes for o in per_client[-3:])

    async def _loop(self, c: int) -> None:
        rng = np.random.default_rng(c)
        while not self._stop.is_set():
            x = rng.standard_normal((int(rng.integers(1, 4)), WIDTH)).astype(np.float32)
            try:
                response = await self._client.post(f"/v2/models/{self.model}/infer", json=v2_body(x))
            except httpx.HTTPError as exc:
                self.outcomes[c].append(Outcome(x, 0, error=f"{type(exc).__name__}: {exc}"))
                continue
            if response.status_code != 200:
                self.outcomes[c].append(Outcome(x, response.status_code, error=response.text))
                continue
            doc = response.json()
            self.outcomes[c].append(Outcome(x, 200, doc["model_version"], v2_outputs(doc)))

    async def more(self, n: int) -> None:
        """Wait until at least ``n`` more requests are answered."""
        target = self.total + n
        await until(lambda: self.total >= target, what=f"{n} more answered requests")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Load]:
        self._tasks = [asyncio.create_task(self._loop(c)) for c in range(len(self.outcomes))]
        try:
            yield self
        finally:
            self._stop.set()
            await asyncio.gather(*self._tasks)
            await self._client.aclose()

    def check(self, versions: set[str]) -> None:
        """Zero failures; every response is its own request's result from the version it names; each client
        sees versions only ever increase (once a newer version serves, the default never goes back)."""
        failures = [(o.status, o.error) for o in self.all() if o.status != 200]
        assert failures == [], f"{len(failures)} of {self.total} requests failed, e.g. {failures[:3]}"
        for o in self.all():
            assert o.version is not None
            expected = probe_reference(o.x, float(o.version))
            np.testing.assert_array_equal(o.outputs["y"], expected["y"])
            np.testing.assert_array_equal(o.outputs["version"], expected["version"])
        for per_client in self.outcomes:
            seen = [int(o.version or 0) for o in per_client]
            assert seen == sorted(seen)
        assert {o.version for o in self.all()} == versions


def v1_is_gone(url: str) -> bool:
    ready = httpx.get(url + "/v2/models/m/versions/1/ready", timeout=10)
    return ready.status_code == 404 and "1" not in index_rows(url, "m")


async def test_new_version_is_swapped_in_under_load_without_a_failed_request(tmp_path: Path) -> None:
    models = tmp_path / "m"
    write_probe(models / "1", 1.0, delay=0.005)  # batches take a while: requests are always queued
    config = server_config(tmp_path, watch_interval=0.2, models=[probe_model("m", models, versions="latest")])
    with run_serving_server(config) as server:
        async with Load(server.url, "m").running() as load:
            await load.more(100)
            publish_version(models, 2, lambda d: write_probe(d, 2.0))
            await until(lambda: load.saw_version("2"), what="responses from version 2")
            await until(lambda: v1_is_gone(server.url), what="version 1 to be unloaded")
            await load.more(100)

            # a version that cannot load leaves version 2 serving
            publish_version(models, 3, lambda d: write_probe(d, 3.0).joinpath("predictor.py").write_text("def (:\n"))
            await until(
                lambda: index_rows(server.url, "m").get("3", {}).get("state") == "FAILED", what="version 3 FAILED"
            )
            await load.more(100)
            # the clients share one connection pool: one of them may have been served little of those 100 (a loaded
            # machine); its own last answers must come from version 2 too (still from version 1: this times out)
            await until(
                lambda: [o.version for o in load.outcomes[0][-3:]] == ["2", "2", "2"], what="client 0 on version 2"
            )
            rows_ = index_rows(server.url, "m")
        assert rows_["2"]["state"] == "AVAILABLE"
        assert "SyntaxError" in rows_["3"]["reason"]
        assert httpx.get(server.url + "/v2/models/m/ready", timeout=10).status_code == 200
        assert httpx.get(server.url + "/v2/models/m/versions/3/ready", timeout=10).status_code == 503
        assert metric(server.url, "dlcloud_serving_model_events_total", model="m", version="1", event="swap") == 1
    load.check({"1", "2"})
    assert [o.version for o in load.outcomes[0][-3:]] == ["2", "2", "2"]


async def test_explicit_load_swaps_in_a_new_version_under_load(tmp_path: Path) -> None:
    models = tmp_path / "m"
    write_probe(models / "1", 1.0, delay=0.005)
    config = server_config(tmp_path, models=[probe_model("m", models)])
    with run_serving_server(config) as server:
        async with Load(server.url, "m").running() as load:
            await load.more(100)
            publish_version(models, 2, lambda d: write_probe(d, 2.0))
            await load.more(50)
            assert not load.saw_version("2")  # watching is off: nothing changes by itself
            async with httpx.AsyncClient(base_url=server.url, timeout=WAIT) as admin:
                response = await admin.post("/v2/repository/models/m/load")
            assert response.status_code == 200, response.text
            assert v1_is_gone(server.url)  # the load call returns once the swap is done
            await load.more(100)
            assert load.saw_version("2")
    load.check({"1", "2"})


async def test_explicit_load_of_a_broken_version_reports_it_and_keeps_serving(tmp_path: Path) -> None:
    models = tmp_path / "m"
    write_probe(models / "1", 1.0)
    config = server_config(tmp_path, models=[probe_model("m", models)])
    with run_serving_server(config) as server:
        async with Load(server.url, "m").running() as load:
            await load.more(50)
            publish_version(models, 2, lambda d: write_probe(d, 2.0).joinpath("probe.json").write_text("{"))
            async with httpx.AsyncClient(base_url=server.url, timeout=WAIT) as admin:
                response = await admin.post("/v2/repository/models/m/load")
                assert response.status_code == 503, response.text
                assert "version 2 of model 'm' failed to load" in response.json()["error"]
                response = await admin.post("/v2/repository/models/m/versions/2/load")
                assert response.status_code == 503, response.text
                assert "JSONDecodeError" in response.json()["error"]
                # reloading the serving version from files that no longer load: reported, the old one serves on
                (models / "1" / "probe.json").write_text("{")
                response = await admin.post("/v2/repository/models/m/versions/1/load")
                assert response.status_code == 503, response.text
                assert "version 1 of model 'm' failed to load: JSONDecodeError" in response.json()["error"]
            await load.more(50)
        rows_ = index_rows(server.url, "m")
        assert (rows_["1"]["state"], rows_["2"]["state"]) == ("AVAILABLE", "FAILED")
    load.check({"1"})


async def test_watching_goes_on_when_unloading_an_old_version_fails(tmp_path: Path) -> None:
    """A predictor whose ``unload()`` raises is still taken out of service, and the watcher keeps working."""
    models = tmp_path / "m"
    write_probe(models / "1", 1.0, fail_unload=True)
    config = server_config(tmp_path, watch_interval=0.2, models=[probe_model("m", models)])
    with run_serving_server(config) as server:
        async with Load(server.url, "m", clients=4).running() as load:
            await load.more(20)
            publish_version(models, 2, lambda d: write_probe(d, 2.0, fail_unload=True))
            await until(lambda: v1_is_gone(server.url), what="version 1 to be unloaded")
            publish_version(models, 3, lambda d: write_probe(d, 3.0))
            await until(lambda: load.saw_version("3"), what="responses from version 3")
            await until(lambda: "2" not in index_rows(server.url, "m"), what="version 2 to be unloaded")
            await load.more(20)
    load.check({"1", "2", "3"})


# --- 4. version policies and labels -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "served", "default"),
    [("latest:2", [2, 3], 3), ([1], [1], 1), ("all", [1, 2, 3], 3), ("latest", [3], 3)],
    ids=["latest-2", "specific-1", "all", "latest"],
)
def test_version_policy_decides_which_versions_serve(
    tmp_path: Path, policy: Any, served: list[int], default: int
) -> None:
    import tritonclient.http as triton

    models = tmp_path / "m"
    for v in (1, 2, 3):
        write_probe(models / str(v), float(v))
    config = server_config(tmp_path, models=[probe_model("m", models, versions=policy)])
    x = rows(11, n=2)
    with run_serving_server(config) as server:
        client = triton.InferenceServerClient(server.hostport)
        try:
            inp = triton.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=True)

            result = client.infer("m", [inp])
            assert result.get_response()["model_version"] == str(default)
            np.testing.assert_array_equal(result.as_numpy("y"), probe_reference(x, default)["y"])
            for v in (1, 2, 3):
                if v in served:
                    result = client.infer("m", [inp], model_version=str(v))
                    np.testing.assert_array_equal(result.as_numpy("version"), np.full(2, v, dtype=np.float32))
                    assert client.is_model_ready("m", str(v))
                else:
                    with pytest.raises(triton.InferenceServerException, match=f"has no version {v}"):
                        client.infer("m", [inp], model_version=str(v))
            metadata = client.get_model_metadata("m")
            assert metadata["versions"] == [str(v) for v in served]
        finally:
            client.close()
        assert sorted(int(v) for v in index_rows(server.url, "m")) == served


def test_labels_route_tf_serving_requests(tmp_path: Path) -> None:
    models = tmp_path / "m"
    for v in (1, 2, 3):
        write_probe(models / str(v), float(v))
    config = server_config(
        tmp_path, models=[probe_model("m", models, versions="latest:2", labels={"stable": 2, "canary": 3})]
    )
    x = rows(12, n=3)
    with run_serving_server(config) as server:

        def predict(path: str) -> httpx.Response:
            return httpx.post(server.url + path, json={"inputs": {"x": x.tolist()}}, timeout=30)

        for path, version in [
            ("/v1/models/m/labels/stable:predict", 2),
            ("/v1/models/m/labels/canary:predict", 3),
            ("/v1/models/m/versions/2:predict", 2),
            ("/v1/models/m:predict", 3),
        ]:
            response = predict(path)
            assert response.status_code == 200, (path, response.text)
            outputs = response.json()["outputs"]
            np.testing.assert_array_equal(np.asarray(outputs["y"], dtype=np.float32), probe_reference(x, version)["y"])
            assert outputs["version"] == [version] * 3
        missing = predict("/v1/models/m/labels/nightly:predict")
        assert missing.status_code == 404
        assert missing.json()["error"] == "model 'm' has no label 'nightly'; its labels are: canary, stable"
        status = httpx.get(server.url + "/v1/models/m/labels/stable", timeout=30).json()
        assert [(s["version"], s["state"]) for s in status["model_version_status"]] == [("2", "AVAILABLE")]


# --- 5. warm-up -------------------------------------------------------------------------------------------


def warmup_requests(*firsts: float) -> list[dict[str, Any]]:
    return [v2_body(np.full((1, WIDTH), first, dtype=np.float32)) for first in firsts]


async def test_warmup_requests_run_before_a_new_version_takes_traffic(tmp_path: Path) -> None:
    models = tmp_path / "m"
    write_probe(models / "1", 1.0)
    config = server_config(tmp_path, watch_interval=0.2, models=[probe_model("m", models)])
    log2 = tmp_path / "v2.log"
    with run_serving_server(config) as server:
        async with Load(server.url, "m", clients=4).running() as load:
            await load.more(20)
            # requests hit the server all the time, so the first one routed to version 2 follows at once
            publish_version(models, 2, lambda d: write_probe(d, 2.0, log=log2, warmup=warmup_requests(101, 102, 103)))
            await until(lambda: load.saw_version("2"), what="responses from version 2")
            await load.more(20)
    load.check({"1", "2"})
    logged = [entry["first"] for entry in read_log(log2)]
    assert logged[:3] == [101.0, 102.0, 103.0]  # the recorded requests, in order, before any client request
    assert len(logged) > 3 and all(first < 100 for first in logged[3:])


def test_a_failing_warmup_marks_the_version_failed(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    write_probe(good / "1", 1.0, log=tmp_path / "good.log", warmup=warmup_requests(5, 6))
    write_probe(bad / "1", 1.0, log=tmp_path / "bad.log", poison=-7.0, warmup=warmup_requests(1, -7, 2))
    config = server_config(tmp_path, models=[probe_model("good", good), probe_model("bad", bad)])
    with run_serving_server(config, wait_ready=False) as server:
        assert httpx.get(server.url + "/v2/health/ready", timeout=10).status_code == 503
        reason = index_rows(server.url, "bad")["1"]
        assert reason["state"] == "FAILED"
        assert "warm-up request 2 failed" in reason["reason"] and "poisoned input -7" in reason["reason"]
        response = httpx.post(server.url + "/v2/models/bad/infer", json=v2_body(rows(1)), timeout=30)
        assert response.status_code == 503
        assert "failed to load" in response.json()["error"]
        assert httpx.post(server.url + "/v2/models/good/infer", json=v2_body(rows(1)), timeout=30).status_code == 200
    assert [e["first"] for e in read_log(tmp_path / "bad.log")] == [1.0, -7.0]  # replay stopped at the failure
    assert [e["first"] for e in read_log(tmp_path / "good.log")][:2] == [5.0, 6.0]


# --- 6. pipelines -----------------------------------------------------------------------------------------

PIPELINE_CODE = """
import numpy as np


def scale(inputs):
    return {"input": np.asarray(inputs["features"], dtype=np.float64) * 0.5 + 1.0}


def fuse(outputs, inputs):
    p = (outputs["clf"]["probabilities"] + outputs["xgb"]["predictions"].astype(np.float64)) / 2
    return {"probabilities": p.astype(np.float32), "label": p.argmax(axis=1).astype(np.int64)}
"""


def test_pipelines_preprocess_fan_out_and_combine(tmp_path: Path) -> None:
    import tritonclient.http as triton
    import xgboost as xgb

    clf = make_sklearn_classifier(tmp_path / "clf", "logistic", n_features=8)
    forest = make_sklearn_classifier(tmp_path / "forest", "forest", n_features=8)
    booster = make_xgboost_model(tmp_path / "xgb", n_features=8)
    (tmp_path / "steps.py").write_text(textwrap.dedent(PIPELINE_CODE))
    features = {"name": "features", "datatype": "FP64", "shape": [-1, 8]}
    probabilities = {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]}
    label = {"name": "label", "datatype": "INT64", "shape": [-1]}
    config = server_config(
        tmp_path,
        models=[
            {"name": "clf", "path": str(clf.path)},
            {"name": "forest", "path": str(forest.path)},
            {"name": "xgb", "path": str(booster.path)},
        ],
        pipelines=[
            {
                "name": "avg",
                "steps": ["clf", "forest"],
                "preprocess": "steps.py:scale",
                "combine": "mean:probabilities",
                "signature": {"inputs": [features], "outputs": [probabilities]},
            },
            {
                "name": "fusion",
                "steps": ["clf", "xgb"],
                "preprocess": "steps.py:scale",
                "combine": "steps.py:fuse",
                "signature": {"inputs": [features], "outputs": [probabilities, label]},
            },
        ],
    )
    x = np.random.default_rng(3).standard_normal((6, 8))
    prepared = x * 0.5 + 1.0
    p_clf = clf.extra.predict_proba(prepared)
    expected_avg = np.mean(np.stack([p_clf, forest.extra.predict_proba(prepared)]), axis=0).astype(np.float32)
    p_fused = (p_clf + booster.extra.predict(xgb.DMatrix(prepared.astype(np.float32))).astype(np.float64)) / 2
    expected_fusion = {"probabilities": p_fused.astype(np.float32), "label": p_fused.argmax(axis=1)}

    with run_serving_server(config) as server:
        client = triton.InferenceServerClient(server.hostport)
        try:
            inp = triton.InferInput("features", list(x.shape), "FP64")
            inp.set_data_from_numpy(x, binary_data=True)
            avg = client.infer("avg", [inp])
            np.testing.assert_allclose(avg.as_numpy("probabilities"), expected_avg, rtol=1e-6)
            fusion = client.infer("fusion", [inp])
            np.testing.assert_allclose(fusion.as_numpy("probabilities"), expected_fusion["probabilities"], rtol=1e-6)
            np.testing.assert_array_equal(fusion.as_numpy("label"), expected_fusion["label"])
            assert client.get_model_metadata("fusion")["platform"] == "pipeline"
        finally:
            client.close()

        for name, expected in [("avg", expected_avg), ("fusion", expected_fusion["probabilities"])]:
            response = httpx.post(
                f"{server.url}/v1/models/{name}:predict", json={"instances": [{"features": r} for r in x.tolist()]}
            )
            assert response.status_code == 200, response.text
            predictions = response.json()["predictions"]
            got = [p["probabilities"] if isinstance(p, dict) else p for p in predictions]
            np.testing.assert_allclose(np.asarray(got, dtype=np.float32), expected, rtol=1e-6)
        # every step went through its model's own batch queue: clf ran once per pipeline request
        assert metric(server.url, "dlcloud_serving_batch_size_count", model="clf") >= 4


async def test_pipeline_and_direct_requests_share_the_model_batch_queue(tmp_path: Path, gate: Gate) -> None:
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    write_probe(tmp_path / "a", 1.0, gate=gate.path, log=a_log)
    write_probe(tmp_path / "b", 2.0, gate=gate.path, log=b_log)
    config = server_config(
        tmp_path,
        models=[probe_model("a", tmp_path / "a"), probe_model("b", tmp_path / "b")],
        pipelines=[{"name": "both", "steps": ["a", "b"]}],  # combine: concat
    )
    with run_serving_server(config) as server:
        warmed = len(read_log(a_log))
        gate.close()
        async with httpx.AsyncClient(base_url=server.url, timeout=WAIT) as client:
            held = await hold(client, "a", a_log)
            piped = asyncio.create_task(client.post("/v2/models/both/infer", json=v2_body(rows(2, n=2))))
            await until(lambda: queue_depth(server.url, "a") == 1, what="the pipeline step")
            direct = infer_task(client, "a", 3)
            await until(lambda: queue_depth(server.url, "a") == 2, what="the direct request")
            gate.open()
            responses = [await held, await piped, await direct]
        assert [r.status_code for r in responses] == [200, 200, 200], [r.text for r in responses]
        outputs = v2_outputs(responses[1].json())
        np.testing.assert_array_equal(outputs["a.y"], probe_reference(rows(2, n=2), 1.0)["y"])
        np.testing.assert_array_equal(outputs["b.y"], probe_reference(rows(2, n=2), 2.0)["y"])
        np.testing.assert_array_equal(v2_outputs(responses[2].json())["y"], probe_reference(rows(3), 1.0)["y"])
    # model a ran the held request alone, then the pipeline's step and the direct request as one batch
    assert [(e["rows"], e["first"]) for e in read_log(a_log)[warmed:]] == [(1, rows(1)[0, 0]), (3, rows(2)[0, 0])]


# --- 7. the admin token -----------------------------------------------------------------------------------


TOKEN = "s3cret-admin-token-42"


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.8.9.10", "localhost", "LocalHost", "::1", "[::1]", "::ffff:127.0.0.1"]
)
def test_a_loopback_server_needs_no_admin_token(host: str) -> None:
    assert ServerConfig(host=host).admin_token is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "192.168.1.20", "fe80::1", "example.com", ""])
def test_listening_off_loopback_without_an_admin_token_is_refused(host: str) -> None:
    with pytest.raises(ConfigError, match=r"not a loopback address.*give --admin-token TOKEN"):
        build_config(overrides={"host": host})
    assert build_config(overrides={"host": host, "admin_token": TOKEN}).admin_token == TOKEN


@pytest.mark.parametrize("token", ["", "s3cret", "x" * 15, f" {TOKEN}"])
def test_a_weak_admin_token_is_refused(token: str) -> None:
    with pytest.raises(ConfigError, match="admin_token: .*at least 16 characters"):
        build_config(overrides={"admin_token": token})


def test_repository_endpoints_need_the_admin_token_inference_does_not(tmp_path: Path) -> None:
    write_probe(tmp_path / "m", 1.0)
    config = server_config(tmp_path, admin_token=TOKEN, models=[probe_model("m", tmp_path / "m")])
    with run_serving_server(config) as server:
        endpoints = [
            ("POST", "/v2/repository/index"),
            ("GET", "/v2/repository/index"),
            ("POST", "/v2/repository/models/m/load"),
            ("POST", "/v2/repository/models/m/versions/1/load"),
            ("POST", "/v2/repository/models/m/unload"),
        ]
        for method, path in endpoints:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                response = httpx.request(method, server.url + path, headers=headers, timeout=30)
                assert response.status_code == 401, (method, path, headers)
                assert "Bearer <admin token>" in response.json()["error"]
        assert httpx.get(server.url + "/v2/models/m/ready", timeout=10).status_code == 200  # nothing was unloaded

        assert httpx.post(server.url + "/v2/models/m/infer", json=v2_body(rows(1)), timeout=30).status_code == 200
        assert httpx.post(server.url + "/v1/models/m:predict", json={"instances": rows(1).tolist()}).status_code == 200
        assert [r["state"] for r in index(server.url, token=TOKEN)] == ["AVAILABLE"]
        for method, path in endpoints[2:]:
            response = httpx.request(
                method, server.url + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
            )
            assert response.status_code == 200, (method, path, response.text)
        assert httpx.post(server.url + "/v2/models/m/infer", json=v2_body(rows(1)), timeout=30).status_code == 503


# --- 8. unloading drains ----------------------------------------------------------------------------------


async def test_unload_lets_inflight_requests_finish_and_refuses_new_ones(tmp_path: Path, gate: Gate) -> None:
    log = tmp_path / "calls.log"
    write_probe(tmp_path / "m", 1.0, gate=gate.path, log=log)
    config = server_config(tmp_path, models=[probe_model("m", tmp_path / "m")])
    with run_serving_server(config) as server:
        gate.close()
        async with httpx.AsyncClient(base_url=server.url, timeout=WAIT) as client:
            held = await hold(client, "m", log)
            queued = [infer_task(client, "m", 2), infer_task(client, "m", 3)]
            await until(lambda: queue_depth(server.url, "m") == 2, what="two queued requests")
            unload = asyncio.create_task(client.post("/v2/repository/models/m/unload"))
            await until(
                lambda: httpx.get(server.url + "/v2/models/m/ready", timeout=10).status_code == 503,
                what="the model to leave routing",
            )
            during = await client.post("/v2/models/m/infer", json=v2_body(rows(4)))
            assert during.status_code == 503
            assert during.json()["error"].startswith("model 'm' has no version ready to serve")
            assert not unload.done()  # it waits for the held and queued requests
            assert index_rows(server.url, "m")["1"]["state"] == "UNLOADING"

            gate.open()
            await assert_probe_answers([held, *queued], [1, 2, 3], 1.0)
            assert (await unload).status_code == 200

            after = await client.post("/v2/models/m/infer", json=v2_body(rows(5)))
            assert after.status_code == 503
            assert after.json()["error"] == "model 'm' has no version ready to serve (it was unloaded)"
            assert index(server.url) == [{"name": "m", "state": "UNAVAILABLE", "reason": "it was unloaded"}]

            assert (await client.post("/v2/repository/models/m/load")).status_code == 200
            again = await client.post("/v2/models/m/infer", json=v2_body(rows(6)))
            assert again.status_code == 200, again.text
