"""Studies over a no-code template (docs/tuning.md, docs/templates.md): the study file's short form
(``trial: {template: mlp, data: ./train.csv, label: y}``) through ``dlcloud tune submit``, which pushes the local
file once as a dataset version every trial reads; the sampled parameters are the template's hparams, checked
against its catalog at submit. Real studies on a separable synthetic CSV (random, ASHA on the trainer's
per-epoch ``val_accuracy``, grid), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from dlcloud.services.studies import run_spec, trial_job_spec
from dlcloud.store.rows import StudyRow
from tests.conftest import Env, assert_api_error
from tests.integration.test_studies import API, assert_each_trial_ran_once, cli, max_overlap, wait_study
from tests.integration.test_templates import template_env  # noqa: F401  (the fixture)
from tests.unit.templates.test_template_trainer import dense_csv

SPACES = {
    "random": {
        "lr": {"type": "loguniform", "low": 0.01, "high": 0.3},
        "units": {"type": "categorical", "values": [4, 8]},
    },
    "tpe": {
        "lr": {"type": "loguniform", "low": 0.01, "high": 0.3},
        "units": {"type": "categorical", "values": [4, 8]},
    },
    # one learning rate too small to move the weights in 3 epochs: ASHA has something to prune
    "asha": {"lr": {"type": "categorical", "values": [1e-6, 1e-5, 0.1, 0.3]}},
    "grid": {"units": {"type": "categorical", "values": [4, 8]}},
}


def study_file(tmp_path: Path, name: str, algorithm: str, **extra: object) -> Path:
    """A study over template mlp on ./train.csv (a local file beside the study file), 3 epochs a trial."""
    dense_csv(tmp_path / "train.csv", n=80)
    study = {
        "name": name,
        "algorithm": algorithm,
        "objective": {"metric": "val_accuracy", "direction": "maximize"},
        "max_trials": 3,
        "parallel_trials": 2,
        "seed": 5,
        "trial": {
            "template": "mlp",
            "data": "./train.csv",
            "label": "y",
            "hparams": {"epochs": 3, "patience": 0, "batch_size": 16},
            "resources": {"cpu": 0.5, "memory": "1Gi"},
        },
        "search_space": SPACES[algorithm],
        **extra,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


@pytest.mark.parametrize("algorithm", ["random", "tpe", "asha", "grid"])
def test_a_study_over_a_template_reads_one_dataset_version(
    template_env: Env,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    algorithm: str,
) -> None:
    env, c = template_env, template_env.admin
    name = f"tpl-{algorithm}"
    extra: dict = {}
    if algorithm == "asha":  # Optuna's pruner, one trial at a time: each is judged against the ones before it
        # (pausing, the default for templates, has its own test below)
        extra = {"early_stopping": {"min_resource": 1, "reduction_factor": 2, "pause": False}, "parallel_trials": 1}
    path = study_file(tmp_path, name, algorithm, **extra)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path.parent)  # the data path is relative to the study file, not to here
    submitted = json.loads(cli(env, monkeypatch, "tune", "submit", "-f", str(path), "-o", "json"))
    assert submitted["state"] == "RUNNING"
    # the short form became the job spec's template section, its data the version the CLI pushed
    trial_spec = c.studies.get(name).spec["trial"]
    assert trial_spec["template"] == {"name": "mlp", "data": f"{name}@1", "path": "train.csv", "label": "y"}
    assert [v.version for v in c.datasets.versions(name)] == [1]

    s = wait_study(c, name, timeout=120)
    trials = c.studies.trials(name)
    failed = [(t.reason, [x.text for x in c.jobs.logs(t.job)][-5:]) for t in trials if t.state == "FAILED"]
    assert s.state == "COMPLETED" and not failed, (s, failed)
    ran = [t for t in trials if t.job]
    if algorithm == "grid":  # the 2-point grid, each point once
        assert "grid" in s.reason and s.trials_started == 2
        assert sorted(t.params["units"] for t in ran) == [4, 8]
    else:
        assert s.trials_started == 3 and "max_trials" in s.reason
    assert {t.state for t in ran} <= {"COMPLETED", "PRUNED"}
    assert s.trials.completed + s.trials.pruned == len(ran)
    assert s.trials.pruned == sum(t.state == "PRUNED" for t in ran)
    if algorithm == "asha":  # a trial behind a better one at its rung is stopped there
        assert s.trials.pruned >= 1, [(t.params, t.state, t.reason) for t in trials]
    for t in ran:
        job = c.jobs.get(t.job)
        assert job.command.startswith("python -m dlcloud.templates.train --template mlp")
        # every trial reads the one version; its sampled parameters are the template's hparams
        assert job.spec["template"]["data"] == f"{name}@1"
        assert job.spec["hparams"] == {"epochs": 3, "patience": 0, "batch_size": 16, **t.params}
        logs = "".join(x.text + "\n" for x in c.jobs.logs(t.job))
        for k, v in t.params.items():
            assert f'"{k}": {json.dumps(v)}' in logs  # DLCLOUD_HPARAMS as the trainer read it
        if t.state == "COMPLETED":
            assert 0.0 <= t.value <= 1.0 and t.last_step == 3  # val_accuracy at the last epoch
        else:  # pruned at a rung; a 3-epoch trial may finish before its SIGTERM lands
            assert t.reason.startswith("pruned at step") and t.value is not None, t
            assert job.state in ("CANCELLED", "SUCCEEDED"), job
    assert max_overlap(c, trials) <= 2
    assert_each_trial_ran_once(c, name, trials)
    best = json.loads(cli(env, monkeypatch, "tune", "best", name, "-o", "json"))
    assert set(best) == set(SPACES[algorithm])
    assert c.studies.best(name).value == max(t.value for t in ran if t.state == "COMPLETED")


def _template_study(**trial_and_space: object) -> dict:
    return {
        "name": "tpl",
        "algorithm": "random",
        "objective": {"metric": "val_accuracy", "direction": "maximize"},
        "max_trials": 2,
        "trial": {"template": "mlp", "data": "blobs@1", "label": "y"},
        "search_space": {"units": {"type": "int", "low": 4, "high": 16}},
        **trial_and_space,
    }


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (
            {"search_space": {"momentum": {"type": "uniform", "low": 0.1, "high": 0.9}}},
            "search_space.momentum: template mlp has no hparam momentum; its hparams are: layers, units, dropout",
        ),
        (
            {"search_space": {"units": {"type": "uniform", "low": 4, "high": 16}}},
            "search_space.units: hparam units must be int 1..4096; sample it with type: int",
        ),
        (
            {"search_space": {"layers": {"type": "int", "low": 1, "high": 40}}},
            "search_space.layers: hparam layers must be int 1..16, got 40",
        ),
        (
            {"search_space": {"activation": {"type": "categorical", "values": ["relu", "swish"]}}},
            "search_space.activation: hparam activation must be one of relu, tanh, gelu, sigmoid, got 'swish'",
        ),
        (
            {"trial": {"template": "mlp", "data": "blobs@1", "hparams": {"epochs": 0}}},
            "trial.hparams: hparam epochs must be int 1..1000, got 0",
        ),
        ({"trial": {"template": "gpt", "data": "blobs@1"}}, "trial.template: unknown template 'gpt'; templates: mlp"),
        ({"trial": {"template": "mlp", "data": "blobs@1", "command": "true"}}, "leave 'command' and 'module' out"),
        ({"args": True}, "args: a template trial reads its hparams"),
        ({"trial": {"template": "mlp", "data": "nothing@1"}}, "dataset 'nothing' not found"),
        (  # a pausing study (the default for templates) ranks at every rung; best_* comes only at the end
            {"algorithm": "asha", "objective": {"metric": "best_val_accuracy", "direction": "maximize"}},
            "objective.metric: a template reports best_val_accuracy only when its training ends",
        ),
    ],
)
def test_a_template_trial_is_checked_against_its_catalog_at_submit(
    env: Env, tmp_path: Path, change: dict, fragment: str
) -> None:
    env.admin.datasets.push("blobs", path=dense_csv(tmp_path / "train.csv", n=20))
    resp = env.signed(env.admin_creds, "POST", f"{API}/studies", _template_study(**change))
    status, code = (404, "dataset_not_found") if "not found" in fragment else (400, "invalid_spec")
    err = assert_api_error(resp, status, code)
    assert fragment in err["message"], err
    assert env.admin.studies.list() == []


def test_a_template_trial_reads_the_dataset_version_named_at_submit(env: Env, tmp_path: Path) -> None:
    """A reference without a version (or a label) is pinned at submit: a version pushed later is not read."""
    c = env.admin
    for n in (20, 30):
        c.datasets.push("blobs", path=dense_csv(tmp_path / "train.csv", n=n))
    trial = {"template": "mlp", "data": "blobs", "path": "train.csv", "validation_split": 0.5, "seed": 3}
    c.studies.submit(_template_study(trial=trial))
    c.datasets.push("blobs", path=dense_csv(tmp_path / "train.csv", n=40))
    study = c.studies.get("tpl")
    assert study.resolved.template_data == "blobs@2" and study.resolved.datasets is None
    assert study.spec["trial"]["template"] == {  # the file as submitted; its trials run on blobs@2
        "name": "mlp",
        "data": "blobs",
        "path": "train.csv",
        "validation_split": 0.5,
        "seed": 3,
    }
    with env.platform.db.read() as s:
        row = s.scalars(select(StudyRow).where(StudyRow.name == "tpl")).one()
        job_spec, _ = trial_job_spec(env.platform, run_spec(row), "tpl", 0, {})
    assert job_spec.template is not None and job_spec.template.data == "blobs@2"


def test_a_trials_datasets_given_as_mappings_are_pinned_at_submit(env: Env, tmp_path: Path) -> None:
    c = env.admin
    for name in ("blobs", "extra", "extra"):
        c.datasets.push(name, path=dense_csv(tmp_path / "train.csv", n=20))
    trial = {"template": "mlp", "data": "blobs@1", "label": "y", "datasets": [{"name": "extra"}]}
    c.studies.submit(_template_study(trial=trial))
    study = c.studies.get("tpl")
    assert study.resolved.datasets == ("extra@2",) and study.resolved.template_data == "blobs@1"
    assert study.spec["trial"]["datasets"] == [{"name": "extra"}]  # the file as submitted


def test_a_pausing_asha_study_over_a_template_resumes_trials_from_their_checkpoints(
    template_env: Env,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ASHA pauses template trials by default: each job trains to its rung (DLCLOUD_STOP_AT_STEP), the trainer
    checkpoints; a promoted trial's next job starts from that checkpoint and trains on from the next epoch."""
    env, c = template_env, template_env.admin
    extra = {"early_stopping": {"min_resource": 1, "reduction_factor": 2}, "max_trials": 4}
    path = study_file(tmp_path, "tpl-pause", "asha", **extra)
    spec = yaml.safe_load(path.read_text())
    spec["trial"]["hparams"]["epochs"] = 4  # rungs at epochs 1 and 2, the last at 4
    spec["objective"]["step"] = "best"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path.parent)
    cli(env, monkeypatch, "tune", "submit", "-f", str(path), "-o", "json")
    s = wait_study(c, "tpl-pause", timeout=180)
    trials = [t for t in c.studies.trials("tpl-pause") if t.state != "DUPLICATE"]
    assert s.state == "COMPLETED" and s.trials_started == 4 == len(trials), (s, trials)
    assert {t.state for t in trials} <= {"COMPLETED", "PRUNED"}, [(t.state, t.reason) for t in trials]
    assert any(len(t.jobs) > 1 for t in trials), trials  # somebody was promoted and resumed
    assert s.trials.pruned >= 1 and s.trials.completed >= 1
    for t in trials:
        epochs: list[int] = []
        previous = None
        for k, name in enumerate(t.jobs):
            job = c.jobs.get(name)
            assert job.state == "SUCCEEDED" and len(job.attempts) == 1, job
            assert job.spec.get("checkpoint_from") == previous  # the previous job, by id
            previous = job.id
            lines = [x.text for x in c.jobs.logs(name)]
            epochs += [int(x.split()[1].rstrip(":")) for x in lines if x.startswith("epoch ")]
            if k:
                assert any(x.startswith("resuming from epoch") for x in lines), lines
        assert epochs == list(range(1, t.last_step + 1)), (t.number, epochs)  # none twice, none skipped
        if t.state == "COMPLETED":
            assert t.last_step == 4 and 0.0 <= t.value <= 1.0
        else:
            assert t.reason.startswith("not promoted (val_accuracy "), t
    assert max(t.value for t in trials if t.state == "COMPLETED") == c.studies.best("tpl-pause").value
