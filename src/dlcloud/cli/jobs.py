"""dlcloud jobs ..."""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.markup import escape

from dlcloud.cli import metrics as view
from dlcloud.cli.common import action_command, answer_command, client
from dlcloud.cli.output import (
    Output,
    OutputOption,
    console,
    err_console,
    render,
    render_fields,
    short_time,
    transfer_progress,
)
from dlcloud.cli.packing import pack_directory
from dlcloud.client import Client
from dlcloud.errors import InvalidSpec
from dlcloud.schemas.common import format_memory
from dlcloud.schemas.jobs import Job, JobAttempt, JobDetail, JobState, LogSection

app = typer.Typer(help="Submit, watch and manage training jobs.", no_args_is_help=True)
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
FOLLOW_SECONDS = 3.0
CODE_ID_RE = re.compile(r"^c-[a-z0-9]{16}$")


def _load_spec(path: Path) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise InvalidSpec(f"cannot read spec {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidSpec(f"{path} is not valid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidSpec(f"{path} must contain a mapping (name: ..., command: ...), not {type(data).__name__}")
    return data


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidSpec(f"--env takes KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


def _parse_secret_env(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE``, or ``KEY`` alone: the value of KEY in this shell's environment (kept out of shell history)."""
    secret = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not key:
            raise InvalidSpec(f"--secret-env takes KEY=VALUE or KEY, got {item!r}")
        if not sep:
            if key not in os.environ:
                raise InvalidSpec(
                    f"--secret-env {key}: {key} is not set in your environment; export it first or give KEY=VALUE"
                )
            value = os.environ[key]
        secret[key] = value
    return secret


def upload_code(c: Client, code: str, base: Path) -> str:
    """A directory, wheel or sdist is uploaded (with a progress bar); a code id passes through."""
    if CODE_ID_RE.match(code):
        return code
    path = (base / code).expanduser() if not Path(code).is_absolute() else Path(code)
    if not path.exists():
        raise InvalidSpec(f"code {code!r} is neither a directory, a .whl/.tar.gz file nor an uploaded code id (c-...)")
    if path.is_dir():
        packed = pack_directory(path)
        for link in packed.skipped_links:
            err_console.print(f"[yellow]skipped link[/yellow] {link} (links are not uploaded)")
        file, kind, cleanup = packed.archive, "archive", True
        label = f"{path.name}/ ({packed.files} files)"
    elif path.name.endswith(".whl"):
        file, kind, cleanup, label = path, "wheel", False, path.name
    elif path.name.endswith((".tar.gz", ".tgz")):
        file, kind, cleanup, label = path, "sdist", False, path.name
    else:
        raise InvalidSpec(f"code file {path.name} must be a wheel (.whl) or an sdist (.tar.gz)")
    try:
        size = file.stat().st_size
        with transfer_progress() as progress:
            task = progress.add_task(f"uploading {label}", total=size)
            result = c.code.upload(
                file,
                kind=kind,
                filename=file.name if kind != "archive" else "code.tar.gz",
                progress=lambda n: progress.advance(task, n),
            )
    finally:
        if cleanup:
            file.unlink(missing_ok=True)
    return result.id


def _parse_hparams(items: list[str]) -> dict[str, Any]:
    """``--hparam NAME=VALUE``: JSON numbers and true/false as such, anything else as text (``007`` too)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise InvalidSpec(f"--hparam takes NAME=VALUE, got {item!r}")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        out[key] = value if isinstance(value, bool | int | float) else text
    return out


def upload_template_data(c: Client, template: dict[str, Any], dataset: str, base: Path) -> dict[str, Any]:
    """A template section whose ``data`` is a local file (or directory), with that data pushed as the next
    version of the dataset ``dataset`` (the job's name) and ``data`` naming it (``dataset@N``, ``path`` the
    file's name). ``data`` that is no local path is a dataset reference (``REF`` or ``REF:PATH``) and kept."""
    out = dict(template)
    data = str(out.get("data") or "")
    if not data:
        raise InvalidSpec("a template job needs data: --data FILE (uploaded) or --data NAME@VERSION (a dataset)")
    local = (base / data).expanduser() if not Path(data).is_absolute() else Path(data)
    if local.exists():
        size = local.stat().st_size if local.is_file() else None
        with transfer_progress() as progress:
            task = progress.add_task(f"uploading {local.name} to dataset {dataset}", total=size)
            version = c.datasets.push(
                dataset,
                path=local,
                description=f"data of job {dataset}",
                progress=lambda n: progress.advance(task, n),
            )
        err_console.print(f"data {local.name} pushed as dataset {dataset} version {version.version}")
        out["data"] = f"{dataset}@{version.version}"
        if local.is_file():
            out["path"] = local.name
        return out
    ref, sep, path = data.partition(":")
    if sep:
        out["data"], out["path"] = ref, path
    return out


def _print_log_line(line: Any, timestamps: bool, show_section: bool = True) -> None:
    """stdout lines to stdout, stderr and system lines to stderr; pre/post lines marked [pre] / [post]."""
    prefix = f"{line.time} " if timestamps and line.time else ""
    if getattr(line, "replica", ""):
        prefix += f"[{line.replica}] "
    if show_section and line.section != "main":
        prefix += f"[{line.section}] "
    if line.stream == "system":
        err_console.print(f"{escape(prefix)}[dim]\\[dlcloud] {escape(line.text)}[/dim]", markup=True)
    elif line.stream == "stderr":
        sys.stderr.write(prefix + line.text + "\n")
        sys.stderr.flush()
    else:
        sys.stdout.write(prefix + line.text + "\n")
        sys.stdout.flush()


def follow_job(c: Client, name: str, timestamps: bool = False) -> int:
    """Stream logs until the job ends; returns the CLI exit code (0 only if SUCCEEDED)."""
    while True:
        for line in c.jobs.logs(name, follow=True):
            _print_log_line(line, timestamps)
        job = c.jobs.get(name)
        if job.state in TERMINAL:
            break
    color = "green" if job.state == JobState.SUCCEEDED else "red"
    err_console.print(f"job {name}: [{color}]{job.state}[/{color}] ({job.reason})")
    return 0 if job.state == JobState.SUCCEEDED else 1


@app.command("submit")
def submit(
    ctx: typer.Context,
    file: Path | None = typer.Option(None, "-f", "--file", help="Job spec, YAML or JSON ('-' for stdin)."),
    name: str | None = typer.Option(None, "--name", help="Job name (DNS-1123 label, unique in your tenant)."),
    code: str | None = typer.Option(None, "--code", help="Directory to pack, .whl/.tar.gz package, or code id."),
    command: str | None = typer.Option(None, "--command", help="Shell command to run in the code directory."),
    module: str | None = typer.Option(None, "--module", help="Python module to run (python -m MODULE ARGS)."),
    args: list[str] = typer.Option([], "--args", help="Argument for --module (repeat for several)."),
    env: list[str] = typer.Option([], "--env", help="Environment variable KEY=VALUE (repeatable)."),
    secret_env: list[str] = typer.Option(
        [],
        "--secret-env",
        help="Secret environment variable (repeatable): KEY=VALUE, or KEY to take the value from your own "
        "environment, out of shell history. Stored encrypted; describe shows only its name.",
    ),
    datasets: list[str] = typer.Option(
        [],
        "--dataset",
        help="A dataset the job reads (repeatable): NAME, NAME@VERSION, NAME@LABEL or OWNER/NAME@...; read-only "
        "at $DLCLOUD_DATASET_<NAME> in the job.",
    ),
    gpus: int | None = typer.Option(None, "--gpus", help="GPUs per replica."),
    cpu: float | None = typer.Option(None, "--cpu", help="CPUs per replica."),
    memory: str | None = typer.Option(None, "--memory", help="Memory per replica, e.g. 4Gi."),
    priority: int | None = typer.Option(
        None, "--priority", help="Higher runs first (-1000..1000, within your tenant's range)."
    ),
    priority_class: str | None = typer.Option(
        None, "--priority-class", help="A priority class of the server (e.g. low, normal, high)."
    ),
    non_preemptible: bool = typer.Option(
        False, "--non-preemptible", help="Never preempted: runs only inside your tenant's guarantee."
    ),
    max_run_time: str | None = typer.Option(
        None, "--max-run-time", help="Longest an attempt should run, e.g. 2h: lets the scheduler backfill it."
    ),
    timeout: str | None = typer.Option(None, "--timeout", help="Wall-clock limit, e.g. 30m or 2h."),
    max_restarts: int | None = typer.Option(None, "--max-restarts", help="Restarts after a failure."),
    backoff: float | None = typer.Option(None, "--backoff", help="Seconds between restarts."),
    environment: str | None = typer.Option(
        None, "--environment", help="Runtime environment: a built-in or one of 'dlcloud envs list'."
    ),
    template: str | None = typer.Option(
        None,
        "--template",
        help="A no-code template instead of code: mlp, logreg, wide-deep, cnn1d, cnn2d, rnn, lstm (docs/templates.md).",
    ),
    data: str | None = typer.Option(
        None,
        "--data",
        help="Template data: a local CSV/LibSVM file (pushed as a version of the dataset named after the job), "
        "or a dataset NAME@VERSION (NAME@VERSION:PATH for one file of several).",
    ),
    label: str | None = typer.Option(None, "--label", help="Template, CSV: the label column (default: the last)."),
    data_format: str | None = typer.Option(
        None, "--data-format", help="Template: csv or libsvm (default: libsvm for .libsvm/.svm files, else csv)."
    ),
    validation_split: float | None = typer.Option(
        None, "--validation-split", help="Template: share of the examples held out for validation (default 0.2)."
    ),
    task: str | None = typer.Option(None, "--task", help="Template: classification (default) or regression."),
    hparam: list[str] = typer.Option(
        [],
        "--hparam",
        help="Hyperparameter NAME=VALUE (repeatable): a template's (layers=3), or any job's, which gets them as "
        "$DLCLOUD_HPARAMS (JSON).",
    ),
    register_model: str | None = typer.Option(
        None,
        "--register-model",
        help="Register a model version under this name when the job succeeds: a template's export, or "
        "'register_model.path' of the spec for other jobs.",
    ),
    checkpoint_from: str | None = typer.Option(
        None,
        "--checkpoint-from",
        metavar="JOB",
        help="Start from the checkpoints of JOB, one of your tenant's jobs that has ended: this job's "
        "$DLCLOUD_CHECKPOINT_DIR starts as a copy of JOB's (e.g. to train a finished job for more epochs).",
    ),
    publish: list[int] = typer.Option(
        [],
        "--publish",
        metavar="PORT",
        help="A port the job serves on in its own network, to reach from this host while it runs: "
        "'jobs describe' shows where (repeatable, at most 8).",
    ),
    follow: bool = typer.Option(False, "--follow", help="Stream the logs until the job ends."),
    output: Output = OutputOption,
) -> None:
    """Submit a training job from a spec file and/or flags (flags win).

    Examples:

      dlcloud jobs submit -f job.yaml --follow
      dlcloud jobs submit --name mnist --code ./trainer --command "python train.py --epochs 3" --gpus 1
      dlcloud jobs submit --name pkg --code dist/trainer-0.1-py3-none-any.whl --module trainer.task --args --lr=0.1
      dlcloud jobs submit --name bert --code . --command "python finetune.py" --environment nlp
      dlcloud jobs submit -f job.yaml --secret-env HF_TOKEN --secret-env WANDB_API_KEY=abc123
      dlcloud jobs submit --name train --code . --command "python train.py" --dataset clicks@production
      dlcloud jobs submit --template mlp --data train.csv --label y --hparam layers=3 --register-model churn
      dlcloud jobs submit --name ctr --template wide-deep --data clicks@3 --data-format libsvm
      dlcloud jobs submit -f job.yaml --priority-class high --max-run-time 2h --non-preemptible
      dlcloud jobs submit -f job.yaml --name mnist-more --env EPOCHS=6 --checkpoint-from mnist
      dlcloud jobs submit --name board --code . --command "tensorboard --logdir runs --port 6006" --publish 6006

    Secrets (--secret-env or 'secret_env:' in the spec) reach the job as environment variables, like --env.

    They are stored encrypted and never shown again: describe and -o json show each name with "***".

    --secret-env HF_TOKEN sends the value HF_TOKEN has in your own environment (kept out of shell history).
    """
    options = dict(locals())  # every option by its parameter name, for _apply_options
    spec, base = _read_spec(file)
    _apply_options(spec, options)
    if not spec.get("name"):
        raise InvalidSpec("a job needs a name: use --name or 'name:' in the spec")
    c = client(ctx)
    if spec.get("template"):
        spec["template"] = upload_template_data(c, spec["template"], str(spec["name"]), base)
    if spec.get("code"):
        spec["code"] = upload_code(c, str(spec["code"]), base)
    job = c.jobs.submit(spec)
    if output == Output.json and not follow:
        render(job, output, [])
        return
    err_console.print(f"job [bold]{job.name}[/bold] submitted ({job.id}), state {job.state}")
    if follow:
        raise typer.Exit(follow_job(c, job.name))


def _read_spec(file: Path | None) -> tuple[dict[str, Any], Path]:
    """The spec file's mapping (empty without one) and the directory its relative paths start from."""
    if file is None:
        return {}, Path.cwd()
    return _load_spec(file), Path.cwd() if str(file) == "-" else file.resolve().parent


# options of jobs submit that replace the spec's field of the same name
SCALAR_OPTIONS = (
    "name",
    "command",
    "module",
    "priority",
    "priority_class",
    "max_run_time",
    "timeout",
    "environment",
    "checkpoint_from",
    "code",
)
# an option given drops the field it conflicts with from the spec file
CONFLICTS = (
    ("priority", "priority_class"),
    ("priority_class", "priority"),
    ("module", "command"),
    ("command", "module"),
)


def _apply_options(spec: dict[str, Any], o: dict[str, Any]) -> None:
    """The options of ``jobs submit`` (``o``, by parameter name) over the spec file's ``spec``: options win; lists
    and mappings (env, datasets, hparams, ...) add to the file's."""
    for key in SCALAR_OPTIONS:
        if o[key] is not None:
            spec[key] = o[key]
    for option, dropped in CONFLICTS:
        if o[option] is not None:
            spec.pop(dropped, None)
    if o["non_preemptible"]:
        spec["preemptible"] = False
    if o["args"]:
        spec["args"] = list(o["args"])
    for key, given in (("datasets", o["datasets"]), ("publish", o["publish"])):
        if given:
            spec[key] = [*(spec.get(key) or []), *given]
    for key, pairs in (
        ("env", _parse_env(o["env"])),
        ("secret_env", _parse_secret_env(o["secret_env"])),
        ("hparams", _parse_hparams(o["hparam"])),
    ):
        if pairs:
            spec[key] = {**(spec.get(key) or {}), **pairs}
    _merge_given(spec, "resources", {"gpus": o["gpus"], "cpu": o["cpu"], "memory": o["memory"]})
    _merge_given(spec, "restart", {"max_restarts": o["max_restarts"], "backoff_seconds": o["backoff"]})
    template = {key: o[key] for key in ("data", "label", "data_format", "validation_split", "task")}
    _merge_given(spec, "template", {"name": o["template"], **template})
    section = spec.get("template")
    if section and not spec.get("name") and section.get("name"):
        spec["name"] = f"{section['name']}-{secrets.token_hex(3)}"
    if o["register_model"] is not None:
        spec["register_model"] = {**(spec.get("register_model") or {}), "name": o["register_model"]}


def _merge_given(spec: dict[str, Any], key: str, values: dict[str, Any]) -> None:
    """The ``values`` that are not None over the mapping ``spec[key]``, set where the result is not empty."""
    merged = dict(spec.get(key) or {})
    merged.update({k: v for k, v in values.items() if v is not None})
    if merged:
        spec[key] = merged


@app.command("list")
def list_jobs(
    ctx: typer.Context,
    state: list[str] = typer.Option([], "--state", help="Only jobs in this state (repeatable)."),
    limit: int = typer.Option(100, "--limit", help="At most this many jobs, newest first."),
    output: Output = OutputOption,
) -> None:
    """List your tenant's jobs, newest first.

    Examples:

      dlcloud jobs list

      dlcloud jobs list --state RUNNING --state QUEUED -o json
    """
    jobs = client(ctx).jobs.list(states=[s.upper() for s in state] or None, limit=limit)
    render(
        jobs,
        output,
        [
            ("NAME", "name"),
            ("STATE", "state"),
            ("USER", "user"),
            ("GPUS", "gpus"),
            ("CPUS", "cpus"),
            ("ATTEMPT", "attempt"),
            ("EXIT", "exit_code"),
            ("CREATED", lambda j: short_time(j.created_at)),
            ("REASON", "reason"),
        ],
    )


@app.command("describe")
def describe(
    ctx: typer.Context, name: str = typer.Argument(..., help="Job name or id."), output: Output = OutputOption
) -> None:
    """Show a job: state, resources, queue position and wait reason, where its published ports are reached
    while it runs (Endpoints), attempts and events.

    Example:

      dlcloud jobs describe mnist
    """
    job = client(ctx).jobs.get(name)
    if output == Output.json:
        render(job, output, [])
        return
    render_fields(job, output, _job_fields(job))
    if job.attempts:
        console.print()
        _print_attempts(job.attempts)
    console.print()
    render(
        job.events,
        Output.table,
        [("TIME", lambda e: short_time(e.time)), ("FROM", "from_state"), ("TO", "to_state"), ("REASON", "reason")],
        title="Events",
    )


def _job_fields(job: JobDetail) -> list[tuple[str, Any]]:
    """The lines of ``jobs describe`` above its tables."""
    fields: list[tuple[str, Any]] = [
        ("Name", job.name),
        ("Id", job.id),
        ("User", job.user),
        ("State", job.state),
        ("Reason", job.reason),
        ("Command", job.command),
        ("Code", job.code),
        ("Environment", job.environment + (f" ({job.environment_hash[:12]})" if job.environment_hash else "")),
        ("Resources", f"{job.gpus} GPU, {job.cpus:g} CPU, {format_memory(job.memory)}"),
        ("Priority", f"{job.priority}" + (f" ({job.priority_class})" if job.priority_class else "")),
        ("Preemptible", "yes" if job.preemptible else "no"),
        ("Attempt", f"{job.attempt} (restarts {job.restarts}, preemptions {job.preemptions})"),
        ("Exit code", job.exit_code),
        ("Created", short_time(job.created_at)),
        ("Started", short_time(job.started_at)),
        ("Finished", short_time(job.finished_at)),
    ]
    if job.queue_position is not None:
        fields.append(("Queue position", job.queue_position))
        fields.append(("Waiting for", job.wait_reason))
        fields.append(("Estimated start", short_time(job.estimated_start)))
    if job.preempt_requested:
        fields.append(("Being preempted", job.preempt_reason))
    if job.endpoints:
        fields.append(("Endpoints", ", ".join(f"{port} -> {at}" for port, at in job.endpoints.items())))
    return fields


def _print_attempts(attempts: list[JobAttempt]) -> None:
    """The attempts of a job, then the replicas of each (a distributed job's)."""
    render(
        attempts,
        Output.table,
        [
            ("ATTEMPT", "number"),
            ("HOST", "host"),
            ("GPUS", lambda a: ",".join(map(str, a.gpus)) or "-"),
            ("STARTED", lambda a: short_time(a.started_at)),
            ("FINISHED", lambda a: short_time(a.finished_at)),
            ("EXIT", "exit_code"),
            ("OUTCOME", "outcome"),
            ("CHECKPOINT", lambda a: short_time(a.checkpoint_at)),
        ],
        title="Attempts",
    )
    # a row per replica with its attempt's number: a view of the CLI's own, so a plain mapping
    replicas = [{**r.model_dump(mode="json"), "attempt": a.number} for a in attempts for r in a.replicas]
    if not replicas:
        return
    console.print()
    render(
        replicas,
        Output.table,
        [
            ("ATTEMPT", "attempt"),
            ("REPLICA", "name"),
            ("STATE", "state"),
            ("HOST", "host"),
            ("PORTS", lambda r: ",".join(map(str, r["ports"])) or "-"),
            ("GPUS", lambda r: ",".join(map(str, r["gpus"])) or "-"),
            ("EXIT", "exit_code"),
        ],
        title="Replicas",
    )


def queue(
    ctx: typer.Context,
    limit: int = typer.Option(1000, "--limit", help="At most this many jobs, from the head of the queue."),
    output: Output = OutputOption,
) -> None:
    """Show the waiting jobs in the scheduler's order: why each waits and when it should start.

    A platform admin sees every tenant's jobs; anyone else their own tenant's.

    Examples:

      dlcloud queue

      dlcloud queue -o json
    """
    rows = client(ctx).jobs.queue(limit=limit)
    render(
        rows,
        output,
        [
            ("POS", "position"),
            ("TENANT", "tenant"),
            ("NAME", "name"),
            ("USER", "user"),
            ("PRIORITY", lambda r: f"{r.priority}" + (f" ({r.priority_class})" if r.priority_class else "")),
            ("GPUS", "gpus"),
            ("WAITING", lambda r: _waited(r.wait_seconds)),
            ("EST. START", lambda r: short_time(r.estimated_start)),
            ("PREEMPTED", "preemptions"),
            ("WAIT REASON", "wait_reason"),
        ],
    )


def _waited(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


@app.command("logs")
def logs(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Job name or id."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep streaming until the job ends."),
    tail: int | None = typer.Option(None, "--tail", help="Only the last N lines (then follow, with -f)."),
    timestamps: bool = typer.Option(False, "--timestamps", help="Prefix each line with its UTC time."),
    section: LogSection = typer.Option(
        LogSection.ALL,
        "--section",
        help="Only the lines of pre_command (pre), the command (main) or post_command (post).",
        case_sensitive=False,
    ),
    replica: str | None = typer.Option(
        None, "--replica", help="Only this replica of a distributed job (worker-1, chief-0, launcher-0)."
    ),
    all_replicas: bool = typer.Option(
        False, "--all", help="All replicas interleaved by time, each line marked [worker-1] (the default)."
    ),
) -> None:
    """Print a job's logs (stdout, stderr and dlcloud's own lines), across all attempts.

    Lines of pre_command and post_command are marked [pre] and [post] unless --section picks one phase.
    A distributed job's replicas are interleaved by time, each line marked with its replica ([worker-1]),
    unless --replica picks one.

    A job keeps the end of its log (the last 256 MiB by default); without --follow at most the last 4 MiB
    are printed. A "[dlcloud] log truncated: ..." line says where earlier lines were left out.

    Examples:

      dlcloud jobs logs mnist --follow

      dlcloud jobs logs mnist --tail 100 --timestamps

      dlcloud jobs logs mnist --section post

      dlcloud jobs logs mnist-ddp --replica worker-1
    """
    if replica and all_replicas:
        raise typer.BadParameter("give --replica or --all, not both")
    c = client(ctx)
    for line in c.jobs.logs(name, follow=follow, tail=tail, section=section.value, replica=replica):
        _print_log_line(line, timestamps, show_section=section == LogSection.ALL)


JOB = ("name", "Job name or id.")  # the argument of cancel and delete, as the help names it


@answer_command(app, "cancel", JOB, err_console, lambda job: f"job {job.name}: {job.reason or job.state}")
def cancel(c: Client, name: str) -> Job:
    """Cancel a job: queued jobs end at once; running ones get SIGTERM, then SIGKILL after the grace period,
    then their post_command runs.

    Example:

      dlcloud jobs cancel mnist
    """
    return c.jobs.cancel(name)


@action_command(app, "delete", JOB, "job {} deleted")
def delete(c: Client, name: str) -> None:
    """Delete a finished job with its logs and files (cancel a running job first).

    Example:

      dlcloud jobs delete mnist
    """
    c.jobs.delete(name)


class MetricsOutput(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


@app.command("metrics")
def metrics(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Job name or id."),
    metric: list[str] = typer.Option([], "-m", "--metric", help="Only this metric (repeatable); default all."),
    attempt: int | None = typer.Option(None, "--attempt", min=1, help="Only this attempt; default all."),
    replica: str | None = typer.Option(
        None, "--replica", help="Only this replica of a distributed job (worker-1); default all."
    ),
    max_points: int = typer.Option(
        1000, "--max-points", min=1, max=10000, help="At most this many points per series; longer ones downsampled."
    ),
    output: MetricsOutput = typer.Option(
        MetricsOutput.table, "-o", "--output", help="table (a chart per metric and a summary), json or csv."
    ),
    follow: bool = typer.Option(False, "-f", "--follow", help="Redraw every few seconds until the job ends."),
) -> None:
    """Show a job's metrics (reported with dlcloud.report): a line chart per metric, one line per attempt and
    replica, and a table of each series' last value, min and max.

    On a terminal narrower than 60 columns, or when the output is not a terminal, only the table is printed.
    -o csv prints the rows metric,attempt,replica,step,value,time; -o json the API's answer.

    Examples:

      dlcloud jobs metrics mnist

      dlcloud jobs metrics mnist -m loss -m val_accuracy --follow

      dlcloud jobs metrics mnist-ddp --replica worker-1 --attempt 2

      dlcloud jobs metrics mnist -o csv > metrics.csv
    """
    if follow and output != MetricsOutput.table:
        raise typer.BadParameter("--follow redraws the chart: use it without -o json/csv", param_hint="--follow")
    c = client(ctx)
    while True:
        # the state first: metrics that arrive before the job ends are in the last drawing
        state = c.jobs.get(name).state if follow else None
        answer = c.jobs.metrics(name, metrics=metric, attempt=attempt, replica=replica, max_points=max_points)
        if output == MetricsOutput.json:
            render(answer, Output.json, [])
        elif output == MetricsOutput.csv:
            view.write_csv(answer, sys.stdout)
        else:
            if follow and console.is_terminal:
                console.clear()
            view.show(answer)
        if not follow:
            return
        if state in TERMINAL:
            err_console.print(f"job {name}: {state}")
            return
        time.sleep(FOLLOW_SECONDS)
