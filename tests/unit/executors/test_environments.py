"""The environment backend interface (``executors/environments.py``) and its local and simulated backends:
spec hashes pinned (they name stored builds and venvs on disk), the server's Python, builds with their
cancel and time-limit story, logs, locations and discarding. No package index is reached: the one build that
needs an index gets a local one that accepts connections and never answers."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

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
from tests.conftest import wait_for

# computed with the code before the interface existed (executors/local/venvs.py): builds in databases and
# venvs on disk are named by these hashes, so they must never change for the same spec
PLAIN = BuildSpec(python="3.11", interpreter="/usr/bin/python3.11")
PLAIN_HASH = "f1ff48a2fceb4d014805717da58871353870c1bf4cba301dcfa0977c766836c8"
FULL = BuildSpec(
    python="3.12",
    interpreter="/opt/py/bin/python3.12",
    inherit=True,
    base_prefix="/opt/py",
    base_site=("/opt/py/lib/python3.12/site-packages",),
    base_packages="ab" * 32,
    requirements=("torch==2.3", "numpy>=1"),
    wheels=(("c" * 64, "/data/cache/x.whl"),),
    index_url="https://pypi.example/simple",
    extra_index_urls=("https://b.example/simple", "https://a.example/simple"),
    no_index=False,
)
FULL_HASH = "deb92c4b616d6eec08fe2bb94143870ecdeb8560f50f1e9ac4933eda98364bc2"
FULL_JSON = (
    '{"python": "3.12", "interpreter": "/opt/py/bin/python3.12", "inherit": true, "base_prefix": "/opt/py", '
    '"base_site": ["/opt/py/lib/python3.12/site-packages"], "base_packages": "' + "ab" * 32 + '", '
    '"requirements": ["torch==2.3", "numpy>=1"], "wheels": [["' + "c" * 64 + '", "/data/cache/x.whl"]], '
    '"index_url": "https://pypi.example/simple", "extra_index_urls": ["https://b.example/simple", '
    '"https://a.example/simple"], "no_index": false}'
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


def inherit_spec(backend: EnvironmentBackend, **kw: object) -> BuildSpec:
    python = backend.server_python()
    fields: dict = dict(python=python, interpreter=backend.resolve_python(python), inherit=True, no_index=True)
    fields.update(backend.inherited_fields())
    fields.update(kw)
    return BuildSpec(**fields)


def test_the_server_python_and_versions_it_lacks(tmp_path: Path) -> None:
    backend = LocalVenvBackend(tmp_path / "envs")
    assert backend.server_python() == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert backend.resolve_python(backend.server_python()) == os.path.abspath(sys.executable)
    with pytest.raises(InvalidArgument, match="Python 3.5 is not installed on the server; available: ") as exc:
        backend.resolve_python("3.5")  # never a candidate: only python3.6 and later are looked for
    assert backend.server_python() in exc.value.details["available"]
    fields = backend.inherited_fields()
    assert set(fields) == {"base_prefix", "base_site", "base_packages"}
    assert fields["base_prefix"] == os.path.abspath(sys.prefix)
    assert "pytest" in backend.server_packages()


def test_build_locate_log_and_discard(tmp_path: Path) -> None:
    backend = LocalVenvBackend(tmp_path / "envs")
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
    backend = LocalVenvBackend(tmp_path / "file" / "envs")
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
    backend = LocalVenvBackend(tmp_path / "envs")
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
    backend = LocalVenvBackend(tmp_path / "envs", timeout=3.0)
    spec = _waiting_spec(backend, silent_index)
    with pytest.raises(BuildError, match="pip install did not finish within the build time limit of 3 s"):
        backend.build(spec, spec.spec_hash(), Cancellation())
    assert not backend.location(spec.spec_hash()).exists()


def test_simulated_environments_are_described_like_local_ones_and_never_built(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    simulated = SimulatedExecutor().environments(settings)
    local = LocalVenvBackend.from_settings(settings)
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
