"""dlcloud tune ...: hyperparameter studies (docs/tuning.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from dlcloud.cli.common import answer_command, client
from dlcloud.cli.jobs import _load_spec, upload_code, upload_template_data
from dlcloud.cli.output import Output, OutputOption, console, print_json, render, render_fields, short_time
from dlcloud.client import Client
from dlcloud.errors import InvalidSpec
from dlcloud.schemas.studies import Study, template_trial

app = typer.Typer(help="Tune hyperparameters: studies of trial jobs (grid, random, TPE, ASHA).", no_args_is_help=True)


STUDY = ("name", "Study name or id.")  # the argument of stop and resume, as the help names it


def _value(v: Any) -> str:
    return "-" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


def _params(p: dict[str, Any]) -> str:
    return " ".join(f"{k}={_value(v)}" for k, v in p.items())


def _progress(s: Study) -> str:
    t = s.trials
    return (
        f"{s.trials_started}/{s.max_trials} started: {t.running} running, "
        + (f"{t.paused} paused, " if t.paused else "")
        + f"{t.completed} completed, "
        f"{t.pruned} pruned, {t.failed} failed, {t.stopped} stopped"
        + (f", {t.duplicate} duplicate(s) skipped" if t.duplicate else "")
    )


def _best(s: Study) -> str:
    b = s.best
    return "-" if not b else f"trial {b.number}: {_value(b.value)} ({_params(b.params)})"


def _upload_trial_files(c: Client, trial: dict[str, Any], study: Any, base: Path) -> dict[str, Any]:
    """The trial with its local files uploaded (paths relative to ``base``, the study file's directory): a
    ``code:`` directory, once; a template's local ``data`` file, pushed as the next version of the dataset named
    after the study, which every trial then reads (``STUDY@N``)."""
    out = dict(trial)
    if isinstance(out.get("code"), str):
        out["code"] = upload_code(c, out["code"], base)
    template = out.get("template")
    if isinstance(template, dict) and isinstance(template.get("data"), str):
        if not isinstance(study, str) or not study:
            raise InvalidSpec("a study needs a name: 'name:' in the study file")
        out["template"] = upload_template_data(c, template, study, base)
    return out


@app.command("submit")
def submit(
    ctx: typer.Context,
    file: Path = typer.Option(..., "-f", "--file", help="Study file, YAML or JSON ('-' for stdin)."),
    output: Output = OutputOption,
) -> None:
    """Submit a study: trial jobs over a search space, toward an objective metric.

    Examples:

      dlcloud tune submit -f study.yaml

      dlcloud tune submit -f study.yaml -o json | jq .id

    A study file (docs/tuning.md):

      name: lr-search
      algorithm: tpe                      # grid | random | tpe | asha
      objective: {metric: val_loss, direction: minimize, step: last}   # step: last | best | N
      max_trials: 20
      parallel_trials: 2
      budget: {seconds: 3600}             # optional; or gpu_hours: 4
      args: true                          # also pass --lr=... --layers=... to the command
      trial: {code: ./trainer, command: python train.py, resources: {gpus: 1}}
      search_space:
        lr: {type: loguniform, low: 1.0e-4, high: 0.3}
        layers: {type: int, low: 1, high: 4}
        optimizer: {type: categorical, values: [sgd, adam]}
        momentum: {type: uniform, low: 0.5, high: 0.99, when: {optimizer: sgd}}

    Each trial is a job named <study>-<number>; its parameters are in $DLCLOUD_HPARAMS (JSON). It reports the
    objective with dlcloud.report(step=..., val_loss=...). A trial's 'code:' directory is uploaded once.

    A no-code template trial (docs/templates.md); its sampled parameters are the template's hparams:

      trial: {template: mlp, data: ./train.csv, label: y}

    A local 'data' file (relative to the study file) is pushed once as the next version of the dataset named
    after the study, and every trial reads that version; 'data: NAME@VERSION' reads an existing dataset.
    """
    spec = _load_spec(file)
    trial = spec.get("trial")
    if trial is not None and not isinstance(trial, dict):
        raise InvalidSpec("trial must be a job spec (a mapping: command: ..., resources: ...)")
    base = file.resolve().parent if str(file) != "-" else Path.cwd()
    with client(ctx) as c:
        if trial is not None:
            spec["trial"] = _upload_trial_files(c, template_trial(trial), spec.get("name"), base)
        study = c.studies.submit(spec)
    if output == Output.json:
        print_json(study)
        return
    console.print(f"study [bold]{study.name}[/bold] submitted ({study.id}): {study.state}")
    console.print(f"watch it with: dlcloud tune describe {study.name}")


@app.command("list")
def list_studies(ctx: typer.Context, output: Output = OutputOption) -> None:
    """List your tenant's studies.

    Examples:

      dlcloud tune list

      dlcloud tune list -o json | jq '.[] | {name, state, best}'
    """
    with client(ctx) as c:
        studies = c.studies.list()
    render(
        studies,
        output,
        [
            ("NAME", "name"),
            ("STATE", "state"),
            ("ALGORITHM", "algorithm"),
            ("TRIALS", lambda s: f"{s.trials_started}/{s.max_trials}"),
            ("BEST", lambda s: _value(s.best.value) if s.best else None),
            ("CREATED", lambda s: short_time(s.created_at)),
        ],
    )


@app.command("describe")
def describe(
    ctx: typer.Context, name: str = typer.Argument(..., help="Study name or id."), output: Output = OutputOption
) -> None:
    """A study's state, progress and the best trial so far.

    Examples:

      dlcloud tune describe lr-search

      dlcloud tune describe lr-search -o json | jq .trials
    """
    with client(ctx) as c:
        s = c.studies.get(name)
    o = s.objective
    render_fields(
        s,
        output,
        [
            ("Name", s.name),
            ("State", f"{s.state} ({s.reason})" if s.reason else s.state),
            ("Algorithm", f"{s.algorithm} (seed {s.seed})"),
            ("Objective", f"{o['direction']} {o['metric']} (step: {o['step']})"),
            ("Progress", _progress(s)),
            ("Parallel", s.parallel_trials),
            ("Best", _best(s)),
            ("Elapsed", f"{s.elapsed_seconds:.0f} s"),
            ("GPU-hours", f"{s.gpu_hours:.3f}"),
            ("Created", short_time(s.created_at)),
            ("Finished", short_time(s.finished_at)),
        ],
    )


@app.command("trials")
def trials(
    ctx: typer.Context, name: str = typer.Argument(..., help="Study name or id."), output: Output = OutputOption
) -> None:
    """A study's trials: state, parameters, objective value, job.

    A pausing ASHA trial shows the step its job trains to (BUDGET) and how many jobs it ran (JOBS: 1, then one
    more each time it was promoted and resumed from its checkpoint); -o json lists them.

    Examples:

      dlcloud tune trials lr-search

      dlcloud tune trials lr-search -o json | jq '.[] | select(.state == "COMPLETED") | .value'
    """
    with client(ctx) as c:
        rows = c.studies.trials(name)
    render(
        rows,
        output,
        [
            ("#", "number"),
            ("STATE", "state"),
            ("VALUE", lambda t: _value(t.value)),
            ("STEP", "last_step"),
            ("BUDGET", lambda t: _value(t.budget)),
            ("PARAMS", lambda t: _params(t.params)),
            ("JOB", "job"),
            ("JOBS", lambda t: str(len(t.jobs))),
            ("REASON", "reason"),
        ],
    )


@app.command("best")
def best(
    ctx: typer.Context, name: str = typer.Argument(..., help="Study name or id."), output: Output = OutputOption
) -> None:
    """The best trial so far; -o json prints its parameters, ready to reuse.

    Examples:

      dlcloud tune best lr-search

      dlcloud tune best lr-search -o json > best-params.json
    """
    with client(ctx) as c:
        b = c.studies.best(name)
    if output == Output.json:
        print_json(b.params)
        return
    console.print(f"trial {b.number} (job {b.job or '-'}): {_value(b.value)}")
    for k, v in b.params.items():
        console.print(f"  {k} = {_value(v)}")


@answer_command(
    app, "stop", STUDY, console, lambda s: f"study {s.name}: {s.state} (its running trials are being cancelled)"
)
def stop(c: Client, name: str) -> Study:
    """Stop a study: its running trials are cancelled (SIGTERM, then their grace period).

    Examples:

      dlcloud tune stop lr-search
    """
    return c.studies.stop(name)


@answer_command(app, "resume", STUDY, console, lambda s: f"study {s.name}: {s.state}")
def resume(c: Client, name: str) -> Study:
    """Continue a stopped study where it stopped (its stopped trials are not run again).

    Examples:

      dlcloud tune resume lr-search
    """
    return c.studies.resume(name)
