"""#19: a point that runs on the CPU asks SLURM for no GPU, whatever the cluster's gpus_per_node
(a CPU-only cluster refuses any GPU request: "Invalid generic resource (gres) specification"):
device=cpu, or device=auto where ``sinfo`` shows no GPU in the partition. A fake ``sbatch`` first
on PATH keeps every submitted script (``helpers/fake_slurm.py``), a fake ``sinfo``
says what the partitions hold."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cpbench.sweep.resources import partition_has_gpus

from helpers.fake_slurm import fake_slurm_bin, fake_slurm_env, sbatch_flags
from helpers.run import fault_model


def _fake_slurm(tmp_path, sinfo_lines: str) -> tuple[dict, object]:
    bin_dir, scripts = fake_slurm_bin(tmp_path, sinfo_lines)
    return fake_slurm_env(bin_dir, scripts), scripts


def _asked(scripts) -> dict[int, tuple[int, int, int | None]]:
    """cp -> (nodes, tasks per node, GPUs per node: None where the script has no --gpus-per-node)."""
    asked = {}
    for path in sorted(scripts.glob("*.sh")):
        flags = sbatch_flags(path.read_text())
        assert "gres" not in flags, flags
        gpus = flags.get("gpus-per-node")
        asked[int(flags["job-name"].rsplit("_cp", 1)[1])] = (
            int(flags["nodes"]), int(flags["ntasks-per-node"]), None if gpus is None else int(gpus))
    return asked


def test_device_cpu_points_ask_for_no_gpu(tmp_path):
    env, scripts = _fake_slurm(tmp_path, "gpu* gpu:8")  # even where the partition has GPUs
    proc = subprocess.run(
        [sys.executable, "-m", "cpbench", "-m", "hydra/launcher=slurm", "device=cpu", "cp=1,2,auto", "routine=timing",
         "N=64", *fault_model("none"), "hydra.launcher.wait=false", f"hydra.sweep.dir={tmp_path / 'sweep'}",
         "report.out=null"],  # the launcher's default gpus_per_node (8) is not passed as 0
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _asked(scripts) == {1: (1, 1, None), 2: (1, 2, None)}  # cp=auto on a CPU is 2 ranks: it shares cp=2's array


@pytest.mark.parametrize("sinfo, expected", [
    ("debug* (null)\ngpu gpu:h200:8(S:0-1)", {1: (1, 1, None), 2: (1, 2, None)}),  # the default partition has none
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
