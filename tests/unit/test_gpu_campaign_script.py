"""``scripts/gpu_campaign.sh`` with ``EXPECT_GPU``: a campaign meant for one GPU model runs nothing
on another (the machine's name comes from ``nvidia-smi``, here a stand-in on PATH)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def fake_nvidia_smi(bin_dir: Path, name: str) -> None:
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!/usr/bin/env bash\necho '{name}'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("expect, runs", [("H200", False), ("H100", True)])
def test_a_campaign_for_another_gpu_runs_nothing(tmp_path, expect, runs):
    fake_nvidia_smi(tmp_path / "bin", "NVIDIA H100 80GB HBM3")
    tree = tmp_path / "tree"  # the script alone, away from any wheels this checkout holds in .whl/
    (tree / "scripts").mkdir(parents=True)
    script = tree / "scripts" / "gpu_campaign.sh"
    script.write_text((ROOT / "scripts" / "gpu_campaign.sh").read_text())
    campaign = tmp_path / "campaign.txt"
    campaign.write_text("# nothing to run: only whether the script gets past its GPU check\n")
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ['PATH']}", "OUT": str(out), "BUDGET_S": "30", "EXPECT_GPU": expect}
    done = subprocess.run(["bash", str(script), str(campaign)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)
    if runs:
        assert done.returncode == 0 and "done in" in done.stdout, done.stdout + done.stderr
        assert not (out / "refused.txt").exists()
    else:
        assert done.returncode == 3, done.stdout + done.stderr
        assert "this machine's GPU is 'NVIDIA H100 80GB HBM3': nothing run" in (out / "refused.txt").read_text()
