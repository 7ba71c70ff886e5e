"""``dlcloud``: the entry point. Errors print as ``error (code): message`` and exit non-zero.

Help is click's plain text, not Rich markup: a help text's ``[...]`` (``[default: ...]``, ``values: [sgd, adam]``,
``[pre]``) prints as written, and an indented paragraph of a docstring (examples, a YAML file) prints as it is laid
out, unwrapped.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from dlcloud import __version__
from dlcloud.cli import admin, datasets, environments, jobs, models, serve, simulate, tune
from dlcloud.cli.common import client
from dlcloud.cli.output import Output, OutputOption, err_console, render_fields
from dlcloud.client import Client, Credentials
from dlcloud.client.config import read_config, write_profile
from dlcloud.errors import DlcloudError
from dlcloud.settings import Settings

app = typer.Typer(
    help="dlcloud: train, tune, track and serve models on shared GPUs.\n\n"
    "Start a platform on this machine with 'dlcloud up'; in another terminal 'dlcloud jobs list' works at once.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # no Rich markup: "[default: 8420]" and "[sgd, adam]" print as written
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(jobs.app, name="jobs")
app.add_typer(models.app, name="models")
app.add_typer(datasets.app, name="datasets")
app.add_typer(environments.app, name="envs")
app.add_typer(tune.app, name="tune")
app.add_typer(admin.tenants_app, name="tenants")
app.add_typer(admin.users_app, name="users")
app.add_typer(admin.keys_app, name="keys")
app.command("quota")(admin.quota)
app.command("queue")(jobs.queue)
app.command("usage")(admin.usage)
app.command("audit")(admin.audit)
app.command("serve")(serve.serve)
app.command("simulate")(simulate.simulate)


def keep_indented_blocks(text: str) -> str:
    """A help text whose indented paragraphs (examples, a YAML file) click prints as written instead of rewrapping
    them (click's ``\\b`` marker before each)."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(f"\b\n{p}" if p.startswith(" ") else p for p in paragraphs)


def _keep_examples_as_written(group: typer.Typer) -> None:
    for info in group.registered_commands:
        info.help = keep_indented_blocks(info.help or inspect.getdoc(info.callback) or "")
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _keep_examples_as_written(sub.typer_instance)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dlcloud {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    profile: str | None = typer.Option(None, "--profile", envvar="DLCLOUD_PROFILE", help="Config profile to use."),
    timeout: float = typer.Option(60.0, "--timeout", help="HTTP timeout in seconds."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    ctx.obj = {"profile": profile, "timeout": timeout}


@app.command("up")
def up(
    host: str | None = typer.Option(None, "--host", help="Address to listen on [default: 127.0.0.1]."),
    port: int | None = typer.Option(None, "--port", help="Port to listen on [default: 8420]."),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Database, code, logs and keys [default: ~/.dlcloud]."
    ),
    database_url: str | None = typer.Option(
        None, "--database-url", help="postgresql://user@host/db; default SQLite in the data dir."
    ),
    storage_url: str | None = typer.Option(
        None,
        "--storage-url",
        help="Where code, models and datasets are kept: file:///PATH or s3://BUCKET/PREFIX (S3 endpoint and "
        "credentials from AWS_* variables or DLCLOUD_S3_*; docs/storage.md) [default: file://<data-dir>].",
    ),
    log_level: str | None = typer.Option(None, "--log-level", help="debug, info, warning or error [default: info]."),
    no_profile: bool = typer.Option(False, "--no-profile", help="Do not write the 'local' CLI profile."),
    sandbox: str | None = typer.Option(
        None,
        "--sandbox",
        help="auto: run user code in a bubblewrap sandbox where it works; off: never (then one tenant only) "
        "[default: auto].",
    ),
    api_workers: int | None = typer.Option(
        None,
        "--api-workers",
        min=1,
        max=256,
        help="API processes behind the port; with more than 1, one more process runs the scheduler "
        "(docs/configuration.md#api-workers) [default: one per core].",
    ),
    allow_unsandboxed_tenants: bool = typer.Option(
        False,
        "--allow-unsandboxed-tenants",
        help="INSECURE: without a sandbox, still run every tenant's jobs; they can then read each other's data "
        "and the server's secrets (docs/isolation.md).",
    ),
) -> None:
    """Start the platform on this machine: the API, the scheduler and the local executor.

    The API is served by --api-workers processes (one per core by default); with more than one, another
    process runs the scheduler and the executor and keeps them serving.

    On first start it creates the platform admin, writes its key to <data-dir>/bootstrap-admin.json and
    sets up the 'local' CLI profile. Stop with Ctrl-C or SIGTERM; running jobs keep running and are
    re-adopted on the next start.

    Examples:

      dlcloud up

      dlcloud up --port 9000 --data-dir /srv/dlcloud --database-url postgresql://postgres@127.0.0.1/dlcloud

      dlcloud up --sandbox off      # no bubblewrap here: only the 'default' tenant runs jobs

      dlcloud up --api-workers 1    # the API and the scheduler in one process

      AWS_ENDPOINT_URL=http://127.0.0.1:9000 dlcloud up --storage-url s3://dlcloud/prod
    """
    # the server pulls FastAPI, uvicorn and SQLAlchemy: only this command needs them
    from dlcloud.server import public_endpoint, serve

    # flags win over DLCLOUD_* variables, which win over the defaults
    if sandbox not in (None, "auto", "off"):
        raise typer.BadParameter(f"must be auto or off, got {sandbox!r}", param_hint="--sandbox")
    flags: dict[str, Any] = {
        "host": host,
        "port": port,
        "database_url": database_url,
        "storage_url": storage_url,
        "log_level": log_level,
        "sandbox": sandbox,
        "allow_unsandboxed_tenants": allow_unsandboxed_tenants or None,
        "api_workers": api_workers,
        "data_dir": data_dir.expanduser().resolve() if data_dir is not None else None,
    }
    settings = Settings(**{k: v for k, v in flags.items() if v is not None})
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    endpoint = public_endpoint(settings)
    serve(settings, on_ready=lambda server: _announce(settings, server, endpoint, write_local_profile=not no_profile))


def _announce(settings: Settings, server: Any, endpoint: str, *, write_local_profile: bool) -> None:
    """Once ``dlcloud up``'s ``server`` (a dlcloud.server.Server) is ready: the 'local' CLI profile written with
    the bootstrap admin's key, and where the platform is, how it isolates jobs and where it stores."""
    if write_local_profile and server.bootstrap_file.exists():
        boot = json.loads(server.bootstrap_file.read_text())
        current = read_config().get("current")
        path = write_profile(
            "local",
            Credentials(endpoint, boot["access_key"], boot["secret_key"]),
            make_current=current in (None, "local"),
        )
        err_console.print(f"CLI profile 'local' written to {path}")
    err_console.print(f"dlcloud is starting at [bold]{endpoint}[/bold]")
    platform = server.platform
    if platform.isolated:
        err_console.print(f"isolation: {platform.isolation}")
    else:
        who = (
            "EVERY tenant's jobs run unsandboxed (--allow-unsandboxed-tenants)"
            if settings.allow_unsandboxed_tenants
            else f"only tenant {settings.bootstrap_tenant_name!r} may run jobs"
        )
        err_console.print(f"[bold red]isolation: {platform.isolation}[/bold red] — {who}; see docs/isolation.md")
    err_console.print(f"storage: {platform.objects.url}")
    err_console.print(f"admin key: {server.bootstrap_file}")


@app.command("configure")
def configure(
    endpoint: str = typer.Option(..., "--endpoint", prompt=True, help="API URL, e.g. http://gpu-box:8420."),
    access_key: str = typer.Option(..., "--access-key", prompt=True, help="Access key id (AK...)."),
    secret_key: str = typer.Option(..., "--secret-key", prompt=True, hide_input=True, help="Secret key."),
    profile: str = typer.Option("default", "--profile", help="Profile name."),
    check: bool = typer.Option(True, "--check/--no-check", help="Verify the credentials with a signed call."),
) -> None:
    """Save credentials to ~/.config/dlcloud/config.toml (mode 0600) and make the profile current.

    Examples:

      dlcloud configure --endpoint http://gpu-box:8420 --access-key AK... --secret-key ...

      dlcloud configure --profile lab    # prompts for each value
    """
    creds = Credentials(endpoint.rstrip("/"), access_key.strip(), secret_key.strip())
    if check:
        with Client(creds) as c:
            who = c.whoami()
        err_console.print(f"signed in as {who.user} (tenant {who.tenant}, {who.role})")
    path = write_profile(profile, creds)
    err_console.print(f"profile '{profile}' saved to {path}")


@app.command("whoami")
def whoami(ctx: typer.Context, output: Output = OutputOption) -> None:
    """Show who the configured credentials belong to.

    Example:

      dlcloud whoami -o json
    """
    who = client(ctx).whoami()
    render_fields(
        who,
        output,
        [("User", who.user), ("Tenant", who.tenant), ("Role", who.role), ("Key", who.access_key)],
    )


# every command is registered above: mark their examples once
_keep_examples_as_written(app)


def main() -> None:
    try:
        app()
    except DlcloudError as exc:
        err_console.print(f"[red]error[/red] ({exc.code}): {escape(exc.message)}", markup=True, highlight=False)
        errors = exc.details.get("errors") if exc.details else None
        if isinstance(errors, list):
            for e in errors[:20]:
                if isinstance(e, dict):
                    err_console.print(f"  - {e.get('field')}: {e.get('problem')}", markup=False)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
