"""#19: a point that runs on the CPU asks SLURM for no GPU, whatever the cluster's gpus_per_node
(a CPU-only cluster refuses any GPU request: "Invalid generic resource (gres) specification"):
device=cpu, or device=auto where ``sinfo`` shows no GPU in the partition. A fake ``sbatch`` first
on PATH keeps every submitted script (as in test_slurm_launcher.py), a fake ``sinfo`` says what
the partitions hold."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import pytest

from cpbench.sweep.resources import partition_has_gpus

from helpers.run import fault_model

FAKE_SBATCH = """#!/usr/bin/env bash
n=$(( $(ls "$FAKE_SBATCH_DIR" | wc -l) + 100 ))
cp "$1" "$FAKE_SBATCH_DIR/$n.sh"
echo "Submitted batch job $n"
"""


def _fake_slurm(tmp_path, sinfo_lines: str) -> tuple[dict, object]:
    bin_dir, scripts = tmp_path / "bin", tmp_path / "submitted"
    bin_dir.mkdir()
    scripts.mkdir()
    sinfo = f"#!/bin/sh\nprintf '{sinfo_lines}\\n'\n"
    for name, text in {"sbatch": FAKE_SBATCH, "srun": "#!/bin/sh\nexit 1\n", "sinfo": sinfo}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_SBATCH_DIR=str(scripts)), scripts


def _asked(scripts) -> dict[int, tuple[int, int, int]]:
    """cp -> (nodes, tasks per node, GPUs per node) of every submitted script."""
    asked = {}
    for path in sorted(scripts.glob("*.sh")):
        flags = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?$", path.read_text(), flags=re.M))
        assert "gres" not in flags, flags
        asked[int(flags["job-name"].rsplit("_cp", 1)[1])] = (
            int(flags["nodes"]), int(flags["ntasks-per-node"]), int(flags.get("gpus-per-node", 0)))
    return asked


def test_device_cpu_points_ask_for_no_gpu(tmp_path):
    env, scripts = _fake_slurm(tmp_path, "gpu* gpu:8")  # even where the partition has GPUs
    proc = subprocess.run(
        [sys.executable, "-m", "cpbench", "-m", "hydra/launcher=slurm", "device=cpu", "cp=1,2,auto", "routine=timing",
         "N=64", *fault_model("none"), "hydra.launcher.wait=false", f"hydra.sweep.dir={tmp_path / 'sweep'}",
         "report.out=null"],  # the launcher's default gpus_per_node (8) is not passed as 0
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _asked(scripts) == {1: (1, 1, 0), 2: (1, 2, 0)}  # cp=auto on a CPU is 2 ranks: it shares cp=2's array


@pytest.mark.parametrize("sinfo, expected", [
    ("debug* (null)\ngpu gpu:h200:8(S:0-1)", {1: (1, 1, 0), 2: (1, 2, 0)}),  # the default partition has none
    ("debug (null)\ngpu* gpu:h200:8(S:0-1)", {1: (1, 1, 1), 2: (1, 2, 2)}),
], ids=["cpu_partition", "gpu_partition"])
def test_device_auto_points_ask_for_gpus_only_where_the_partition_has_them(tmp_path, sinfo, expected):
    env, scripts = _fake_slurm(tmp_path, sinfo)
    proc = subprocess.run(
        [sys.executable, "-m", "cpbench", "-m", "hydra/launcher=slurm", "cp=1,2", "routine=timing", "N=64",
         *fault_model("none"), "hydra.launcher.wait=false", f"hydra.sweep.dir={tmp_path / 'sweep'}",
         "report.out=null"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _asked(scripts) == expected


@pytest.mark.parametrize("lines, partition, expected", [
    ("debug* (null)", None, False),
    ("cpu* (null)\ngpu gpu:4", None, False),
    ("gpu gpu:4", "gpu", True),  # sinfo -p gpu: only that partition's lines, no default mark needed
    ("gpu* nvme:1,gpu:a100:4(S:0-1)", None, True),
    ("gpu* gpumem:80", None, False),
    ("", None, None),  # nothing to read: keep gpus_per_node
])
def test_partition_has_gpus_reads_sinfo_gres(tmp_path, monkeypatch, lines, partition, expected):
    env, _ = _fake_slurm(tmp_path, lines)
    monkeypatch.setenv("PATH", env["PATH"])
    assert partition_has_gpus(partition) is expected


def test_partition_has_gpus_is_none_without_sinfo(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo on PATH
    assert partition_has_gpus(None) is None
