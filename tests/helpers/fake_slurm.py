"""A fake SLURM on PATH for the launcher tests without a cluster: ``sbatch`` keeps every
submitted script (and answers like sbatch), ``srun`` fails, ``sinfo`` prints fixed lines of
``%P %G`` (partition, GRES): what the launcher reads to decide whether device=auto points ask
for GPUs."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

FAKE_SBATCH = """#!/usr/bin/env bash
# Keeps the submitted script and answers like sbatch.
n=$(( $(ls "$FAKE_SBATCH_DIR" | wc -l) + 100 ))
cp "$1" "$FAKE_SBATCH_DIR/$n.sh"
echo "Submitted batch job $n"
"""
GPU_PARTITION = "gpu* gpu:8"  # the default partition offers GPUs


def fake_slurm_bin(tmp_path: Path, sinfo_lines: str = GPU_PARTITION) -> tuple[Path, Path]:
    """``(bin dir, scripts dir)``: the fake commands in ``tmp_path/bin``; sbatch writes to the other."""
    bin_dir, scripts = tmp_path / "bin", tmp_path / "submitted"
    bin_dir.mkdir()
    scripts.mkdir()
    sinfo = f"#!/bin/sh\nprintf '{sinfo_lines}\\n'\n"
    for name, text in {"sbatch": FAKE_SBATCH, "srun": "#!/bin/sh\nexit 1\n", "sinfo": sinfo}.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return bin_dir, scripts


def fake_slurm_env(bin_dir: Path, scripts: Path) -> dict[str, str]:
    """The environment that puts the fake commands first on PATH."""
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_SBATCH_DIR=str(scripts))


def sbatch_flags(script: str) -> dict[str, str]:
    """``#SBATCH --flag=value`` lines of a submitted script."""
    return dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?$", script, flags=re.M))
