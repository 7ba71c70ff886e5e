"""Read a model artifact's signature: ``python -m dlcloud.serving.inspect [--format FMT] PATH``.

The registry runs this in a subprocess (so a bad pickle or a crashing library cannot take the API
down). Contract: stdout carries exactly one JSON object and nothing else --
``{"format": "onnx", "signature": {"inputs": [...], "outputs": [...]}}`` (``"signature": null`` when the
format cannot describe itself, e.g. TorchScript without a sidecar) with exit code 0, or
``{"error": "..."}`` with exit code 2. Library chatter (TensorFlow, onnxruntime, XGBoost's log
callback, stray prints) is sent to stderr: file descriptor 1 points at stderr while the model loads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

from dlcloud.serving.loaders import FORMATS, detect_format, get_loader
from dlcloud.serving.types import Signature

EXIT_ERROR = 2


def inspect_signature(path: Path, fmt: str | None = None) -> Signature | None:
    """Load the model at ``path`` with its format's loader and return the signature it infers.

    Args:
        path: the artifact file or directory.
        fmt: the format name; detected from ``path`` when None.

    Returns:
        The inferred signature, or None when the format cannot describe its inputs and outputs.

    Raises:
        ValueError, FileNotFoundError, MissingDependency, or whatever the library raises on a bad artifact.
    """
    path = Path(path)
    predictor = get_loader(fmt or detect_format(path))(path)
    predictor.load()
    try:
        return predictor.inferred_signature
    finally:
        predictor.unload()


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[IO[str]]:
    """Point fd 1 (and ``sys.stdout``) at stderr; yield a stream on the real stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    real = os.fdopen(saved, "w", encoding="utf-8")
    previous, sys.stdout = sys.stdout, sys.stderr
    try:
        yield real
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout = previous
        os.dup2(saved, 1)
        real.close()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # usage errors also answer in JSON
        print(json.dumps({"error": message}))
        raise SystemExit(EXIT_ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(
        prog="python -m dlcloud.serving.inspect",
        description="Print a model artifact's signature as JSON. Example: "
        "python -m dlcloud.serving.inspect --format onnx model.onnx",
    )
    parser.add_argument("--format", choices=FORMATS, help="the model format (detected from the path when left out)")
    parser.add_argument("path", type=Path, help="the artifact file or directory")
    args = parser.parse_args(argv)
    # quiet TensorFlow's C++ logging before anything imports it; it would go to stderr anyway
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result: dict[str, Any]
    code = 0
    with _stdout_to_stderr() as out:
        try:
            fmt = args.format or detect_format(args.path)
            signature = inspect_signature(args.path, fmt)
            result = {"format": fmt, "signature": signature.to_dict() if signature is not None else None}
        except Exception as exc:  # every failure is answered in JSON; the traceback goes to stderr
            traceback.print_exc()
            result = {"error": str(exc) or type(exc).__name__}
            code = EXIT_ERROR
        out.write(json.dumps(result) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
