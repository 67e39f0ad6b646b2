"""Run cpbench as a user does (``python -m cpbench`` in a subprocess) and compose its configs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cpbench.config import CONF_DIR, Point, resolve_point

REPO_ROOT = Path(__file__).resolve().parents[2]

# The acceptance multirun: 8 timing points of the tiny reference trunk on CPU.
# Inference samples 4 diffusion steps (not 200): CI time; the sampler's per-step cost is all it adds.
TIMING_MULTIRUN_ARGS = ["-m", "workflow=inference,training", "cp=1,2", "N=16,32", "S=16", "model=tiny", "device=cpu",
                        "routine=timing", "workflow.sampling_steps=4"]


def run_command(cmd: list[str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own session; on timeout kill the whole session (workers included)."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ.copy(), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_cpbench(args: list[str], cwd: Path, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """``python -m cpbench ARGS`` in ``cwd`` (outputs and report land there)."""
    return run_command([sys.executable, "-m", "cpbench", *args], cwd, timeout_s)


def compose_cfg(*overrides: str):
    """The job config ``python -m cpbench OVERRIDES`` would see (without the hydra node)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    OmegaConf.set_struct(cfg, False)
    cfg.pop("hydra", None)
    return cfg


def compose_point(*overrides: str) -> Point:
    return resolve_point(compose_cfg(*overrides))


def fault_model(fault: str, threshold_n: int = 48) -> list[str]:
    """Overrides selecting the fault-injecting test adapter."""
    return ["model=adapter", "model._target_=tests.helpers.faults.FaultAdapter", f"+model.fault={fault}",
            f"+model.threshold_n={threshold_n}"]
