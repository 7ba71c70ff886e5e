"""Keep a local model directory in step with the registry, for ``dlcloud serve --registry``.

The directory has the layout the model server watches: ``<root>/<version>/`` per version. The mirror
downloads the versions the registry wants served (every version, or the one behind a label), verifies
their checksums (``Models.download``), and moves each into place with one rename, so the server never
sees half a version. A version the registry no longer wants is removed only once a wanted one is on disk
(the server then swaps without a gap). While a version is on disk the mirror renews its deployment lease,
so the registry refuses to delete it (also on a model another tenant shares with ours).

Trust: a model another tenant shares with ours is *trusted* only when the user says so (``--trust-code
OWNER/NAME``). An untrusted shared model is served as it was at the first sync: a label the owner moves and
versions the owner adds are not followed, and a version whose format runs code when loaded (a pickle, a
Python predictor) is never downloaded: ``UntrustedCode``. The tenant's own models need no trust.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from dlcloud.client.base import Client
from dlcloud.errors import DlcloudError, RateLimited, UntrustedCode
from dlcloud.schemas.models import ModelVersion, executes_code

log = logging.getLogger("dlcloud.serving.registry")


def parse_registry_ref(value: str) -> tuple[str, str | None]:
    """``NAME``, ``OWNER/NAME``, ``NAME@LABEL`` -> (model reference, label or None)."""
    ref, _, label = value.partition("@")
    if not ref or (value.endswith("@") and not label):
        raise ValueError(f"--registry {value!r} must look like NAME, OWNER/NAME or NAME@LABEL")
    return ref, label or None


@dataclass
class RegistryMirror:
    client: Client
    ref: str  # NAME or OWNER/NAME
    label: str | None
    root: Path
    deployment: str
    endpoint: str
    ttl_seconds: float = 60.0
    trusted: bool = False  # the user trusts the owner's code and changes (--trust-code OWNER/NAME)
    leases_refused: set[int] = field(default_factory=set)
    shared: bool | None = None  # another tenant's model (learnt from the registry on the first sync)
    pinned: dict[int, ModelVersion] | None = None  # what an untrusted shared model serves: the first sync's
    _not_followed: set[int] = field(default_factory=set)

    @property
    def local_name(self) -> str:
        return self.ref.rpartition("/")[2]

    @property
    def follows(self) -> bool:
        """Whether registry changes (label moves, new versions) are followed: own or trusted models only."""
        return self._is_shared() is False or self.trusted

    def _is_shared(self) -> bool:
        if self.shared is None:
            self.shared = self.client.models.get(self.ref).shared
        return self.shared

    def on_disk(self) -> dict[int, Path]:
        if not self.root.is_dir():
            return {}
        return {int(p.name): p for p in self.root.iterdir() if p.name.isdigit() and p.is_dir()}

    def _registry_wanted(self) -> dict[int, ModelVersion]:
        if self.label is not None:
            meta = self.client.models.version(self.ref, self.label)
            return {meta.version: meta}
        return {m.version: m for m in self.client.models.versions(self.ref)}

    def wanted(self) -> dict[int, ModelVersion]:
        """The versions to serve: the registry's now, or for an untrusted shared model those of the first call."""
        current = self._registry_wanted()
        if self.follows:
            return current
        if self.pinned is None:
            self.pinned = current
            return current
        ignored = set(current) - set(self.pinned)
        if ignored and not ignored <= self._not_followed:
            self._not_followed |= ignored
            what = f"label {self.label!r} now points at" if self.label else "the registry now has"
            log.warning(
                "registry model %s: %s version(s) %s; not following: the model is shared by another tenant and "
                "not trusted (serve it with --trust-code %s to follow the owner's changes)",
                self.ref,
                what,
                ", ".join(map(str, sorted(ignored))),
                self.ref,
            )
        return self.pinned

    def _check_code(self, wanted: dict[int, ModelVersion]) -> None:
        """Refuse versions whose loading runs code, of a shared model the user did not trust."""
        if self.trusted or self._is_shared() is False:
            return
        for version, meta in sorted(wanted.items()):
            fmt = meta.format
            if meta.executes_code or executes_code(fmt):
                owner = meta.owner or self.ref.partition("/")[0]
                raise UntrustedCode(
                    f"version {version} of {self.ref} is a {fmt!r} model: loading it runs code written by tenant "
                    f"{owner!r}, in this server. Serve it only if you trust that tenant's code: add "
                    f"--trust-code {self.ref} (the server then also follows the owner's label moves and new "
                    "versions)"
                )

    def first_format(self) -> str | None:
        wanted = self.wanted()
        return wanted[max(wanted)].format if wanted else None

    def sync(self) -> bool:
        """One pass; True when the directory changed.

        Raises:
            UntrustedCode: a wanted version of an untrusted shared model runs code when loaded.
        """
        wanted = self.wanted()
        self._check_code(wanted)
        present = self.on_disk()
        changed = False
        for version, meta in sorted(wanted.items()):
            if version not in present:
                self._fetch(version, meta)
                changed = True
        present = self.on_disk()
        if any(v in present for v in wanted):
            for version, path in present.items():
                if version not in wanted:
                    log.info("registry model %s: version %d is no longer wanted; removing it", self.ref, version)
                    shutil.rmtree(path, ignore_errors=True)
                    self._release(version)  # the server drains it from memory; the registry may delete it
                    changed = True
        for version in self.on_disk():
            self._renew(version)
        return changed

    def _fetch(self, version: int, meta: ModelVersion) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".staging-{version}-", dir=self.root))
        try:
            artifact = self.client.models.download(self.ref, version, staging)
            if artifact.is_dir():
                target_dir = artifact  # a SavedModel or predictor directory becomes the version directory
            else:
                target_dir = staging
            if meta.signature and not (target_dir / "signature.json").exists():
                (target_dir / "signature.json").write_text(json.dumps(meta.signature))
            target_dir.rename(self.root / str(version))
            log.info("registry model %s: version %d downloaded (sha256 %s)", self.ref, version, meta.sha256[:12])
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _renew(self, version: int) -> None:
        if version in self.leases_refused:
            return
        try:
            self.client.models.heartbeat_deployment(
                self.ref, version, self.deployment, self.endpoint, ttl_seconds=self.ttl_seconds
            )
        except RateLimited as exc:
            # our key or tenant is over its request rate for now: not a refusal, the next pass renews it
            log.warning("registry model %s: renewing version %d's lease must wait: %s", self.ref, version, exc)
        except DlcloudError as exc:
            # e.g. a lease of that name held by another user of our tenant: serve it, but do not insist
            self.leases_refused.add(version)
            log.warning("registry model %s: cannot mark version %d deployed: %s", self.ref, version, exc)

    def _release(self, version: int) -> None:
        if version in self.leases_refused:
            return
        try:
            self.client.models.release_deployment(self.ref, version, self.deployment)
        except DlcloudError as exc:
            log.warning("registry model %s: releasing version %d failed: %s", self.ref, version, exc)

    def release(self) -> None:
        """End the leases of every version on disk (the server is stopping)."""
        for version in self.on_disk():
            self._release(version)


class MirrorThread(threading.Thread):
    """Syncs every mirror each ``interval`` seconds until stopped; a registry outage keeps what is on disk."""

    def __init__(self, mirrors: list[RegistryMirror], interval: float) -> None:
        super().__init__(name="dlcloud-registry-mirror", daemon=True)
        self.mirrors = mirrors
        self.interval = interval
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            for mirror in self.mirrors:
                try:
                    mirror.sync()
                except (DlcloudError, OSError) as exc:
                    log.warning("registry model %s: sync failed, serving what is on disk: %s", mirror.ref, exc)

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=30)
        for mirror in self.mirrors:
            mirror.release()
