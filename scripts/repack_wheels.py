"""Repack the large wheels of a folder LZMA-compressed, in place, so more of them travel in one device call.

    python3 scripts/repack_wheels.py DIR [--over-mb 5]

A device call carries at most 64 MiB with the repository (~10.5 MB). A wheel is a zip archive, and
pip (through Python's zipfile) reads LZMA-compressed members as well as deflated ones, so the same
files and RECORD, recompressed, install the same package: biotite 1.6.0's wheel goes from 57.2 to
47.1 MB, which lets it travel beside the repository. A wheel that LZMA does not shrink stays as it is.
"""

from __future__ import annotations

import argparse
import zipfile
from pathlib import Path


def repack_lzma(wheel: Path) -> int:
    """Rewrite ``wheel`` with every member LZMA-compressed when that is smaller; returns bytes saved."""
    packed = wheel.with_suffix(".lzma-tmp")
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(packed, "w", zipfile.ZIP_LZMA) as zout:
        for member in zin.infolist():
            zout.writestr(member, zin.read(member), compress_type=zipfile.ZIP_LZMA)
    saved = wheel.stat().st_size - packed.stat().st_size
    if saved > 0:
        packed.replace(wheel)
        return saved
    packed.unlink()
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--over-mb", type=float, default=5.0, help="repack wheels larger than this")
    args = parser.parse_args()
    for wheel in sorted(args.dir.glob("*.whl")):
        if wheel.stat().st_size > args.over_mb * 1e6:
            saved = repack_lzma(wheel)
            print(f"{wheel.name}: {wheel.stat().st_size / 1e6:.1f} MB ({saved / 1e6:.1f} MB saved by LZMA)")


if __name__ == "__main__":
    main()
