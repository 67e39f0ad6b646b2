"""#19: a point that runs on the CPU asks SLURM for no GPU, whatever the cluster's gpus_per_node
(a CPU-only cluster refuses any GPU request: "Invalid generic resource (gres) specification").
A fake ``sbatch`` first on PATH keeps every submitted script (as in test_slurm_launcher.py)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

from helpers.run import fault_model

FAKE_SBATCH = """#!/usr/bin/env bash
n=$(( $(ls "$FAKE_SBATCH_DIR" | wc -l) + 100 ))
cp "$1" "$FAKE_SBATCH_DIR/$n.sh"
echo "Submitted batch job $n"
"""


def test_device_cpu_points_ask_for_no_gpu(tmp_path):
    bin_dir, scripts = tmp_path / "bin", tmp_path / "submitted"
    bin_dir.mkdir()
    scripts.mkdir()
    for name, text in {"sbatch": FAKE_SBATCH, "srun": "#!/bin/sh\nexit 1\n"}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_SBATCH_DIR=str(scripts))
    proc = subprocess.run(
        [sys.executable, "-m", "cpbench", "-m", "hydra/launcher=slurm", "device=cpu", "cp=1,2,auto", "routine=timing",
         "N=64", *fault_model("none"), "hydra.launcher.wait=false", f"hydra.sweep.dir={tmp_path / 'sweep'}",
         "report.out=null"],  # the launcher's default gpus_per_node (8) is not passed as 0
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    asked = {}
    for path in sorted(scripts.glob("*.sh")):
        flags = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?$", path.read_text(), flags=re.M))
        assert "gpus-per-node" not in flags and "gres" not in flags, flags
        asked[int(flags["job-name"].rsplit("_cp", 1)[1])] = (int(flags["nodes"]), int(flags["ntasks-per-node"]))
    assert asked == {1: (1, 1), 2: (1, 2)}  # cp=auto on a CPU is 2 ranks: it shares cp=2's array
