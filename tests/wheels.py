"""Tiny wheels made in a test, so environments install something without a package index."""

from __future__ import annotations

import zipfile
from pathlib import Path


def make_wheel(directory: Path, name: str = "tinypkg", version: str = "0.1", body: str = "") -> Path:
    """A pure-Python wheel holding package ``name`` (``VERSION`` = version, plus ``body``)."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n{body}",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: dlcloud-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{dist}/RECORD,,\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            zf.writestr(member, text)
        zf.writestr(f"{dist}/RECORD", record)
    return path
