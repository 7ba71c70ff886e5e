"""The served models and their versions. This module owns the version state machine.

Vocabulary: a *model* is a name clients address; a *version* is one loaded artifact of it. A version
moves LOADING -> AVAILABLE (loaded, warmed up, routable) -> UNLOADING (no new requests; draining) ->
gone, or LOADING -> FAILED. Only this module changes ``ModelVersion.state``.

Invariants:
- Routing picks the requested version, the version behind a label, or the highest AVAILABLE version;
  routing and enqueueing happen without an ``await`` in between, and a version leaves routing (state
  UNLOADING) before it is drained, so a swap never fails a request.
- A new version replaces old ones only once it is AVAILABLE; if it fails to load, the old ones keep serving.
- Model loading, warm-up and unloading run in worker threads; the event loop only routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import numpy as np

from dlcloud.serving.batching import BatchingConfig, DynamicBatcher
from dlcloud.serving.config import ModelSpec, ServerConfig
from dlcloud.serving.errors import BadRequest, NotFound, ServingError, Unavailable
from dlcloud.serving.loaders import artifact_for, check_inputs, detect_format, load_predictor
from dlcloud.serving.loaders.base import Arrays, Predictor
from dlcloud.serving.metrics import ServingMetrics
from dlcloud.serving.pipeline import Pipeline
from dlcloud.serving.protocol.v2 import decode_infer_request
from dlcloud.serving.types import V2_TO_NUMPY, Signature

log = logging.getLogger("dlcloud.serving")

WARMUP_FILE = "warmup.json"

Runner = Callable[[Arrays, float | None], Awaitable[Arrays]]


class VersionState(StrEnum):
    LOADING = "LOADING"
    AVAILABLE = "AVAILABLE"
    UNLOADING = "UNLOADING"
    FAILED = "FAILED"


@dataclass(eq=False)
class ModelVersion:
    model: str
    version: int
    platform: str
    path: Path | None = None
    state: VersionState = VersionState.LOADING
    signature: Signature | None = None
    max_batch_size: int = 0
    error: str | None = None
    predictor: Predictor | None = None
    batcher: DynamicBatcher | None = None
    runner: Runner | None = None
    inflight: int = 0
    loaded_at: float = field(default_factory=time.time)
    _drained: asyncio.Event | None = None

    @property
    def label(self) -> str:
        return str(self.version)

    @property
    def output_datatypes(self) -> dict[str, str] | None:
        if self.signature is None or not self.signature.outputs:
            return None
        return {o.name: o.datatype for o in self.signature.outputs}

    async def run(self, inputs: Arrays, timeout: float | None) -> Arrays:
        """Validate one request against the signature and run it (batched where configured)."""
        if self.signature is not None:
            inputs = check_inputs(self.signature, inputs)
        for name, array in inputs.items():
            if array.ndim and array.shape[0] == 0 and self.max_batch_size > 0:
                raise BadRequest(f"input '{name}' has no rows; send at least one row")
        assert self.runner is not None
        self.inflight += 1
        try:
            return await self.runner(inputs, timeout)
        finally:
            self.inflight -= 1
            if self.inflight == 0 and self._drained is not None:
                self._drained.set()

    async def drained(self) -> None:
        if self.inflight:
            self._drained = asyncio.Event()
            await self._drained.wait()

    def queue_depth(self) -> int:
        return self.batcher.queue_depth if self.batcher is not None else 0


class ServedModel:
    """A name clients address, its versions and labels. ``versions`` is replaced, never mutated, so
    readers on the event loop always see a consistent mapping."""

    def __init__(self, name: str, kind: str, spec: ModelSpec | None = None) -> None:
        self.name = name
        self.kind = kind
        self.spec = spec
        self.versions: dict[int, ModelVersion] = {}
        self.labels: dict[str, int] = dict(spec.labels) if spec is not None else {}
        self.enabled = True  # False after an explicit unload through the repository API
        self.lock = asyncio.Lock()  # one load/unload sequence at a time per model

    def put(self, mv: ModelVersion) -> None:
        self.versions = {**self.versions, mv.version: mv}

    def drop(self, version: int) -> None:
        self.versions = {v: mv for v, mv in self.versions.items() if v != version}

    def available(self) -> list[ModelVersion]:
        return [mv for v, mv in sorted(self.versions.items()) if mv.state is VersionState.AVAILABLE]

    def available_versions(self) -> list[int]:
        return [mv.version for mv in self.available()]

    def default_version(self) -> ModelVersion | None:
        live = self.available()
        return live[-1] if live else None

    def route(self, version: int | None = None, label: str | None = None) -> ModelVersion:
        if label is not None:
            if label not in self.labels:
                names = ", ".join(sorted(self.labels)) or "none"
                raise NotFound(f"model '{self.name}' has no label '{label}'; its labels are: {names}")
            version = self.labels[label]
        if version is None:
            mv = self.default_version()
            if mv is None:
                raise Unavailable(f"model '{self.name}' has no version ready to serve{self._why()}")
            return mv
        found = self.versions.get(version)
        if found is None:
            served = ", ".join(str(v) for v in sorted(self.versions)) or "none"
            raise NotFound(f"model '{self.name}' has no version {version}; versions served: {served}")
        if found.state is not VersionState.AVAILABLE:
            detail = f": {found.error}" if found.error else ""
            raise Unavailable(f"version {version} of model '{self.name}' is {found.state.value}{detail}")
        return found

    def _why(self) -> str:
        failed = [mv for mv in self.versions.values() if mv.state is VersionState.FAILED]
        if failed:
            return f" (version {failed[-1].version} failed to load: {failed[-1].error})"
        if not self.enabled:
            return " (it was unloaded)"
        return " (still loading)" if self.versions else ""

    def ready(self) -> bool:
        return self.default_version() is not None


def discover_versions(path: Path) -> dict[int, Path]:
    """A directory of numbered sub-directories is a versioned model; anything else is version 1."""
    if not path.exists():
        return {}
    if path.is_dir():
        numbered = {int(p.name): p for p in path.iterdir() if p.name.isdigit() and p.is_dir()}
        if numbered:
            return numbered
    return {1: path}


def resolve_artifact(path: Path, fmt: str | None) -> tuple[Path, str]:
    """The artifact to load from a version path, and its format."""
    fmt = fmt or detect_format(path)
    return artifact_for(path, fmt), fmt


def zeros_for(signature: Signature) -> Arrays | None:
    """A one-row input of zeros for an automatic warm-up, when every non-batch dimension is known."""
    arrays: Arrays = {}
    for spec in signature.inputs:
        dims = list(spec.shape)
        if spec.datatype not in V2_TO_NUMPY or spec.datatype == "BYTES" or not dims or any(d < 0 for d in dims[1:]):
            return None
        dims[0] = 1
        arrays[spec.name] = np.zeros(dims, dtype=V2_TO_NUMPY[spec.datatype])
    return arrays or None


def decode_warmup(path: Path, max_body_bytes: int) -> list[Arrays]:
    """A warm-up file: a JSON list of V2 infer requests (JSON tensors), replayed in order."""
    try:
        items = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot read warm-up file {path}: {exc}") from exc
    if not isinstance(items, list):
        raise RuntimeError(f"warm-up file {path} must hold a JSON list of V2 infer requests")
    requests = []
    for item in items:
        request = decode_infer_request(json.dumps(item).encode(), {}, max_body_bytes=max_body_bytes)
        requests.append({t.name: t.array for t in request.inputs})
    return requests


class ModelRepository:
    def __init__(self, config: ServerConfig, metrics: ServingMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.models: dict[str, ServedModel] = {}
        for spec in config.models:
            self.models[spec.name] = ServedModel(spec.name, "model", spec)
        self.pipelines: dict[str, Pipeline] = {}
        self._watch_task: asyncio.Task[None] | None = None
        self._seen: dict[str, dict[int, Path]] = {}
        metrics.watch_queues(self._queue_stats)

    # lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.gather(*(self.sync_model(name) for name in list(self.models)))
        for pspec in self.config.pipelines:
            pipeline = Pipeline(pspec, self, self.config.base_dir)
            served = ServedModel(pspec.name, "pipeline")
            mv = ModelVersion(model=pspec.name, version=1, platform="pipeline")
            try:
                await asyncio.to_thread(pipeline.load)
                mv.signature = pipeline.signature()
                mv.runner = pipeline.run
                mv.state = VersionState.AVAILABLE
                self.metrics.model_events.labels(pspec.name, "1", "load").inc()
            except Exception as exc:
                mv.state, mv.error = VersionState.FAILED, f"{type(exc).__name__}: {exc}"
                log.error("pipeline %s failed to load: %s", pspec.name, mv.error)
                self.metrics.model_events.labels(pspec.name, "1", "load_failed").inc()
            served.put(mv)
            self.pipelines[pspec.name] = pipeline
            self.models[pspec.name] = served
        if self.config.watch_interval > 0:
            self._watch_task = asyncio.create_task(self._watch(), name="dlcloud-serving-watch")

    async def stop(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
            self._watch_task = None
        for served in list(self.models.values()):
            for mv in list(served.versions.values()):
                await self._retire(served, mv, event=None)

    # queries -------------------------------------------------------------------------------------

    def get(self, name: str) -> ServedModel:
        served = self.models.get(name)
        if served is None:
            names = ", ".join(sorted(self.models)) or "none"
            raise NotFound(f"unknown model '{name}'; models served: {names}")
        return served

    def ready(self) -> bool:
        return all(m.ready() for m in self.models.values() if m.enabled)

    def signature_of(self, name: str) -> Signature | None:
        """The signature of model ``name``'s default version (a pipeline step's); None when it has none."""
        mv = self.get(name).default_version()
        return mv.signature if mv is not None else None

    async def infer(
        self, name: str, version: int | None, label: str | None, inputs: Arrays, timeout: float | None = None
    ) -> tuple[ModelVersion, Arrays]:
        mv = self.get(name).route(version, label)
        return mv, await mv.run(inputs, timeout)

    def index(self) -> list[dict[str, str]]:
        rows = []
        for name, served in sorted(self.models.items()):
            if not served.versions:
                rows.append({"name": name, "state": "UNAVAILABLE", "reason": served._why().strip(" ()")})
            for v, mv in sorted(served.versions.items()):
                rows.append({"name": name, "version": str(v), "state": mv.state.value, "reason": mv.error or ""})
        return rows

    def _queue_stats(self) -> Iterator[tuple[str, str, int, int]]:
        for name, served in self.models.items():
            for mv in served.versions.values():
                yield name, mv.label, mv.queue_depth(), mv.inflight

    # loading and swapping ------------------------------------------------------------------------

    async def sync_model(self, name: str, *, enable: bool = True) -> list[ModelVersion]:
        """Bring the loaded versions in line with the disk and the version policy.

        Returns the versions this call tried to load and that FAILED (the versions serving before keep
        serving). ``enable=False`` (the directory watcher) leaves a model that was explicitly unloaded alone,
        also when the unload happened while the watcher was waiting for the lock.
        """
        served = self.get(name)
        spec = served.spec
        if spec is None:
            raise BadRequest(f"'{name}' is a pipeline; it is loaded with its models")
        async with served.lock:
            if not enable and not served.enabled:
                return []
            served.enabled = True
            root = self.config.resolve(spec.path)
            on_disk = await asyncio.to_thread(discover_versions, root)
            self._seen[name] = on_disk
            wanted = spec.versions.select(list(on_disk))
            if not on_disk:
                log.error("model %s: %s does not exist", name, root)
            to_load = [
                v
                for v in wanted
                if v not in served.versions
                or served.versions[v].state is VersionState.FAILED
                or served.versions[v].path != on_disk[v]
            ]
            loaded = await asyncio.gather(*(self._load(served, v, on_disk[v]) for v in to_load))
            any_wanted_live = any(
                served.versions.get(v) is not None and served.versions[v].state is VersionState.AVAILABLE
                for v in wanted
            )
            for v, mv in list(served.versions.items()):
                if v in wanted:
                    continue
                # a version leaves only when a wanted one serves, or when its files are gone
                if any_wanted_live or v not in on_disk or mv.state is VersionState.FAILED:
                    await self._retire(served, mv, event="swap" if any_wanted_live else None)
            return [mv for mv in loaded if mv.state is VersionState.FAILED]

    async def load_version(self, name: str, version: int) -> None:
        served = self.get(name)
        if served.spec is None:
            raise BadRequest(f"'{name}' is a pipeline; it is loaded with its models")
        async with served.lock:
            on_disk = await asyncio.to_thread(discover_versions, self.config.resolve(served.spec.path))
            if version not in on_disk:
                found = ", ".join(str(v) for v in sorted(on_disk)) or "none"
                raise NotFound(f"model '{name}' has no version {version} on disk; versions found: {found}")
            served.enabled = True
            mv = await self._load(served, version, on_disk[version])
            if mv.state is VersionState.FAILED:
                serving = " (the version loaded before keeps serving)" if version in served.available_versions() else ""
                raise Unavailable(f"version {version} of model '{name}' failed to load: {mv.error}{serving}")

    async def unload_version(self, name: str, version: int) -> None:
        served = self.get(name)
        async with served.lock:
            mv = served.versions.get(version)
            if mv is None:
                raise NotFound(f"model '{name}' has no version {version} loaded")
            await self._retire(served, mv, event="unload")

    async def unload_model(self, name: str) -> None:
        served = self.get(name)
        if served.spec is None:
            raise BadRequest(f"'{name}' is a pipeline; it is unloaded with its models")
        async with served.lock:
            served.enabled = False
            for mv in list(served.versions.values()):
                await self._retire(served, mv, event="unload")

    async def _load(self, served: ServedModel, version: int, path: Path) -> ModelVersion:
        """Load, warm up and publish one version; returns it (AVAILABLE or FAILED with its error).

        When the version is already serving, the old one keeps serving until the new one is AVAILABLE; a
        new one that FAILED is returned but not published (the old one stays in ``served.versions``).
        """
        spec = served.spec
        assert spec is not None
        labels = (served.name, str(version))
        mv = ModelVersion(model=served.name, version=version, platform=spec.format or "", path=path)
        previous = served.versions.get(version)
        if previous is not None and previous.state is VersionState.AVAILABLE:
            # the same version number with new files: keep the old one serving until the new one is ready
            mv = ModelVersion(model=served.name, version=version, platform=previous.platform, path=path)
            await self._bring_up(served, mv, spec)
            if mv.state is VersionState.AVAILABLE:
                self._swap_in(served, mv)
                await self._retire(served, previous, event=None, keep_entry=True)
            return mv
        served.put(mv)
        await self._bring_up(served, mv, spec)
        if mv.state is VersionState.AVAILABLE:
            self.metrics.model_events.labels(*labels, "load").inc()
        return mv

    def _swap_in(self, served: ServedModel, mv: ModelVersion) -> None:
        served.put(mv)
        self.metrics.model_events.labels(served.name, mv.label, "swap").inc()

    async def _bring_up(self, served: ServedModel, mv: ModelVersion, spec: ModelSpec) -> None:
        started = time.perf_counter()
        try:
            artifact, fmt = await asyncio.to_thread(resolve_artifact, mv.path or Path(), spec.format)
            predictor = load_predictor(artifact, fmt, spec.declared_signature(), **spec.options)
            await asyncio.to_thread(predictor.load)
            mv.predictor, mv.platform = predictor, predictor.platform
            try:
                mv.signature = predictor.signature
            except ValueError:
                mv.signature = None
            batching = spec.batching
            mv.max_batch_size = batching.max_batch_size
            batcher = DynamicBatcher(
                predictor.predict,
                BatchingConfig(
                    max_batch_size=batching.max_batch_size,
                    max_queue_delay=batching.max_queue_delay,
                    preferred_batch_sizes=batching.preferred_batch_sizes,
                    max_queue_size=batching.max_queue_size,
                    max_queue_bytes=batching.max_queue_bytes,
                    timeout=batching.timeout,
                    instances=batching.instances,
                ),
                name=f"{served.name}/{mv.version}",
                on_batch=self.metrics.batch_observer(served.name, mv.label),
            )
            await batcher.start()
            mv.batcher = batcher
            mv.runner = self._submitter(batcher)
            await self._warm_up(mv, spec)
            mv.state = VersionState.AVAILABLE
            mv.loaded_at = time.time()
            log.info(
                "model %s version %d AVAILABLE (%s, %.0f ms)",
                served.name,
                mv.version,
                mv.platform,
                (time.perf_counter() - started) * 1000,
            )
        except Exception as exc:
            message = exc.message if isinstance(exc, ServingError) else f"{type(exc).__name__}: {exc}"
            mv.state, mv.error = VersionState.FAILED, message
            log.error("model %s version %d failed to load: %s", served.name, mv.version, message)
            self.metrics.model_events.labels(served.name, mv.label, "load_failed").inc()
            await self._release(mv)

    @staticmethod
    def _submitter(batcher: DynamicBatcher) -> Runner:
        async def run(inputs: Arrays, timeout: float | None) -> Arrays:
            return await batcher.submit(inputs, timeout=timeout)

        return run

    async def _warm_up(self, mv: ModelVersion, spec: ModelSpec) -> None:
        """Replay recorded warm-up requests (or one row of zeros) before the version takes traffic."""
        requests: list[Arrays] = []
        candidates = [self.config.resolve(spec.warmup)] if spec.warmup is not None else []
        if mv.path is not None:
            base = mv.path if mv.path.is_dir() else mv.path.parent
            candidates.append(base / WARMUP_FILE)
        for candidate in candidates:
            if candidate.is_file():
                requests = await asyncio.to_thread(decode_warmup, candidate, self.config.max_body_bytes)
                break
        if not requests and mv.signature is not None:
            zeros = zeros_for(mv.signature)
            if zeros is not None:
                requests = [zeros]
        for i, inputs in enumerate(requests, 1):
            try:
                await mv.run(inputs, None)
            except ServingError as exc:
                raise RuntimeError(f"warm-up request {i} failed: {exc.message}") from exc

    async def _retire(
        self, served: ServedModel, mv: ModelVersion, *, event: str | None, keep_entry: bool = False
    ) -> None:
        """Take a version out of routing, let its in-flight requests finish, then unload it."""
        if mv.state is VersionState.AVAILABLE:
            mv.state = VersionState.UNLOADING
            if not keep_entry:
                served.put(mv)
            await mv.drained()
        if not keep_entry and served.versions.get(mv.version) is mv:
            served.drop(mv.version)
        await self._release(mv)
        if event is not None:
            self.metrics.model_events.labels(served.name, mv.label, event).inc()
        log.info("model %s version %d unloaded", served.name, mv.version)

    @staticmethod
    async def _release(mv: ModelVersion) -> None:
        if mv.batcher is not None:
            await mv.batcher.stop(drain=True)
            mv.batcher = None
        if mv.predictor is not None:
            predictor, mv.predictor = mv.predictor, None
            if predictor.loaded:
                try:
                    await asyncio.to_thread(predictor.unload)
                except Exception:
                    # the version is out of service either way; a failing unload hook must not stop a swap,
                    # the directory watcher or the server's shutdown
                    log.exception("model %s version %d: unloading it raised", mv.model, mv.version)

    # directory watching --------------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.config.watch_interval)
            for name, served in list(self.models.items()):
                if served.spec is None or not served.enabled:
                    continue
                try:
                    on_disk = await asyncio.to_thread(discover_versions, self.config.resolve(served.spec.path))
                    if on_disk != self._seen.get(name):
                        log.info("model %s: versions on disk changed to %s", name, sorted(on_disk))
                        await self.sync_model(name, enable=False)
                except (OSError, ServingError) as exc:
                    log.error("model %s: watching %s failed: %s", name, served.spec.path, exc)
                except Exception:  # one model's surprise must not end watching for every model
                    log.exception("model %s: watching %s failed", name, served.spec.path)
