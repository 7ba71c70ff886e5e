"""``dlcloud serve``: the model server on this machine (KServe V2 + TF Serving REST)."""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.markup import escape

from dlcloud.cli.common import client
from dlcloud.cli.output import err_console
from dlcloud.client.mirror import MirrorThread, RegistryMirror, parse_registry_ref
from dlcloud.errors import DlcloudError


def serve(
    ctx: typer.Context,
    model: list[str] = typer.Option(
        [], "--model", "-m", help="NAME=PATH[:FORMAT]; repeat for several models. PATH may hold numbered versions."
    ),
    registry: list[str] = typer.Option(
        [], "--registry", "-r", help="Serve a registry model: NAME, OWNER/NAME or NAME@LABEL; repeat for several."
    ),
    trust_code: list[str] = typer.Option(
        [],
        "--trust-code",
        help="OWNER/NAME: trust a model another tenant shares (run its code, follow its label); repeatable.",
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
    max_queue_bytes: str | None = typer.Option(
        None, "--max-queue-bytes", help="Queued input bytes per version before 429, e.g. 256Mi [default: 1Gi]."
    ),
    request_timeout: str | None = typer.Option(None, "--request-timeout", help="Longest wait in the queue, e.g. 2s."),
    instances: int | None = typer.Option(None, "--instances", help="Batches of one model that may run at once."),
    versions: str | None = typer.Option(None, "--versions", help="Version policy: latest, latest:N, all or 1,3."),
    watch_interval: str | None = typer.Option(
        None, "--watch-interval", help="Rescan model directories for new versions this often (0: never)."
    ),
    admin_token: str | None = typer.Option(
        None,
        "--admin-token",
        envvar="DLCLOUD_SERVE_ADMIN_TOKEN",
        help="Bearer token (16+ characters) for the load/unload endpoints; required off 127.0.0.1.",
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
      dlcloud serve --registry team-a/churn@production --trust-code team-a/churn
      dlcloud serve -m clf=./clf.joblib --host 0.0.0.0 --admin-token "$(openssl rand -hex 16)"

    With --registry the server follows the registry (credentials from 'dlcloud configure'): the versions it
    names (all of them, or the one behind the label) are downloaded, checksum-verified and swapped in as the
    registry changes; the served versions are marked deployed, so they cannot be deleted meanwhile.

    A model another tenant shares (OWNER/NAME) is served as it is at start, its label moves not followed,
    unless you trust it with --trust-code OWNER/NAME; a shared sklearn or python model (their loading runs
    the owner's code) is refused without it.

    Listening on anything but a loopback address needs --admin-token.
    """
    batching = {
        "max_batch_size": max_batch_size,
        "max_queue_delay": max_queue_delay,
        "max_queue_size": max_queue_size,
        "max_queue_bytes": max_queue_bytes,
        "timeout": request_timeout,
        "instances": instances,
    }
    overrides = {
        "host": host,
        "port": port,
        "root_path": root_path,
        "watch_interval": watch_interval,
        "admin_token": admin_token,
        "access_log": access_log,
    }
    given = {k: v for k, v in batching.items() if v is not None}
    settings: dict[str, Any] = {"config_file": config, "overrides": overrides, "batching": given, "versions": versions}
    cfg, mirrors = _serving_config(ctx, model, settings, registry, trust_code, cache_dir)
    _log_to_stderr(log_level)
    _run(cfg, mirrors, registry_interval, log_level)


def _run(cfg: Any, mirrors: list[RegistryMirror], registry_interval: float, log_level: str) -> None:
    """Serve ``cfg`` until stopped, following the registry for ``mirrors`` meanwhile."""
    # the model server pulls numpy and the frameworks' loaders: only this command needs them
    from dlcloud.serving.server import run

    def started(bound: int) -> None:
        names = ", ".join(m.name for m in cfg.models) + "".join(f", {p.name} (pipeline)" for p in cfg.pipelines)
        err_console.print(f"serving {names} at [bold]http://{cfg.host}:{bound}[/bold] (V2: /v2, TF Serving: /v1)")

    follower = MirrorThread(mirrors, registry_interval) if mirrors else None
    if follower is not None:
        follower.start()
    try:
        run(cfg, log_level=log_level, on_started=started)
    finally:
        if follower is not None:
            follower.stop()


def _config_error(message: str) -> NoReturn:
    err_console.print(f"[red]error (invalid_config):[/red] {escape(message)}")
    raise typer.Exit(2)


def _serving_config(
    ctx: typer.Context,
    model: list[str],
    settings: dict[str, Any],
    registry: list[str],
    trust_code: list[str],
    cache_dir: Path,
) -> tuple[Any, list[RegistryMirror]]:
    """The server's configuration (a dlcloud.serving.config.ServingConfig) from the flags, with the --registry
    models downloaded; a configuration that cannot serve exits 2 saying why."""
    # the model server's package pulls numpy: only this command needs it
    from dlcloud.serving.config import ConfigError, build_config

    try:
        build_config(model_flags=model, **settings)  # refuse a bad configuration before touching the registry
    except ConfigError as exc:
        _config_error(str(exc))
    trusted = _trusted_refs(trust_code, registry)
    overrides = settings["overrides"]
    host, port = overrides["host"] or "127.0.0.1", overrides["port"] or 8000
    mirrors = _registry_mirrors(ctx, registry, trusted, cache_dir, host, port)
    try:
        extra = [
            {"name": m.local_name, "path": str(m.root), "format": m.first_format(), "versions": "all"} for m in mirrors
        ]
        cfg = build_config(model_flags=model, extra_models=extra, **settings)
    except ConfigError as exc:
        for mirror in mirrors:
            mirror.release()
        _config_error(str(exc))
    if not cfg.models:
        _config_error("nothing to serve: give --model NAME=PATH or --config FILE")
    missing = [m for m in cfg.models if not cfg.resolve(m.path).exists()]
    if missing:
        _config_error("model paths do not exist: " + ", ".join(f"{m.name}={cfg.resolve(m.path)}" for m in missing))
    return cfg, mirrors


def _log_to_stderr(log_level: str) -> None:
    """The server's log lines to stderr; the access log as bare JSON lines."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    access = logging.getLogger("dlcloud.serving.access")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access.addHandler(handler)
    access.propagate = False


def _trusted_refs(trust_code: list[str], registry: list[str]) -> set[str]:
    """The OWNER/NAME references of --trust-code, each of which must name a --registry model."""
    served = set()
    for value in registry:
        with contextlib.suppress(ValueError):  # reported with the mirrors
            served.add(parse_registry_ref(value)[0])
    trusted = set()
    for value in trust_code:
        owner, sep, name = value.partition("/")
        if not sep or not owner or not name or "/" in name or "@" in value:
            _config_error(
                f"--trust-code {value!r} must name a model another tenant shares with yours as OWNER/NAME (no label: "
                "trust covers every version)"
            )
        if value not in served:
            _config_error(
                f"--trust-code {value} names no --registry model; served: " + (", ".join(sorted(served)) or "none")
            )
        trusted.add(value)
    return trusted


def _registry_mirrors(
    ctx: typer.Context, refs: list[str], trusted: set[str], cache_dir: Path, host: str, port: int
) -> list[RegistryMirror]:
    """Download what each --registry reference names, before the server starts (with a progress line)."""
    if not refs:
        return []
    api = client(ctx)
    mirrors: list[RegistryMirror] = []
    for value in refs:
        try:
            ref, label = parse_registry_ref(value)
        except ValueError as exc:
            _config_error(str(exc))
        root = cache_dir.expanduser().resolve() / ref.replace("/", "__")
        mirror = RegistryMirror(
            api,
            ref,
            label,
            root,
            deployment=f"{socket.gethostname()}-{port}",
            endpoint=f"http://{host}:{port}",
            trusted=ref in trusted,
        )
        with err_console.status(f"fetching {value} from the registry..."):
            try:
                mirror.sync()
            except DlcloudError as exc:
                for started in mirrors:  # the server will not start: end the leases taken so far
                    started.release()
                err_console.print(f"[red]error ({exc.code}):[/red] {escape(f'{value}: {exc.message}')}")
                raise typer.Exit(1) from None
        versions = ", ".join(str(v) for v in sorted(mirror.on_disk())) or "none"
        err_console.print(f"{value}: version(s) {versions} in {root}")
        if not mirror.follows:
            err_console.print(
                f"{value}: shared by tenant {ref.partition('/')[0]!r} and not trusted: serving these versions as "
                f"they are; the owner's changes are not followed (--trust-code {ref} to follow them)"
            )
        mirrors.append(mirror)
    return mirrors
