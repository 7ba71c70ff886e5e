"""``dlcloud serve``: the model server on this machine (KServe V2 + TF Serving REST)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import typer

from dlcloud.cli.output import err_console


def serve(
    ctx: typer.Context,
    model: list[str] = typer.Option(
        [], "--model", "-m", help="NAME=PATH[:FORMAT]; repeat for several models. PATH may hold numbered versions."
    ),
    registry: list[str] = typer.Option(
        [], "--registry", "-r", help="Serve a registry model: NAME, OWNER/NAME or NAME@LABEL; repeat for several."
    ),
    cache_dir: Path = typer.Option(
        Path("~/.cache/dlcloud/models"), "--cache-dir", help="Where registry versions are downloaded."
    ),
    registry_interval: float = typer.Option(10.0, "--registry-interval", help="Seconds between registry checks."),
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML/JSON file with models and pipelines."),
    host: str | None = typer.Option(None, "--host", help="Address to listen on [default: 127.0.0.1]."),
    port: int | None = typer.Option(None, "--port", help="Port to listen on [default: 8000]."),
    root_path: str | None = typer.Option(None, "--root-path", help="Also serve under this URL prefix."),
    max_batch_size: int | None = typer.Option(None, "--max-batch-size", help="Rows per batch (0: no batching)."),
    max_queue_delay: str | None = typer.Option(
        None, "--max-queue-delay", help="Wait this long for a batch to fill, e.g. 2ms [default: 0, run at once]."
    ),
    max_queue_size: int | None = typer.Option(None, "--max-queue-size", help="Queued requests before 429."),
    request_timeout: str | None = typer.Option(None, "--request-timeout", help="Longest wait in the queue, e.g. 2s."),
    instances: int | None = typer.Option(None, "--instances", help="Batches of one model that may run at once."),
    versions: str | None = typer.Option(None, "--versions", help="Version policy: latest, latest:N, all or 1,3."),
    watch_interval: str | None = typer.Option(
        None, "--watch-interval", help="Rescan model directories for new versions this often (0: never)."
    ),
    admin_token: str | None = typer.Option(
        None, "--admin-token", envvar="DLCLOUD_SERVE_ADMIN_TOKEN", help="Bearer token for the load/unload endpoints."
    ),
    access_log: bool = typer.Option(True, "--access-log/--no-access-log", help="One JSON line per request."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Serve models over KServe V2 (/v2, works with tritonclient) and TF Serving REST (/v1).

    The format is recognised from the path (.pt TorchScript, .onnx, .joblib/.pkl scikit-learn,
    .json/.ubj XGBoost, a SavedModel directory, a directory with predictor.py) unless given after a
    colon. A directory of numbered sub-directories (1/, 2/, ...) is a versioned model: new versions are
    picked up while serving, loaded, warmed up and swapped in without failing a request.

    Examples:

      dlcloud serve --model mlp=./mlp.pt --model clf=./clf.joblib --port 8000

      dlcloud serve -m ranker=./models/ranker:onnx --max-batch-size 64 --max-queue-delay 2ms

      dlcloud serve --config serving.yaml

      dlcloud serve --registry fraud@production --registry team-a/ranker --port 8000

    With --registry the server follows the registry (credentials from 'dlcloud configure'): the versions it
    names (all of them, or the one behind the label) are downloaded, checksum-verified and swapped in as the
    registry changes; the served versions are marked deployed, so they cannot be deleted meanwhile.
    """
    from dlcloud.serving.config import ConfigError, build_config

    batching = {
        k: v
        for k, v in {
            "max_batch_size": max_batch_size,
            "max_queue_delay": max_queue_delay,
            "max_queue_size": max_queue_size,
            "timeout": request_timeout,
            "instances": instances,
        }.items()
        if v is not None
    }
    overrides = {
        "host": host,
        "port": port,
        "root_path": root_path,
        "watch_interval": watch_interval,
        "admin_token": admin_token,
        "access_log": access_log,
    }
    mirrors = _registry_mirrors(ctx, registry, cache_dir, host or "127.0.0.1", port or 8000)
    extra = [
        {"name": m.local_name, "path": str(m.root), "format": m.first_format(), "versions": "all"} for m in mirrors
    ]
    try:
        cfg = build_config(
            config_file=config,
            model_flags=model,
            overrides=overrides,
            batching=batching,
            versions=versions,
            extra_models=extra,
        )
    except ConfigError as exc:
        err_console.print(f"[red]error (invalid_config):[/red] {exc}")
        raise typer.Exit(2) from None
    if not cfg.models:
        err_console.print(
            "[red]error (invalid_config):[/red] nothing to serve: give --model NAME=PATH or --config FILE"
        )
        raise typer.Exit(2)
    missing = [m for m in cfg.models if not cfg.resolve(m.path).exists()]
    if missing:
        listed = ", ".join(f"{m.name}={cfg.resolve(m.path)}" for m in missing)
        err_console.print(f"[red]error (invalid_config):[/red] model paths do not exist: {listed}")
        raise typer.Exit(2)

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    access = logging.getLogger("dlcloud.serving.access")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access.addHandler(handler)
    access.propagate = False

    from dlcloud.serving.server import run

    def started(bound: int) -> None:
        names = ", ".join(m.name for m in cfg.models) + "".join(f", {p.name} (pipeline)" for p in cfg.pipelines)
        err_console.print(f"serving {names} at [bold]http://{cfg.host}:{bound}[/bold] (V2: /v2, TF Serving: /v1)")

    follower = None
    if mirrors:
        from dlcloud.client.mirror import MirrorThread

        follower = MirrorThread(mirrors, registry_interval)
        follower.start()
    try:
        run(cfg, log_level=log_level, on_started=started)
    finally:
        if follower is not None:
            follower.stop()


def _registry_mirrors(ctx: typer.Context, refs: list[str], cache_dir: Path, host: str, port: int) -> list:
    """Download what each --registry reference names, before the server starts (with a progress line)."""
    if not refs:
        return []
    import socket

    from dlcloud.cli.common import client
    from dlcloud.client.mirror import RegistryMirror, parse_registry_ref
    from dlcloud.errors import DlcloudError

    api = client(ctx)
    mirrors = []
    for value in refs:
        try:
            ref, label = parse_registry_ref(value)
        except ValueError as exc:
            err_console.print(f"[red]error (invalid_config):[/red] {exc}")
            raise typer.Exit(2) from None
        root = cache_dir.expanduser().resolve() / ref.replace("/", "__")
        mirror = RegistryMirror(
            api,
            ref,
            label,
            root,
            deployment=f"{socket.gethostname()}-{port}",
            endpoint=f"http://{host}:{port}",
        )
        with err_console.status(f"fetching {value} from the registry..."):
            try:
                mirror.sync()
            except DlcloudError as exc:
                err_console.print(f"[red]error ({exc.code}):[/red] {value}: {exc.message}")
                raise typer.Exit(1) from None
        versions = ", ".join(str(v) for v in sorted(mirror.on_disk())) or "none"
        err_console.print(f"{value}: version(s) {versions} in {root}")
        mirrors.append(mirror)
    return mirrors
