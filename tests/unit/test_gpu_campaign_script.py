"""``scripts/gpu_campaign.sh`` with ``EXPECT_GPU``: a campaign meant for one GPU model runs nothing
on another (the machine's name comes from ``nvidia-smi``, here a stand-in on PATH); with ``ONLY``
it takes only the named lines, and a name with no line refuses the run."""

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


def run_campaign(tmp_path: Path, lines: str, **env_vars: str) -> subprocess.CompletedProcess:
    """The script alone (away from any wheels this checkout holds in .whl/) on ``lines`` as its
    campaign file, on a stand-in H100, with a 30 s budget and ``env_vars``."""
    fake_nvidia_smi(tmp_path / "bin", "NVIDIA H100 80GB HBM3")
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    script = tree / "scripts" / "gpu_campaign.sh"
    script.write_text((ROOT / "scripts" / "gpu_campaign.sh").read_text())
    campaign = tmp_path / "campaign.txt"
    campaign.write_text(lines)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ['PATH']}", "OUT": str(tmp_path / "out"), "BUDGET_S": "30", **env_vars}
    return subprocess.run(["bash", str(script), str(campaign)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("expect, runs", [("H200", False), ("H100", True)])
def test_a_campaign_for_another_gpu_runs_nothing(tmp_path, expect, runs):
    done = run_campaign(tmp_path, "# nothing to run: only whether the script gets past its GPU check\n",
                        EXPECT_GPU=expect)
    out = tmp_path / "out"
    if runs:
        assert done.returncode == 0 and "done in" in done.stdout, done.stdout + done.stderr
        assert not (out / "refused.txt").exists()
    else:
        assert done.returncode == 3, done.stdout + done.stderr
        assert "this machine's GPU is 'NVIDIA H100 80GB HBM3': nothing run" in (out / "refused.txt").read_text()


@pytest.mark.parametrize("only, taken", [("", {"a", "b", "ab", "c"}), ("b", {"b"}), ("a,c", {"a", "c"})])
def test_only_takes_the_named_lines(tmp_path, only, taken):
    """Each line needs more than the budget, so a line the loop takes prints its skip and runs
    nothing; a name is matched whole (``ab`` is not ``a`` or ``b``)."""
    done = run_campaign(tmp_path, "a 999 N=1\nb 999 N=2\nab 999 N=3\nc 999 N=4\n", ONLY=only)
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = {line.split()[1].rstrip(":") for line in done.stdout.splitlines() if line.startswith("skip ")}
    assert skipped == taken, done.stdout


def test_only_naming_no_line_runs_nothing(tmp_path):
    """A name in ``ONLY`` that no line has (a typo, or a line not written yet) refuses the whole run
    with one line naming it, before the GPU check or any job."""
    done = run_campaign(tmp_path, "a 1 N=1\nb 1 N=2\n", ONLY="a,bb")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "has no line named 'bb'" in done.stdout
    assert "job " not in done.stdout and "skip " not in done.stdout


def test_compile_cache_goes_back_and_comes_in_again(tmp_path):
    """``KEEP_COMPILE_CACHE=1`` packs the compile cache into ``$OUT/compile_cache.tgz``; a later
    campaign whose ``RESUME_FROM`` holds that archive unpacks it into its own cache first."""
    first_cache = tmp_path / "cache1"
    (first_cache / "inductor" / "fxgraph").mkdir(parents=True)
    (first_cache / "inductor" / "fxgraph" / "entry").write_text("compiled graph")
    done = run_campaign(tmp_path, "", KEEP_COMPILE_CACHE="1", COMPILE_CACHE=str(first_cache))
    assert done.returncode == 0, done.stdout + done.stderr
    packed = tmp_path / "out" / "compile_cache.tgz"
    assert packed.exists() and "KiB packed" in done.stdout, done.stdout

    later = tmp_path / "later"
    later.mkdir()
    second_cache = tmp_path / "cache2"
    done = run_campaign(later, "", RESUME_FROM=str(tmp_path / "out"), COMPILE_CACHE=str(second_cache))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (second_cache / "inductor" / "fxgraph" / "entry").read_text() == "compiled graph"
    assert not (later / "out" / "compile_cache.tgz").exists()  # not asked to keep it
