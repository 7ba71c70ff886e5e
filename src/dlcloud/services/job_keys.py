"""Where the object store keeps a job's things: its saved outputs and archived logs, each attempt's apart, and its
last saved checkpoints.

Plain functions of ids, shared by the job service, supervision, logs and the model registry (a model
registered from a job reads its outputs).
"""

from __future__ import annotations


def job_prefix(tenant_id: str, job_id: str) -> str:
    """Everything the object store keeps of a job (its saved outputs, archived logs and saved checkpoints) is
    below this prefix."""
    return f"jobs/{tenant_id}/{job_id}"


def outputs_key(tenant_id: str, job_id: str, attempt: int) -> str:
    """Where the job's outputs, as attempt ``attempt`` left them, are kept in the object store (a tree, saved
    by the executor when the attempt ends)."""
    return f"{job_prefix(tenant_id, job_id)}/outputs/attempt-{attempt}"


def checkpoints_key(tenant_id: str, job_id: str) -> str:
    """Where the job's last saved checkpoints are kept in the object store (``storage/checkpoint_store.py``: two
    slots and a pointer), saved by the executor while it runs and when an attempt ends."""
    return f"{job_prefix(tenant_id, job_id)}/checkpoints"


def logs_key(tenant_id: str, job_id: str, attempt: int) -> str:
    """Where the logs of attempt ``attempt`` are archived in the object store when it ends (a tree:
    ``<replica or "main">/output.log`` and its older half)."""
    return f"{job_prefix(tenant_id, job_id)}/logs/attempt-{attempt}"
