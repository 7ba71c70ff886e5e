"""Shared CLI helpers: the SDK client from the global options, and the commands that do one thing to one named
object (``keys disable KEY``, ``jobs delete NAME``, ``tune stop NAME``): each is a function of the SDK client and
the name, its docstring the command's help, that a decorator here adds to its group."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from dlcloud.cli.output import Output, OutputOption, err_console, print_json
from dlcloud.client import Client

# a command's argument: its name as the help shows it ("key", "name") and its help
Target = tuple[str, str]


def client(ctx: typer.Context) -> Client:
    obj = ctx.find_root().obj or {}
    return Client.from_env(obj.get("profile"), timeout=obj.get("timeout", 60.0))


def action_command(
    app: typer.Typer, command: str, target: Target, done: str
) -> Callable[[Callable[[Client, str], None]], Callable[[Client, str], None]]:
    """Add ``command TARGET`` to ``app``: the decorated SDK call on the object TARGET names, then ``done`` on
    stderr with TARGET in place of ``{}`` ("key {} disabled")."""
    metavar, target_help = target

    def register(call: Callable[[Client, str], None]) -> Callable[[Client, str], None]:
        @app.command(command, help=inspect.getdoc(call))
        def run(ctx: typer.Context, name: str = typer.Argument(..., metavar=metavar, help=target_help)) -> None:
            call(client(ctx), name)
            err_console.print(done.format(name))

        return call

    return register


def answer_command(
    app: typer.Typer, command: str, target: Target, to: Console, line: Callable[[Any], str]
) -> Callable[[Callable[[Client, str], Any]], Callable[[Client, str], Any]]:
    """Add ``command TARGET [-o json]`` to ``app``: the decorated SDK call on the object TARGET names; its answer
    as JSON with ``-o json``, else the one ``line`` made of it, printed on ``to``."""
    metavar, target_help = target

    def register(call: Callable[[Client, str], Any]) -> Callable[[Client, str], Any]:
        @app.command(command, help=inspect.getdoc(call))
        def run(
            ctx: typer.Context,
            name: str = typer.Argument(..., metavar=metavar, help=target_help),
            output: Output = OutputOption,
        ) -> None:
            with client(ctx) as c:
                answer = call(c, name)
            if output == Output.json:
                print_json(answer)
            else:
                to.print(line(answer))

        return call

    return register
