"""Shared CLI helpers: the SDK client from the global options."""

from __future__ import annotations

import typer

from dlcloud.client import Client


def client(ctx: typer.Context) -> Client:
    obj = ctx.find_root().obj or {}
    return Client.from_env(obj.get("profile"), timeout=obj.get("timeout", 60.0))
