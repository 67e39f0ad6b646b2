"""What the one-device scripts (``profile_ops.py``, ``graph_parity.py``) share: a one-rank
process group with its ``("cp",)`` mesh, and the boltz2 trunk-only model and inputs they run
(the reference adapter's defaults are the boltz2 sizes, ``cpbench/conf/model/boltz2.yaml``; trunk only:
no MSA module, no recycling, no sampling). Imported from the scripts' folder."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from cpbench.models.pairformer.adapter import PairformerAdapter

TRUNK_ONLY = dict(msa_blocks=0, recycles=0, sampling=False)


def one_rank_mesh(device: torch.device, port: int) -> Any:
    """A one-rank process group (NCCL on CUDA, gloo on a CPU) and its 1d ``("cp",)`` mesh."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    return init_device_mesh(device.type, (1,), mesh_dim_names=("cp",))


def emulated_mesh(device: torch.device, cp: int, grid: tuple[int, int] | None = None) -> Any:
    """Rank 0 of a cp=``cp`` group over torch's fake process group (``emulate=true``'s group:
    every collective returns at once) and its mesh: 1d ``("cp",)``, or 2d ``("cp0", "cp1")``
    over ``grid``."""
    from cpbench.harness.emulation import init_fake_group

    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_fake_group(0, cp)
    if grid is not None:
        return init_device_mesh(device.type, tuple(grid), mesh_dim_names=("cp0", "cp1"))
    return init_device_mesh(device.type, (cp,), mesh_dim_names=("cp",))


def trunk_setup(n: int, blocks: int, kernels: str, mesh: Any, device: torch.device,
                dtype: str = "bf16", workflow: dict = TRUNK_ONLY,
                **choices: str) -> tuple[PairformerAdapter, torch.nn.Module, dict]:
    """``(adapter, model, batch)`` of the boltz2 pass (``workflow``: the adapter's workflow
    arguments, trunk only by default) with ``blocks`` blocks at ``n`` tokens (weights from seed 0;
    the job's defaults: 8 atoms per token, S=256); ``choices``: the adapter's ``passes`` and
    ``attention``."""
    adapter = PairformerAdapter(**workflow, blocks=blocks, dtype=dtype, kernels=kernels, **choices)
    torch.manual_seed(0)
    model = adapter.build_model(mesh, device)
    return adapter, model, adapter.build_batch(n, 8 * n, 256, mesh, device)
