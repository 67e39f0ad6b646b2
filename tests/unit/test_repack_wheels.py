"""``scripts/repack_wheels.py``: a wheel repacked LZMA-compressed is smaller and pip installs the same
files from it (the GPU machine installs the repacked wheels with pip, from no index)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def make_wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel whose module carries 6 MB of compressible, non-trivial text."""
    name, version = "lzmademo", "1.0"
    body = "".join(f"ROW_{i} = {i * i % 9973}\n" for i in range(400_000))
    files = {f"{name}/__init__.py": body,
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL":
                 "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},,\n" for path in files) + f"{name}-{version}.dist-info/RECORD,,\n"
    files[f"{name}-{version}.dist-info/RECORD"] = record
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def test_a_repacked_wheel_is_smaller_and_installs_the_same_files(tmp_path):
    wheel = make_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        before = {i.filename: zf.read(i) for i in zf.infolist()}
    size = wheel.stat().st_size
    subprocess.run([sys.executable, str(ROOT / "scripts" / "repack_wheels.py"), str(tmp_path)], check=True,
                   capture_output=True, text=True)
    assert wheel.stat().st_size < size
    with zipfile.ZipFile(wheel) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_LZMA}
        assert {i.filename: zf.read(i) for i in zf.infolist()} == before
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", str(target), str(wheel)], check=True,
                   capture_output=True, text=True, env={**os.environ, "PIP_NO_INPUT": "1"})
    installed = (target / "lzmademo" / "__init__.py").read_bytes()
    assert installed == before["lzmademo/__init__.py"]
