"""Client credentials: environment variables first, then the config file.

``~/.config/dlcloud/config.toml`` (or ``$XDG_CONFIG_HOME/dlcloud/config.toml``, or ``$DLCLOUD_CONFIG``),
mode 0600::

    current = "local"

    [profiles.local]
    endpoint = "http://127.0.0.1:8420"
    access_key = "AK..."
    secret_key = "..."
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlcloud.errors import DlcloudError


@dataclass(frozen=True)
class Credentials:
    endpoint: str
    access_key: str
    secret_key: str


class ConfigError(DlcloudError):
    code = "not_configured"


def config_path() -> Path:
    explicit = os.environ.get("DLCLOUD_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "dlcloud" / "config.toml"


def read_config(path: Path | None = None) -> dict[str, Any]:
    path = path or config_path()
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, OSError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def write_profile(name: str, creds: Credentials, *, make_current: bool = True, path: Path | None = None) -> Path:
    """Add or replace a profile; the file is written atomically with mode 0600."""
    path = path or config_path()
    data = read_config(path)
    profiles = dict(data.get("profiles", {}))
    profiles[name] = {"endpoint": creds.endpoint, "access_key": creds.access_key, "secret_key": creds.secret_key}
    current = name if make_current or not data.get("current") else data["current"]
    lines = [f"current = {_toml_string(current)}", ""]
    for pname, prof in sorted(profiles.items()):
        lines.append(f"[profiles.{_toml_string(pname)}]")
        for key in ("endpoint", "access_key", "secret_key"):
            if key in prof:
                lines.append(f"{key} = {_toml_string(str(prof[key]))}")
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def load_credentials(profile: str | None = None) -> Credentials:
    """DLCLOUD_ENDPOINT / DLCLOUD_ACCESS_KEY / DLCLOUD_SECRET_KEY, else the (current) profile."""
    env = os.environ
    data: dict[str, Any] | None = None
    prof: dict[str, Any] = {}
    if profile is None:
        profile = env.get("DLCLOUD_PROFILE")
    if profile is not None or not all(
        env.get(k) for k in ("DLCLOUD_ENDPOINT", "DLCLOUD_ACCESS_KEY", "DLCLOUD_SECRET_KEY")
    ):
        data = read_config()
        name = profile or data.get("current")
        profiles = data.get("profiles", {})
        if profile is not None and profile not in profiles:
            raise ConfigError(
                f"profile {profile!r} not found in {config_path()}; run 'dlcloud configure --profile {profile}'"
            )
        prof = profiles.get(name, {}) if name else {}
    endpoint = env.get("DLCLOUD_ENDPOINT") or prof.get("endpoint")
    access = env.get("DLCLOUD_ACCESS_KEY") or prof.get("access_key")
    secret = env.get("DLCLOUD_SECRET_KEY") or prof.get("secret_key")
    if not (endpoint and access and secret):
        raise ConfigError(
            "no credentials: run 'dlcloud configure', start a local platform with 'dlcloud up', or set "
            "DLCLOUD_ENDPOINT, DLCLOUD_ACCESS_KEY and DLCLOUD_SECRET_KEY"
        )
    return Credentials(endpoint.rstrip("/"), access, secret)
