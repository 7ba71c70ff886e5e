"""A user's session with the real server and CLI: configure, submit a directory with a PyTorch training
script, follow its logs, failures, restarts, cancel, timeout, a control-plane crash and secret env."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import WAIT_FOR_GO, release, wait_for
from tests.e2e.conftest import DLCLOUD, Server

pytestmark = pytest.mark.e2e
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}

TRAIN = textwrap.dedent(
    """
    import os, torch
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = x @ torch.tensor([1.0, -2.0, 3.0, 0.5]) + 0.1
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for i in range(0, 256, 32):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[i:i+32]).squeeze(-1), y[i:i+32])
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
    torch.save(model.state_dict(), os.path.join(os.environ["DLCLOUD_OUTPUT_DIR"], "model.pt"))
    print("done training")
    """
)


def _trainer(root: Path) -> Path:
    d = root / "trainer"
    d.mkdir()
    (d / "train.py").write_text(TRAIN)
    (d / "big.bin").write_bytes(b"x" * 1000)
    (d / ".dlcloudignore").write_text("big.bin\n")
    return d


def _state(server: Server, name: str, profile: str | None = None) -> dict:
    args = ["--profile", profile] if profile else []
    return server.cli_json(*args, "jobs", "describe", name)  # type: ignore[return-value]


def _wait_end(server: Server, name: str, timeout: float = 120, profile: str | None = None) -> dict:
    return wait_for(
        lambda: (j := _state(server, name, profile))["state"] in TERMINAL and j,
        timeout=timeout,
        interval=0.3,
        what=f"job {name} to end",
    )


def test_configure_submit_directory_and_follow_pytorch_training(server: Server):
    # the bootstrap admin's profile works with no configuration
    assert server.cli_json("whoami")["role"] == "platform-admin"
    assert json.loads((server.data_dir / "bootstrap-admin.json").read_text())["endpoint"] == server.endpoint
    assert (server.data_dir / "bootstrap-admin.json").stat().st_mode & 0o777 == 0o600
    server.cli("tenants", "create", "vision", "--gpus", "0", "--max-running-jobs", "2")
    server.cli("users", "create", "alice", "--tenant", "vision")
    key = server.cli_json("keys", "create", "--user", "alice", "--tenant", "vision")
    assert set(key) >= {"access_key", "secret_key"}
    server.cli(
        "configure",
        "--profile",
        "alice",
        "--endpoint",
        server.endpoint,
        "--access-key",
        key["access_key"],
        "--secret-key",
        key["secret_key"],
    )
    cfg = server.root / "config" / "dlcloud" / "config.toml"
    assert cfg.stat().st_mode & 0o777 == 0o600

    trainer = _trainer(server.root)
    res = server.cli(
        "--profile",
        "alice",
        "jobs",
        "submit",
        "--name",
        "mnist",
        "--code",
        str(trainer),
        "--command",
        "python train.py",
        "--follow",
    )
    assert "epoch 2 loss" in res.stdout and "done training" in res.stdout
    assert "SUCCEEDED" in res.stderr
    job = _state(server, "mnist", "alice")
    assert job["state"] == "SUCCEEDED" and job["user"] == "alice" and job["tenant"] == "vision"
    # the ignored file did not travel; the model was written to the output dir
    assert "big.bin" not in server.cli("--profile", "alice", "jobs", "logs", "mnist").stdout
    outputs = list((server.data_dir / "runs").glob("*/*/outputs/model.pt"))
    assert len(outputs) == 1
    follow = server.cli("--profile", "alice", "jobs", "logs", "mnist", "--follow", "--tail", "2")
    assert follow.stdout.strip().splitlines() == ["done training"]
    # configure made alice's profile current; the admin (another tenant) cannot see alice's job
    assert server.cli_json("whoami")["user"] == "alice"
    denied = server.cli("--profile", "local", "jobs", "describe", "mnist", check=False)
    assert denied.returncode != 0 and "not found" in denied.stderr
    usage = server.cli_json("--profile", "local", "usage", "--all", "--since", "1h")
    assert any(r["tenant"] == "vision" and r["user"] == "alice" and r["jobs"] == 1 for r in usage["rows"])
    audit = server.cli_json("--profile", "local", "audit", "--all")
    assert any(e["action"] == "jobs.submit" and e["user"] == "alice" for e in audit)


def test_failing_script_restart_cancel_and_timeout(server: Server):
    bad = server.cli("jobs", "submit", "--name", "bad", "--command", "echo oops >&2; exit 7", "--follow", check=False)
    assert bad.returncode != 0 and "FAILED" in bad.stderr and "oops" in bad.stderr
    assert _state(server, "bad")["exit_code"] == 7

    spec = server.root / "retry.yaml"
    spec.write_text(
        textwrap.dedent(
            """
            name: retry
            command: |
              n=$(cat "$DLCLOUD_CHECKPOINT_DIR/n" 2>/dev/null || echo 0); n=$((n+1))
              echo $n > "$DLCLOUD_CHECKPOINT_DIR/n"
              echo "try $n"; [ $n -ge 2 ]
            restart: {max_restarts: 2, backoff_seconds: 0.2}
            """
        )
    )
    server.cli("jobs", "submit", "-f", str(spec))
    job = _wait_end(server, "retry")
    assert job["state"] == "SUCCEEDED" and job["attempt"] == 2

    server.cli("jobs", "submit", "--name", "long", "--command", "echo up; sleep 120")
    wait_for(lambda: "up" in server.cli("jobs", "logs", "long").stdout, timeout=60, interval=0.3, what="long to start")
    server.cli("jobs", "cancel", "long")
    assert _wait_end(server, "long")["state"] == "CANCELLED"

    server.cli("jobs", "submit", "--name", "slow", "--command", "sleep 120", "--timeout", "2s")
    assert _wait_end(server, "slow")["state"] == "TIMED_OUT"
    listed = {j["name"]: j["state"] for j in server.cli_json("jobs", "list")}
    assert listed == {"bad": "FAILED", "retry": "SUCCEEDED", "long": "CANCELLED", "slow": "TIMED_OUT"}


def test_bad_input_is_a_clear_error_without_traceback(server: Server):
    spec = server.root / "bad.yaml"
    spec.write_text("name: x\ncommand: echo\nresources: {cpu: -1}\nwhatever: 1\n")
    res = server.cli("jobs", "submit", "-f", str(spec), check=False)
    assert res.returncode != 0
    assert "resources.cpu" in res.stderr and "whatever" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    res = server.cli("jobs", "describe", "nope", check=False)
    assert res.returncode != 0 and "not found" in res.stderr
    assert server.cli_json("jobs", "list") == []


def test_server_kill9_while_job_runs_then_restart_completes_it_once(server: Server):
    server.cli("jobs", "submit", "--name", "survivor", "--command", f"echo started; {WAIT_FOR_GO}; echo finished")
    wait_for(lambda: _state(server, "survivor")["state"] == "RUNNING", timeout=60, interval=0.2, what="RUNNING")
    wait_for(lambda: "started" in server.cli("jobs", "logs", "survivor").stdout, timeout=30, interval=0.2, what="start")
    job_id = _state(server, "survivor")["id"]
    server.kill9()
    release(server.data_dir, job_id)  # the job finishes while the control plane is down
    server.start()
    job = _wait_end(server, "survivor")
    assert job["state"] == "SUCCEEDED"
    assert len(job["attempts"]) == 1
    assert [e["to_state"] for e in job["events"]].count("SUCCEEDED") == 1
    out = server.cli("jobs", "logs", "survivor").stdout.split()
    assert out.count("started") == 1 and out.count("finished") == 1


def test_pre_and_post_commands_have_their_own_log_sections(server: Server):
    spec = server.root / "phases.yaml"
    spec.write_text(
        textwrap.dedent(
            """
            name: phases
            pre_command: echo fetching data
            command: echo training; exit 3
            post_command: |
              echo "uploading after exit $DLCLOUD_EXIT_CODE"
              echo upload-warning >&2
            post_timeout: 1m
            """
        )
    )
    res = server.cli("jobs", "submit", "-f", str(spec), "--follow", check=False)
    assert res.returncode != 0 and "FAILED" in res.stderr
    assert res.stdout.splitlines() == ["[pre] fetching data", "training", "[post] uploading after exit 3"]
    assert "[post] upload-warning" in res.stderr.splitlines()
    assert _state(server, "phases")["exit_code"] == 3  # the command's, not post's

    post = server.cli("jobs", "logs", "phases", "--section", "post")
    assert post.stdout.splitlines() == ["uploading after exit 3"]
    assert "upload-warning" in post.stderr.splitlines()
    assert "[dlcloud] post_command exited with code 0" in post.stderr and "training" not in post.stderr
    assert server.cli("jobs", "logs", "phases", "--section", "main").stdout.splitlines() == ["training"]
    assert server.cli("jobs", "logs", "phases", "--section", "pre").stdout.splitlines() == ["fetching data"]
    bad = server.cli("jobs", "logs", "phases", "--section", "during", check=False)
    assert bad.returncode != 0 and "during" in bad.stderr

    # --follow goes on from the command into post_command, which a cancel does not skip
    follow_spec = server.root / "follow.yaml"
    follow_spec.write_text(
        'name: follow\ncommand: echo waiting; exec sleep 120\npost_command: echo "post saw $DLCLOUD_EXIT_CODE"\n'
    )
    server.cli("jobs", "submit", "-f", str(follow_spec))
    followed = server.root / "follow.out"
    with followed.open("w") as out:
        follower = subprocess.Popen(
            [DLCLOUD, "jobs", "logs", "follow", "--follow"], env=server.env, stdout=out, stderr=subprocess.DEVNULL
        )
    try:
        wait_for(lambda: "waiting" in followed.read_text(), timeout=60, interval=0.2, what="the follower")
        server.cli("jobs", "cancel", "follow")
        assert follower.wait(timeout=60) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert followed.read_text().splitlines() == ["waiting", "[post] post saw 143"]
    assert _state(server, "follow")["state"] == "CANCELLED"


def test_logs_of_a_big_log_are_its_end_and_tail_reads_from_the_end(server: Server):
    """8 MB of log: a read shows its last 4 MiB and says so; --tail 2 the last two lines."""
    command = "python -c \"[print(f'row {i:06d} ' + 'r' * 100) for i in range(55000)]; print('the end')\""
    server.cli("jobs", "submit", "--name", "big-log", "--command", command)
    assert _wait_end(server, "big-log")["state"] == "SUCCEEDED"

    tail = server.cli("jobs", "logs", "big-log", "--tail", "2")
    assert tail.stdout.splitlines() == ["the end"]
    assert tail.stderr.splitlines() == ["[dlcloud] command exited with code 0"]
    full = server.cli("jobs", "logs", "big-log")
    assert full.stderr.splitlines()[0].startswith("[dlcloud] log truncated: earlier lines not shown")
    rows = full.stdout.splitlines()
    assert rows[-2:] == [f"row 054999 {'r' * 100}", "the end"]
    first = int(rows[0].split()[1])
    assert [int(r.split()[1]) for r in rows[:-1]] == list(range(first, 55000))
    assert 28_000 < 55000 - first < 29_000  # 4 MiB of 147-byte lines, of the 8 MB log


def test_secret_env_from_flags_the_spec_and_the_shell_is_never_shown(server: Server):
    from_shell, from_flag, from_spec = (
        "shell-" + secrets.token_hex(8),
        "flag-" + secrets.token_hex(8),
        "spec-" + secrets.token_hex(8),
    )
    spec = server.root / "secret.yaml"
    spec.write_text(
        "name: secretive\n"
        'command: for v in "$FROM_SHELL" "$FROM_FLAG" "$FROM_SPEC"; do printf %s "$v" | sha256sum; done\n'
        f"secret_env: {{FROM_SPEC: {from_spec}}}\n"
    )
    argv = [DLCLOUD, "jobs", "submit", "-f", str(spec), "--secret-env", "FROM_SHELL"]
    argv += ["--secret-env", f"FROM_FLAG={from_flag}", "--follow"]
    res = subprocess.run(
        argv, env={**server.env, "FROM_SHELL": from_shell}, capture_output=True, text=True, timeout=180, check=False
    )
    assert res.returncode == 0, res.stderr
    for value in (from_shell, from_flag, from_spec):
        assert hashlib.sha256(value.encode()).hexdigest() in res.stdout  # the job got each value itself
    job = _state(server, "secretive")
    assert job["spec"]["secret_env"] == {"FROM_SHELL": "***", "FROM_FLAG": "***", "FROM_SPEC": "***"}
    shown = [
        res.stdout + res.stderr,
        json.dumps(job),
        server.cli("jobs", "describe", "secretive").stdout,
        server.cli("jobs", "list", "-o", "json").stdout,
        server.cli("jobs", "logs", "secretive").stdout,
        server.cli("audit", "-o", "json").stdout,
        server.log(),
    ]
    stored = b"".join(p.read_bytes() for p in server.data_dir.glob("dlcloud.db*"))  # the database and its WAL
    assert b"FROM_SPEC" in stored
    for value in (from_shell, from_flag, from_spec):
        assert not [text for text in shown if value in text]
        assert value.encode() not in stored

    res = server.cli(
        "jobs", "submit", "--name", "unset", "--command", "true", "--secret-env", "NOT_SET_ANYWHERE", check=False
    )
    assert res.returncode != 0 and "NOT_SET_ANYWHERE is not set in your environment" in res.stderr
    res = server.cli(
        "jobs", "submit", "--name", "both", "--command", "true", "--env", "K=a", "--secret-env", "K=b", check=False
    )
    assert res.returncode != 0 and "K given in both env and secret_env" in res.stderr
    assert [j["name"] for j in server.cli_json("jobs", "list")] == ["secretive"]
