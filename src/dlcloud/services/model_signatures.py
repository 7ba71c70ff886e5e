"""Model signatures and formats: a declared signature validated, a missing one inferred from the artifact.

A declared signature is validated and normalised (400 ``invalid_signature``). Without one the signature is
inferred by ``python -m dlcloud.serving.inspect`` in a process of its own that the executor runs
(``Executor.inspect_model``), so ML libraries and the artifact's own code never enter the API process; when
inference fails the answer is "no signature", never an error. Nothing here reads or writes the registry's rows.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from dlcloud.errors import InvalidSignature, UnknownFormat
from dlcloud.executors.base import Executor
from dlcloud.schemas.models import FORMATS
from dlcloud.serving.signatures import Signature, TensorSpec

log = logging.getLogger(__name__)


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise UnknownFormat(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def check_signature(data: Any) -> dict[str, Any]:
    """A declared signature, validated and normalised (datatypes upper case, shapes as lists)."""
    if not isinstance(data, dict):
        raise InvalidSignature("signature must be an object with 'inputs' and 'outputs' lists")
    unknown = sorted(set(data) - {"inputs", "outputs"})
    if unknown:
        raise InvalidSignature(f"signature has unknown field(s) {', '.join(unknown)}; allowed: inputs, outputs")
    for side in ("inputs", "outputs"):
        items = data.get(side, [])
        if not isinstance(items, list):
            raise InvalidSignature(f"signature.{side} must be a list of {{name, datatype, shape}} objects")
        seen: set[str] = set()
        for i, spec in enumerate(items):
            where = f"signature.{side}[{i}]"
            if not isinstance(spec, dict):
                raise InvalidSignature(f"{where} must be an object with name, datatype and shape")
            extra = sorted(set(spec) - {"name", "datatype", "shape"})
            if extra:
                allowed = "name, datatype, shape"
                raise InvalidSignature(f"{where} has unknown field(s) {', '.join(extra)}; allowed: {allowed}")
            name = spec.get("name")
            if not isinstance(name, str) or not name or len(name) > 256:
                raise InvalidSignature(f"{where}.name must be a string of 1-256 characters")
            if name in seen:
                raise InvalidSignature(f"{where}: {side} name {name!r} appears twice")
            seen.add(name)
            if not isinstance(spec.get("datatype"), str):
                raise InvalidSignature(f"{where} ({name}): datatype must be a string such as FP32, INT64 or BYTES")
            shape = spec.get("shape", [])
            if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
                raise InvalidSignature(f"{where} ({name}): shape must be a list of integers (-1 = any size)")
            try:
                TensorSpec.from_dict(spec)
            except ValueError as exc:
                raise InvalidSignature(f"{where} ({name}): {exc}") from None
    if not data.get("inputs") and not data.get("outputs"):
        raise InvalidSignature("signature declares no inputs and no outputs")
    return Signature.from_dict(data).to_dict()


def infer_signature(executor: Executor, tree: str, artifact: str, fmt: str, timeout: float) -> dict[str, Any] | None:
    """Ask ``python -m dlcloud.serving.inspect``, run by ``executor`` on the stored artifact (``artifact`` in
    the tree ``tree``), for its signature; None when it cannot tell.

    The contract: it prints ``{"signature": {...} | null}`` on stdout and exits 0. Anything else (the
    module missing, a library missing, a crash, the timeout) means "no signature", never a failed register.
    """
    proc = executor.inspect_model(tree, artifact, fmt, timeout)
    if proc is None:
        return None
    if proc.returncode != 0:
        log.info("signature inference for %s exited %d: %s", tree, proc.returncode, proc.stderr[-2000:])
        return None
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    data: Any = None
    for candidate in (proc.stdout, lines[-1] if lines else ""):  # libraries may print to stdout before it
        try:
            data = json.loads(candidate)
            break
        except json.JSONDecodeError:
            continue
    signature = data.get("signature") if isinstance(data, dict) else None
    if signature is None:
        return None
    try:
        return check_signature(signature)
    except InvalidSignature as exc:
        log.warning("signature inferred for %s is unusable: %s", tree, exc)
        return None
