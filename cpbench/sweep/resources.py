"""What one sweep point asks SLURM for: one task per rank, GPUs per node up to a node's worth.

    cp=2, gpus_per_node=4  ->  1 node,  2 tasks per node, 2 GPUs per node
    cp=8, gpus_per_node=4  ->  2 nodes, 4 tasks per node, 4 GPUs per node
    cp=2, gpus_per_node=0  ->  1 node,  2 tasks, no GPU request (a CPU cluster; gloo)

Points that need the same resources share one SLURM job array. A point with ``device=auto``
asks for no GPU where the partition has none (``partition_has_gpus``, from ``sinfo``): a cluster
without GPU GRES refuses any GPU request.
"""

from __future__ import annotations

import math
import re
import subprocess
from dataclasses import dataclass

# A GPU in sinfo's GRES column (%G): "gpu:8", "gpu:h200:8(S:0-1)", "gpu" within "nvme:1,gpu:4".
_GPU_GRES = re.compile(r"(?:^|,)gpu(?:[:(]|$)")


@dataclass(frozen=True)
class JobResources:
    """The allocation of one job (one sweep point).

    Attributes:
        cp: ranks of the point (= SLURM tasks of the job, one rank slot each).
        nodes: ``⌈cp / gpus_per_node⌉`` (1 on a CPU cluster).
        tasks_per_node: ranks per node, ``min(cp, gpus_per_node)`` (cp on a CPU cluster).
        gpus_per_node: GPUs requested per node (0: no GPU request).
        ntasks: total tasks when ``nodes * tasks_per_node`` would overshoot ``cp`` (cp=6 on
            4-GPU nodes: 2 nodes, at most 4 tasks each, 6 in all); None when it does not.
    """

    cp: int
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    ntasks: int | None = None

    def submitit_params(self) -> dict:
        """These resources as submitit's generic executor parameters (plus sbatch extras)."""
        params: dict = {"nodes": self.nodes, "tasks_per_node": self.tasks_per_node}
        # gpus_per_node=0 must not reach sbatch: clusters without GPU GRES reject --gpus-per-node=0.
        params["gpus_per_node"] = self.gpus_per_node or None
        return params

    def sbatch_extras(self) -> dict:
        """sbatch flags submitit has no parameter for (``additional_parameters``)."""
        return {"ntasks": self.ntasks} if self.ntasks is not None else {}


def resources_for(cp: int, gpus_per_node: int) -> JobResources:
    """One task per rank; ``gpus_per_node`` ranks (and GPUs) per node; 0 = CPU-only cluster.

    Raises:
        ValueError: cp < 1 or gpus_per_node < 0.
    """
    if cp < 1:
        raise ValueError(f"cp={cp}: a positive integer")
    if gpus_per_node < 0:
        raise ValueError(f"hydra.launcher.gpus_per_node={gpus_per_node}: 0 (CPU cluster) or a positive integer")
    if gpus_per_node == 0:
        return JobResources(cp=cp, nodes=1, tasks_per_node=cp, gpus_per_node=0)
    tasks_per_node = min(cp, gpus_per_node)
    nodes = math.ceil(cp / gpus_per_node)
    ntasks = cp if nodes * tasks_per_node != cp else None
    return JobResources(cp=cp, nodes=nodes, tasks_per_node=tasks_per_node,
                        gpus_per_node=tasks_per_node, ntasks=ntasks)


def partition_has_gpus(partition: str | None) -> bool | None:
    """Whether a node of ``partition`` (None: the cluster's default partition, the one ``sinfo``
    marks with ``*``) offers GPUs as generic resources, read from ``sinfo -h -o "%P %G"``.
    None when ``sinfo`` cannot answer (no SLURM here, an unknown partition): then the caller
    keeps what ``hydra.launcher.gpus_per_node`` says."""
    cmd = ["sinfo", "-h", "-o", "%P %G"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    gres = [fields[1] for fields in (line.split(None, 1) for line in out.stdout.splitlines())
            if len(fields) == 2 and (partition or fields[0].endswith("*"))]
    return any(_GPU_GRES.search(g.strip()) for g in gres) if gres else None
