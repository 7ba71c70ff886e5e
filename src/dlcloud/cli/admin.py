"""dlcloud tenants / users / keys / quota / usage / audit."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import typer

from dlcloud.cli.common import action_command, client
from dlcloud.cli.output import (
    Output,
    OutputOption,
    console,
    err_console,
    print_json,
    render,
    render_fields,
    short_time,
)
from dlcloud.client import Client
from dlcloud.errors import InvalidArgument
from dlcloud.schemas.common import format_memory, parse_duration
from dlcloud.schemas.tenants import QuotaReport, RateLimit, SchedulingSpec, SchedulingTerms, Tenant

tenants_app = typer.Typer(help="Manage tenants and their quotas (platform admin).", no_args_is_help=True)
users_app = typer.Typer(help="Manage users.", no_args_is_help=True)
keys_app = typer.Typer(help="Manage access keys (AK/SK pairs).", no_args_is_help=True)


def _quota(
    gpus: int | None,
    cpus: float | None,
    memory: str | None,
    running: int | None,
    queued: int | None,
    storage: str | None = None,
) -> dict:
    q = {
        "gpus": gpus,
        "cpus": cpus,
        "memory": memory,
        "max_running_jobs": running,
        "max_queued_jobs": queued,
        "storage": storage,
    }
    return {k: v for k, v in q.items() if v is not None}


def _tenant_row(t: Tenant) -> dict[str, Any]:
    q = t.quota
    return {
        "name": t.name,
        "gpus": q.gpus,
        "cpus": q.cpus,
        "memory": format_memory(q.memory) if q.memory is not None else None,
        "running": q.max_running_jobs,
        "queued": q.max_queued_jobs,
        "storage": format_memory(q.storage) if q.storage is not None else None,
        "created": short_time(t.created_at),
    }


TENANT_COLUMNS = [
    ("NAME", "name"),
    ("GPUS", "gpus"),
    ("CPUS", "cpus"),
    ("MEMORY", "memory"),
    ("MAX RUNNING", "running"),
    ("MAX QUEUED", "queued"),
    ("STORAGE", "storage"),
    ("CREATED", "created"),
]


@tenants_app.command("create")
def tenants_create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Tenant name (DNS-1123 label)."),
    gpus: int | None = typer.Option(None, "--gpus", help="GPU limit (default unlimited)."),
    cpus: float | None = typer.Option(None, "--cpus", help="CPU limit."),
    memory: str | None = typer.Option(None, "--memory", help="Memory limit, e.g. 64Gi."),
    max_running_jobs: int | None = typer.Option(None, "--max-running-jobs", help="Concurrently running jobs."),
    max_queued_jobs: int | None = typer.Option(None, "--max-queued-jobs", help="Queued jobs."),
    storage: str | None = typer.Option(
        None, "--storage", help="Bytes of datasets, model versions and code it may store, e.g. 500Gi."
    ),
    output: Output = OutputOption,
) -> None:
    """Create a tenant with optional quotas (unset = unlimited).

    Example:

      dlcloud tenants create vision --gpus 4 --cpus 32 --memory 128Gi --max-running-jobs 8 --storage 500Gi
    """
    t = client(ctx).tenants.create(name, _quota(gpus, cpus, memory, max_running_jobs, max_queued_jobs, storage))
    if output == Output.json:
        print_json(t)
    else:
        err_console.print(f"tenant {t.name} created")


@tenants_app.command("list")
def tenants_list(ctx: typer.Context, output: Output = OutputOption) -> None:
    """List tenants and their quotas.

    Example:

      dlcloud tenants list -o json
    """
    ts = client(ctx).tenants.list()
    if output == Output.json:
        print_json(ts)
    else:
        render([_tenant_row(t) for t in ts], output, TENANT_COLUMNS)


def _borrow(value: str, kind: type | None) -> object:
    """A --borrow-* value: a number (``kind``), a memory size (``kind`` None), or 'unlimited'."""
    if value.lower() in ("unlimited", "none", "-"):
        return None
    if kind is None:
        return value
    try:
        return kind(value)
    except ValueError:
        raise InvalidArgument(f"a borrowing limit is a number or 'unlimited'; got {value!r}") from None


def _priority_range(value: str) -> tuple[int, int]:
    lo, sep, hi = value.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(lo), int(hi)
    except ValueError:
        raise InvalidArgument(f"--priority-range must be MIN:MAX, e.g. -100:100; got {value!r}") from None


@tenants_app.command("set-network")
def tenants_set_network(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Tenant name."),
    egress: str = typer.Option(
        ..., "--egress", help="none, internet, allow (only --allow), or default (the platform's policy)."
    ),
    allow: list[str] = typer.Option(
        [], "--allow", help="With --egress allow: an address, CIDR or host name its jobs may reach (repeatable)."
    ),
    output: Output = OutputOption,
) -> None:
    """Set what a tenant's jobs may reach beyond their own network (platform admin). Every job has a network
    namespace of its own and reaches the API; the host's own addresses stay out of reach unless named in
    --allow. See docs/isolation.md#network.

    Examples:

      dlcloud tenants set-network vision --egress internet

      dlcloud tenants set-network nlp --egress allow --allow 10.20.0.0/16 --allow pypi.org

      dlcloud tenants set-network nlp --egress default
    """
    if egress not in ("none", "internet", "allow", "default"):
        raise InvalidArgument(f"--egress must be none, internet, allow or default; got {egress!r}")
    if allow and egress != "allow":
        raise InvalidArgument("--allow goes with --egress allow")
    policy = {"egress": None if egress == "default" else egress, "allow": allow}
    t = client(ctx).tenants.update(name, network=policy)
    if output == Output.json:
        print_json(t)
        return
    net = t.network
    render_fields(
        t,
        output,
        [
            ("Tenant", t.name),
            ("Egress", net.egress or "platform default"),
            ("Allow", ", ".join(net.allow) or "-"),
        ],
    )


@tenants_app.command("set-sandbox")
def tenants_set_sandbox(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Tenant name."),
    user_namespaces: str = typer.Option(
        ..., "--user-namespaces", help="allow (its jobs may make user namespaces of their own) or deny (the default)."
    ),
    output: Output = OutputOption,
) -> None:
    """Set what a tenant's jobs may do in their sandbox beyond the default (platform admin). By default a job
    cannot make user namespaces (unshare -U, rootless containers): they put more of the kernel in its reach.
    See docs/isolation.md#user-namespaces.

    Examples:

      dlcloud tenants set-sandbox vision --user-namespaces allow

      dlcloud tenants set-sandbox vision --user-namespaces deny
    """
    if user_namespaces not in ("allow", "deny"):
        raise InvalidArgument(f"--user-namespaces must be allow or deny; got {user_namespaces!r}")
    t = client(ctx).tenants.update(name, sandbox={"user_namespaces": user_namespaces == "allow"})
    if output == Output.json:
        print_json(t)
        return
    allowed = t.sandbox.user_namespaces
    render_fields(t, output, [("Tenant", t.name), ("User namespaces", "allowed" if allowed else "denied")])


@tenants_app.command("update")
def tenants_update(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Tenant name."),
    guarantee_gpus: int | None = typer.Option(None, "--guarantee-gpus", help="GPUs the tenant is guaranteed."),
    guarantee_cpus: float | None = typer.Option(None, "--guarantee-cpus", help="CPUs the tenant is guaranteed."),
    guarantee_memory: str | None = typer.Option(None, "--guarantee-memory", help="Memory guaranteed, e.g. 64Gi."),
    borrow_gpus: str | None = typer.Option(
        None, "--borrow-gpus", help="GPUs it may borrow beyond its guarantee when idle, or 'unlimited'."
    ),
    borrow_cpus: str | None = typer.Option(None, "--borrow-cpus", help="CPUs it may borrow, or 'unlimited'."),
    borrow_memory: str | None = typer.Option(
        None, "--borrow-memory", help="Memory it may borrow, e.g. 64Gi, or 'unlimited'."
    ),
    weight: float | None = typer.Option(None, "--weight", help="Weight in fair share (default 1)."),
    priority_range: str | None = typer.Option(
        None, "--priority-range", help="Priorities its jobs may have, MIN:MAX (e.g. -100:100)."
    ),
    output: Output = OutputOption,
) -> None:
    """Change a tenant's scheduling terms (platform admin); what is not given stays as it is.

    The guarantee must stay within the tenant's quota (dlcloud tenants set-quota). See docs/scheduling.md.

    Examples:

      dlcloud tenants update vision --guarantee-gpus 8 --borrow-gpus 8 --weight 2 --priority-range -100:100

      dlcloud tenants update nlp --borrow-gpus unlimited
    """
    c = client(ctx)
    sched = c.tenants.get(name).scheduling.model_dump(mode="json")  # the terms sent back, changed where given
    guarantee = dict(sched["guarantee"])
    for key, value in (("gpus", guarantee_gpus), ("cpus", guarantee_cpus), ("memory", guarantee_memory)):
        if value is not None:
            guarantee[key] = value
    borrow = dict(sched["borrow_limit"])
    for key, raw, kind in (("gpus", borrow_gpus, int), ("cpus", borrow_cpus, float), ("memory", borrow_memory, None)):
        if raw is not None:
            borrow[key] = _borrow(raw, kind)
    sched["guarantee"] = guarantee
    sched["borrow_limit"] = borrow
    if weight is not None:
        sched["weight"] = weight
    if priority_range is not None:
        sched["priority_min"], sched["priority_max"] = _priority_range(priority_range)
    t = c.tenants.update(name, scheduling=sched)
    if output == Output.json:
        print_json(t)
        return
    render_fields(t, output, [("Tenant", t.name), *_scheduling_fields(t.scheduling)])


def _limit(value: object, fmt: Callable[[Any], str] = str) -> str:
    return "unlimited" if value is None else fmt(value)


def _scheduling_fields(s: SchedulingSpec | SchedulingTerms) -> list[tuple[str, str]]:
    """A tenant's fair-share terms as lines: guarantee, borrowing limit, weight, priority range."""
    g, b = s.guarantee, s.borrow_limit
    return [
        ("Guarantee", f"{g.gpus} GPU, {g.cpus:g} CPU, {format_memory(g.memory)}"),
        (
            "Borrow limit",
            f"{_limit(b.gpus)} GPU, {_limit(b.cpus, lambda v: f'{v:g}')} CPU, {_limit(b.memory, format_memory)} memory",
        ),
        ("Weight", f"{s.weight:g}"),
        ("Priority range", f"{s.priority_min}..{s.priority_max}"),
    ]


@tenants_app.command("set-quota")
def tenants_set_quota(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Tenant name."),
    gpus: int | None = typer.Option(None, "--gpus"),
    cpus: float | None = typer.Option(None, "--cpus"),
    memory: str | None = typer.Option(None, "--memory"),
    max_running_jobs: int | None = typer.Option(None, "--max-running-jobs"),
    max_queued_jobs: int | None = typer.Option(None, "--max-queued-jobs"),
    storage: str | None = typer.Option(None, "--storage", help="Bytes of datasets, models and code, e.g. 500Gi."),
    output: Output = OutputOption,
) -> None:
    """Replace a tenant's quota (limits not given become unlimited).

    Example:

      dlcloud tenants set-quota vision --gpus 8 --max-running-jobs 16
    """
    t = client(ctx).tenants.set_quota(name, _quota(gpus, cpus, memory, max_running_jobs, max_queued_jobs, storage))
    if output == Output.json:
        print_json(t)
    else:
        render([_tenant_row(t)], output, TENANT_COLUMNS)


@users_app.command("create")
def users_create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="User name (DNS-1123 label)."),
    tenant: str | None = typer.Option(None, "--tenant", help="Tenant (default: yours)."),
    role: str = typer.Option("member", "--role", help="member, tenant-admin or platform-admin."),
    output: Output = OutputOption,
) -> None:
    """Create a user.

    Example:

      dlcloud users create alice --tenant vision --role tenant-admin
    """
    u = client(ctx).users.create(name, tenant=tenant, role=role)
    if output == Output.json:
        print_json(u)
    else:
        err_console.print(f"user {u.name} created in tenant {u.tenant} as {u.role}")


@users_app.command("list")
def users_list(
    ctx: typer.Context,
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant."),
    output: Output = OutputOption,
) -> None:
    """List users.

    Example:

      dlcloud users list --tenant vision
    """
    us = client(ctx).users.list(tenant)
    render(
        us,
        output,
        [("NAME", "name"), ("TENANT", "tenant"), ("ROLE", "role"), ("CREATED", lambda u: short_time(u.created_at))],
    )


@keys_app.command("create")
def keys_create(
    ctx: typer.Context,
    user: str | None = typer.Option(None, "--user", help="For this user (default: you)."),
    tenant: str | None = typer.Option(None, "--tenant", help="The user's tenant (platform admin)."),
    output: Output = OutputOption,
) -> None:
    """Create an access key. The secret is printed once and never again.

    Examples:

      dlcloud keys create

      dlcloud keys create --user alice --tenant vision -o json
    """
    k = client(ctx).keys.create(user=user, tenant=tenant)
    if output == Output.json:
        print_json({"access_key": k.access_key, "secret_key": k.secret_key, "user": k.user, "tenant": k.tenant})
        return
    render_fields(
        k,
        output,
        [("Access key", k.access_key), ("Secret key", k.secret_key), ("User", f"{k.user} ({k.tenant})")],
    )
    err_console.print("[yellow]Store the secret key now: it cannot be shown again.[/yellow]")


@keys_app.command("list")
def keys_list(
    ctx: typer.Context,
    user: str | None = typer.Option(None, "--user"),
    tenant: str | None = typer.Option(None, "--tenant"),
    output: Output = OutputOption,
) -> None:
    """List access keys (never their secrets).

    Example:

      dlcloud keys list --user alice
    """
    ks = client(ctx).keys.list(user=user, tenant=tenant)
    render(
        ks,
        output,
        [
            ("ACCESS KEY", "access_key"),
            ("USER", "user"),
            ("TENANT", "tenant"),
            ("ENABLED", "enabled"),
            ("CREATED", lambda k: short_time(k.created_at)),
        ],
    )


KEY = ("key", "Access key id.")


@action_command(keys_app, "disable", KEY, "key {} disabled")
def keys_disable(c: Client, key: str) -> None:
    """Disable a key: requests signed with it are refused until it is enabled again.

    Example:

      dlcloud keys disable AKXXXXXXXXXXXXXXXXXX
    """
    c.keys.disable(key)


@action_command(keys_app, "enable", KEY, "key {} enabled")
def keys_enable(c: Client, key: str) -> None:
    """Enable a disabled key.

    Example:

      dlcloud keys enable AKXXXXXXXXXXXXXXXXXX
    """
    c.keys.enable(key)


@action_command(keys_app, "delete", KEY, "key {} deleted")
def keys_delete(c: Client, key: str) -> None:
    """Delete a key for good.

    Example:

      dlcloud keys delete AKXXXXXXXXXXXXXXXXXX
    """
    c.keys.delete(key)


def quota(
    ctx: typer.Context,
    tenant: str | None = typer.Option(None, "--tenant", help="Another tenant (platform admin)."),
    output: Output = OutputOption,
) -> None:
    """Show your tenant's limits and live usage, the queued-jobs cap in force, the request rate limits, what
    bounds each job, and the tenant's fair-share terms.

    A tenant whose quota leaves max queued jobs unset gets the platform's default cap ("(platform default)").
    The request rate limits are per access key and per tenant (all its keys together); over one, a call is
    refused with 429 rate_limited and a Retry-After (docs/quotas-and-usage.md). Processes per job count each
    replica's; the tenant's count all its processes where only a per-user limit can (as root without a pids
    cgroup: its max running jobs times the per-job limit); disk per job is what its directories may take
    (docs/isolation.md#processes-and-disk).

    The fair-share terms say why a job waits or is preempted (docs/scheduling.md): the tenant's guarantee, how
    far it may borrow beyond it (jobs running on borrowed capacity may be preempted to give it back), its weight,
    and the priorities and priority classes its jobs may use.

    Examples:

      dlcloud quota

      dlcloud quota --tenant vision -o json
    """
    r = client(ctx).accounting.quota(tenant)
    if output == Output.json:
        print_json(r)
        return
    render(
        _quota_rows(r),
        output,
        [("RESOURCE", "resource"), ("USED", "used"), ("LIMIT", "limit")],
        title=f"tenant {r.tenant}",
    )
    s = r.scheduling
    console.print()
    console.print(f"[bold]Scheduling[/bold] (policy {s.policy})")
    classes = ", ".join(f"{k} ({v})" for k, v in s.priority_classes.items()) or "none"
    render_fields(
        s,
        output,
        [*_scheduling_fields(s), ("Priority classes", f"{classes}; default {s.default_priority_class}")],
    )


def _quota_rows(r: QuotaReport) -> list[dict[str, Any]]:
    """The rows of ``dlcloud quota``'s table: each limit with its use, then what the platform admits."""
    lim, use = r.limits, r.usage
    admission = r.admission

    def rate_str(v: RateLimit | None) -> str:
        return "unlimited" if v is None else f"{v.requests_per_second:g}/s, bursts of {v.burst}"

    queued_limit = _limit(admission.max_queued_jobs)
    if admission.max_queued_jobs_source == "platform default":
        queued_limit += " (platform default)"
    rows: list[dict[str, Any]] = [
        {"resource": "gpus", "used": use.gpus, "limit": _limit(lim.gpus)},
        {"resource": "cpus", "used": f"{use.cpus:g}", "limit": _limit(lim.cpus, lambda v: f"{v:g}")},
        {
            "resource": "memory",
            "used": format_memory(use.memory) if use.memory else "0",
            "limit": _limit(lim.memory, format_memory),
        },
        {"resource": "running jobs", "used": use.running_jobs, "limit": _limit(lim.max_running_jobs)},
        {"resource": "queued jobs", "used": use.queued_jobs, "limit": queued_limit},
        {
            "resource": "storage",
            "used": format_memory(use.storage) if use.storage else "0",
            "limit": _limit(lim.storage, format_memory),
        },
    ]
    if admission:
        rows += [
            {"resource": "requests (your key)", "used": "", "limit": rate_str(admission.rate_limit_per_key)},
            {"resource": "requests (tenant)", "used": "", "limit": rate_str(admission.rate_limit_per_tenant)},
            {"resource": "processes (per job)", "used": "", "limit": _limit(admission.processes_per_job)},
            {"resource": "processes (tenant)", "used": "", "limit": _limit(admission.processes_per_tenant)},
            {"resource": "disk (per job)", "used": "", "limit": _limit(admission.disk_per_job, format_memory)},
        ]
    return rows


def _since(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return (datetime.now(UTC) - timedelta(seconds=parse_duration(value))).isoformat()
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(
            f"--since takes a duration (24h, 7d) or an ISO time (2026-11-01T00:00), got {value!r}"
        ) from None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).isoformat()


def usage(
    ctx: typer.Context,
    since: str = typer.Option("24h", "--since", help="Window start: a duration back (24h, 7d) or an ISO time."),
    tenant: str | None = typer.Option(None, "--tenant", help="Another tenant (platform admin)."),
    all_tenants: bool = typer.Option(False, "--all", help="Every tenant (platform admin)."),
    output: Output = OutputOption,
) -> None:
    """GPU-seconds, CPU-seconds and job counts per tenant and user.

    Examples:

      dlcloud usage --since 7d

      dlcloud usage --since 2026-11-01T00:00 --all -o json
    """
    r = client(ctx).accounting.usage(since=_since(since), tenant=tenant, all_tenants=all_tenants)
    if output == Output.json:
        print_json(r)
        return
    render(
        r.rows,
        output,
        [
            ("TENANT", "tenant"),
            ("USER", "user"),
            ("JOBS", "jobs"),
            ("ATTEMPTS", "attempts"),
            ("GPU-SECONDS", lambda x: f"{x.gpu_seconds:.1f}"),
            ("CPU-SECONDS", lambda x: f"{x.cpu_seconds:.1f}"),
        ],
        title=f"usage since {short_time(r.since)}",
    )


def audit(
    ctx: typer.Context,
    since: str | None = typer.Option(None, "--since", help="A duration back (1h, 7d) or an ISO time."),
    action: str | None = typer.Option(None, "--action", help="Only this action, e.g. jobs.submit."),
    user: str | None = typer.Option(None, "--user", help="Only this user."),
    all_tenants: bool = typer.Option(False, "--all", help="Every tenant (platform admin)."),
    limit: int = typer.Option(100, "--limit", help="Newest N events."),
    output: Output = OutputOption,
) -> None:
    """The audit log: who did what, when, from where, and how it ended (tenant admins).

    Examples:

      dlcloud audit --since 1h

      dlcloud audit --all --action auth.bad_signature -o json
    """
    events = client(ctx).accounting.audit(
        since=_since(since), action=action, user=user, all_tenants=all_tenants, limit=limit
    )
    render(
        events,
        output,
        [
            ("TIME", lambda e: short_time(e.time)),
            ("TENANT", "tenant"),
            ("USER", "user"),
            ("KEY", "access_key"),
            ("ACTION", "action"),
            ("RESOURCE", "resource"),
            ("OUTCOME", lambda e: e.outcome if not e.error_code else f"{e.outcome} ({e.error_code})"),
            ("CLIENT", "client_address"),
            ("REQUEST", "request_id"),
        ],
    )
