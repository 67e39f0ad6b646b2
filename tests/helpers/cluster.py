"""When the SLURM tests (``tests/cluster/``, marker ``slurm``) may run: only on explicit opt-in.

They submit jobs to whichever cluster ``sinfo`` answers for, so a developer's or a user's own
cluster must never receive them by accident: they run only with ``CPBENCH_TEST_SLURM=1`` (set by
``.ci/run``, which first starts a one-node cluster with ``.ci/slurm_up.sh``), and then only where a
SLURM node answers.
"""

from __future__ import annotations

import os
import shutil
import subprocess

OPT_IN = "CPBENCH_TEST_SLURM"


def cluster_skip_reason() -> str | None:
    """Why the SLURM tests skip here (one line), or None when they may run."""
    if os.environ.get(OPT_IN) != "1":
        return f"SLURM tests submit real jobs: set {OPT_IN}=1 to run them (.ci/run does, on its own one-node cluster)"
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "no SLURM client (sinfo/sbatch) here: run .ci/slurm_up.sh as root to start a one-node cluster"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo does not answer ({exc}): run .ci/slurm_up.sh"
    states = out.stdout.split()
    if out.returncode != 0 or not any(s.startswith(("idle", "mix", "alloc")) for s in states):
        return f"no usable SLURM node (sinfo: {out.stdout.strip() or out.stderr.strip()}): run .ci/slurm_up.sh"
    return None
