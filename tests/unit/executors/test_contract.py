"""The executor contract (``executors/base.py``), checked against both implementations: the local executor
(real processes in the sandbox) and the simulated one (nothing runs). What only the local executor can show
(a command's output, reading a dataset, saved outputs, a new instance re-adopting an attempt) is checked on it
alone, in the tests named so."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlcloud.errors import InvalidState
from dlcloud.executors import AttemptReport, Executor, Workload
from dlcloud.executors.base import LAUNCH_FAILED, DatasetMount, StoredCode
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.executors.registry import get_executor_class
from dlcloud.executors.simulated import SimulatedExecutor
from dlcloud.settings import Settings
from dlcloud.storage.objects import ObjectStore, scan_tree
from dlcloud.storage.stores import open_object_store
from tests.conftest import wait_for

KINDS = ["local", "simulated"]


def _make(kind: str) -> Executor:
    return LocalExecutor() if kind == "local" else SimulatedExecutor()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    data = tmp_path / "data"
    data.mkdir()
    return Settings(data_dir=data, stop_grace_seconds=1.0)


@pytest.fixture
def objects(settings: Settings) -> ObjectStore:
    return open_object_store(settings)


@pytest.fixture(params=KINDS)
def executor(request: pytest.FixtureRequest, settings: Settings, objects: ObjectStore) -> Iterator[Executor]:
    ex = _make(request.param)
    ex.bind(settings, objects, ex.environments(settings, objects))
    yield ex
    ex.reap()


def _workload(job: str, command: str = "sleep 30", **fields: object) -> Workload:
    return Workload(job_id=job, tenant_id="t1", attempt=1, command=command, grace_seconds=1.0, **fields)  # type: ignore[arg-type]


def _state(ex: Executor, handle: str, *states: str, timeout: float = 30.0) -> AttemptReport:
    def check() -> AttemptReport | None:
        report = ex.poll(handle)
        return report if report.state in states else None

    return wait_for(check, timeout=timeout, what=f"attempt {handle} to be {'/'.join(states)}")


def _dataset(objects: ObjectStore, tmp_path: Path, text: str = "hello") -> DatasetMount:
    src = tmp_path / "dataset-src"
    src.mkdir()
    (src / "part-0.txt").write_text(text)
    manifest = objects.put_tree("datasets/t1/d1/1", src, scan_tree(src))
    return DatasetMount("clicks", "datasets/t1/d1/1", manifest.artifact_sha256())


def _code(objects: ObjectStore, tmp_path: Path, script: str) -> StoredCode:
    archive = tmp_path / "code.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = script.encode()
        info = tarfile.TarInfo("run.sh")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    stored = objects.put_file("code/t1/c1", archive)
    assert stored.sha256 is not None
    return StoredCode("code/t1/c1", stored.sha256, "archive")


def test_both_executors_are_in_the_registry_and_built_from_the_settings(tmp_path: Path) -> None:
    from dlcloud.errors import InvalidArgument

    assert get_executor_class("local") is LocalExecutor
    assert get_executor_class("simulated") is SimulatedExecutor
    off = Settings(data_dir=tmp_path, sandbox="off")
    local = get_executor_class(off.executor).from_settings(off)
    assert isinstance(local, LocalExecutor) and local.isolation()[0] is False
    assert "--sandbox off" in local.isolation()[1]
    simulated = Settings(data_dir=tmp_path, executor="simulated")
    assert isinstance(get_executor_class(simulated.executor).from_settings(simulated), SimulatedExecutor)
    with pytest.raises(InvalidArgument, match="valid executors: local, simulated"):
        get_executor_class("kubernetes")


def test_start_poll_stop_by_handle(executor: Executor) -> None:
    handle = executor.handle("t1", "job1", 1)
    assert handle.endswith("t1/job1/attempt-1")
    executor.start(handle, _workload("job1"))
    _state(executor, handle, "running")
    executor.stop(handle)
    report = _state(executor, handle, "exited")
    assert report.stopped and report.exit_code is not None and report.exit_code != 0
    executor.stop(handle)  # stopping an ended attempt does nothing
    assert executor.poll(handle).state == "exited"


def test_a_handle_starts_once(executor: Executor) -> None:
    handle = executor.handle("t1", "job1", 1)
    executor.start(handle, _workload("job1"))
    with pytest.raises(InvalidState):
        executor.start(handle, _workload("job1"))
    executor.stop(handle)
    _state(executor, handle, "exited")


def test_nothing_to_save_is_said_not_saved(executor: Executor) -> None:
    handle = executor.handle("t1", "quiet", 1)
    executor.start(handle, _workload("quiet"))
    _state(executor, handle, "running")
    executor.stop(handle)
    _state(executor, handle, "exited")
    assert executor.save_outputs(handle, "jobs/t1/quiet/outputs/attempt-1") is False  # it wrote none


def test_checkpoints_are_measured_and_an_executor_without_them_says_zero(executor: Executor) -> None:
    handle = executor.handle("t1", "ckpt", 1)
    executor.start(handle, _workload("ckpt", 'head -c 100000 /dev/zero > "$DLCLOUD_CHECKPOINT_DIR/c"; sleep 30'))
    _state(executor, handle, "running")
    if isinstance(executor, LocalExecutor):
        wait_for(lambda: executor.checkpoints_bytes(handle) >= 100000, what="the checkpoint to be written")
    else:
        assert executor.checkpoints_bytes(handle) == 0  # it keeps none
    executor.stop(handle)
    _state(executor, handle, "exited")


def test_an_attempt_never_started_is_lost_before_launch(executor: Executor) -> None:
    report = executor.poll(executor.handle("t1", "never", 1))
    assert report.state == "lost" and report.launched is False
    executor.stop(executor.handle("t1", "never", 1))  # harmless


def test_missing_inputs_end_the_attempt_with_a_message_naming_no_storage_key(
    executor: Executor, objects: ObjectStore, tmp_path: Path
) -> None:
    good = _dataset(objects, tmp_path)
    altered = DatasetMount("clicks", good.storage_key, "0" * 64)  # not the version the job was given
    missing_code = StoredCode("code/t1/gone", "1" * 64, "archive")
    for job, fields, what in [
        ("j1", {"datasets": (altered,)}, "dataset 'clicks'"),
        ("j2", {"datasets": (DatasetMount("other", "datasets/t1/none/1", "2" * 64),)}, "dataset 'other'"),
        ("j3", {"code": missing_code}, "its code"),
    ]:
        handle = executor.handle("t1", job, 1)
        executor.start(handle, _workload(job, **fields))
        report = _state(executor, handle, "exited")
        assert report.exit_code == LAUNCH_FAILED, report
        assert what in report.message and "datasets/" not in report.message and "code/" not in report.message


def test_local_runs_code_and_datasets_from_the_store_and_saves_outputs(
    settings: Settings, objects: ObjectStore, tmp_path: Path
) -> None:
    ex = LocalExecutor()
    ex.bind(settings, objects, ex.environments(settings, objects))
    data = _dataset(objects, tmp_path, "rows")
    script = (
        'cat "$DLCLOUD_DATASET_CLICKS/part-0.txt" > "$DLCLOUD_OUTPUT_DIR/copy.txt"\n'
        'echo "$DLCLOUD_DATASETS" | grep -q clicks\n'
        '! touch "$DLCLOUD_DATASET_CLICKS/x" 2>/dev/null\n'  # a mounted dataset is read-only
        "echo done\n"
    )
    code = _code(objects, tmp_path, script)
    handle = ex.handle("t1", "job1", 1)
    ex.start(handle, _workload("job1", "sh run.sh", code=code, datasets=(data,)))
    report = _state(ex, handle, "exited")
    assert report.exit_code == 0, (report, {n: p.read_text() for n, p in ex.log_files(handle).items()})
    assert "done" in ex.log_files(handle)[""].read_text()
    assert ex.save_outputs(handle, "jobs/t1/job1/outputs/attempt-1") is True
    manifest = objects.tree_manifest("jobs/t1/job1/outputs/attempt-1")
    assert [e.path for e in manifest.entries] == ["copy.txt"]
    assert b"".join(objects.iter_tree_file("jobs/t1/job1/outputs/attempt-1", manifest.entries[0])) == b"rows"
    assert ex.archive_logs(handle, "jobs/t1/job1/logs/attempt-1") is True
    logs = objects.tree_manifest("jobs/t1/job1/logs/attempt-1")
    assert [e.path for e in logs.entries] == ["main/output.log"]
    ex.remove_job("t1", "job1")
    assert ex.log_files(handle) == {"": ex.attempt_dir(handle) / "output.log"}
    assert not ex.attempt_dir(handle).parent.exists()


def test_local_outputs_refused_once_measured_store_nothing(settings: Settings, objects: ObjectStore) -> None:
    ex = LocalExecutor()
    ex.bind(settings, objects, ex.environments(settings, objects))
    handle = ex.handle("t1", "big", 1)
    command = 'head -c 5000 /dev/zero > "$DLCLOUD_OUTPUT_DIR/o"; ln -s / "$DLCLOUD_OUTPUT_DIR/r"'
    ex.start(handle, _workload("big", command))
    assert _state(ex, handle, "exited").exit_code == 0
    seen: list[int] = []

    def refuse(size: int) -> None:
        seen.append(size)
        raise InvalidState("over the quota")

    with pytest.raises(InvalidState, match="over the quota"):
        ex.save_outputs(handle, "jobs/t1/big/outputs/attempt-1", admit=refuse)
    assert seen == [5000]  # the link is neither followed nor counted
    assert list(objects.list("jobs/t1/big")) == []
    assert ex.save_outputs(handle, "jobs/t1/big/outputs/attempt-1", admit=seen.append) is True
    assert seen == [5000, 5000] and objects.tree_manifest("jobs/t1/big/outputs/attempt-1").size == 5000


def test_local_attempt_is_readopted_by_a_new_instance(settings: Settings, objects: ObjectStore) -> None:
    first = LocalExecutor()
    first.bind(settings, objects, first.environments(settings, objects))
    handle = first.handle("t1", "job1", 1)
    first.start(handle, _workload("job1"))
    _state(first, handle, "running")
    second = LocalExecutor()  # a restarted control plane: nothing in memory about the attempt
    second.bind(settings, objects, second.environments(settings, objects))
    assert second.poll(handle).state == "running"
    second.stop(handle)
    assert _state(second, handle, "exited").stopped


def test_local_handles_name_only_attempt_directories(settings: Settings, objects: ObjectStore) -> None:
    ex = LocalExecutor()
    ex.bind(settings, objects, ex.environments(settings, objects))
    for bad in ["../t1/job1/attempt-1", "/runs/t1/../../etc/attempt-1", "/etc/passwd", "t1/job1/attempt-0", "t1/job1"]:
        with pytest.raises(ValueError, match="not an attempt handle"):
            ex.attempt_dir(bad)
    mine = settings.runs_dir / "t1" / "job1" / "attempt-1"
    assert ex.handle("t1", "job1", 1) == str(mine) and ex.attempt_dir(str(mine)) == mine
    assert ex.attempt_dir("t1/job1/attempt-1") == mine
    # another control plane's attempt on this host (its own data dir, the same database): found where it runs
    other = Path("/srv/other/runs/t1/job1/attempt-2")
    assert ex.attempt_dir(str(other)) == other


def test_local_datasets_that_can_never_fit_this_hosts_cache_end_the_attempt(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """On a remote store datasets are copied into the host's cache: more than it may ever hold ends the attempt
    (it would wait forever, holding its GPUs), saying which setting bounds it."""
    from tests.s3server import s3_server_or_skip

    store = s3_server_or_skip(request).new_store()
    data = tmp_path / "data"
    data.mkdir()
    settings = Settings(data_dir=data, dataset_cache_max_bytes=1024 * 1024)
    ex = LocalExecutor()
    ex.bind(settings, store, ex.environments(settings, store))
    mount = _dataset(store, tmp_path, "x" * (1024 * 1024 + 1))
    handle = ex.handle("t1", "big", 1)
    ex.start(handle, _workload("big", datasets=(mount,)))
    report = _state(ex, handle, "exited")
    assert report.exit_code == LAUNCH_FAILED and "dataset_cache_max_bytes" in report.message, report


def test_local_inspection_of_a_tree_it_cannot_fetch_is_no_signature(settings: Settings) -> None:
    """On a store that keeps no files on this host the local executor fetches the stored tree before inspecting it;
    when the store fails (down, damaged, disk full) the answer is "no signature", never an error, and nothing is
    left in the scratch directory."""
    from dlcloud.storage.local import LocalObjectStore
    from dlcloud.storage.objects import StorageError

    class Unreachable(LocalObjectStore):
        def tree_local_path(self, prefix: str) -> Path | None:
            return None

        def get_tree(self, prefix: str, dest: Path, manifest: object = None) -> object:  # type: ignore[override]
            dest.mkdir(parents=True)
            (dest / "partial").write_bytes(b"x")
            raise StorageError("the object store did not answer")

    objects = Unreachable(settings.data_dir / "objects")
    ex = LocalExecutor()
    ex.bind(settings, objects, ex.environments(settings, objects))
    assert ex.inspect_model("models/t1/m-1/1", "model.onnx", "onnx", 30) is None
    assert list((settings.data_dir / "tmp" / "uploads").iterdir()) == []
    with pytest.raises(Exception, match="artifact name"):
        ex.inspect_model("models/t1/m-1/1", "../escape", "onnx", 30)
