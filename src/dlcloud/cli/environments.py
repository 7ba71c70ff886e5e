"""dlcloud envs ..."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from dlcloud.cli.common import action_command, client
from dlcloud.cli.output import Output, OutputOption, console, err_console, render, render_fields, short_time, size_text
from dlcloud.client import Client
from dlcloud.client.environments import RequirementsFile, read_requirements
from dlcloud.schemas.environments import Environment, EnvironmentDetail

app = typer.Typer(
    help="Runtime environments for jobs: a Python version plus pip requirements, built once as a cached venv.",
    no_args_is_help=True,
)
STATE_COLORS = {"READY": "green", "FAILED": "red", "UNAVAILABLE": "red", "BUILDING": "yellow"}


def _requirements(env: Environment) -> str:
    reqs = env.requirements
    if not reqs:
        return "-"
    shown = ", ".join(reqs[:3])
    return shown + (f" (+{len(reqs) - 3})" if len(reqs) > 3 else "")


def _print_build_line(line: Any, to_stderr: bool) -> None:
    if line.stream == "system":
        err_console.print(f"[dim]\\[dlcloud] {escape(line.text)}[/dim]", markup=True)
    else:
        out = sys.stderr if to_stderr else sys.stdout
        out.write(line.text + "\n")
        out.flush()


def _wait(c: Client, name: str) -> EnvironmentDetail:
    """Stream the build log until the build ends; the environment as it is then."""
    while True:
        for line in c.environments.logs(name, follow=True):
            _print_build_line(line, to_stderr=True)
        env = c.environments.get(name)
        if env.state != "BUILDING":
            return env


def _report(env: Environment) -> None:
    color = STATE_COLORS.get(env.state, "white")
    err_console.print(f"environment {env.name}: [{color}]{env.state}[/{color}]")
    if env.error:
        err_console.print(env.error)


@app.command("create")
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Environment name (DNS-1123 label, unique in your tenant)."),
    python: str | None = typer.Option(None, "--python", help="Python version, e.g. 3.11 (default: the server's own)."),
    requirements_file: list[Path] = typer.Option(
        [], "-r", "--requirements-file", help="A pip requirements file (repeatable)."
    ),
    requirement: list[str] = typer.Option(
        [], "--requirement", help="A pip requirement, e.g. 'numpy==2.1' (repeatable). Not expanded: '${' is refused."
    ),
    wheel: list[Path] = typer.Option([], "--wheel", help="A local .whl file to upload and install (repeatable)."),
    inherit: bool = typer.Option(
        False, "--inherit/--no-inherit", help="See the server's packages (torch, ...) instead of installing them."
    ),
    index_url: str | None = typer.Option(None, "--index-url", help="pip's package index URL."),
    extra_index_url: list[str] = typer.Option([], "--extra-index-url", help="An extra package index (repeatable)."),
    no_index: bool = typer.Option(False, "--no-index", help="Use no package index: wheels and inherited packages."),
    description: str = typer.Option("", "--description", help="Free text kept with the environment."),
    image: str | None = typer.Option(None, "--image", help="Container image, recorded for the Kubernetes executor."),
    wait: bool = typer.Option(False, "--wait", help="Stream the build log until it is READY or FAILED."),
    output: Output = OutputOption,
) -> None:
    """Create an environment; the server builds its venv in the background (once per distinct spec).

    With --wait the build log is streamed; the exit code is non-zero if the build fails.

    Examples:

      dlcloud envs create nlp --inherit --requirement 'transformers==4.46.0' --wait

      dlcloud envs create tabular --python 3.11 -r requirements.txt --wait

      dlcloud envs create offline --no-index --wheel dist/mylib-1.0-py3-none-any.whl --inherit
    """

    spec = RequirementsFile()
    for f in requirements_file:
        read_requirements(f, spec)
    c = client(ctx)
    env = c.environments.create(
        name,
        python=python,
        requirements=[*spec.requirements, *requirement],
        wheels=[*spec.wheels, *wheel],
        inherit=inherit,
        index_url=index_url or spec.index_url,
        extra_index_urls=[*spec.extra_index_urls, *extra_index_url],
        no_index=no_index or spec.no_index,
        description=description,
        image=image,
    )
    if output != Output.json:
        reused = " (an identical environment was built before: reused)" if env.state == "READY" else ""
        err_console.print(f"environment [bold]{env.name}[/bold] created, state {env.state}{reused}")
    if wait and env.state == "BUILDING":
        env = _wait(c, name)
        if output != Output.json:
            _report(env)
    if output == Output.json:
        render(c.environments.get(name) if wait else env, output, [])
    if env.state == "FAILED":
        raise typer.Exit(1)


@app.command("list")
def list_envs(ctx: typer.Context, output: Output = OutputOption) -> None:
    """List the built-in environments, then your tenant's.

    Examples:

      dlcloud envs list

      dlcloud envs list -o json
    """
    envs = client(ctx).environments.list()
    render(
        envs,
        output,
        [
            ("NAME", "name"),
            ("KIND", lambda e: "built-in" if e.builtin else "user"),
            ("STATE", "state"),
            ("PYTHON", "python"),
            ("INHERIT", lambda e: "yes" if e.inherit else "no"),
            ("REQUIREMENTS", _requirements),
            ("SIZE", lambda e: size_text(e.size_bytes)),
            ("HASH", lambda e: (e.spec_hash or "-")[:12]),
            ("CREATED", lambda e: short_time(e.created_at)),
        ],
    )


@app.command("describe")
def describe(
    ctx: typer.Context, name: str = typer.Argument(..., help="Environment name."), output: Output = OutputOption
) -> None:
    """Show an environment: state, spec, hash, size, inherited packages, jobs using it, build log tail.

    Examples:

      dlcloud envs describe nlp

      dlcloud envs describe pytorch -o json
    """
    e = client(ctx).environments.get(name)
    if output == Output.json:
        render(e, output, [])
        return
    fields: list[tuple[str, Any]] = [
        ("Name", e.name + (" (built-in)" if e.builtin else "")),
        ("State", e.state),
    ]
    if e.error:
        fields.append(("Error", e.error))
    fields += [
        ("Description", e.description or "-"),
        ("Python", e.python),
        ("Inherit", "yes: the server's packages are importable" if e.inherit else "no"),
        ("Requirements", "\n".join(e.requirements) or "-"),
        ("Wheels", ", ".join(e.wheels) or "-"),
        ("Index", "none (--no-index)" if e.no_index else (e.index_url or "pip's default")),
    ]
    if e.extra_index_urls:
        fields.append(("Extra indexes", ", ".join(e.extra_index_urls)))
    if e.base_packages:
        fields.append(("Inherited", ", ".join(f"{k} {v}" for k, v in e.base_packages.items())))
    fields += [
        ("Image", e.image or "-"),
        ("Hash", e.spec_hash or "- (the server's own environment)"),
        ("Size", size_text(e.size_bytes)),
        ("Builds", e.builds),
        ("Ready since", short_time(e.ready_at)),
        ("Created by", e.created_by or "-"),
        ("Created", short_time(e.created_at)),
        ("Used by", ", ".join(e.jobs) or "no unfinished job"),
    ]
    render_fields(e, output, fields)
    if e.log_tail:
        console.print()
        console.print("[bold]Build log (tail)[/bold]")
        for line in e.log_tail:
            console.print(line, markup=False)


@app.command("logs")
def logs(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Environment name."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep streaming until the build ends."),
    tail: int | None = typer.Option(None, "--tail", help="Only the last N lines."),
) -> None:
    """Print the latest build log of an environment (pip's output on stdout, dlcloud's lines on stderr).

    Examples:

      dlcloud envs logs nlp --follow

      dlcloud envs logs nlp --tail 50
    """
    for line in client(ctx).environments.logs(name, follow=follow, tail=tail):
        _print_build_line(line, to_stderr=False)


@action_command(app, "delete", ("name", "Environment name."), "environment {} deleted")
def delete(c: Client, name: str) -> None:
    """Delete an environment (refused while an unfinished job uses it or while it builds).

    Its venv is removed from the server once no environment of any tenant shares it.

    Example:

      dlcloud envs delete nlp
    """
    c.environments.delete(name)
