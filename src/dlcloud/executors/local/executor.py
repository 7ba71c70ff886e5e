"""LocalExecutor: the executor contract (``executors/base.py``) on this host.

It owns every host detail the control plane must not know: the attempt directory behind a handle
(``<runs_dir>/<tenant>/<job>/attempt-<n>``), the job's checkpoint, output and TensorBoard directories beside it
(a gang replica's TensorBoard directory is ``tensorboard/<replica>``), the local
files of its code (``ObjectCache``), the read-only directories of its datasets (``TreeCache``, pinned per
attempt), the venv of its environment, the uid and devices its sandbox gets, and the rendezvous address of a
gang. ``ProcessRunner`` (``runner.py``) then runs the attempt through a detached launcher.

``start`` returns at once: the inputs are fetched on a thread of this executor while ``poll`` says
"pending" (a dataset waiting for room in the cache says so in the report's message). A crash while fetching
leaves no launched attempt (no workload.json): after a restart ``poll`` says lost before launch and the control
plane starts it again; the caches never expose a partial entry. Inputs that are missing or damaged end the
attempt with ``LAUNCH_FAILED``, recorded in the attempt directory like any launch failure.

A workload with ``checkpoint_from`` gets, while the first attempt that finds the job's checkpoint directory
missing is prepared, a copy of the named job's (``checkpoints.py``: links never followed, special files never
opened, hard links copied once, bounded by ``checkpoint_copy_max_bytes`` and the disk's free space, owned by the
job's sandbox uid); the named job's directory gone (deleted), or its checkpoints past a bound, end the attempt
with ``LAUNCH_FAILED``; a stop while it copies ends the copy, leaving nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dlcloud.errors import DlcloudError, InvalidState
from dlcloud.executors import model_inspect
from dlcloud.executors.base import (
    LAUNCH_FAILED,
    MAIN_LOG,
    REPLICA_FILES_REF,
    REPLICAS_DIR,
    TENSORBOARD_ENV,
    AttemptReport,
    CheckpointsUnavailable,
    DatasetMount,
    Executor,
    InputsUnavailable,
    LogReader,
    Replica,
    Workload,
    check_inputs,
    log_segments,
)
from dlcloud.executors.environments import EnvironmentBackend
from dlcloud.executors.local import job_view, network, reader_charge, saved_checkpoints
from dlcloud.executors.local import launcher as launcher_mod
from dlcloud.executors.local.checkpoints import (
    NoRoom,
    SourceGone,
    Stopped,
    TooLarge,
    TooManyEntries,
    copy_checkpoints,
    last_change,
    measure_checkpoints,
    size_text,
)
from dlcloud.executors.local.environments import LocalVenvBackend
from dlcloud.executors.local.runner import ProcessRunner, Run, make_private_dirs
from dlcloud.executors.local.sandbox import Sandbox, probe
from dlcloud.executors.local.venvs import BuildSandbox
from dlcloud.executors.outputs import save_left_out, scan_outputs
from dlcloud.schemas.datasets import dataset_env_name
from dlcloud.settings import Settings
from dlcloud.storage.artifacts import check_artifact_name
from dlcloud.storage.cache import ObjectCache
from dlcloud.storage.objects import Manifest, ObjectStore, StorageError, scan_tree
from dlcloud.storage.tree_cache import CacheFull, TreeCache

log = logging.getLogger(__name__)

HANDLE_TAIL_RE = re.compile(r"(?:^|/)([A-Za-z0-9_-]{1,64})/([A-Za-z0-9_-]{1,64})/attempt-([1-9][0-9]{0,8})$")
JOB_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a job's directory name, as in a handle
CACHE_RETRY_SECONDS = 2.0  # how often an attempt waiting for room in the dataset cache tries again
PREPARE_TRIES = 5  # reads of the inputs that may fail for the store (waits growing from 2 s) before it ends
CHECKPOINTS, OUTPUTS, TENSORBOARD = "checkpoints", "outputs", "tensorboard"
CHECKPOINT_LOOK_SECONDS = 15.0  # how often a running attempt's checkpoint directory is looked at for a change
# what a Run takes from its Workload as it is (the rest the executor decides: directories, env, local copies)
RUN_FIELDS = {f.name for f in fields(Run)} - {"env", "replicas", "mounts"}
DATASETS_MOUNT = job_view.DATASETS_AT  # where a sandboxed job finds its datasets, each at /datasets/<name>


class LocalExecutor(Executor):
    """Runs workloads as processes on this host.

    Args:
        python: the interpreter for jobs (its directory goes first on PATH; pip installs a package with it).
            Default: this process's interpreter.
        base_env: the variables every command starts from (see ``ProcessRunner``).
        sandbox: how user code is sandboxed (``sandbox.probe``); default: probe this host, sandbox if it can.
    """

    name = "local"

    @classmethod
    def from_settings(cls, settings: Settings, sandbox: Sandbox | None = None, **decided: Any) -> LocalExecutor:
        """Sandboxed as the settings say (``sandbox``, the uid range), running jobs with this Python; ``sandbox``:
        the probe another process of this server made (``decided``), else probed here."""
        sandbox = sandbox or probe(
            enabled=settings.sandbox != "off",
            uid_start=settings.sandbox_uid_start,
            uid_count=settings.sandbox_uid_count,
            pythons=[sys.executable],
        )
        executor = cls(sandbox=sandbox)
        executor.network_settings = (settings.job_network, settings.job_egress)
        executor.runs_dir = settings.runs_dir
        return executor

    def __init__(
        self, python: str | None = None, base_env: dict[str, str] | None = None, sandbox: Sandbox | None = None
    ) -> None:
        super().__init__()
        self.runner = ProcessRunner(python, base_env, sandbox)
        self.network_settings: tuple[str, str] | None = None  # (job_network, job_egress), for the banner
        self.runs_dir: Path | None = None  # where the banner's probe tries the holder's overlays
        self._lock = threading.Lock()
        self._preparing: dict[str, str] = {}  # handle -> what its preparation waits for ("" while fetching)
        self._checkpoints: dict[str, tuple[float, datetime | None]] = {}  # handle -> (looked at, last change seen)
        self.code_cache: ObjectCache | None = None
        self.data_cache: TreeCache | None = None

    def bind(self, settings: Settings, objects: ObjectStore, environments: EnvironmentBackend) -> None:
        super().bind(settings, objects, environments)
        cache = settings.data_dir / "cache"
        self.code_cache = ObjectCache(cache / "objects", objects)
        self.data_cache = TreeCache(cache / "datasets", objects, settings.dataset_cache_max_bytes)

    def decided(self) -> dict[str, Any]:
        return {"sandbox": self.sandbox}

    # ---- what the runner knows

    @property
    def sandbox(self) -> Sandbox:
        return self.runner.sandbox

    def isolation(self) -> tuple[bool, str]:
        sandboxed, text = self.runner.isolation()
        if sandboxed and self.network_settings is not None:
            job_network, egress = self.network_settings
            volumes = ""
            if job_network == "private" and self.runs_dir is not None:
                volumes = network.probe_volumes(self.runs_dir, userns=not self.sandbox.per_tenant_uids)
            text += "; network: " + network.describe(job_network, egress, volumes)
        return sandboxed, text

    def sandbox_prefix(self, writable: Sequence[Path], readable: Sequence[Path]) -> list[str] | None:
        return self.runner.sandbox_prefix(writable, readable)

    def port_is_free(self, port: int) -> bool:
        """Nothing on this host is bound to it: an attempt in its own network namespace would not mind, but
        one on the host's network (settings ``job_network: host``, or no sandbox) would."""
        return network.host_port_is_free(port)

    @property
    def inspects_sandboxed(self) -> bool:
        return self.runner.sandbox.enabled

    def inspect_model(
        self, tree: str, artifact: str, fmt: str, timeout: float
    ) -> subprocess.CompletedProcess[str] | None:
        """On this host: sandboxed where jobs are (no network, writing only its work directory), else bare. The
        tree is read where the store keeps it on this host (read-only), else fetched (and verified) into a
        private directory of the requests' scratch (``settings.scratch_dir``, whose sweep removes what a crash
        leaves), removed afterwards. A tree that cannot be fetched is "no signature", as any other failure here."""
        check_artifact_name(artifact)
        sandbox = self.sandbox_prefix if self.inspects_sandboxed else None
        local = self.objects.tree_local_path(tree)
        if local is not None:
            return model_inspect.run_inspect(local / artifact, fmt, timeout, sandbox)
        scratch = self.settings.scratch_dir
        make_private_dirs(scratch)
        with tempfile.TemporaryDirectory(prefix="inspect-", dir=scratch) as tmp:
            try:
                self.objects.get_tree(tree, Path(tmp) / "tree")
            except (DlcloudError, OSError) as exc:  # storage unavailable, damaged, disk full
                log.warning("signature inference could not fetch %s: %s", tree, exc)
                return None
            return model_inspect.run_inspect(Path(tmp) / "tree" / artifact, fmt, timeout, sandbox)

    def reader_prefix(self, readable: Sequence[Path], slot: int | None) -> list[str] | None:
        return self.runner.reader_prefix(readable, slot)

    def _reader_charge(self, cpus: float) -> contextlib.AbstractContextManager[list[str]]:
        """A cgroup with the job's CPU quota for the reader, else ``nice`` (``reader_charge``)."""
        return reader_charge.charged(cpus)

    def build_sandbox(self) -> BuildSandbox | None:
        return self.runner.build_sandbox()

    def environments(self, settings: Settings, objects: ObjectStore) -> LocalVenvBackend:
        """Venvs in ``settings.envs_dir``, built in this executor's build sandbox."""
        return LocalVenvBackend.from_settings(settings, objects, sandbox=self.runner.build_sandbox())

    @property
    def jobs_run_as_root(self) -> bool:
        return self.runner.jobs_run_as_root

    def reap(self) -> None:
        self.runner.reap()

    # ---- where things are

    def _job_dir(self, tenant_id: str, job_id: str) -> Path:
        return self.settings.runs_dir / tenant_id / job_id

    def handle(self, tenant_id: str, job_id: str, attempt: int) -> str:
        """The attempt's directory, absolute: every control plane on this host that shares the database (a
        successor with its own data dir, see control/leader.py) finds the attempt where it runs, and adopts it."""
        return str(self._job_dir(tenant_id, job_id) / f"attempt-{attempt}")

    def attempt_dir(self, handle: str) -> Path:
        """The directory of the attempt ``handle`` names: an absolute path ending in
        ``<tenant-id>/<job-id>/attempt-<n>`` (no ``..``), or that tail alone (under this ``runs_dir``)."""
        m = HANDLE_TAIL_RE.search(handle)
        path = Path(handle)
        if m is None or ".." in path.parts or (path.is_absolute() and m.start() == 0):
            raise ValueError(f"not an attempt handle of the local executor: {handle!r}")
        if not path.is_absolute():
            if m.start() != 0:
                raise ValueError(f"not an attempt handle of the local executor: {handle!r}")
            return self._job_dir(m.group(1), m.group(2)) / f"attempt-{m.group(3)}"
        return path

    @staticmethod
    def _holder(handle: str) -> str:
        """Who pins the attempt's datasets in the cache: ``<job id>.<attempt>``."""
        m = HANDLE_TAIL_RE.search(handle)
        if m is None:
            raise ValueError(f"not an attempt handle of the local executor: {handle!r}")
        return f"{m.group(2)}.{m.group(3)}"

    # ---- start

    def _start(self, handle: str, workload: Workload) -> None:
        attempt_dir = self.attempt_dir(handle)
        with self._lock:
            if handle in self._preparing or (attempt_dir / launcher_mod.WORKLOAD_FILE).exists():
                raise InvalidState(f"attempt {handle} was already started; every attempt needs a new handle")
            if (attempt_dir / launcher_mod.EXIT_FILE).exists():
                raise InvalidState(f"attempt {handle} already ended")
            self._preparing[handle] = ""
        try:
            make_private_dirs(attempt_dir)  # a stop while preparing leaves its marker here
            thread = threading.Thread(
                target=self._prepare_and_run, args=(handle, workload), name=f"prepare-{handle}", daemon=True
            )
            thread.start()
        except BaseException:
            with self._lock:
                self._preparing.pop(handle, None)
            raise

    def _prepare_and_run(self, handle: str, workload: Workload) -> None:
        attempt_dir = self.attempt_dir(handle)
        try:
            for tries in range(1, PREPARE_TRIES + 1):
                try:
                    run = self._prepare(handle, workload, attempt_dir)
                    break
                except StorageError as exc:  # the store is down or slow: wait for it, within bounds
                    log.error("attempt %s: its inputs cannot be read yet (try %d): %s", handle, tries, exc.message)
                    with self._lock:
                        self._preparing[handle] = "waiting for the server's storage to read the job's inputs"
                    if self._stopped_before_start(attempt_dir):
                        return
                    threading.Event().wait(CACHE_RETRY_SECONDS * tries)
            else:
                why = "its code or datasets could not be read: the server's storage failed; ask an administrator"
                self._record_end(attempt_dir, LAUNCH_FAILED, why)
                return
            if run is None or self._stopped_before_start(attempt_dir):
                return
            self.runner.start(run)
        except InvalidState:  # another control plane started it meanwhile (a deposed leader and its successor)
            log.warning("attempt %s was started elsewhere meanwhile", handle)
        except InputsUnavailable as exc:
            log.error("attempt %s cannot start: %s", handle, exc.message)
            self._record_end(attempt_dir, LAUNCH_FAILED, exc.message)
        except Exception as exc:  # an executor thread must leave a record, whatever happened
            log.exception("attempt %s could not be prepared", handle)
            self._record_end(attempt_dir, LAUNCH_FAILED, f"could not be prepared: {type(exc).__name__}")
        finally:
            with self._lock:
                self._preparing.pop(handle, None)

    def _prepare(self, handle: str, w: Workload, attempt_dir: Path) -> Run | None:
        """The Run of the workload: its inputs fetched into this host's caches, its directories decided."""
        assert self.code_cache is not None and self.data_cache is not None
        manifests = check_inputs(self.objects, w)
        code_archive = package = None
        if w.code is not None:
            try:
                local = self.code_cache.path(w.code.storage_key, w.code.sha256)
            except StorageError:
                raise  # the store is down: tried again
            except DlcloudError as exc:
                log.error("attempt %s: code %s: %s", handle, w.code.storage_key, exc.message)
                raise InputsUnavailable("its code is damaged in the server's storage; ask an administrator") from None
            code_archive, package = (local, None) if w.code.kind == "archive" else (None, local)
        data = self._acquire_all(handle, manifests, attempt_dir)
        if data is None:
            return None
        jd = attempt_dir.parent
        restored = self._restore_checkpoints(handle, w, jd / CHECKPOINTS)
        if not restored and not self._copy_checkpoints_from(handle, w, attempt_dir):
            return None
        with self._lock:
            self._preparing[handle] = ""
        env = dict(w.env)
        # in a sandbox each dataset is at /datasets/<name> (where the host keeps it is none of the job's business);
        # bare, the job reads the host's directory
        seen = {name: f"{DATASETS_MOUNT}/{name}" if self.sandbox.enabled else str(path) for name, path in data}
        # in a sandbox the job's directories are at neutral paths (job_view.py); bare, at the host's
        at = job_view.job_dir_at if self.sandbox.enabled else (lambda name: str(jd / name))
        env.update(
            {
                "DLCLOUD_CHECKPOINT_DIR": at(CHECKPOINTS),
                "DLCLOUD_OUTPUT_DIR": at(OUTPUTS),
                TENSORBOARD_ENV: at(TENSORBOARD),
                "DLCLOUD_DATASETS": json.dumps(seen),
            }
        )
        env.update({dataset_env_name(name): path for name, path in seen.items()})
        replicas = tuple(self._replica(r, attempt_dir, at) for r in w.replicas)
        # the job's own directories, kept across attempts; a gang replica writes its event files into its own
        tensorboard = (jd / TENSORBOARD, *(jd / TENSORBOARD / r.name for r in w.replicas))
        same = {f.name: getattr(w, f.name) for f in fields(Workload) if f.name in RUN_FIELDS}  # limits, phases...
        return Run(
            **same,
            attempt_dir=attempt_dir,
            env=env,
            code_archive=code_archive,
            package=package,
            venv=self.environment_backend.location(w.environment) if w.environment else None,
            replicas=replicas,
            data_dirs=(jd / CHECKPOINTS, jd / OUTPUTS, *tensorboard),
            readonly_dirs=() if self.sandbox.enabled else tuple(path for _name, path in data),
            mounts=tuple((path, seen[name]) for name, path in data) if self.sandbox.enabled else (),
            private_network=self.settings.job_network == "private",
            pids_max=self.settings.job_pids_max,
            nproc_max=w.tenant_processes or self.settings.tenant_processes_max,
            disk_max_bytes=self.settings.job_disk_max_bytes,
            publish_address=str(self.settings.job_publish_address),
        )

    def _restore_checkpoints(self, handle: str, w: Workload, dest: Path) -> bool:
        """The job's checkpoint directory missing on this host: the last one the store keeps of it, else (the job
        starts from another's, ``checkpoint_from``) the named job's, when its own directory is not on this host.
        True: the directory is there now (restored, or already there); False: ``_copy_checkpoints_from`` decides."""
        if os.path.lexists(dest):
            return True
        saved = [(w.checkpoints_key, "")]
        source = w.checkpoint_from
        elsewhere = source is not None and JOB_ID_RE.fullmatch(source) and source != w.job_id
        if source is not None and elsewhere and not (self._job_dir(w.tenant_id, source) / CHECKPOINTS).is_dir():
            saved.append((w.checkpoint_from_key, source))
        for key, whose in saved:
            if key is None:
                continue
            with self._lock:
                self._preparing[handle] = f"fetching the checkpoints {'of job ' + whose if whose else 'it saved'}"
            uid = self.sandbox.uid_for(w.sandbox_slot) if self.sandbox.enabled else None
            limits = self.settings.max_archive_members, self.settings.checkpoint_copy_max_bytes
            if saved_checkpoints.restore(self.objects, key, dest, uid, self.settings.scratch_dir, *limits, whose):
                return True
        return False

    def _copy_checkpoints_from(self, handle: str, w: Workload, attempt_dir: Path) -> bool:
        """The job's checkpoint directory as a copy of the one of the job ``w.checkpoint_from`` names (of the same
        tenant), made by the first attempt that finds it missing; later attempts keep the job's own. The named
        job's directory gone (it was deleted), or its checkpoints past a bound, end the attempt; no checkpoints
        there: an empty directory. False: the attempt was stopped meanwhile (its end recorded, nothing copied)."""
        dest = attempt_dir.parent / CHECKPOINTS
        source = w.checkpoint_from
        if source is None or os.path.lexists(dest):
            return True
        if not JOB_ID_RE.fullmatch(source) or source == w.job_id:
            raise CheckpointsUnavailable(f"its checkpoint_from names no other job ({source!r})")
        with self._lock:
            self._preparing[handle] = f"copying the checkpoints of job {source} (checkpoint_from)"
        limit, max_bytes = self.settings.max_archive_members, self.settings.checkpoint_copy_max_bytes
        uid = self.sandbox.uid_for(w.sandbox_slot) if self.sandbox.enabled else None
        stop_request = attempt_dir / launcher_mod.STOP_REQUEST_FILE
        try:
            result = copy_checkpoints(
                self._job_dir(w.tenant_id, source),
                CHECKPOINTS,
                dest,
                uid,
                limit,
                max_bytes=max_bytes,
                stop=stop_request.exists,
            )
        except Stopped:  # its marker is there: the end is recorded as a stop before the start
            self._stopped_before_start(attempt_dir)
            return False
        except SourceGone:
            raise CheckpointsUnavailable(
                f"the job its checkpoint_from names ({source}) was deleted after this job was submitted, and its "
                "checkpoints with it; submit this job again without checkpoint_from, or from another job"
            ) from None
        except TooManyEntries:
            raise CheckpointsUnavailable(
                f"the checkpoints of job {source} (checkpoint_from) hold more than {limit} files and directories, "
                "the most that is copied (max_archive_members)"
            ) from None
        except TooLarge:
            raise CheckpointsUnavailable(
                f"the checkpoints of job {source} (checkpoint_from) take more than {size_text(max_bytes)} of disk, "
                "the most that is copied (checkpoint_copy_max_bytes); submit this job from another job or without "
                "checkpoint_from, or ask an administrator"
            ) from None
        except NoRoom as exc:
            log.error(
                "attempt %s: no room for the checkpoints of job %s: %d bytes needed, %d available, %d kept free",
                handle,
                source,
                exc.need,
                exc.available,
                exc.margin,
            )
            raise CheckpointsUnavailable(
                f"the checkpoints of job {source} (checkpoint_from, {size_text(exc.need)}) do not fit on the "
                f"server's disk, which keeps {size_text(exc.margin)} free; ask an administrator"
            ) from None
        except OSError as exc:
            log.error("attempt %s: copying the checkpoints of job %s failed: %s", handle, source, exc)
            raise CheckpointsUnavailable(
                f"the checkpoints of job {source} (checkpoint_from) could not be copied: {exc.strerror or exc}"
            ) from None
        log.info(
            "attempt %s: checkpoints of job %s copied (%d files, %d of them hard links, %d directories, %d bytes)%s",
            handle,
            source,
            result.files,
            result.linked,
            result.dirs,
            result.bytes,
            "; another preparation of the attempt copied them first: its copy kept" if result.already_there else "",
        )
        if result.left_out:
            shown = ", ".join(f"{path} ({why})" for path, why in sorted(result.left_out.items())[:20])
            log.warning("attempt %s: left out of the checkpoints of job %s: %s", handle, source, shown)
        return True

    def _acquire_all(
        self, handle: str, manifests: list[tuple[DatasetMount, Manifest]], attempt_dir: Path
    ) -> list[tuple[str, Path]] | None:
        """(name, local directory) of each dataset, all pinned for the attempt, or None when it was stopped
        meanwhile. All or nothing: while the cache has no room the attempt pins none (two attempts each holding
        one of the other's datasets would wait for each other forever); datasets that can never fit together
        end it."""
        assert self.data_cache is not None
        cache = self.data_cache
        need = sum(m.size for d, m in manifests if self.objects.tree_local_path(d.storage_key) is None)
        if need > cache.max_bytes:
            raise InputsUnavailable(
                f"its datasets need {need} bytes in this host's dataset cache, which holds {cache.max_bytes} "
                "(dataset_cache_max_bytes); ask an administrator"
            )
        holder = self._holder(handle)
        while True:
            data: list[tuple[str, Path]] = []
            try:
                for mount, manifest in manifests:
                    try:
                        data.append((mount.name, cache.acquire(mount.storage_key, manifest, holder)))
                    except CacheFull:
                        raise
                    except StorageError:
                        raise  # the store is down: tried again by the caller
                    except DlcloudError as exc:
                        log.error("attempt %s: dataset %s: %s", handle, mount.storage_key, exc.message)
                        where = (
                            "its files changed or vanished in the bucket it was registered from"
                            if manifest.source
                            else "it is damaged in the server's storage"
                        )
                        raise InputsUnavailable(
                            f"its dataset {mount.name!r} cannot be read: {where}; ask an administrator"
                        ) from None
                return data
            except CacheFull as exc:  # waits, pinning nothing, until attempts that hold the cache end
                cache.release(holder)
                with self._lock:
                    self._preparing[handle] = f"waiting for room in the dataset cache: {exc.message}"
                if self._stopped_before_start(attempt_dir):
                    return None
                threading.Event().wait(CACHE_RETRY_SECONDS)

    def _stopped_before_start(self, attempt_dir: Path) -> bool:
        """Whether a stop came while the attempt was being prepared (then its end is recorded)."""
        if not (attempt_dir / launcher_mod.STOP_REQUEST_FILE).exists():
            return False
        self._record_end(attempt_dir, -15, "stopped before it started", stopped=True)
        return True

    def _replica(self, r: Replica, attempt_dir: Path, at: Callable[[str], str]) -> Replica:
        """The replica with its own TensorBoard directory, and the directory of its files in place of
        REPLICA_FILES_REF (both as the replica sees them: ``at`` names the job's directories)."""
        tensorboard = {TENSORBOARD_ENV: f"{at(TENSORBOARD)}/{r.name}"}
        if not r.files:
            return replace(r, env={**r.env, **tensorboard})
        host = attempt_dir / REPLICAS_DIR / r.name / job_view.FILES
        files_dir = job_view.FILES_AT if self.sandbox.enabled else str(host)
        env = {
            k: files_dir + v[len(REPLICA_FILES_REF) :] if v.startswith(REPLICA_FILES_REF) else v
            for k, v in r.env.items()
        }
        env["DLCLOUD_REPLICA_FILES"] = files_dir
        return replace(r, env={**env, **tensorboard})

    def _record_end(self, attempt_dir: Path, code: int, message: str, stopped: bool = False) -> None:
        """An attempt that ends before its launcher: exit.json, as the launcher writes it. Never over a record
        that exists, nor for an attempt launched meanwhile (by another control plane)."""
        if (attempt_dir / launcher_mod.WORKLOAD_FILE).exists():
            return
        tmp = attempt_dir / f"{launcher_mod.EXIT_FILE}.new.{os.getpid()}.{threading.get_ident()}"
        launcher_mod.write_json_atomic(
            str(tmp),
            {
                "exit_code": code,
                "finished_at": launcher_mod.utc_now_iso(),
                "timed_out": False,
                "stopped": stopped,
                "message": message,
            },
        )
        try:
            os.link(tmp, attempt_dir / launcher_mod.EXIT_FILE)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()

    # ---- poll / stop

    def _poll(self, handle: str) -> AttemptReport:
        with self._lock:
            waiting = self._preparing.get(handle)
        if waiting is not None:
            return AttemptReport(state="pending", message=waiting)
        report = self.runner.poll(self.attempt_dir(handle))
        if report.state == "running":
            return replace(report, checkpoint_at=self._checkpoint_at(handle, report.started_at))
        with self._lock:
            self._checkpoints.pop(handle, None)
        if report.state in ("exited", "lost") and self.data_cache is not None:
            self.data_cache.release(self._holder(handle))  # its processes are gone: its datasets may go too
        return report

    def _checkpoint_at(self, handle: str, started_at: datetime | None) -> datetime | None:
        """The last change this attempt made to its job's checkpoint directory (``checkpoints.last_change``),
        looked at once every ``CHECKPOINT_LOOK_SECONDS``; None while it made none (a change from before its
        start is an earlier attempt's, or the copy of ``checkpoint_from``: resuming from it is the start)."""
        now = time.monotonic()
        with self._lock:
            seen = self._checkpoints.get(handle)
        if seen is not None and now - seen[0] < CHECKPOINT_LOOK_SECONDS:
            return seen[1]
        changed = last_change(self.attempt_dir(handle).parent, CHECKPOINTS)
        at = datetime.fromtimestamp(changed, UTC) if changed is not None else None
        if at is not None and (started_at is None or at <= started_at):
            at = None
        elif at is not None:  # the job sets its files' times: one in the future only makes it a cheaper victim
            at = min(at, datetime.now(UTC))
        with self._lock:
            self._checkpoints[handle] = (now, at)
        return at

    def _stop(self, handle: str) -> None:
        self.runner.stop(self.attempt_dir(handle))  # while preparing: the marker it leaves stops the launch

    # ---- logs, outputs, removal

    def log_files(self, handle: str) -> dict[str, Path]:
        """The attempt's output.log files by replica name (this executor's own: ``archive_logs`` copies them)."""
        return self.runner.log_files(self.attempt_dir(handle))

    def log_replicas(self, handle: str) -> list[str]:
        return self.runner.log_replicas(self.attempt_dir(handle))

    def open_log(self, handle: str, replica: str) -> LogReader:
        return self.runner.open_log(self.attempt_dir(handle), replica)

    def save_outputs(self, handle: str, key: str, admit: Callable[[int], None] | None = None) -> bool:
        outputs = self.attempt_dir(handle).parent / OUTPUTS
        if outputs.is_symlink() or not outputs.is_dir():
            return False
        # what a model artifact may hold: the bound that keeps a job from making the control plane copy
        # terabytes (a sparse file counts whole) or walk millions of files
        limits = self.settings.max_archive_members, self.settings.max_unpacked_bytes
        manifest, left_out = scan_outputs(outputs, *limits, admit=admit)
        if not manifest.entries and not manifest.empty_dirs and not left_out:
            return False
        self.objects.put_tree(key, outputs, manifest)
        if left_out:
            save_left_out(self.objects, key, left_out)
        return True

    def save_checkpoints(self, handle: str, key: str) -> bool:
        """A snapshot of the job's checkpoint directory into the store (``saved_checkpoints.save``)."""
        limits = self.settings.max_archive_members, self.settings.checkpoint_copy_max_bytes
        job_dir = self.attempt_dir(handle).parent
        return saved_checkpoints.save(self.objects, key, job_dir, CHECKPOINTS, self.settings.scratch_dir, *limits)

    def checkpoints_bytes(self, handle: str) -> int:
        """Allocated blocks, each file once (``checkpoints.measure_checkpoints``), bounded like a copy of them."""
        bound = self.settings.max_archive_members
        size, whole = measure_checkpoints(self.attempt_dir(handle).parent, CHECKPOINTS, bound)
        if not whole:
            log.warning("attempt %s: its checkpoints hold more than %d names: %d bytes counted", handle, bound, size)
        return size

    def archive_logs(self, handle: str, key: str) -> bool:
        files = {
            f"{replica or MAIN_LOG}/{segment.name}": segment
            for replica, log_file in self.log_files(handle).items()
            for segment in log_segments(log_file)
            if segment.is_file() and not segment.is_symlink()  # written by the launcher, never by the job
        }
        if not files:
            return False
        with tempfile.TemporaryDirectory(dir=self.settings.data_dir) as tmp:
            tree = Path(tmp)
            for rel, src in files.items():
                (tree / rel).parent.mkdir(exist_ok=True)
                shutil.copyfile(src, tree / rel)  # a snapshot: the files could still grow (a stop's post phase)
            self.objects.put_tree(key, tree, scan_tree(tree))
        return True

    def _tensorboard_dir(self, handle: str) -> Path | None:
        try:
            return self.attempt_dir(handle).parent / TENSORBOARD
        except ValueError:  # not a handle of this executor: it has no directory of that attempt
            return None

    def endpoints(self, handle: str) -> dict[int, str]:
        try:
            return network.endpoints(self.attempt_dir(handle))
        except ValueError:  # not a handle of this executor
            return {}

    def remove_job(self, tenant_id: str, job_id: str) -> None:
        job_dir = self._job_dir(tenant_id, job_id)
        for attempt in job_dir.glob("attempt-*"):  # an attempt whose end was never polled keeps its work dirs
            job_view.remove_work_dirs(attempt)
        shutil.rmtree(job_dir, ignore_errors=True)
