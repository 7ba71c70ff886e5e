"""Runtime environments: the built-in catalogue, user environments and the environment a job runs in.

Rules (this module is the only writer of the ``environments`` table; builds belong to ``env_builds``):
- A user environment is a name in a tenant for an immutable spec; its hash is fixed when it is created
  (delete and create it again to change it, or to pick up a changed server environment).
- The built-in names (``BUILTINS``) exist for every tenant, are reserved and cannot be deleted. ``default``
  is the server's own Python environment, used as it is (no venv); the others are venvs, built when a job
  first uses them, their hash following the server's environment as it is at that time.
- Creating returns at once; the control plane builds it (``env_builds``). A spec built before, by any
  tenant, is READY at once.
- A job's environment must exist (own tenant or built-in) and must not have FAILED; the job records its
  name and build hash, and waits in the queue while it is BUILDING (``control/loop.py``).
- Deleting is for the environment's author or a tenant admin; it is refused while an unfinished job uses
  the environment or while it is building. The build goes when no environment of any tenant shares it.
- Python versions: only interpreters present on the server. An inheriting environment must use the
  server's own version (compiled packages are built for one version).
- What the server's environment is, what a build makes and where a job finds it are the executor's:
  this module asks the platform's ``EnvironmentBackend`` (``executors/environments.py``) and knows no path.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dlcloud.errors import AlreadyExists, InvalidArgument, InvalidSpec, InvalidState, NotFound, PermissionDenied
from dlcloud.executors.environments import BuildSpec, EnvironmentBackend
from dlcloud.schemas.environments import Environment, EnvironmentCreate, EnvironmentDetail, EnvironmentState
from dlcloud.services import env_builds
from dlcloud.services.auth import Caller
from dlcloud.services.isolation import require_isolation
from dlcloud.services.platform import Platform
from dlcloud.store import environments as store
from dlcloud.store import tenants as tenant_store
from dlcloud.store.ids import new_id
from dlcloud.store.rows import CodeRow, EnvironmentBuildRow, EnvironmentRow, utcnow

LOG_TAIL_LINES = 20
POLL_SECONDS = 0.25
STATE_CHECK_SECONDS = 1.0
# packages of the server's environment that describe shows for inheriting environments, when present
SHOWN_BASE_PACKAGES = (
    "torch",
    "torchvision",
    "torchaudio",
    "tensorflow",
    "tensorflow-cpu",
    "keras",
    "jax",
    "scikit-learn",
    "xgboost",
    "xgboost-cpu",
    "lightgbm",
    "onnxruntime",
    "numpy",
    "scipy",
    "pandas",
)


@dataclass(frozen=True)
class Builtin:
    name: str
    description: str
    inherit: bool
    needs: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (package, distributions that provide it)
    venv: bool = True


_TF = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos", "tf-nightly")
BUILTINS: dict[str, Builtin] = {
    b.name: b
    for b in (
        Builtin("default", "the server's own Python environment, as it is (no venv)", inherit=True, venv=False),
        Builtin("python", "a clean venv of the server's Python, with pip and nothing else", inherit=False),
        Builtin(
            "pytorch",
            "PyTorch from the server's environment, in a venv that inherits it",
            True,
            (("torch", ("torch",)),),
        ),
        Builtin(
            "tensorflow",
            "TensorFlow from the server's environment, in a venv that inherits it",
            True,
            (("tensorflow", _TF),),
        ),
        Builtin(
            "sklearn",
            "scikit-learn from the server's environment, in a venv that inherits it",
            True,
            (("scikit-learn", ("scikit-learn",)),),
        ),
    )
}


# -- specs -------------------------------------------------------------------------------------------------


def _missing(b: Builtin, dists: dict[str, str]) -> list[str]:
    return [what for what, provided_by in b.needs if not any(d in dists for d in provided_by)]


def _unavailable_reason(b: Builtin, missing: list[str]) -> str:
    return (
        f"needs {', '.join(missing)} in the server's Python environment ({sys.prefix}), which lacks it; install it "
        f"there (e.g. pip install 'dlcloud[{b.name}]') or create your own environment with it in its requirements"
    )


def _builtin_spec(backend: EnvironmentBackend, b: Builtin) -> BuildSpec:
    python = backend.server_python()
    base = backend.inherited_fields() if b.inherit else {}
    backend.check_python(python)
    return BuildSpec(python=python, inherit=b.inherit, **base)


def builtin_hashes(backend: EnvironmentBackend) -> set[str]:
    return {_builtin_spec(backend, b).spec_hash() for b in BUILTINS.values() if b.venv}


def _base_packages(dists: dict[str, str]) -> dict[str, str]:
    return {name: dists[name] for name in SHOWN_BASE_PACKAGES if name in dists}


# -- read models -------------------------------------------------------------------------------------------


def _state(build: EnvironmentBuildRow | None) -> tuple[EnvironmentState, str | None]:
    if build is None:
        return EnvironmentState.NOT_BUILT, None
    return EnvironmentState(build.state), build.error


def _user_model(row: EnvironmentRow, build: EnvironmentBuildRow | None, created_by: str) -> Environment:
    spec = row.spec
    state, error = _state(build)
    if build is None:  # never left so by this module; say what to do rather than fail
        state, error = (
            EnvironmentState.FAILED,
            "its build record is missing; delete the environment and create it again",
        )
    return Environment(
        name=row.name,
        builtin=False,
        state=state,
        error=error,
        python=spec["python"],
        inherit=bool(spec.get("inherit")),
        requirements=list(spec.get("requirements") or []),
        spec_hash=row.spec_hash,
        description=spec.get("description") or "",
        image=spec.get("image"),
        created_by=created_by,
        created_at=row.created_at,
        ready_at=build.finished_at if build is not None and build.state == EnvironmentState.READY else None,
        size_bytes=build.size_bytes if build is not None else None,
    )


def _builtin_model(
    s: Session, backend: EnvironmentBackend, b: Builtin, dists: dict[str, str]
) -> tuple[Environment, EnvironmentBuildRow | None]:
    common: dict[str, Any] = dict(
        name=b.name,
        builtin=True,
        python=backend.server_python(),
        inherit=b.inherit,
        requirements=[],
        description=b.description,
        image=None,
        created_by=None,
        created_at=None,
    )
    if not b.venv:
        env = Environment(
            **common, state=EnvironmentState.READY, error=None, spec_hash=None, ready_at=None, size_bytes=None
        )
        return env, None
    spec_hash = _builtin_spec(backend, b).spec_hash()
    build = store.get_build(s, spec_hash)
    state, error = _state(build)
    missing = _missing(b, dists)
    if missing:
        state, error = EnvironmentState.UNAVAILABLE, _unavailable_reason(b, missing)
    ready = build.finished_at if build is not None and build.state == EnvironmentState.READY else None
    size = build.size_bytes if build is not None else None
    return Environment(**common, state=state, error=error, spec_hash=spec_hash, ready_at=ready, size_bytes=size), build


# -- create --------------------------------------------------------------------------------------------------


def _wheels(s: Session, caller: Caller, ids: list[str]) -> tuple[list[tuple[str, str]], list[dict[str, str]]]:
    """(sha256, storage key) for the build and {id, filename, sha256} for the stored spec of each uploaded
    wheel (the backend finds its bytes when it builds)."""
    build, shown = [], []
    for code_id in dict.fromkeys(ids):
        row = s.get(CodeRow, code_id)
        if row is None or row.tenant_id != caller.tenant_id:
            raise InvalidArgument(f"wheel {code_id!r} not found; upload it first (the CLI does this for --wheel FILE)")
        if row.kind != "wheel":
            raise InvalidArgument(f"code {code_id!r} is a {row.kind}, not a wheel; environments install wheels only")
        build.append((row.sha256, row.storage_key))
        shown.append({"id": row.id, "filename": row.filename, "sha256": row.sha256})
    return build, shown


def _refuse_expansion(req: EnvironmentCreate) -> None:
    """Refuse ``${`` in what reaches pip: pip replaces ``${NAME}`` in requirements files with the variable
    NAME of its environment, so such a requirement could carry values of the server's environment into the
    build's log and error (builds pass requirements as arguments, which pip does not expand, as well)."""
    fields = [("requirement", r) for r in req.requirements] + [("extra_index_urls", u) for u in req.extra_index_urls]
    if req.index_url:
        fields.append(("index_url", req.index_url))
    for what, value in fields:
        if "${" in value:
            raise InvalidArgument(
                f"{what} {value!r} contains '${{': pip would replace ${{NAME}} with an environment variable of the "
                "server; write the value itself (nothing in an environment spec is expanded)"
            )


def create_environment(platform: Platform, caller: Caller, req: EnvironmentCreate) -> Environment:
    """Record the environment and ask for its build; returns at once (READY when the spec was built before)."""
    require_isolation(platform, caller, "building environments")
    _refuse_expansion(req)
    if req.name in BUILTINS:
        raise InvalidArgument(
            f"{req.name!r} is a built-in environment; choose another name (built-ins: {', '.join(BUILTINS)})"
        )
    backend = platform.environments
    server_python = backend.server_python()
    python = req.python or server_python
    backend.check_python(python)
    if req.inherit and python != server_python:
        raise InvalidArgument(
            f"inherit needs Python {server_python}, the version of the server's environment whose packages are "
            f"inherited; got {python}"
        )
    base = backend.inherited_fields() if req.inherit else {}
    try:
        with platform.db.write() as s:
            if store.get_environment(s, caller.tenant_id, req.name) is not None:
                raise AlreadyExists(f"environment {req.name!r} already exists; delete it or choose another name")
            wheels, shown_wheels = _wheels(s, caller, req.wheels)
            spec = BuildSpec(
                python=python,
                inherit=req.inherit,
                requirements=tuple(req.requirements),
                wheels=tuple(wheels),
                index_url=req.index_url,
                extra_index_urls=tuple(req.extra_index_urls),
                no_index=req.no_index,
                **base,
            )
            spec_hash = spec.spec_hash()
            build = env_builds.request_build(s, spec, spec_hash)
            stored = req.model_dump(mode="json")
            stored.update(python=python, wheels=shown_wheels)
            row = EnvironmentRow(
                id=new_id("e-"),
                tenant_id=caller.tenant_id,
                name=req.name,
                spec=stored,
                spec_hash=spec_hash,
                created_by=caller.user_id,
                created_at=utcnow(),
            )
            s.add(row)
            s.flush()
            env = _user_model(row, build, caller.user)
    except IntegrityError:  # the same name created concurrently (PostgreSQL)
        raise AlreadyExists(f"environment {req.name!r} already exists; delete it or choose another name") from None
    platform.wake()
    return env


# -- reads ---------------------------------------------------------------------------------------------------


def list_environments(platform: Platform, caller: Caller) -> list[Environment]:
    """The built-ins, then the tenant's environments by name."""
    backend = platform.environments
    dists = backend.server_packages()
    with platform.db.read() as s:
        out = [_builtin_model(s, backend, b, dists)[0] for b in BUILTINS.values()]
        rows = store.list_environments(s, caller.tenant_id)
        builds = store.builds_of(s, (r.spec_hash for r in rows))
        users = tenant_store.user_names(s, (r.created_by for r in rows))
        out += [_user_model(r, builds.get(r.spec_hash), users.get(r.created_by, r.created_by)) for r in rows]
        return out


def describe_environment(platform: Platform, caller: Caller, name: str) -> EnvironmentDetail:
    backend = platform.environments
    dists = backend.server_packages()
    with platform.db.read() as s:
        extra: dict[str, Any] = dict(wheels=[], index_url=None, extra_index_urls=[], no_index=False)
        b = BUILTINS.get(name)
        if b is not None:
            env, build = _builtin_model(s, backend, b, dists)
        else:
            row = store.get_environment(s, caller.tenant_id, name)
            if row is None:
                raise NotFound(f"environment {name!r} not found")
            build = store.get_build(s, row.spec_hash)
            author = tenant_store.user_name(s, row.created_by)  # the id itself for a user deleted since
            env = _user_model(row, build, author)
            spec = row.spec
            extra = dict(
                wheels=[w["filename"] for w in spec.get("wheels") or []],
                index_url=spec.get("index_url"),
                extra_index_urls=list(spec.get("extra_index_urls") or []),
                no_index=bool(spec.get("no_index")),
            )
        jobs = store.unfinished_jobs_using(s, caller.tenant_id, name)
        builds = build.builds if build is not None else 0
    tail = backend.log_tail(env.spec_hash, LOG_TAIL_LINES) if env.spec_hash else []
    return EnvironmentDetail(
        **env.model_dump(),
        **extra,
        base_packages=_base_packages(dists) if env.inherit else {},
        builds=builds,
        jobs=jobs,
        log_tail=tail,
    )


# -- jobs ----------------------------------------------------------------------------------------------------


def resolve_for_job(platform: Platform, s: Session, caller: Caller, name: str | None) -> tuple[str | None, str | None]:
    """(name, build hash) of the environment a job names, checked; (None, None) for ``default``.

    A built-in's build is asked for here (built on first use, retried if it failed). Raises InvalidSpec
    for an unknown, unavailable or failed environment.
    """
    if name is None or name == "default":
        return None, None
    b = BUILTINS.get(name)
    if b is not None:
        backend = platform.environments
        missing = _missing(b, backend.server_packages())
        if missing:
            raise InvalidSpec(f"environment {name!r} is unavailable: it {_unavailable_reason(b, missing)}")
        spec = _builtin_spec(backend, b)
        spec_hash = spec.spec_hash()
        build = store.get_build(s, spec_hash)
        if build is None or build.state == EnvironmentState.FAILED:  # first use, or a retry
            env_builds.request_build(s, spec, spec_hash)
        return name, spec_hash
    row = store.get_environment(s, caller.tenant_id, name)
    if row is None:
        available = [*BUILTINS, *(r.name for r in store.list_environments(s, caller.tenant_id))]
        raise InvalidSpec(
            f"environment {name!r} does not exist; available: {', '.join(available)}",
            details={"available": available},
        )
    build = store.get_build(s, row.spec_hash)
    if build is None or build.state == EnvironmentState.FAILED:
        why = build.error if build is not None else "its build record is missing"
        raise InvalidSpec(
            f"environment {name!r} failed to build: {why}\n(fix the spec, then: dlcloud envs delete {name}; "
            f"dlcloud envs create {name} ...)",
            details={"environment": name},
        )
    return name, row.spec_hash


# -- delete ---------------------------------------------------------------------------------------------------


def delete_environment(platform: Platform, caller: Caller, name: str) -> None:
    if name in BUILTINS:
        raise InvalidArgument(f"{name!r} is a built-in environment; built-ins cannot be deleted")
    keep = builtin_hashes(platform.environments)
    with platform.db.write() as s:
        row = store.get_environment(s, caller.tenant_id, name, for_update=True)
        if row is None:
            raise NotFound(f"environment {name!r} not found")
        if row.created_by != caller.user_id and not caller.is_tenant_admin:
            raise PermissionDenied(f"only the author or a tenant admin can delete environment {name!r}")
        jobs = store.unfinished_jobs_using(s, caller.tenant_id, name)
        if jobs:
            raise InvalidState(
                f"environment {name!r} is used by unfinished job(s) {', '.join(jobs[:5])}"
                f"{' and more' if len(jobs) > 5 else ''}; wait for them to end or cancel them first",
                details={"jobs": jobs},
            )
        build = store.get_build(s, row.spec_hash, for_update=True)
        if build is not None and build.state == EnvironmentState.BUILDING:
            raise InvalidState(
                f"environment {name!r} is still building; wait for the build to end "
                f"(dlcloud envs logs {name} --follow), then delete it"
            )
        spec_hash = row.spec_hash
        s.delete(row)
        s.flush()
        unused = env_builds.forget_if_unused(s, spec_hash, keep)
    if unused:
        env_builds.remove_files(platform, spec_hash)


# -- build logs -----------------------------------------------------------------------------------------------


def _log_target(platform: Platform, caller: Caller, name: str) -> tuple[str, Path, bool]:
    """(hash, log path, building now) of an environment, for its build log."""
    with platform.db.read() as s:
        b = BUILTINS.get(name)
        if b is not None and not b.venv:
            raise InvalidArgument(f"{name!r} is the server's own environment; it is never built and has no build log")
        if b is not None:
            spec_hash = _builtin_spec(platform.environments, b).spec_hash()
        else:
            row = store.get_environment(s, caller.tenant_id, name)
            if row is None:
                raise NotFound(f"environment {name!r} not found")
            spec_hash = row.spec_hash
        build = store.get_build(s, spec_hash)
        building = build is not None and build.state == EnvironmentState.BUILDING
    return spec_hash, platform.environments.log_path(spec_hash), building


async def open_log_stream(
    platform: Platform, caller: Caller, name: str, *, follow: bool, tail: int | None
) -> AsyncIterator[str]:
    """Check access now (raises NotFound), then return an iterator over the latest build's log lines.

    Following ends when the build is no longer BUILDING. A log that shrinks was restarted by a new build
    (a retry) and is read again from its start.
    """
    spec_hash, path, building = await anyio.to_thread.run_sync(_log_target, platform, caller, name)
    return _stream(platform, caller, name, spec_hash, path, follow=follow and building, tail=tail)


async def _stream(
    platform: Platform, caller: Caller, name: str, spec_hash: str, path: Path, *, follow: bool, tail: int | None
) -> AsyncIterator[str]:
    offset = 0
    pending = ""
    if tail is not None:
        for line in platform.environments.log_tail(spec_hash, tail):
            yield line + "\n"
        offset = path.stat().st_size if path.exists() else 0

    def read_new() -> list[str]:
        nonlocal offset, pending
        try:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < offset:  # a new build truncated the log
                    offset, pending = 0, ""
                f.seek(offset)
                data = f.read(4 * 1024 * 1024)
        except FileNotFoundError:
            return []
        offset += len(data)
        parts = (pending + data.decode("utf-8", errors="replace")).split("\n")
        pending = parts[-1]
        return [p + "\n" for p in parts[:-1]]

    loop = asyncio.get_running_loop()
    last_check = loop.time()
    building = follow
    while True:
        for line in read_new():
            yield line
        if not building:
            break
        await asyncio.sleep(POLL_SECONDS)
        if loop.time() - last_check >= STATE_CHECK_SECONDS:
            last_check = loop.time()
            _, _, building = await anyio.to_thread.run_sync(_log_target, platform, caller, name)
    for line in read_new():
        yield line
    if pending:
        yield pending + "\n"
