"""The environment backend interface (``executors/environments.py``) and its local and simulated backends:
spec hashes pinned (they name stored builds and venvs on disk), the server's Python, builds with their
cancel and time-limit story, logs, locations and discarding. No package index is reached: the one build that
needs an index gets a local one that accepts connections and never answers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlcloud.errors import InvalidArgument, Unavailable
from dlcloud.executors import host_venvs
from dlcloud.executors.environments import (
    BuildCancelled,
    BuildError,
    BuildSpec,
    Cancellation,
    EnvironmentBackend,
    NoEnvironments,
)
from dlcloud.executors.local import venvs
from dlcloud.executors.local.environments import LocalVenvBackend
from dlcloud.executors.simulated import SimulatedExecutor
from dlcloud.settings import Settings
from dlcloud.storage.cache import ObjectCache
from dlcloud.storage.local import LocalObjectStore
from dlcloud.storage.stores import open_object_store
from tests.conftest import wait_for
from tests.wheels import make_wheel

# builds in databases and venvs on disk are named by these hashes, so they must never change for the same spec
# (format 2: the spec names no host path; change HASH_FORMAT rather than these)
PLAIN = BuildSpec(python="3.11")
PLAIN_HASH = "9deb3b45761022b5e5bb50903f26975d6f372d4c0814ad933664e1e171f6c3ec"
FULL = BuildSpec(
    python="3.12",
    inherit=True,
    base_packages="ab" * 32,
    requirements=("torch==2.3", "numpy>=1"),
    wheels=(("c" * 64, "code/t-1/c-1/x-1.0-py3-none-any.whl"),),
    index_url="https://pypi.example/simple",
    extra_index_urls=("https://b.example/simple", "https://a.example/simple"),
    no_index=False,
)
FULL_HASH = "9abf83bb983d4eb18a0ce090c83961ea593ed05b173bfa80bba007fed6071bd5"
FULL_JSON = (
    '{"python": "3.12", "inherit": true, "base_packages": "' + "ab" * 32 + '", '
    '"requirements": ["torch==2.3", "numpy>=1"], "wheels": [["' + "c" * 64 + '", '
    '"code/t-1/c-1/x-1.0-py3-none-any.whl"]], "index_url": "https://pypi.example/simple", "extra_index_urls": '
    '["https://b.example/simple", "https://a.example/simple"], "no_index": false}'
)


def test_spec_hash_and_json_are_those_stored_before() -> None:
    assert PLAIN.spec_hash() == PLAIN_HASH
    assert FULL.spec_hash() == FULL_HASH
    assert json.dumps(FULL.to_json()) == FULL_JSON
    # what the database gives back (lists, not tuples) is the same spec with the same hash
    stored = BuildSpec.from_json(json.loads(FULL_JSON))
    assert stored == FULL and stored.spec_hash() == FULL_HASH
    # the local module still names the same types (the local code and stored specs know them by it)
    assert venvs.BuildSpec is BuildSpec and venvs.BuildError is BuildError


def test_a_spec_names_nothing_of_the_host() -> None:
    """Decision 7: what is stored of a build is its content, never where this host keeps things (an old row's
    host fields, from before migration 0024 took them out, are not read back either)."""
    assert set(FULL.to_json()) == {
        "python",
        "inherit",
        "base_packages",
        "requirements",
        "wheels",
        "index_url",
        "extra_index_urls",
        "no_index",
    }
    old = {**json.loads(FULL_JSON), "interpreter": "/opt/py/bin/python3.12", "base_prefix": "/opt/py"}
    assert BuildSpec.from_json({**old, "base_site": ["/opt/py/lib/python3.12/site-packages"]}) == FULL


def local_backend(envs_dir: Path, **kw: Any) -> LocalVenvBackend:
    """A local backend whose wheels come from a local store beside its venvs."""
    store = LocalObjectStore(envs_dir.parent / "objects")
    return LocalVenvBackend(envs_dir, wheels=ObjectCache(envs_dir.parent / "cache", store), **kw)


def inherit_spec(backend: EnvironmentBackend, **kw: object) -> BuildSpec:
    python = backend.server_python()
    fields: dict = dict(python=python, inherit=True, no_index=True)
    fields.update(backend.inherited_fields())
    fields.update(kw)
    return BuildSpec(**fields)


def test_the_server_python_and_versions_it_lacks(tmp_path: Path) -> None:
    backend = local_backend(tmp_path / "envs")
    assert backend.server_python() == f"{sys.version_info[0]}.{sys.version_info[1]}"
    backend.check_python(backend.server_python())
    with pytest.raises(InvalidArgument, match="Python 3.5 is not installed on the server; available: ") as exc:
        backend.check_python("3.5")  # never a candidate: only python3.6 and later are looked for
    assert backend.server_python() in exc.value.details["available"]
    fields = backend.inherited_fields()
    assert fields == {"base_packages": host_venvs.base_digest(host_venvs.base_distributions())}
    assert "pytest" in backend.server_packages()


def test_build_locate_log_and_discard(tmp_path: Path) -> None:
    backend = local_backend(tmp_path / "envs")
    spec = inherit_spec(backend)
    spec_hash = spec.spec_hash()
    result = backend.build(spec, spec_hash, Cancellation())
    assert result.built and result.size_bytes > 0
    venv = backend.location(spec_hash)
    assert venv == tmp_path / "envs" / spec_hash and (venv / venvs.READY_MARKER).exists()
    assert any("build finished" in line for line in backend.log_tail(spec_hash, 5))
    assert backend.log_tail(spec_hash, 0) == []
    assert "build started" in backend.log_path(spec_hash).read_text()
    again = backend.build(spec, spec_hash, Cancellation())  # found, not built again
    assert not again.built and again.size_bytes == result.size_bytes

    # discard: never while a builder holds the hash, nor when it is wanted again; else venv and log go
    with host_venvs.build_lock(backend.envs_dir, spec_hash):
        assert backend.discard(spec_hash) is False
    assert backend.discard(spec_hash, wanted=lambda: True) is False
    assert venv.is_dir()
    assert backend.discard(spec_hash) is True
    assert not venv.exists() and not backend.log_path(spec_hash).exists()
    assert backend.log_tail(spec_hash, 5) == []

    with pytest.raises(ValueError, match="not a spec hash"):
        backend.location("../../etc")


def test_a_build_that_cannot_write_fails_readably(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    backend = local_backend(tmp_path / "file" / "envs")
    spec = inherit_spec(backend)
    with pytest.raises(BuildError, match="could not build the environment: "):
        backend.build(spec, spec.spec_hash(), Cancellation())


@pytest.fixture
def silent_index() -> Iterator[str]:
    """A package index that takes connections and never answers: pip waits on it."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"http://127.0.0.1:{server.getsockname()[1]}/simple"


def _waiting_spec(backend: EnvironmentBackend, index: str) -> BuildSpec:
    return inherit_spec(backend, requirements=("tinypkg-dlcloud-never",), index_url=index, no_index=False)


def test_cancel_stops_a_running_build_and_the_next_ones(tmp_path: Path, silent_index: str) -> None:
    backend = local_backend(tmp_path / "envs")
    spec = _waiting_spec(backend, silent_index)
    spec_hash = spec.spec_hash()
    cancel = Cancellation()
    outcome: list[Exception] = []

    def build() -> None:
        try:
            backend.build(spec, spec_hash, cancel)
        except Exception as exc:  # handed to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=build)
    thread.start()
    log = backend.log_path(spec_hash)
    wait_for(lambda: log.exists() and "Looking in indexes" in log.read_text(), what="pip to run")
    started = time.monotonic()
    cancel.cancel()
    thread.join(timeout=30)
    assert not thread.is_alive() and time.monotonic() - started < 10
    assert len(outcome) == 1 and isinstance(outcome[0], BuildCancelled)
    assert not backend.location(spec_hash).exists()
    assert "build interrupted" in log.read_text()
    with pytest.raises(BuildCancelled):  # a build asked for after the cancel never starts
        backend.build(inherit_spec(backend), inherit_spec(backend).spec_hash(), cancel)


def test_a_build_past_the_time_limit_fails(tmp_path: Path, silent_index: str) -> None:
    backend = local_backend(tmp_path / "envs", timeout=3.0)
    spec = _waiting_spec(backend, silent_index)
    with pytest.raises(BuildError, match="pip install did not finish within the build time limit of 3 s"):
        backend.build(spec, spec.spec_hash(), Cancellation())
    assert not backend.location(spec.spec_hash()).exists()


def test_simulated_environments_are_described_like_local_ones_and_never_built(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    objects = open_object_store(settings)
    simulated = SimulatedExecutor().environments(settings, objects)
    local = LocalVenvBackend.from_settings(settings, objects)
    assert simulated.server_python() == local.server_python()
    assert simulated.inherited_fields() == local.inherited_fields()
    spec = inherit_spec(simulated, requirements=("nonexistent-pkg-dlcloud==9.9",))
    result = simulated.build(spec, spec.spec_hash(), Cancellation())
    assert result.built and result.size_bytes == 0
    assert not simulated.location(spec.spec_hash()).exists()
    assert any("build skipped" in line for line in simulated.log_tail(spec.spec_hash(), 5))
    assert simulated.discard(spec.spec_hash()) and simulated.log_tail(spec.spec_hash(), 5) == []


def test_a_platform_without_a_backend_says_so() -> None:
    with pytest.raises(Unavailable, match="runtime environments are not available"):
        NoEnvironments().server_python()


class _RemoteLike(LocalObjectStore):
    """A store that keeps no file where a build could read it (as S3): every read is a fetched copy."""

    def local_path(self, key: str) -> Path | None:
        return None


def test_a_wheel_is_built_from_its_storage_key_on_a_store_without_local_files(tmp_path: Path) -> None:
    """The spec names the wheel by key; the build fetches it into the object cache (named by checksum) and
    gives pip a file under the wheel's own name."""
    wheel = make_wheel(tmp_path / "dist")
    store = _RemoteLike(tmp_path / "objects")
    key = f"code/t-1/c-1/{wheel.name}"
    info = store.put_file(key, wheel)
    backend = LocalVenvBackend(tmp_path / "envs", wheels=ObjectCache(tmp_path / "cache", store))
    spec = inherit_spec(backend, wheels=((info.sha256, key),))
    spec_hash = spec.spec_hash()
    assert backend.build(spec, spec_hash, Cancellation()).built
    python = backend.location(spec_hash) / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import tinypkg; print(tinypkg.__file__)"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith(str(backend.location(spec_hash))), out.stderr
    assert (tmp_path / "cache" / info.sha256[:2] / info.sha256).is_file()

    missing = inherit_spec(backend, wheels=(("0" * 64, "code/t-1/c-2/gone-1.0-py3-none-any.whl"),))
    with pytest.raises(BuildError, match="is missing or damaged in storage"):
        backend.build(missing, missing.spec_hash(), Cancellation())
