"""Attacks from inside a job, as a tenant's member would try them on a real ``dlcloud up``.

The attacker knows every host path (the test hands them over, worst case) and tries to read the server's
key, the database, the bootstrap admin key, another tenant's checkpoints, code and workload record, the
server's /proc environ; to fake its own exit record, escape its quota, signal the server, and poison a
built-in environment that another tenant's job then uses. Each must fail with nothing leaked.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.security.conftest import DB_PASSWORD, PIP_SECRET, Platform

pytestmark = pytest.mark.e2e
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}

VICTIM = textwrap.dedent(
    """
    import os, sys
    open(os.path.join(os.environ["DLCLOUD_CHECKPOINT_DIR"], "ckpt.txt"), "w").write("victim-checkpoint-data")
    # a .pth planted in the environment would have run before this line and set PLANTED
    print("victim ready", os.environ.get("PLANTED", "clean"), flush=True)
    if len(sys.argv) > 1:
        import time
        time.sleep(float(sys.argv[1]))
    """
)

ATTACK = textwrap.dedent(
    """
    import json, os, signal, site, sys
    targets = json.loads(open("targets.json").read())
    report = {}

    def attempt(fn):
        try:
            fn()
            return "DONE"
        except OSError as exc:
            return type(exc).__name__

    def read(path):
        with open(path, "rb") as f:
            f.read(64)

    def write(path):
        with open(path, "w") as f:
            f.write(json.dumps({"exit_code": 0, "finished_at": "2020-01-01T00:00:00Z"}))

    for name, path in targets["read"].items():
        report["read " + name] = attempt(lambda: read(path))
    attempt_dir = os.path.dirname(os.getcwd())  # the working directory is <attempt dir>/code
    for record in ("exit.json", "launcher.json", "child.json", "stop-requested"):
        targets["write"]["own " + record] = os.path.join(attempt_dir, record)
    for name, path in targets["write"].items():
        report["write " + name] = attempt(lambda: write(path))
    report["server environ"] = attempt(lambda: read(f"/proc/{targets['server_pid']}/environ"))
    report["signal server"] = attempt(lambda: os.kill(targets["server_pid"], 0))
    report["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    report["uid"] = os.getuid()
    env_dir = sys.prefix
    report["chmod environment"] = attempt(lambda: os.chmod(env_dir, 0o777))
    pth = os.path.join(site.getsitepackages()[0], "zz_planted.pth")
    report["plant .pth"] = attempt(lambda: open(pth, "w").write("import os; os.environ['PLANTED'] = 'yes'"))
    report["postgres socket"] = "exists" if os.path.exists("/var/run/postgresql") else "absent"
    report["own checkpoint"] = attempt(
        lambda: open(os.path.join(os.environ["DLCLOUD_CHECKPOINT_DIR"], "mine.txt"), "w").write("ok")
    )
    print("REPORT " + json.dumps(report), flush=True)
    print("environment " + " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())), flush=True)
    import time
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
    """
)


def _describe(p: Platform, profile: str, name: str) -> dict:
    return json.loads(p.as_(profile, "jobs", "describe", name, "-o", "json").stdout)


def _wait_state(p: Platform, profile: str, name: str, states: set[str], timeout: float = 120) -> dict:
    return wait_for(
        lambda: (j := _describe(p, profile, name))["state"] in states and j,
        timeout=timeout,
        interval=0.3,
        what=f"job {name} to reach {states}",
    )


def _logs(p: Platform, profile: str, name: str) -> str:
    return p.as_(profile, "jobs", "logs", name).stdout


def _submit(p: Platform, profile: str, name: str, code: Path, command: str, *extra: str) -> None:
    p.as_(profile, "jobs", "submit", "--name", name, "--code", str(code), "--command", command, *extra)


def test_a_job_reaches_no_secret_no_other_tenant_and_cannot_fake_its_end(platform: Platform, tmp_path: Path):
    server = platform.server
    data = server.data_dir
    victim_code = tmp_path / "victim"
    victim_code.mkdir()
    (victim_code / "victim.py").write_text(VICTIM)
    _submit(platform, "vera", "holder", victim_code, "python victim.py", "--env", "HF_TOKEN=victim-hf-token")
    _wait_state(platform, "vera", "holder", {"SUCCEEDED"})
    [victim_dir] = [d for d in (data / "runs").glob("*/*") if (d / "checkpoints" / "ckpt.txt").exists()]

    attack_code = tmp_path / "attack"
    attack_code.mkdir()
    (attack_code / "attack.py").write_text(ATTACK)
    # the attacker knows every path; its own attempt directory is found after the job is placed
    targets = {
        "read": {
            "server key": str(data / "server.key"),
            "bootstrap key": str(data / "bootstrap-admin.json"),
            "database": str(data / "dlcloud.db"),
            "victim checkpoint": str(victim_dir / "checkpoints" / "ckpt.txt"),
            "victim code archive": str(next((data / "code").rglob("*.tar.gz"))),
            "victim workload": str(victim_dir / "attempt-1" / "workload.json"),
            "victim log": str(victim_dir / "attempt-1" / "output.log"),
        },
        "write": {"data dir": str(data / "planted.txt")},
        "server_pid": server.proc.pid if server.proc else 1,
    }
    (attack_code / "targets.json").write_text(json.dumps(targets))
    _submit(platform, "mallory", "attack", attack_code, "python attack.py 600", "--environment", "python")
    job = _wait_state(platform, "mallory", "attack", {"RUNNING"} | TERMINAL, timeout=300)
    assert job["state"] == "RUNNING", job
    [attack_dir] = [d for d in (data / "runs").glob("*/*") if d != victim_dir]
    logs = wait_for(lambda: "REPORT " in (out := _logs(platform, "mallory", "attack")) and out, what="the report")
    report = json.loads(logs.split("REPORT ", 1)[1].splitlines()[0])

    # writes to the records' paths land nowhere (not in view) or in the job's own scaffolding: on the host the
    # records are the launcher's alone
    attempt = attack_dir / "attempt-1"
    assert not (attempt / "exit.json").exists() and not (attempt / "stop-requested").exists()
    assert json.loads((attempt / "launcher.json").read_text())["pid"] > 0
    assert "exit_code" not in json.loads((attempt / "child.json").read_text())
    for name in targets["read"]:
        assert report[f"read {name}"] in ("FileNotFoundError", "PermissionError"), (name, report)
    assert report["server environ"] in ("FileNotFoundError", "PermissionError"), report
    assert report["signal server"] in ("ProcessLookupError", "PermissionError"), report
    assert max(report["pids"]) < 10, report  # its own PID namespace: only its own few processes
    assert report["chmod environment"] in ("OSError", "PermissionError"), report  # read-only mount
    assert report["plant .pth"] in ("OSError", "PermissionError"), report
    assert report["postgres socket"] == "absent"
    assert report["own checkpoint"] == "DONE"  # its own data stays writable

    # nothing of the server's or the victim's secrets in what the job saw (its environment is in the log)
    admin_secret = json.loads((data / "bootstrap-admin.json").read_text())["secret_key"]
    for secret in (DB_PASSWORD, PIP_SECRET, admin_secret, "victim-hf-token", "victim-checkpoint-data"):
        assert secret not in logs

    # faking its own end failed above: the records are not in its view
    assert not (data / "planted.txt").exists()
    assert not (attack_dir / "attempt-1" / "exit.json").exists()
    # still running, still holding the quota of one running job: a second job waits
    _submit(platform, "mallory", "second", attack_code, "python attack.py")
    second = _wait_state(platform, "mallory", "second", {"QUEUED"})
    wait_for(
        lambda: "running" in (_describe(platform, "mallory", "second").get("wait_reason") or ""),
        what="the quota reason",
    )
    assert _describe(platform, "mallory", "attack")["state"] == "RUNNING"
    assert second["state"] == "QUEUED"
    platform.as_("mallory", "jobs", "cancel", "attack")
    _wait_state(platform, "mallory", "attack", {"CANCELLED"})

    # the victim's next job in the same built-in environment runs clean
    _submit(platform, "vera", "after", victim_code, "python victim.py", "--environment", "python")
    _wait_state(platform, "vera", "after", {"SUCCEEDED"}, timeout=300)
    assert "victim ready clean" in _logs(platform, "vera", "after")


PICKLE_MAKER = textwrap.dedent(
    """
    import pickle, sys

    class Payload:
        def __reduce__(self):
            code = (
                "import os, json\\n"
                "found = {}\\n"
                "for p in %r:\\n"
                "    try:\\n"
                "        found[p] = open(p).read()[:64]\\n"
                "    except OSError as e:\\n"
                "        found[p] = type(e).__name__\\n"
                "found['env'] = dict(os.environ)\\n"
                "for out in %r:\\n"
                "    try:\\n"
                "        open(out, 'w').write(json.dumps(found))\\n"
                "    except OSError:\\n"
                "        pass\\n"
            ) % (sys.argv[2:], [sys.argv[1]])
            return (exec, (code,))

    pickle.dump(Payload(), open("model.pkl", "wb"))
    """
)


def test_a_pickled_model_runs_its_code_only_in_a_sandbox(platform: Platform, tmp_path: Path):
    """Registering a pickle runs its code (signature inference): only in a sandbox that sees no secret and
    can write nothing of the server's."""
    data = platform.server.data_dir
    leak = data / "leaked.json"
    maker = tmp_path / "maker.py"
    maker.write_text(PICKLE_MAKER)
    import subprocess
    import sys

    secrets_paths = [str(data / "server.key"), str(data / "bootstrap-admin.json")]
    subprocess.run([sys.executable, str(maker), str(leak), *secrets_paths], cwd=tmp_path, check=True)
    res = platform.as_(
        "mallory", "models", "register", "evil", "--file", str(tmp_path / "model.pkl"), "--format", "sklearn"
    )
    assert res.returncode == 0, res.stderr
    assert not leak.exists(), leak.read_text()
    described = json.loads(platform.as_("mallory", "models", "describe", "evil", "-o", "json").stdout)
    assert "executes_code" in json.dumps(described)
